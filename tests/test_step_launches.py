"""benchmarks/step_launches.py on the CPU (its smoke mode): a model's step is profiled and its
counts printed, with the autograd nodes and top-level ops a real step has."""

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
                                      "--size", "32", "--iters", "1"])
    script.main()
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("nat_mini:")]
    assert len(line) == 1, line
    m = re.search(r"wall ([\d.]+) ms a step, (\d+) GPU kernels, (\d+) autograd nodes, (\d+) top-level aten ops",
                  line[0])
    assert m, line[0]
    wall, kernels, nodes, ops = float(m[1]), int(m[2]), int(m[3]), int(m[4])
    # nat_mini has 3 + 4 + 6 + 5 blocks: each adds ~10 nodes (two norms, four Linears, NA, ...)
    assert wall > 0 and kernels == 0 and nodes > 10 * 10 and ops > nodes
