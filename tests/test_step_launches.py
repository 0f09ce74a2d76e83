"""benchmarks/step_launches.py on the CPU (its smoke mode): a model's step is profiled and its
counts printed, with the autograd nodes and top-level ops a real step has, and ``--host``'s
line (the launch-only host time and the calling thread's wall time)."""

import importlib.util
import os
import re
import sys

import pytest

pytest.importorskip("timm")

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "step_launches.py")


def test_smoke_run_counts_a_real_step(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("step_launches", _PATH)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", ["step_launches.py", "--models", "nat_mini", "--device", "cpu", "-b", "1",
                                      "--size", "32", "--iters", "1", "--host"])
    script.main()
    out = capsys.readouterr().out.splitlines()
    line = [x for x in out if x.startswith("nat_mini:")]
    assert len(line) == 1, line
    m = re.search(r"wall ([\d.]+) ms a step, (\d+) GPU kernels, (\d+) autograd nodes, (\d+) top-level aten ops",
                  line[0])
    assert m, line[0]
    wall, kernels, nodes, ops = float(m[1]), int(m[2]), int(m[3]), int(m[4])
    # nat_mini has 3 + 4 + 6 + 5 blocks: each adds ~10 nodes (two norms, four Linears, NA, ...)
    assert wall > 0 and kernels == 0 and nodes > 10 * 10 and ops > nodes
    # --host: the host's time a step when only launching, and the calling thread's wall time
    host = [x for x in out if "launched without waiting" in x]
    assert len(host) == 1, out
    m = re.search(r"host ([\d.]+) ms a step .*calling thread: wall ([\d.]+) ms", host[0])
    assert m and float(m[1]) > 0 and float(m[2]) > 0, host[0]
