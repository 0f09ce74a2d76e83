"""Lines an install shows its user, and the compile progress of a CUDA build.

pip captures a build backend's stdout/stderr and shows them only with -v or on failure
(pypa/pip#6634). So a line meant for the user goes to stderr (build logs, pip -v) and,
when stderr is not already the terminal, also straight to the terminal if there is one.
A build without a terminal (Docker, CI) shows it only with -v; `python -m nattn` tells
the same at run time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import List, Optional

_STEP = re.compile(r"^\[\s*(\d+)/(\d+)\]")  # ninja: "[12/70] Building CUDA object ..."
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")  # make: "[ 17%] Building CUDA object ..."


_state = {"wrote": False}


def to_terminal(line: str) -> None:
    if sys.stderr.isatty():  # the user already sees stderr (python -m build, setup.py)
        return
    # The first line leaves pip's "Building ... " line; later ones overwrite its spinner.
    lead = "\r\033[K" if _state["wrote"] else "\n"
    try:
        with open("/dev/tty", "w") as tty:
            # A background job writing to its terminal may be stopped (stty tostop): skip.
            if os.tcgetpgrp(tty.fileno()) != os.getpgrp():
                return
            tty.write(lead + line + "\n")
        _state["wrote"] = True
    except OSError:  # no controlling terminal
        pass


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    to_terminal(line)


def fraction(line: str) -> Optional[float]:
    """How far a ninja or make progress line says the build is (0..1), else None."""
    m = _STEP.match(line)
    if m:
        return int(m.group(1)) / max(int(m.group(2)), 1)
    m = _PERCENT.match(line)
    return int(m.group(1)) / 100 if m else None


def run_with_progress(cmd: List[str], label: str) -> None:
    """Run ``cmd`` with its output passed on (pip -v, logs) and a terminal line every 10%."""
    start, next_mark = time.monotonic(), 10  # percent
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        done = fraction(line)
        percent = -1 if done is None else round(done * 100)
        if percent >= next_mark:
            next_mark = percent // 10 * 10 + 10
            minutes, seconds = divmod(int(time.monotonic() - start), 60)
            to_terminal(f"nattn: {label}: {percent:3d}% ({minutes}m{seconds:02d}s)")
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, cmd)
