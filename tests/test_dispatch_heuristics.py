"""Automatic backend order: small windows go to the cuda kernels first, large ones to flex.

The window limit depends on the kernel family libnattn would run: SIMT (float32 without TF32,
against flex's exact fp32 matmuls; 16-bit problems it takes) or tensor cores (fp16/bf16, head
dim <= 128, SM80+)."""

from types import SimpleNamespace

import torch

from nattn.backends import AUTO_ORDER, choose_na_backend
from nattn.backends import heuristics
from nattn.backends.heuristics import SIMT_FP32_MAX_WINDOW, SIMT_MAX_WINDOW, TC_MAX_WINDOW, na_auto_order
from nattn.params import NAParams


def params(kernel):
    n = len(kernel)
    return NAParams(tuple(kernel), (1,) * n, (1,) * n, (False,) * n, 1.0)


CUDA_Q = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32, shape=(1, 8, 8, 2, 64))
ORDER = ["cuda", "flex", "reference"]


def test_small_window_prefers_cuda(monkeypatch):
    monkeypatch.setattr(heuristics, "_tf32_allowed", lambda: False)
    assert na_auto_order(ORDER, CUDA_Q, params((7, 7))) == ORDER
    # float32 without TF32: flex's exact fp32 matmuls lose to SIMT up to SIMT_FP32_MAX_WINDOW
    assert SIMT_MAX_WINDOW < 13 * 13 < 5 * 7 * 7 < 25 * 25 <= SIMT_FP32_MAX_WINDOW < 33 * 33
    for window in ((13, 13), (5, 7, 7), (25, 25)):
        assert na_auto_order(ORDER, CUDA_Q, params(window)) == ORDER, window


def test_large_window_prefers_flex(monkeypatch):
    monkeypatch.setattr(heuristics, "_tf32_allowed", lambda: False)
    assert na_auto_order(ORDER, CUDA_Q, params((33, 33))) == ["flex", "cuda", "reference"]
    assert na_auto_order(ORDER, CUDA_Q, params((80, 80))) == ["flex", "cuda", "reference"]
    assert na_auto_order(ORDER, CUDA_Q, params((2048,))) == ["flex", "cuda", "reference"]


def test_cpu_and_missing_backends_keep_registered_order():
    cpu_q = SimpleNamespace(device=torch.device("cpu"))
    assert na_auto_order(ORDER, cpu_q, params((80, 80))) == ORDER
    assert na_auto_order(["cuda", "reference"], CUDA_Q, params((80, 80))) == ["cuda", "reference"]


def test_cpu_dispatch_picks_tiled():
    q = torch.randn(1, 16, 16, 2, 8)
    assert AUTO_ORDER[-1] == "reference" and AUTO_ORDER.index("tiled") < AUTO_ORDER.index("reference")
    assert choose_na_backend(q, q, q, None, params((13, 13))) == "tiled"


def test_tensor_core_problems_keep_cuda_up_to_their_limit(monkeypatch):
    monkeypatch.setattr(heuristics, "_capability_major", lambda index: 9)
    half_q = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(1, 8, 8, 2, 64))
    assert SIMT_MAX_WINDOW < 13 * 13 <= TC_MAX_WINDOW < 2048
    assert na_auto_order(ORDER, half_q, params((13, 13))) == ORDER
    assert na_auto_order(ORDER, half_q, params((5, 7, 7))) == ORDER  # video-3d: measured faster
    assert na_auto_order(ORDER, half_q, params((7, 9, 9))) == ["flex", "cuda", "reference"]  # even
    assert na_auto_order(ORDER, half_q, params((2048,))) == ["flex", "cuda", "reference"]
    wide_q = SimpleNamespace(device=half_q.device, dtype=torch.bfloat16, shape=(1, 8, 8, 2, 256))
    assert na_auto_order(ORDER, wide_q, params((13, 13))) == ["flex", "cuda", "reference"]
    wide_v = SimpleNamespace(shape=(1, 8, 8, 2, 192))  # D_v > 128: libnattn runs SIMT
    assert na_auto_order(ORDER, half_q, params((13, 13)), wide_v) == ["flex", "cuda", "reference"]
    monkeypatch.setattr(heuristics, "_capability_major", lambda index: 7)  # no mma.sync bf16
    assert na_auto_order(ORDER, half_q, params((13, 13))) == ["flex", "cuda", "reference"]


