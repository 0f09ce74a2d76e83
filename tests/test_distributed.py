"""nattn.distributed on the CPU: gloo process groups of 2 and 3 processes, each rank holding
a contiguous (uneven) shard along one spatial axis; head-parallel and halo NA must equal NA
on the whole tensors, forward, LSE and gradients, for every feature."""

import os
import socket
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import nattn
from nattn.distributed import ContextParallel, na_halo, na_ulysses, shard, shard_sizes, unshard
from nattn.distributed import halo as halo_module
from nattn.distributed.halo import interior, region
from nattn.distributed.ulysses import _chunk_count
from nattn.windows import axis_window

_interior = interior
from nattn.nn import NeighborhoodAttention2D, NeighborhoodAttention3D

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
# (spatial, kernel, stride, dilation, causal, heads, heads_kv, extra, rpb, axis)
CASES = [
    ((23,), (5,), (1,), (2,), (False,), 6, 3, 0, True, 0),
    ((19,), (4,), (2,), (1,), (True,), 6, 6, 3, False, 0),
    ((11, 9), (3, 5), (1, 1), (2, 1), (False, False), 6, 3, 0, True, 0),
    ((10, 13), (4, 3), (2, 3), (1, 2), (True, False), 12, 6, 2, False, 1),
    ((5, 7, 8), (3, 3, 5), (1, 1, 2), (1, 2, 1), (False, False, True), 6, 6, 0, False, 2),
    ((7, 5, 6), (3, 3, 3), (1, 1, 1), (2, 1, 1), (False, False, False), 6, 3, 1, True, 0),
]


