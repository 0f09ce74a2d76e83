"""Measured dispatch (opt-in): the fastest backend that accepts a problem wins, measured once
per signature; explicit requests, tracing and disabled tuning keep the usual choice (a compiled
call tunes when its op runs).

No test here depends on real time: the backends advance an injected fake clock
(``autotune._clock``) by a set amount per forward, so every measurement is exact."""

import json
import time

import pytest
import torch

import nattn
from nattn.backends import AUTO_ORDER, BACKENDS, autotune, choose_na_backend
from nattn.backends.reference import ReferenceBackend
from nattn.params import normalize


class FakeClock:
    """Stands in for ``autotune._clock``: time moves only when a ``Timed`` backend runs."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Timed(ReferenceBackend):
    """The reference math behind another name; each forward takes ``delay`` seconds of the fake
    clock (a list: one delay per call, the last one repeated)."""

    def __init__(self, name, clock, delay):
        self.name, self.clock, self.delay, self.calls, self.checks = name, clock, delay, 0, 0

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        self.checks += 1
        return []

    def na_forward(self, q, k, v, rpb, params):
        self.calls += 1
        delays = self.delay if isinstance(self.delay, list) else [self.delay]
        self.clock.now += delays[min(self.calls, len(delays)) - 1]
        return super().na_forward(q, k, v, rpb, params)


def _untimed_order():
    """The registered order without the tiled backend: it runs these CPU problems for real,
    which the fake clock would time as 0 ms (the reference is timed only as a last resort)."""
    return [n for n in AUTO_ORDER if n != "tiled"]


@pytest.fixture
def two_backends(monkeypatch, tmp_path):
    clock = FakeClock()
    monkeypatch.setattr(autotune, "_clock", clock)
    slow, fast = Timed("slow", clock, 0.080), Timed("fast", clock, 0.002)
    monkeypatch.setitem(BACKENDS, "slow", slow)
    monkeypatch.setitem(BACKENDS, "fast", fast)
    # the slow one first in the automatic order: only a measurement picks the fast one
    monkeypatch.setattr("nattn.backends.AUTO_ORDER", ["slow", "fast"] + _untimed_order())
    monkeypatch.setitem(autotune._state, "errors", {})
    autotune.enable(True, cache_path=str(tmp_path / "tune.json"))
    yield slow, fast
    autotune.enable(False, cache_path="")
    autotune._state["path"] = None
    autotune._state["results"] = None


def problem(size=12, kernel=5):
    q, k, v = (torch.randn(1, size, size, 2, 8) for _ in range(3))
    return q, k, v, normalize(q, k, v, 2, kernel)


def test_fastest_wins_and_is_measured_once(two_backends):
    slow, fast = two_backends
    q, k, v, p = problem()
    assert choose_na_backend(q, k, v, None, p) == "fast"
    calls = (slow.calls, fast.calls)
    assert calls == (1 + autotune.REPEATS, 1 + autotune.REPEATS)  # warm-up + repeats each
    slow.checks = fast.checks = 0
    assert choose_na_backend(q, k, v, None, p) == "fast"
    assert (slow.calls, fast.calls) == calls  # cached
    assert (slow.checks, fast.checks) == (0, 1)  # a hit checks only the winner
    (entry,) = autotune.results().values()
    assert entry["backend"] == "fast" and entry["ms"] == pytest.approx({"slow": 80.0, "fast": 2.0})
    q2, k2, v2, p2 = problem(size=14)  # another signature is measured again
    assert choose_na_backend(q2, k2, v2, None, p2) == "fast" and slow.calls > calls[0]


def test_results_persist_in_the_cache_file(two_backends, tmp_path):
    slow, _ = two_backends
    q, k, v, p = problem()
    choose_na_backend(q, k, v, None, p)
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert [e["backend"] for e in saved.values()] == ["fast"]
    assert [e["ms"] for e in saved.values()] == [pytest.approx({"slow": 80.0, "fast": 2.0})]
    autotune.enable(True, cache_path=str(tmp_path / "tune.json"))  # a new process would load it
    before = slow.calls
    assert choose_na_backend(q, k, v, None, p) == "fast" and slow.calls == before


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_rewritten(two_backends, tmp_path, content):
    path = tmp_path / "tune.json"
    path.write_text(content)
    autotune.enable(True, cache_path=str(path))
    q, k, v, p = problem()
    with pytest.warns(RuntimeWarning, match="unreadable cache file"):
        assert choose_na_backend(q, k, v, None, p) == "fast"
    saved = json.loads(path.read_text())
    assert [e["backend"] for e in saved.values()] == ["fast"]


def test_saving_keeps_what_other_processes_wrote(two_backends, tmp_path):
    """Entries another process wrote after this one loaded the file survive this one's save;
    this process's own entries win on the same signature."""
    path = tmp_path / "tune.json"
    q, k, v, p = problem()
    autotune.results()  # loaded (empty) before the other process writes
    other = {"another-signature": {"backend": "slow", "ms": {"slow": 1.0}}}
    path.write_text(json.dumps(other))
    choose_na_backend(q, k, v, None, p)
    saved = json.loads(path.read_text())
    assert saved["another-signature"] == other["another-signature"]
    assert sorted(e["backend"] for e in saved.values()) == ["fast", "slow"]