def test_hopper_problems_go_to_cuda_first(monkeypatch):
    """On a 9.0 GPU whose libnattn has the sm90 family, calls from its minimum window on go
    to cuda ahead of flex; calls that need gradients only where the build has its backward."""
    monkeypatch.setattr(heuristics, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(heuristics, "_capability_major", lambda index: 9)
    minimum = {1: 128, 2: 1000, 3: 4000}
    monkeypatch.setattr(heuristics, "_sm90_min_window", lambda dtype, na, backward=False, head_dim=0: minimum[na])
    q = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(1, 8, 8, 2, 128),
                        requires_grad=False)
    for kernel in ((80, 80), (2048,), (18, 24, 24), (33, 33)):
        assert heuristics.runs_hopper(q, params(kernel))
        assert na_auto_order(ORDER, q, params(kernel)) == ORDER
    assert not heuristics.runs_hopper(q, params((25, 25)))  # below the 2-D minimum
    assert na_auto_order(ORDER, q, params((25, 25))) == ["flex", "cuda", "reference"]
    grad_q = SimpleNamespace(**{**vars(q), "requires_grad": True})
    monkeypatch.setattr(heuristics, "_sm90_has_backward", lambda dtype, na, hd: False)  # an older build
    assert not heuristics.runs_hopper(grad_q, params((80, 80)))
    with torch.no_grad():
        assert heuristics.runs_hopper(grad_q, params((80, 80)))
    monkeypatch.setattr(heuristics, "_sm90_has_backward", lambda dtype, na, hd: (dtype, na, hd) == ("bfloat16", 2, 128))
    assert heuristics.runs_hopper(grad_q, params((80, 80)))
    assert na_auto_order(ORDER, grad_q, params((80, 80))) == ORDER
    assert not heuristics.runs_hopper(grad_q, params((18, 24, 24)))  # no 3-D backward in this "build"
    v48 = SimpleNamespace(shape=(1, 8, 8, 2, 64))
    monkeypatch.setattr(heuristics, "_sm90_instances", lambda dtype, na: ((32, 64, 128, 256), None))
    assert not heuristics.runs_hopper(q, params((80, 80)), v48)  # D_v != D on a build that never pads
    monkeypatch.setattr(heuristics, "_capability", lambda index: (9, 1))
    assert not heuristics.runs_hopper(q, params((80, 80)))
    monkeypatch.setattr(heuristics, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(heuristics, "_sm90_min_window", lambda dtype, na, backward=False, head_dim=0: None)  # not built
    assert not heuristics.runs_hopper(q, params((80, 80)))
    # Forward and backward minimums differ (64-query pairs take 2-D windows from 150 keys
    # in the forward; the backward's pairs only from 1000): a training call follows the latter.
    fwd, bwd = {1: 128, 2: 150, 3: 4000}, {1: 128, 2: 1000, 3: 4000}
    monkeypatch.setattr(heuristics, "_sm90_min_window", lambda dtype, na, backward=False, head_dim=0: (bwd if backward else fwd)[na])
    monkeypatch.setattr(heuristics, "_sm90_has_backward", lambda dtype, na, hd: True)
    assert heuristics.runs_hopper(q, params((25, 25))) and heuristics.runs_hopper(q, params((13, 13)))
    assert not heuristics.runs_hopper(grad_q, params((25, 25)))
    assert na_auto_order(ORDER, grad_q, params((25, 25))) == ["flex", "cuda", "reference"]
    with torch.no_grad():
        assert na_auto_order(ORDER, grad_q, params((25, 25))) == ORDER


def test_head_dims_without_a_hopper_instance_run_it_padded_from_large_windows(monkeypatch):
    """D != D_v, or a head dim between the Hopper instances: libnattn runs them on the
    instance of the next head dim with zero-padded copies from its padded minimum window
    (the copies and padded channels cost too much below it, where tc runs them natively),
    calls above head dim 128 (no tc instance) at any window; training calls need the
    instance's backward."""
    monkeypatch.setattr(heuristics, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(heuristics, "_capability_major", lambda index: 9)
    monkeypatch.setattr(heuristics, "_sm90_min_window", lambda dtype, na, backward=False, head_dim=0: 128)
    monkeypatch.setattr(heuristics, "_sm90_has_backward", lambda dtype, na, hd: hd <= 128)
    monkeypatch.setattr(heuristics, "_sm90_instances", lambda dtype, na: ((32, 64, 128, 256), 401))

    def q_of(dim, grad=False):
        return SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(1, 8, 8, 2, dim),
                               requires_grad=grad)

    v = lambda dim: SimpleNamespace(shape=(1, 8, 8, 2, dim))  # noqa: E731
    padded = heuristics.padded_hopper_head_dim
    assert padded(q_of(64), params((21, 21)), v(128)) == 128  # D != D_v: the larger instance
    assert padded(q_of(96), params((21, 21)), v(96)) == 128  # between instances
    assert padded(q_of(48), params((21, 21)), v(32)) == 64
    assert padded(q_of(64), params((19, 21)), v(128)) is None  # 399 keys: tc runs it natively
    assert padded(q_of(64), params((21, 21)), v(64)) is None  # an instance of its own
    assert padded(q_of(192), params((7, 7)), v(192)) == 256  # above tc's 128: any window
    assert padded(q_of(192), params((21, 21)), v(192), training=True) is None  # this library: no backward at 256
    assert not heuristics.runs_hopper(q_of(192, grad=True), params((21, 21)), v(192))
    monkeypatch.setattr(heuristics, "_sm90_has_backward", lambda dtype, na, hd: True)
    assert padded(q_of(192), params((7, 7)), v(192), training=True) == 256  # with one: any window
    assert heuristics.runs_hopper(q_of(192, grad=True), params((7, 7)), v(192))
    monkeypatch.setattr(heuristics, "_sm90_has_backward", lambda dtype, na, hd: hd <= 128)
    assert padded(q_of(96), params((21, 21)), v(96), training=True) == 128
    assert heuristics.runs_hopper(q_of(96, grad=True), params((21, 21)), v(96))
    assert heuristics.runs_hopper(q_of(64), params((80, 80)), v(128))
    assert na_auto_order(ORDER, q_of(64), params((80, 80)), v(128)) == ORDER  # cuda ahead of flex
    assert na_auto_order(ORDER, q_of(64), params((19, 21)), v(128)) == ORDER  # tc's own window
    assert na_auto_order(ORDER, q_of(64), params((33, 33)), v(256)) == ORDER  # flex's window, padded to 256
    monkeypatch.setattr(heuristics, "_sm90_instances", lambda dtype, na: ((32, 64, 128, 256), 0 if na == 1 else 401))
    assert padded(q_of(64), params((2048,)), v(128)) is None  # 1-D: flex runs D != D_v faster
    assert padded(q_of(192), params((2048,)), v(192)) == 256  # ... but has no head dim above 128 either
    assert padded(q_of(64), params((21, 21)), v(128)) == 128
    fp32 = SimpleNamespace(**{**vars(q_of(96)), "dtype": torch.float32})
    assert padded(fp32, params((21, 21)), v(96)) is None  # the Hopper family is 16-bit
    monkeypatch.setattr(heuristics, "_sm90_instances", lambda dtype, na: ((32, 64, 128, 256), None))
    assert padded(q_of(64), params((80, 80)), v(128)) is None  # an older library: never padded
    assert na_auto_order(ORDER, q_of(64), params((80, 80)), v(128)) == ["flex", "cuda", "reference"]
