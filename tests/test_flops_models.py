"""Whole-model FLOPs: fvcore reproduces the published GFLOPs of NAT/DiNAT at 224x224
(within 3%), and torch's FlopCounterMode agrees with fvcore on the same model."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import nattn
from nattn.backends import BACKENDS, register_backend
from nattn.backends.base import Backend
from nattn.flops import add_nattn_handles

timm = pytest.importorskip("timm")
fvcore = pytest.importorskip("fvcore.nn")

# Published GFLOPs (fvcore MACs) at 224x224: NAT (arXiv:2204.07143), DiNAT, DiNAT_s and
# isotropic (arXiv:2209.15001).
PUBLISHED_GFLOPS = {
    "nat_mini": 2.7, "nat_tiny": 4.3, "nat_small": 7.8, "nat_base": 13.7,
    "dinat_mini": 2.7, "dinat_tiny": 4.3, "dinat_small": 7.8, "dinat_base": 13.7, "dinat_large": 30.6,
    "dinat_s_tiny": 4.5, "dinat_s_small": 8.7, "dinat_s_base": 15.4, "dinat_s_large": 34.5,
    "nat_isotropic_small": 4.3, "dinat_isotropic_small": 4.3, "nat_isotropic_base": 16.9,
    "dinat_isotropic_base": 16.9,
}
FVCORE_TRACED = ["nat_mini", "nat_tiny", "nat_small", "nat_base", "dinat_s_tiny"]  # the rest: meta below


class _ShapeOnly(Backend):
    """Counting needs shapes, not values: zeros keep fvcore's CPU trace at 224 fast."""

    name = "shape_only_for_tests"

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        return [] if explicit else ["test-only backend"]

    def na_forward(self, q, k, v, rpb, params):
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_zeros(q.shape[:-1], dtype=torch.float32)


if _ShapeOnly.name not in BACKENDS:
    register_backend(_ShapeOnly())


def _fvcore_gmacs(model, x):
    analysis = add_nattn_handles(fvcore.FlopCountAnalysis(model.eval(), x))
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    with torch.no_grad():
        return analysis.total() / 1e9, analysis


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("name", FVCORE_TRACED)
def test_fvcore_reproduces_published_gflops(name):
    model = timm.create_model(name, backend=_ShapeOnly.name)
    gmacs, analysis = _fvcore_gmacs(model, torch.zeros(1, 3, 224, 224))
    assert abs(gmacs - PUBLISHED_GFLOPS[name]) / PUBLISHED_GFLOPS[name] < 0.03, gmacs
    assert analysis.by_operator()["na_forward"] > 0


@pytest.mark.parametrize("name", sorted(PUBLISHED_GFLOPS))
def test_flop_counter_mode_reproduces_published_gflops(name):
    """On the meta device (no compute): torch's FLOPs / 2 = MACs without layer norms (<1%)."""
    with torch.device("meta"):
        model = timm.create_model(name)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(torch.empty(1, 3, 224, 224, device="meta"))
    gmacs = counter.get_total_flops() / 2e9
    assert abs(gmacs - PUBLISHED_GFLOPS[name]) / PUBLISHED_GFLOPS[name] < 0.03, gmacs


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_flop_counter_mode_agrees_with_fvcore_on_a_model():
    """torch counts 2 FLOPs per MAC and skips layer norms; otherwise the same ops."""
    model = timm.create_model("dinat_mini", backend=_ShapeOnly.name)
    _, analysis = _fvcore_gmacs(model, torch.zeros(1, 3, 224, 224))
    by_op = analysis.by_operator()
    with torch.device("meta"):
        meta_model = timm.create_model("dinat_mini")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        meta_model.eval()(torch.empty(1, 3, 224, 224, device="meta"))
    assert counter.get_total_flops() == 2 * (analysis.total() - by_op["layer_norm"])
    na_torch = sum(v for k, v in counter.get_flop_counts()["Global"].items() if "nattn" in str(k))
    assert na_torch == 2 * by_op["na_forward"]


def test_flop_counter_mode_on_video_model_is_dominated_by_known_ops():
    with torch.device("meta"):
        model = timm.create_model("dinat_video_tiny")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(torch.empty(1, 3, 16, 224, 224, device="meta"))
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert counts["nattn.na_forward"] == sum(
        nattn.flops.na_flops((1, 8, 56 // 2 ** i, 56 // 2 ** i, h, 32), kernel_size=(3, 7, 7)) * d
        for i, (h, d) in enumerate(zip((2, 4, 8, 16), (2, 2, 6, 2)))
    )