def _save_entries(path, worker, count, barrier):
    """One tuning process: ``count`` saves, each adding one signature of its own."""
    autotune._state["path"], autotune._state["results"] = path, {}
    barrier.wait()
    for i in range(count):
        autotune._state["results"][f"w{worker}-{i}"] = {"backend": "fast", "ms": {"fast": float(i)}}
        autotune._save()


def test_concurrent_processes_lose_no_entries(tmp_path):
    """Several processes saving at once: the file stays valid JSON and holds every entry."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    ctx = multiprocessing.get_context("fork")
    path, workers, count = str(tmp_path / "tune.json"), 3, 25
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_save_entries, args=(path, w, count, barrier)) for w in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    saved = json.loads(open(path).read())
    assert set(saved) == {f"w{w}-{i}" for w in range(workers) for i in range(count)}


def test_the_warm_up_is_not_timed_and_the_best_repeat_counts(two_backends):
    """A huge first call (compilation) is not timed, and the minimum over the repeats counts:
    slow's mean (or a timed first call) would lose to fast, its best repeat wins."""
    slow, fast = two_backends
    slow.delay = [5.0] + [0.003] * (autotune.REPEATS - 1) + [0.001]
    fast.delay = [0.0] + [0.002] * autotune.REPEATS
    q, k, v, p = problem()
    assert choose_na_backend(q, k, v, None, p) == "slow"
    (entry,) = autotune.results().values()
    assert entry["ms"] == pytest.approx({"slow": 1.0, "fast": 2.0})


def test_the_real_clock_is_monotonic():
    assert autotune._clock is time.perf_counter


def test_explicit_backend_and_disabled_tuning_are_not_measured(two_backends):
    slow, fast = two_backends
    q, k, v, p = problem()
    assert choose_na_backend(q, k, v, None, p, "slow") == "slow"
    autotune.enable(False)
    assert choose_na_backend(q, k, v, None, p) == "slow"  # the usual order
    assert slow.calls == 0 and fast.calls == 0


def test_not_tuned_while_compiling(two_backends, monkeypatch):
    slow, fast = two_backends
    q, k, v, p = problem()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert choose_na_backend(q, k, v, None, p) == "slow" and slow.calls == fast.calls == 0


def test_a_failing_backend_is_skipped_and_reported(two_backends, monkeypatch):
    slow, fast = two_backends

    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(fast, "na_forward", broken)
    q, k, v, p = problem()
    assert choose_na_backend(q, k, v, None, p) == "slow"
    assert any("boom" in why for why in autotune.errors().values())


