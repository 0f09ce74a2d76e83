"""benchmarks/dispatch_check.py's verdict: the rules' pick is flagged only when it measured
slower than the other family by more than the tolerance, and never without both times."""

import importlib.util
import os
import random

import pytest

pytest.importorskip("triton")  # library_ab (its problem parser) times with triton's do_bench

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "dispatch_check.py")
_spec = importlib.util.spec_from_file_location("dispatch_check", _PATH)
dispatch_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dispatch_check)


@pytest.mark.parametrize("seed", range(5))
def test_verdict_flags_only_the_slower_pick(seed):
    rng = random.Random(seed)
    fast, tol = rng.uniform(0.01, 10.0), rng.uniform(0.01, 0.1)
    slow = fast * (1 + tol) * rng.uniform(1.01, 2.0)
    near = fast * (1 + tol * rng.uniform(0.0, 0.99))
    verdict = dispatch_check.verdict
    assert verdict({"sm90": fast, "tc": slow}, True, tol) == "ok"
    assert verdict({"sm90": slow, "tc": fast}, True, tol) == "MISMATCH"
    assert verdict({"sm90": slow, "tc": fast}, False, tol) == "ok"
    assert verdict({"sm90": fast, "tc": slow}, False, tol) == "MISMATCH"
    assert verdict({"sm90": near, "tc": fast}, True, tol) == "ok"  # within the tolerance
    assert verdict({"sm90": None, "tc": fast}, True, tol) == "-"


def test_unknown_flags_name_the_accepted_ones():
    with pytest.raises(SystemExit, match="accepted: bwd, rpb, tol=FRACTION"):
        dispatch_check.main(["dinat-s1-2d", "fast"])


def test_a_rejected_problem_is_said_and_the_rest_still_run(monkeypatch, capsys):
    ran = []

    def fake_check(name, bwd, rpb, tol):
        if name == "bad":
            raise ValueError("kernel_size along axis 0 (X) must be >= 2, got 1")
        ran.append(name)

    monkeypatch.setattr(dispatch_check, "check", fake_check)
    monkeypatch.setattr(dispatch_check.torch.cuda, "get_device_name", lambda *a: "stand-in")
    dispatch_check.main(["one,bad,two", "bwd"])
    assert ran == ["one", "two"]
    out = capsys.readouterr().out
    assert "bad" in out and "rejected: kernel_size along axis 0" in out
