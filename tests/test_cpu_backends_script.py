"""benchmarks/cpu_backends.py runs its three tables (a smoke run on tiny settings): rows
with numbers, the page-fault column, the unfused ops, a model."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import cpu_backends  # noqa: E402


def _table(capsys, *argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cpu_backends.py", *argv])
    cpu_backends.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    return rows[0], rows[1:]


def test_layers_table(capsys, monkeypatch):
    header, rows = _table(capsys, "--only", "nat-mini-7,2d-k7-gqa-rpb", "--reps", "1", monkeypatch=monkeypatch)
    assert "page faults" in header and len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 9 and all(float(c) >= 0 for c in cells[1:5] + cells[6:])


def test_unfused_table(capsys, monkeypatch):
    header, rows = _table(capsys, "--unfused", "--only", "nat-mini-7", "--reps", "1", monkeypatch=monkeypatch)
    assert "gathers" in header and len(rows) == 1
    assert all(float(c) > 0 for c in rows[0].strip("|").split("|")[1:])
    import nattn.qk_av
    assert nattn.qk_av.USE_TILED  # restored


@pytest.mark.parametrize("train", [False, True])
def test_models_table(capsys, monkeypatch, train):
    pytest.importorskip("timm")
    argv = ["--models", "nat_mini", "--batch", "1", "--reps", "1"] + (["--train"] if train else [])
    _, rows = _table(capsys, *argv, monkeypatch=monkeypatch)
    assert len(rows) == 1 and rows[0].startswith("| nat_mini |")


def test_forced_boxes_table(capsys, monkeypatch):
    from nattn.backends import tiled_plan
    model = tiled_plan.box_sizes
    header, rows = _table(capsys, "--only", "nat-mini-7", "--boxes", "7x7,4x4", "--reps", "1",
                          monkeypatch=monkeypatch)
    assert "cost model" in header and len(rows) == 2
    cells = [c.strip() for c in rows[1].strip("|").split("|")]
    assert cells[:4] == ["nat-mini-7", "4x4", "16", "49"] and cells[-1] == "7x7"
    assert tiled_plan.box_sizes is model  # restored
    with pytest.raises(SystemExit, match="axes"):
        _table(capsys, "--only", "nat-mini-7", "--boxes", "4", "--reps", "1", monkeypatch=monkeypatch)
