"""The GPU's SM clock, power draw and temperature at one moment (from ``nvidia-smi``), so a
benchmark says whether it ran throttled: back to back, large attention problems hold an H200
at its power limit, where the SM clock settles well below its maximum, and the same kernel
then takes longer than it does on a cool GPU."""

from __future__ import annotations

import shutil
import subprocess
from typing import Optional

import torch

_QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
_KEYS = ("sm_mhz", "max_sm_mhz", "power_w", "power_limit_w", "temperature_c")


def _device_id(device: torch.device) -> str:
    """nvidia-smi's name for a CUDA device: its UUID (indices differ under CUDA_VISIBLE_DEVICES)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else str(index)


def parse(line: str) -> Optional[dict]:
    """One CSV line of the query (no header, no units) -> the named values, or None."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(_KEYS):
        return None
    try:
        return {k: float(v) for k, v in zip(_KEYS, parts)}
    except ValueError:  # "[N/A]" and the like
        return None


def read(device: torch.device, timeout: float = 5.0) -> Optional[dict]:
    """The device's state now, or None where nvidia-smi is missing or says nothing usable."""
    exe = shutil.which("nvidia-smi")
    if exe is None or device.type != "cuda":
        return None
    try:
        done = subprocess.run([exe, f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits", "-i", _device_id(device)],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return parse(lines[0]) if done.returncode == 0 and lines else None


def describe(state: dict) -> str:
    return (f"SM clock {state['sm_mhz']:.0f} of {state['max_sm_mhz']:.0f} MHz, "
            f"{state['power_w']:.0f} of {state['power_limit_w']:.0f} W, {state['temperature_c']:.0f} C")
