"""Eager NA calls remember (params, backend) per signature (nattn/_call_cache.py): a hit must
never let an argument through that the checks would reject, nor reuse a choice made under
other conditions."""

import pytest
import torch

import nattn
from nattn import _call_cache


def qkv(requires_grad=False):
    return [torch.randn(1, 6, 6, 2, 8, requires_grad=requires_grad) for _ in range(3)]


def test_values_that_hash_alike_are_checked_apart():
    q, k, v = qkv()
    nattn.na2d(q, k, v, 3)
    assert len(_call_cache._CACHE) == 1
    with pytest.raises(TypeError, match="kernel_size"):
        nattn.na2d(q, k, v, 3.0)  # 3.0 == 3 and hash(3.0) == hash(3)
    with pytest.raises(TypeError, match="is_causal"):
        nattn.na2d(q, k, v, 3, is_causal=1)  # 1 == True
    nattn.na2d(q, k, v, 3, is_causal=True)
    assert len(_call_cache._CACHE) == 2


def test_a_hit_returns_the_same_result_and_other_shapes_are_checked():
    q, k, v = qkv()
    first = nattn.na2d(q, k, v, 3, dilation=2)
    again = nattn.na2d(q, k, v, 3, dilation=2)
    torch.testing.assert_close(first, again)
    small = torch.randn(1, 4, 4, 2, 8)
    with pytest.raises(ValueError, match="kernel_size \\* dilation"):
        nattn.na2d(small, small, small, 3, dilation=2)


def test_grad_mode_and_determinism_are_part_of_the_signature():
    q, k, v = qkv(requires_grad=True)
    nattn.na2d(q, k, v, 3)
    with torch.no_grad():
        nattn.na2d(q, k, v, 3)
    torch.use_deterministic_algorithms(True)
    try:
        nattn.na2d(q, k, v, 3)
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(_call_cache._CACHE) == 3


def test_uncacheable_arguments_and_tuning_skip_the_cache():
    q, k, v = qkv()
    nattn.na2d(q, k, v, torch.tensor(3).item())  # an int: cached
    assert len(_call_cache._CACHE) == 1
    _call_cache.clear()
    with nattn.autotune():
        nattn.na2d(q, k, v, 3)
    assert not _call_cache._CACHE
    assert _call_cache.key((q,), (object(),)) is None


def test_op_keys_tell_apart_what_a_compiled_call_chooses_by():
    """The ops of compiled calls key their choice on the backend string, the normalized
    params and the tensors (``op_key``): each of those alone changes the key."""
    from nattn.backends import deferred
    from nattn.params import NAParams

    q, k, v = qkv()
    params = NAParams((3, 3), (1, 1), (1, 1), (False, False), 8 ** -0.5)
    spec = deferred.spec(None, None, None, False)
    base = _call_cache.op_key((q, k, v, None), spec, params)
    assert base == _call_cache.op_key((q.clone(), k, v, None), spec, params)
    others = [
        _call_cache.op_key((q, k, v, None), deferred.spec(None, None, True, False), params),
        _call_cache.op_key((q, k, v, None), spec, NAParams((3, 3), (1, 1), (2, 2), (False, False), 8 ** -0.5)),
        _call_cache.op_key((q, k, v, None), spec, NAParams((3, 3), (1, 1), (1, 1), (True, False), 8 ** -0.5)),
        _call_cache.op_key((q.transpose(1, 2), k, v, None), spec, params),
        _call_cache.op_key((q.double(), k, v, None), spec, params),
        _call_cache.op_key((q, k, v, torch.zeros(2, 5, 5)), spec, params),
    ]
    with torch.no_grad():
        others.append(_call_cache.op_key((q, k, v, None), spec, params))
    assert all(o is not None and o != base for o in others)
    assert len(set(others)) == len(others)
    assert _call_cache.op_key((torch.nn.Parameter(q).as_subclass(_Sub), k, v, None), spec, params) is None


class _Sub(torch.Tensor):
    pass


def test_nested_argument_types_are_part_of_the_signature():
    """Flat and nested tuples, lists and scalars that compare equal key apart."""
    q, _, _ = qkv()
    keys = {_call_cache.key((q,), (a,)) for a in
            [(3, 3), (3.0, 3), (3, True), [3, 3], ((3, 3),), ((3.0, 3),), ([3, 3],), 3, 3.0, True, None]}
    assert None not in keys and len(keys) == 11
    assert _call_cache.key((q,), ((3, 3),)) == _call_cache.key((q,), ((3, 3),))
    assert _call_cache.key((q,), ((3, object()),)) is None