def test_results_match_the_reference_through_the_public_api(two_backends):
    q, k, v, _ = problem()
    out = nattn.na2d(q, k, v, 5)
    torch.testing.assert_close(out, nattn.na2d(q, k, v, 5, backend="reference"))


# ------------------------------------------------------------ kernel configurations
class Configurable(Timed):
    """A backend with kernel configurations: ``name:<cfg>`` runs a Timed view whose delay (and
    whether its output is right) the test sets per configuration; the backward's configurations
    ("dq=pass", "dq=atomic") get their own delays."""

    def __init__(self, name, clock, delay, configs, backward=None):
        super().__init__(name, clock, delay)
        self.configs = configs  # text -> (delay, wrong output?)
        self.backward = backward or {}  # "dq=..." -> delay
        self.views = {}

    def configurations(self, q, k, v, rpb, params):
        return [t for t in self.configs if "dq=" not in t]

    def backward_configurations(self, q, k, v, rpb, params):
        return list(self.backward)

    def configured(self, text):
        if text not in self.views:
            from nattn.backends import kernel_config
            cfg = kernel_config.parse(text)
            tile = kernel_config.KernelConfig(cfg.tile).text
            delay, wrong = self.configs.get(tile, (self.delay, False))
            view = Timed(f"{self.name}:{text}", self.clock, delay)
            if wrong:
                view.na_forward = lambda q, k, v, rpb, params: tuple(
                    t + 1 for t in ReferenceBackend.na_forward(view, q, k, v, rpb, params))
            bwd = self.backward.get(next((p for p in text.split("+") if p.startswith("dq=")), ""), 0.0)
            clock = self.clock

            def backward(*args, bwd=bwd):
                clock.now += bwd
                return ReferenceBackend.na_backward(view, *args)
            view.na_backward = backward
            self.views[text] = view
        return self.views[text]


@pytest.fixture
def configurable(monkeypatch, tmp_path):
    clock = FakeClock()
    monkeypatch.setattr(autotune, "_clock", clock)
    b = Configurable("tiles", clock, 0.010, {"q8x8_k7x16": (0.004, False), "q8x16_k8x16": (0.001, True),
                                             "q8x16_k4x16": (0.006, False)})
    monkeypatch.setitem(BACKENDS, "tiles", b)
    monkeypatch.setattr("nattn.backends.AUTO_ORDER", ["tiles"] + _untimed_order())
    monkeypatch.setitem(autotune._state, "errors", {})
    autotune.enable(False, cache_path=str(tmp_path / "tune.json"))
    yield b
    autotune._state["path"] = None
    autotune._state["results"] = None


def test_configurations_are_timed_and_a_wrong_one_is_never_chosen(configurable):
    q, k, v, p = problem()
    # the fastest configuration (q8x16_k8x16) computes the wrong thing: the next one wins
    assert choose_na_backend(q, k, v, None, p, tune=True) == "tiles:q8x8_k7x16"
    (entry,) = autotune.results().values()
    assert entry["ms"]["tiles"] == pytest.approx(10.0) and entry["ms"]["tiles:q8x8_k7x16"] == pytest.approx(4.0)
    assert entry["ms"]["tiles:q8x16_k8x16"] is None
    assert any("disagrees with tiles's" in why for why in autotune.errors().values())
    # a hit runs the configured name straight away, through the public API too
    calls = configurable.views["q8x8_k7x16"].calls
    out = nattn.na2d(q, k, v, 5, tune=True)
    torch.testing.assert_close(out, nattn.na2d(q, k, v, 5, backend="reference"))
    assert configurable.views["q8x8_k7x16"].calls == calls + 1


