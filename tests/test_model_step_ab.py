"""benchmarks/model_step_ab.py on the CPU (its smoke mode): every switch runs both sides and
prints a row for each, and the packed switch leaves nattn's function restored."""

import importlib.util
import os
import sys

import pytest

pytest.importorskip("timm")

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "model_step_ab.py")


def _load():
    spec = importlib.util.spec_from_file_location("model_step_ab", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("switch", ["threads", "packed", "fast-norm", "block-norm", "group-casts", "drop-draw",
                                    "packed-calls"])
def test_each_switch_times_both_sides(switch, monkeypatch, capsys):
    import nattn.nn.neighborhood_attention as na_module

    before = na_module.na_packed_qkv
    script = _load()
    monkeypatch.setattr(sys, "argv", ["model_step_ab.py", "--switch", switch, "--device", "cpu", "--model",
                                      "nat_mini", "-b", "1", "--size", "32", "--iters", "1", "--rounds", "1"])
    script.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("round 1")]
    assert [f"{switch}=on" in rows[0], f"{switch}=off" in rows[1]] == [True, True] and len(rows) == 2
    assert all("ms a step" in r and "GPU time -" in r for r in rows)
    assert na_module.na_packed_qkv is before
