"""The benchmark CLI: argument parsing, problems and floors, and a CPU run end to end."""

import csv
import json
import os

import pytest
import torch

from nattn.bench import ANCHORS, SMOKE
from nattn.bench.__main__ import main
from nattn.bench.cli import parse
from nattn.bench.floors import Rates, floors
from nattn.bench.problems import cpu_copy, shrink
from nattn.bench.report import markdown_summary
from nattn.bench.timing import median_ms


@pytest.fixture
def quick_timing(monkeypatch):
    """The CLI's timings at their minimum (2 warm-up calls, 3 timed ones) instead of ~300 ms of
    work each: these tests check what a run reports, not how precise its times are."""

    def quick(fn, input_sets, device, **kwargs):
        return median_ms(fn, input_sets, device, **{**kwargs, "warmup_ms": 0.0, "target_ms": 0.0})

    monkeypatch.setattr("nattn.bench.run.median_ms", quick)
    monkeypatch.setattr("nattn.bench.floors.median_ms", quick)


def test_custom_problem_from_flags():
    args, (p,) = parse(["-i", "16", "20", "-b", "2", "-n", "4", "--heads-kv", "2", "-d", "32", "--dim-v", "16",
                        "-w", "5", "7", "-s", "2", "--dilation", "1", "2", "--causal", "1", "0",
                        "--add-kv", "3", "--backprop", "--backend", "reference", "--dtype", "fp32"])
    assert p.spatial == (16, 20) and p.kernel == (5, 7) and p.stride == (2, 2) and p.dilation == (1, 2)
    assert p.causal == (True, False) and (p.heads, p.heads_kv, p.dim, p.dim_v, p.extra) == (4, 2, 32, 16, 3)
    assert args.backprop and args.backend == ["reference"]
    _, (q,) = parse(["-i", "30", "-w", "5", "--causal"])
    assert q.causal == (True,) and q.heads_kv == q.heads and q.dim_v == q.dim


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to run"),
    (["-i", "1", "2", "3", "4", "-w", "3"], "1 to 3 ints"),
    (["-i", "16", "16"], "--window is required"),
    (["-i", "16", "16", "-w", "3", "4", "5"], "--window takes 1 or 2"),
    (["-i", "16", "-w", "9", "--dilation", "2"], "window * dilation <= size"),
    (["-i", "16", "-w", "4", "-s", "5"], "stride <= window"),
    (["-i", "16", "-w", "4", "--rpb"], "--rpb needs odd"),
    (["-i", "16", "-w", "3", "-n", "4", "--heads-kv", "3"], "divisible"),
    (["-i", "16", "-w", "3", "--backend", "nope"], "not registered"),
    (["--suite", "smoke", "-i", "16", "-w", "3"], "not both"),
    (["--suite", "bogus"], "invalid choice"),
    (["--suite", "anchors", "--only", "nope"], "not in suite"),
    (["--only", "smoke-1d"], "--only selects"),
    (["-i", "16", "-w", "3", "--dropout", "1.0"], "--dropout must be in [0, 1)"),
])
def test_bad_flags_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_only_selects_suite_problems():
    _, problems = parse(["--suite", "anchors", "--only", "video-3d,dinat-s1-2d"])
    assert [p.name for p in problems] == ["dinat-s1-2d", "video-3d"]


def test_anchors_are_the_canonical_problems():
    names = [p.name for p in ANCHORS]
    assert names == ["dinat-s1-2d", "dinat-s2-dil4", "mid-2d-k13", "video-3d", "1d-32k-w2048",
                     "flux-2d-w80", "hunyuan-3d", "flux-2d-w80-s16", "hunyuan-3d-s16"]
    gna = {p.name: p.stride for p in ANCHORS if any(s > 1 for s in p.stride)}
    assert gna == {"flux-2d-w80-s16": (16, 16), "hunyuan-3d-s16": (16, 8, 8)}
    flux = ANCHORS[5]
    assert flux.spatial == (256, 256) and flux.kernel == (80, 80) and flux.heads == 24 and flux.dim == 128
    # docs/semantics.md's count: 4 * B * H * N * W * D when D_v == D.
    assert flux.na_flops() == 4 * 1 * 24 * 256 * 256 * 6400 * 128