def test_tuning_is_per_call_per_block_or_global(configurable):
    q, k, v, p = problem()
    assert choose_na_backend(q, k, v, None, p) == "tiles"  # off: the default configuration
    with nattn.autotune():
        assert choose_na_backend(q, k, v, None, p) == "tiles:q8x8_k7x16"
        assert choose_na_backend(q, k, v, None, p, tune=False) == "tiles"  # the call's own word wins
    assert choose_na_backend(q, k, v, None, p) == "tiles"
    autotune.enable(True)
    try:
        assert choose_na_backend(q, k, v, None, p) == "tiles:q8x8_k7x16"
        with nattn.autotune(False):
            assert choose_na_backend(q, k, v, None, p) == "tiles"
    finally:
        autotune.enable(False)


def test_the_backward_configuration_is_timed_when_the_call_needs_gradients(configurable):
    configurable.backward = {"dq=pass": 0.009, "dq=atomic": 0.003}
    q, k, v, p = problem()
    q.requires_grad_(True)
    assert choose_na_backend(q, k, v, None, p, tune=True) == "tiles:q8x8_k7x16+dq=atomic"
    (entry,) = autotune.results().values()
    assert entry["backward_ms"] == pytest.approx({"tiles:q8x8_k7x16+dq=pass": 9.0, "tiles:q8x8_k7x16+dq=atomic": 3.0})
    out = nattn.na2d(q, k, v, 5, tune=True)  # forward and backward through the configured name
    out.sum().backward()
    ref_q = q.detach().clone().requires_grad_(True)
    nattn.na2d(ref_q, k, v, 5, backend="reference").sum().backward()
    torch.testing.assert_close(q.grad, ref_q.grad)


def test_a_tuned_name_is_one_that_can_be_named_explicitly(configurable):
    q, k, v, p = problem()
    assert choose_na_backend(q, k, v, None, p, "tiles:q8x16_k4x16") == "tiles:q8x16_k4x16"
    with pytest.raises(ValueError, match="accepted, joined by"):
        choose_na_backend(q, k, v, None, p, "tiles:q8x16")
    with pytest.raises(ValueError, match="takes no kernel configuration"):
        choose_na_backend(q, k, v, None, p, "reference:q8x16_k8x16")


def test_a_deterministic_call_keeps_the_default_backward(configurable):
    """deterministic=True (or torch.use_deterministic_algorithms) never times nor picks the
    backward's other configurations; the call's own word wins over torch's switch."""
    configurable.backward = {"dq=pass": 0.009, "dq=atomic": 0.003}
    q, k, v, p = problem()
    q.requires_grad_(True)
    assert choose_na_backend(q, k, v, None, p, tune=True, deterministic=True) == "tiles:q8x8_k7x16"
    torch.use_deterministic_algorithms(True)
    try:
        assert choose_na_backend(q, k, v, None, p, tune=True) == "tiles:q8x8_k7x16"
        assert choose_na_backend(q, k, v, None, p, tune=True, deterministic=False) == "tiles:q8x8_k7x16+dq=atomic"
    finally:
        torch.use_deterministic_algorithms(False)
    # two signatures (deterministic, not): only the second timed the backward
    timed_backward = [e for e in autotune.results().values() if "backward_ms" in e]
    assert len(autotune.results()) == 2 and len(timed_backward) == 1


def test_a_compiled_call_tunes_when_its_op_runs(configurable):
    """Under torch.compile the op chooses on its real tensors when it runs (outside the
    traced graph), so tune=True measures there and the compiled call runs the winner."""
    q, k, v, _ = problem()
    compiled = torch.compile(lambda q, k, v: nattn.na2d(q, k, v, 5, tune=True), fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v)
    (entry,) = autotune.results().values()
    assert entry["backend"] == "tiles:q8x8_k7x16"
    calls = configurable.views["q8x8_k7x16"].calls
    torch.testing.assert_close(compiled(q, k, v), out)
    assert configurable.views["q8x8_k7x16"].calls == calls + 1  # the measured winner runs
    torch.testing.assert_close(out, nattn.na2d(q, k, v, 5, backend="reference"))