# Halo-specific: windows that reach past a neighbour's shard (halo wider than a shard),
# strides and dilations across shard borders, causal axes, heads that do not divide by P.
HALO_CASES = [
    ((17,), (9,), (3,), (1,), (False,), 5, 5, 0, False, 0),
    ((29,), (5,), (2,), (3,), (True,), 2, 1, 2, False, 0),
    ((12, 7), (7, 3), (1, 1), (1, 2), (False, False), 1, 1, 0, True, 0),
    ((9, 10, 4), (3, 5, 3), (2, 4, 1), (2, 1, 1), (True, False, False), 3, 1, 0, False, 1),
    # causal, small window: the first rank's region is its own shard (nothing travels to it,
    # yet it must take part in the exchange's backward)
    ((40,), (3,), (1,), (1,), (True,), 2, 2, 0, False, 0),
]
# Shards wide against their windows: every rank has interior queries (halo overlap=True
# computes them from its own shard while the exchange runs).
OVERLAP_CASES = [
    ((41,), (5,), (1,), (2,), (False,), 2, 1, 2, False, 0),
    ((37,), (6,), (3,), (1,), (True,), 2, 2, 0, False, 0),
    ((30, 5), (5, 3), (1, 1), (1, 1), (False, False), 2, 1, 0, True, 0),
    ((4, 33, 3), (3, 4, 3), (1, 2, 1), (1, 2, 1), (False, True, False), 1, 1, 0, False, 1),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_case(case, rank, world, scheme=na_ulysses):
    spatial, kernel, stride, dilation, causal, heads, heads_kv, extra, with_rpb, axis = case
    n = len(spatial)
    g = torch.Generator().manual_seed(hash(case) % 2**31)  # the same inputs on every rank

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v = r(2, *spatial, heads, 4), r(2, *spatial, heads_kv, 4), r(2, *spatial, heads_kv, 5)
    ek, ev = (r(2, extra, heads_kv, 4), r(2, extra, heads_kv, 5)) if extra else (None, None)
    rpb = r(heads, *(2 * x - 1 for x in kernel)) if with_rpb else None
    kw = dict(stride=stride, dilation=dilation, is_causal=causal, scale=0.4, additional_keys=ek,
              additional_values=ev, rpb=rpb, backend="reference")
    ref, ref_lse = FUNCS[n](q, k, v, kernel, return_lse=True, **kw)
    go, gl = torch.randn(ref.shape, generator=g, dtype=torch.float64), torch.randn(ref_lse.shape, generator=g,
                                                                                  dtype=torch.float64)
    shared = [t for t in (ek, ev, rpb) if t is not None]
    want = torch.autograd.grad([ref, ref_lse], [q, k, v, *shared], [go, gl])

    sizes = shard_sizes(spatial[axis], world)
    sizes = sizes[1:] + sizes[:1]  # uneven, and not the default order
    local = [shard(t, axis, sizes=sizes).detach().requires_grad_(True) for t in (q, k, v)]
    mine = [t.detach().clone().requires_grad_(True) for t in shared]
    it = iter(mine)
    kw.update(additional_keys=next(it) if ek is not None else None,
              additional_values=next(it) if ev is not None else None, rpb=next(it) if rpb is not None else None)
    out, lse = scheme(*local, kernel, return_lse=True, na_dim=n, axis=axis, **kw)
    torch.testing.assert_close(out, shard(ref, axis, sizes=sizes), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, shard(ref_lse, axis, sizes=sizes), rtol=1e-10, atol=1e-10)
    got = torch.autograd.grad([out, lse], local + mine,
                              [shard(go, axis, sizes=sizes), shard(gl, axis, sizes=sizes)])
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a, shard(b, axis, sizes=sizes), rtol=1e-9, atol=1e-9)
    for a, b in zip(got[3:], want[3:]):  # replicated tensors: each rank holds its heads' share
        total = a.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(total, b, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(unshard(out.detach(), axis), ref.detach(), rtol=1e-10, atol=1e-10)


def _check_module(rank, world, scheme="ulysses", chunks=1, overlap=False):
    """NeighborhoodAttention3D(context_parallel=...) on shards = the module on the whole input."""
    torch.manual_seed(7)  # the same weights and input on every rank
    m = NeighborhoodAttention3D(24, 6, (3, 3, 5), dilation=(1, 2, 1), rel_pos_bias=True).double()
    plan = ContextParallel(axis=1, scheme=scheme, chunks=chunks, overlap=overlap)
    cp = NeighborhoodAttention3D(24, 6, (3, 3, 5), dilation=(1, 2, 1), rel_pos_bias=True,
                                 context_parallel=plan).double()
    cp.load_state_dict(m.state_dict())
    x = torch.randn(2, 5, 9, 7, 24, dtype=torch.float64, requires_grad=True)
    ref = m(x)
    g = torch.randn_like(ref)
    ref.backward(g)
    xl = shard(x, 1).detach().requires_grad_(True)
    out = cp(xl)
    torch.testing.assert_close(out, shard(ref, 1), rtol=1e-10, atol=1e-10)
    out.backward(shard(g, 1))
    torch.testing.assert_close(xl.grad, shard(x.grad, 1), rtol=1e-9, atol=1e-9)
    for name, p in cp.named_parameters():  # every parameter: sum of the ranks' shares
        total = p.grad.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(total, dict(m.named_parameters())[name].grad, rtol=1e-9, atol=1e-9)


def _worker(rank, world, port, cases):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case in cases:
            _check_case(case, rank, world)
        # Ulysses in rounds of heads (communication overlapping NA): the same results
        rounds = [c for c in cases if _chunk_count(3, c[5] // world, c[6] // world) > 1]
        assert rounds, "no case splits into rounds"
        for case in rounds:
            _check_case(case, rank, world, partial(na_ulysses, chunks=3))
        _check_module(rank, world, chunks=3)
        # which path runs: interior() is asked only with overlap=True
        asked = []
        halo_module.interior = lambda *a: asked.append(a) or _interior(*a)
        for case in HALO_CASES + cases:
            _check_case(case, rank, world, na_halo)
        _check_module(rank, world, "halo")
        assert not asked, "overlap=False computed an interior"
        for case in OVERLAP_CASES + HALO_CASES + cases:
            _check_case(case, rank, world, partial(na_halo, overlap=True))
        _check_module(rank, world, "halo", overlap=True)
        assert len(asked) == len(OVERLAP_CASES + HALO_CASES + cases) + 1
        _check_module(rank, world)
        with pytest.raises(ValueError, match="divide by the group size"):
            q = torch.randn(1, 8, 5, 4)
            na_ulysses(q, q, q, 3, na_dim=1) if world == 3 else na_ulysses(q[..., :3, :], q, q, 3, na_dim=1)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_head_parallel_equals_single_process(world):
    cases = [c for c in CASES if c[5] % world == 0 and c[6] % world == 0]
    assert len(cases) >= 3
    mp.spawn(_worker, args=(world, _free_port(), cases), nprocs=world, join=True)


def test_module_argument_errors():
    with pytest.raises(TypeError, match="ContextParallel"):
        NeighborhoodAttention2D(16, 2, 3, context_parallel=object())
    with pytest.raises(ValueError, match="spatial axis"):
        NeighborhoodAttention2D(16, 2, 3, context_parallel=ContextParallel(axis=2))
    with pytest.raises(ValueError, match="scheme"):
        ContextParallel(scheme="ring")
    with pytest.raises(ValueError, match="chunks"):
        ContextParallel(chunks=0)
    with pytest.raises(ValueError, match="ulysses"):
        ContextParallel(scheme="halo", chunks=2)
    with pytest.raises(ValueError, match="halo"):
        ContextParallel(overlap=True)
    with pytest.raises(TypeError, match="overlap"):
        ContextParallel(scheme="halo", overlap=1)


def test_overlap_cases_have_interior_queries_on_every_rank():
    for world in (2, 3):
        for spatial, kernel, stride, dilation, causal, *_, axis in OVERLAP_CASES:
            sizes = shard_sizes(spatial[axis], world)
            sizes = sizes[1:] + sizes[:1]  # the order _check_case shards in
            for r in range(world):
                start = sum(sizes[:r])
                window = (kernel[axis], stride[axis], dilation[axis], causal[axis])
                assert interior(start, start + sizes[r], spatial[axis], *window) is not None


@pytest.mark.parametrize("seed", range(4))
def test_interior_queries_keep_their_windows_on_the_shard_alone(seed):
    """interior()'s queries have, on their region of the shard alone, the windows (keys,
    validity, bias offsets) they have on the whole axis; the region lies inside the shard."""
    g = torch.Generator().manual_seed(seed)
    found = 0
    for _ in range(150):
        k, d = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        s = int(torch.randint(1, k + 1, (1,), generator=g))
        causal = bool(torch.randint(0, 2, (1,), generator=g))
        length = k * d + int(torch.randint(0, 60, (1,), generator=g))
        start = int(torch.randint(0, length, (1,), generator=g))
        stop = int(torch.randint(start + 1, length + 1, (1,), generator=g))
        got = interior(start, stop, length, k, s, d, causal)
        if got is None:
            continue
        found += 1
        a, b = got
        lo, hi = region(a, b, length, k, s, d, causal)
        assert start <= a < b <= stop and start <= lo <= a and b <= hi <= stop
        queries = list(range(a, b))
        keys, valid, bias = axis_window(length, k, s, d, causal, queries=queries)
        sub_keys, sub_valid, sub_bias = axis_window(hi - lo, k, s, d, causal, queries=[x - lo for x in queries])
        assert torch.equal(valid, sub_valid) and torch.equal(bias[valid], sub_bias[sub_valid])
        assert torch.equal(keys[valid], sub_keys[sub_valid] + lo)
    assert found >= 20  # the check above ran on enough shards


def test_rounds_divide_every_ranks_heads():
    assert _chunk_count(3, 6, 3) == 3 and _chunk_count(4, 6, 3) == 3 and _chunk_count(2, 6, 3) == 1
    assert _chunk_count(8, 4, 2) == 2 and _chunk_count(1, 8, 8) == 1 and _chunk_count(5, 2, 2) == 2


def test_needs_a_process_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is already initialised here")
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        na_ulysses(q, q, q, 3, na_dim=1)