def test_smaller_copies_keep_features_and_fit():
    for p in ANCHORS + SMOKE:
        s = shrink(p, 4096)
        assert all(n >= k * d for n, k, d in zip(s.spatial, s.kernel, s.dilation))
        assert s.kernel == p.kernel and s.dilation == p.dilation and s.dim == p.dim
        assert s.heads % s.heads_kv == 0
        assert s.tokens <= 4096 or any(n == k * d for n, k, d in zip(s.spatial, s.kernel, s.dilation))
        c = cpu_copy(p)
        assert max(c.kernel) <= 5 and c.batch == 1 and c.heads <= 2
        assert c.tokens <= 512 or any(n == k * d for n, k, d in zip(c.spatial, c.kernel, c.dilation))


def test_floors_follow_anchors_definition():
    """FLOP floor = dense time x W / N; memory floor = (q, k, v, out) bytes / copy rate."""
    p = ANCHORS[0]
    rates = Rates(copy_bytes_per_s=4.3e12, dense_flops_per_s=600e12, device="test")
    f = floors(p, rates, 2, dense_ms=0.809, backward=False)
    assert f.flop_ms == pytest.approx(0.809 * 49 / 3136)
    assert f.memory_ms == pytest.approx(4 * 32 * 3136 * 4 * 32 * 2 / 4.3e12 * 1e3)
    assert f.ms == max(f.flop_ms, f.memory_ms)
    f_nodense = floors(p, rates, 2, dense_ms=None, backward=False)
    assert f_nodense.flop_ms == pytest.approx(p.na_flops() / 600e12 * 1e3)


