"""Kernel configurations carried by backend names (nattn/backends/kernel_config.py), and the
problem-struct fields the cuda backend packs from them."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nattn._cuda import kernel_table
from nattn.backends import BACKENDS, get
from nattn.backends import kernel_config as kc
from nattn.params import normalize


def test_parse_and_text_round_trip():
    cfg = kc.parse("q8x16_k4x16+dq=atomic")
    assert cfg == kc.KernelConfig(((8, 16), (4, 16)), 2)
    assert cfg.text == "q8x16_k4x16+dq=atomic" and kc.parse(cfg.text) == cfg
    assert kc.parse("dq=pass") == kc.KernelConfig(None, 1)
    assert kc.parse("q2x4x8_k1x5x16").fields() == (2, 4, 8, 1, 5, 16, 0, 0)
    assert kc.parse("q64_k128+kv=4").fields() == (64, 1, 1, 128, 1, 1, 0, 4)
    assert kc.parse("kv=8+dq=pass") == kc.KernelConfig(None, 1, 8) and kc.parse("kv=8+dq=pass").text == "dq=pass+kv=8"
    assert kc.DEFAULT.fields() == (0,) * 8 and kc.DEFAULT.text == ""
    # kv=1: explicitly unsplit (field 1), unlike the default (0: the library may split)
    assert kc.parse("kv=1").fields()[-1] == 1 and kc.parse("kv=1").text == "kv=1"
    assert kc.split("cuda:q64_k128") == ("cuda", "q64_k128") and kc.split("flex") == ("flex", "")
    assert kc.join("cuda", kc.DEFAULT) == "cuda" and kc.join("cuda", cfg) == "cuda:q8x16_k4x16+dq=atomic"


@pytest.mark.parametrize("bad", ["q8x16", "q8x16_k4", "q0_k64", "dq=fast", "q8_k8+q8_k8", "dq=pass+dq=atomic", "tile",
                                 "kv=0", "kv=65", "kv=x", "kv=2+kv=4"])
def test_malformed_configurations_name_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="accepted|same number of axes"):
        kc.parse(bad)


def test_configured_cuda_names_share_the_backend_and_cache_views():
    a, b = get("cuda:q8x8_k7x16"), get("cuda:q8x8_k7x16")
    assert a is b and a.name == "cuda:q8x8_k7x16" and a.parent is BACKENDS["cuda"]
    assert get("cuda") is BACKENDS["cuda"]


def test_the_problem_struct_carries_the_configuration():
    """The eight configuration fields (kernel_table.PROBLEM_FIELDS: tile, dq_mode, kv_splits) come from the name."""
    with FakeTensorMode():
        q = torch.empty(2, 16, 16, 4, 32, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        params = normalize(q, q, q, 2, 7)
        cfg = kc.parse("q8x8_k7x16+dq=atomic+kv=3")
        fields, _ = BACKENDS["cuda"]._template(params, (q, q, q, out, None, None, None, None), cfg)
        default, _ = BACKENDS["cuda"]._template(params, (q, q, q, out, None, None, None, None))
    tile = kernel_table.FIELD_OFFSETS["tile"]
    dq = kernel_table.FIELD_OFFSETS["dq_mode"]
    kv = kernel_table.FIELD_OFFSETS["kv_splits"]
    assert list(fields[tile:tile + 6]) == [8, 8, 1, 7, 16, 1] and fields[dq] == 2 and fields[kv] == 3
    assert list(default[tile:tile + 8]) == [0] * 8
    # ... followed by ABI 3's three dropout fields (tests/test_cuda_dropout.py)
    assert kernel_table.ABI_VERSION >= 3 and kv == kernel_table.FIELD_OFFSETS["dropout_threshold"] - 1