def test_cpu_smoke_run_end_to_end(tmp_path, capsys, quick_timing):
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    code = main(["--suite", "smoke", "--backprop", "--no-progress", "--markdown", "--device", "cpu",
                 "--json", str(js), "--csv", str(cs), "--plot", str(tmp_path / "r.png")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "CPU run" in out and "MISMATCH" not in out
    run = json.loads(js.read_text())
    assert [r["name"] for r in run["results"]] == [p.name for p in SMOKE]
    for res in run["results"]:
        rows = {r["name"]: r for r in res["rows"]}
        auto = rows["nattn:auto"]
        assert auto["backend"] == "tiled" and auto["check"]["ok"] is True
        assert auto["fwd_ms"] > 0 and auto["fwd_bwd_ms"] > 0
        assert rows["dense sdpa"]["fwd_ms"] > 0
        flex = rows["flex (row-major)"]
        assert flex["check"]["ok"] is True and flex["fwd_ms"] > 0 and "fwd_bwd_ms" not in flex
        assert res["floors"]["fwd"]["floor_ms"] > 0
    lines = list(csv.DictReader(cs.open()))
    assert len(lines) == 3 * len(SMOKE)
    assert "| smoke-1d |" in out


def test_heads_first_layout_passes_heads_first_views(tmp_path, capsys, quick_timing, monkeypatch):
    """--layout heads-first: nattn's rows get [B, H, *spatial, D] storage viewed heads-last
    (what the kernels see), checked against the reference like any row."""
    from nattn.bench import rows as rows_mod

    seen = []
    real = rows_mod.NattnRow.forward

    def spy(self, q, k, v, *rest):
        seen.append((q.stride(), q.shape, q.is_leaf))
        return real(self, q, k, v, *rest)

    monkeypatch.setattr(rows_mod.NattnRow, "forward", spy)
    js = tmp_path / "r.json"
    argv = ["-i", "6", "10", "-w", "3", "-n", "3", "-d", "8", "--no-peers", "--no-progress", "--device", "cpu",
            "--backprop", "--layout", "heads-first", "--json", str(js)]
    assert main(argv) == 0, capsys.readouterr().out
    row = json.loads(js.read_text())["results"][0]["rows"][0]
    assert row["name"] == "nattn:auto (heads-first)" and row["check"]["ok"] is True and row["fwd_bwd_ms"] > 0
    stride, shape, leaf = seen[-1]
    assert shape[1:] == (6, 10, 3, 8) and stride[1:] == (80, 8, 480, 1) and leaf  # heads-first storage
    with pytest.raises(SystemExit):
        parse(["--suite", "smoke", "--layout", "heads-middle"])


def test_mismatch_is_reported_in_red(monkeypatch, capsys, quick_timing):
    """A wrong backend is never hidden: its check fails, the run says MISMATCH and exits 1."""
    from nattn.bench import rows as rows_mod

    real = rows_mod.NattnRow.forward
    monkeypatch.setattr(rows_mod.NattnRow, "forward", lambda self, *a: real(self, *a) * 1.5)
    monkeypatch.setenv("FORCE_COLOR", "1")
    code = main(["-i", "12", "-w", "3", "-n", "1", "-d", "8", "--no-peers", "--no-progress", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1
    assert "\033[31mMISMATCH" in out


def test_dropout_rows_share_the_reference_draw(monkeypatch, capsys, quick_timing):
    """--dropout applies to every problem; an NA row is checked with the reference's random
    draw (a row drawing another mask fails its check), flex says why it cannot run."""
    from nattn.bench import verify

    _, problems = parse(["--suite", "smoke", "--dropout", "0.25"])
    assert problems and all(p.dropout == 0.25 and "drop0.25" in p.describe() for p in problems)
    argv = ["-i", "12", "-w", "3", "-n", "2", "-d", "8", "--dropout", "0.5", "--backprop", "--no-progress",
            "--device", "cpu", "--markdown"]
    assert main(argv) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "MISMATCH" not in out and "flex_attention has no attention dropout" in out
    real, seed = verify.reference_output, verify.DROPOUT_SEED

    def other_draw(p, t):  # the reference with another mask: the row no longer matches it
        verify.DROPOUT_SEED = seed + 1
        try:
            return real(p, t)
        finally:
            verify.DROPOUT_SEED = seed

    monkeypatch.setattr(verify, "reference_output", other_draw)
    assert main(argv) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_markdown_summary_marks_skipped_and_mismatch():
    res = [{"name": "a", "skipped": "time budget of 1 s spent"},
           {"name": "b", "rows": [{"name": "nattn:auto", "fwd_ms": 1.0, "check": {"ok": False}}],
            "floors": {"fwd": {"flop_ms": 0.1, "memory_ms": 0.2, "floor_ms": 0.2}}}]
    text = markdown_summary(res, backprop=False)
    assert "skipped" in text and "1.000 (MISMATCH)" in text


def test_models_suite_runs_timm_models_side_by_side(capsys):
    """--suite models on the CPU: a tiny nattn model beside a timm peer, one row per mode."""
    assert main(["--suite", "models", "--models", "nat_mini,resnet18,nat_video_tiny", "--size", "64", "-b", "1",
                 "--frames", "2", "--iters", "1", "--modes", "eager", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "| model | mode | train img/s | inference img/s | at GPU time: train / inference |" in out
    rows = [line for line in out.splitlines() if line.startswith(("| nat_mini", "| resnet18", "| nat_video_tiny"))]
    assert len(rows) == 3 and all("| eager |" in r and "failed" not in r for r in rows)
    for r in rows:
        train, infer = (float(x) for x in r.strip("|").split("|")[2:4])
        assert train > 0 and infer > 0
        assert r.strip("|").split("|")[4].strip() == "-"  # no GPU time on the CPU


@pytest.mark.parametrize("argv,message", [
    (["--suite", "models", "--modes", "jit"], "--modes takes eager, compiled"),
    (["--suite", "models", "--size", "8"], "--size must be >= 32"),
])
def test_models_suite_flags_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(argv)
    assert message in capsys.readouterr().err


def test_model_step_time_is_the_median_window(monkeypatch):
    """step_ms: three warm-up calls, then `repeats` windows of `iters` calls; the result is the
    median window's mean (a fake clock: each call advances it by the current window's cost)."""
    from nattn.bench import models

    clock = [0.0]
    costs = iter([0.001] * 3 + [0.010] * 4 + [0.050] * 4 + [0.020] * 4)  # warm-up, then 3 windows
    calls = []

    def fn():
        calls.append(1)
        clock[0] += next(costs)

    monkeypatch.setattr(models.time, "perf_counter", lambda: clock[0])
    ms = models.step_ms(fn, torch.device("cpu"), iters=4, repeats=3)
    assert len(calls) == 3 + 3 * 4
    assert ms == pytest.approx(20.0)


def test_host_overhead_baseline_runs_on_the_cpu():
    """benchmarks/host_overhead.py --null --baseline: nattn's Python with a do-nothing backend
    and torch's SDPA on the same tensors, each a forward and a forward + backward per call (the
    numbers are the host's; only that both are measured is checked)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "host_overhead.py"), "--null", "--baseline"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if "forward+backward" in line]
    assert len(lines) == 2 and lines[0].startswith("backend null:") and lines[1].startswith("torch sdpa (baseline):")


def _host_overhead_module():
    """benchmarks/host_overhead.py, imported (benchmarks/ is not a package)."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("host_overhead", os.path.join(root, "benchmarks", "host_overhead.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_host_overhead_null_library_runs_the_backend_call_path():
    """benchmarks/host_overhead.py --null-library: the cuda backend's na_forward / na_backward
    against a stand-in libnattn compiled with cc (what a call costs in Python up to the C
    entry point); the backend's stream getter is restored afterwards."""
    from nattn.backends import BACKENDS
    from nattn.backends import cuda as cuda_backend
    mod = _host_overhead_module()
    getter = cuda_backend._raw_stream
    fwd, bwd = mod.null_library_times(n=20)
    assert 0 < fwd < 1e5 and 0 < bwd < 1e5
    assert cuda_backend._raw_stream is getter
    times = mod.null_library_times(n=20, packed=True)  # and the packed ops through the dispatcher
    assert len(times) == 4 and all(0 < t < 1e5 for t in times)
    assert cuda_backend._raw_stream is getter and "_lib" not in vars(BACKENDS["cuda"])


def test_host_overhead_torch_profile_counts_a_call(capsys):
    """benchmarks/host_overhead.py --torch-profile's table: per NA call, the autograd Function
    and its backward node once each (with a do-nothing backend on the CPU; on the GPU the
    same table holds libnattn's launches and memsets)."""
    import torch
    import nattn
    mod = _host_overhead_module()
    from backend_registry import temporarily_registered
    with temporarily_registered(mod.null_backend()) as null:
        q, k, v = (torch.randn(1, 6, 6, 2, 8, requires_grad=True) for _ in range(3))

        def step():  # two calls feeding each other, one backward
            nattn.na2d(nattn.na2d(q, k, v, 3, backend=null), k, v, 3, backend=null).sum().backward()

        mod.print_runtime_calls(step, calls=2, steps=3)
    rows = {line[:48].strip(): line[48:].split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert float(rows["NAFunctionFast"][0]) == 1.0
    assert float(rows["NAFunctionFastBackward"][0]) == 1.0
    assert float(rows["NAFunctionFast"][1]) > 0


def test_host_overhead_backend_calls_and_autograd_control(capsys):
    """--backend-calls times a backend's own forward and backward (here the do-nothing one,
    registered for this test only); --autograd-control prints a Python node's and an aten
    node's cost for both threads autograd can run a backward on."""
    import torch
    from backend_registry import temporarily_registered
    mod = _host_overhead_module()
    q, k, v = (torch.randn(1, 6, 6, 2, 8) for _ in range(3))
    with temporarily_registered(mod.null_backend()) as null:
        fwd, bwd = mod.backend_call_times(null, q, k, v)
    assert 0 < fwd < 1e5 and 0 < bwd < 1e5
    mod.autograd_control("cpu", n=2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "device thread" in lines[0] and "calling thread" in lines[1]
    assert all("Python Function node" in line and "aten node" in line for line in lines)


def test_models_suite_fast_norm_builds_under_timms_switch(capsys, monkeypatch):
    """--fast-norm: models are created with timm's fast-norm switch on (nattn's norms then
    run at the autocast dtype), the switch is off again afterwards, and the title says so."""
    from timm.layers import is_fast_norm
    import timm

    seen = []
    real = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: seen.append(is_fast_norm()) or real(*a, **k))
    assert main(["--suite", "models", "--models", "nat_mini", "--size", "32", "-b", "1", "--iters", "1",
                 "--modes", "eager", "--device", "cpu", "--fast-norm"]) == 0
    out = capsys.readouterr().out
    assert seen == [True] and not is_fast_norm()
    assert "timm fast norm" in out and "| nat_mini | eager |" in out


def test_family_ms_forces_the_family_for_the_call_only(monkeypatch):
    """``family_ms`` sets NATTN_FAMILY while the call runs (None: unset) and unsets it after;
    a family that declines the problem (the call raises) times as None."""
    from nattn.bench.timing import family_ms
    monkeypatch.setenv("NATTN_FAMILY", "simt")
    seen = []

    def declined():
        seen.append(os.environ.get("NATTN_FAMILY"))
        raise RuntimeError("the family declines")

    assert family_ms("sm90", declined) is None and seen == ["sm90"]
    assert "NATTN_FAMILY" not in os.environ
    monkeypatch.setenv("NATTN_FAMILY", "tc")
    assert family_ms(None, declined) is None and seen == ["sm90", "tc"]
    assert "NATTN_FAMILY" not in os.environ
