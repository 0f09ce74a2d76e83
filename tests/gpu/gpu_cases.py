"""Random NA problems sized for the GPU tier: every feature, odd shapes, real head dims."""

import os
import random
import sys
from dataclasses import dataclass, replace
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/, for scripts too
from cases import Problem, random_window  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (8, 16, 24, 32, 40, 64, 72, 96, 128, 136, 256)
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# Relative error a kernel's output or gradient may have against the float64 reference: the
# storage rounding of 16-bit inputs and outputs dominates (bf16's 8-bit mantissa, fp16's 11).
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


def built_space(dtypes=DTYPES, head_dims=HEAD_DIMS):
    """``dtypes`` and ``head_dims`` cut to what the loaded library runs in every NA dim.

    A full build keeps both whole (same random draws as before); a developer build
    (benchmarks/build_variants.sh: bfloat16 at head dims 32 and 64) draws its sweep from
    what it holds instead of failing on cases it was never built for. The SIMT family is
    always built and takes every problem its buckets hold, so its table is the bound."""
    from nattn._cuda import library
    lib = library.load()
    if lib is None:
        return tuple(dtypes), tuple(head_dims)
    kept, widest = [], None
    for dt in dtypes:
        buckets = [lib.kernels.get(("simt", _DTYPE_NAMES[dt], nd), []) for nd in (1, 2, 3)]
        if all(buckets):
            kept.append(dt)
            top = min(b[-1] for b in buckets)
            widest = top if widest is None else min(widest, top)
    assert kept, f"the library at {library.library_path()} runs none of {dtypes}"
    return tuple(kept), tuple(h for h in head_dims if h <= widest)


@dataclass
class GpuCase(Problem):
    dtype: torch.dtype
    layout: str  # "plain" | "fused" (q/k/v sliced from one projection) | "heads_major" | "axes_reversed"
    scale: Optional[float]
    seed: int

    def __str__(self):
        dt = str(self.dtype).replace("torch.", "")
        return (f"{dt}-sp{'x'.join(map(str, self.spatial))}-k{self.kernel}-s{self.stride}"
                f"-d{self.dilation}-c{''.join('1' if c else '0' for c in self.causal)}"
                f"-b{self.batch}h{self.heads}/{self.heads_kv}-D{self.dim}/{self.dim_v}"
                f"-x{self.extra}-rpb{int(self.rpb)}-{self.layout}")


def random_case(rng: random.Random, na_dim: int, wide: bool = False, dtypes=DTYPES, head_dims=HEAD_DIMS,
                extras=(0, 0, 0, 5)) -> GpuCase:
    """A problem with every window feature (odd and even kernels, dilation, stride, causal,
    RPB), GQA, strided layouts, drawn from ``dtypes``, ``head_dims`` and ``extras`` (extra
    keys). wide: kernels large enough that a warp's window union spans several staged chunks
    along the last axis and many lines (the tiled kernels' multi-chunk paths)."""
    max_tokens = {1: 3000, 2: 3000, 3: 4000} if wide else {1: 700, 2: 900, 3: 1200}
    max_kernel = {1: 90, 2: 25, 3: 15} if wide else {1: 21, 2: 9, 3: 5}
    spatial, kernel, stride, dilation, causal, rpb = random_window(
        rng, na_dim, max_tokens[na_dim], max_kernel[na_dim],
        [1, 1, 1, 2, 3], lambda r, kd: kd + r.choice([0, 1, 3, 7, r.randint(0, 40)]), causal_p=0.25, rpb_p=0.3,
    )
    heads_kv = rng.choice([1, 1, 2, 3])
    heads = heads_kv * rng.choice([1, 1, 2, 4])
    dim = rng.choice(head_dims)
    dim_v = dim if rng.random() < 0.7 else rng.choice(head_dims)
    return GpuCase(
        spatial=spatial, kernel=kernel, stride=stride,
        dilation=dilation, causal=causal, batch=rng.choice([1, 2, 3]),
        heads=heads, heads_kv=heads_kv, dim=dim, dim_v=dim_v,
        extra=rng.choice(extras), rpb=rpb, dtype=rng.choice(dtypes),
        layout=rng.choice(["plain", "plain", "fused", "heads_major", "axes_reversed"]),
        scale=rng.choice([None, None, 0.2]), seed=rng.randint(0, 2**31),
    )


def sweep(count: int, seed: int = 1234, wide: bool = False):
    rng = random.Random(seed)
    dtypes, head_dims = built_space()
    return [random_case(rng, 1 + i % 3, wide, dtypes, head_dims) for i in range(count)]


# Each run draws fresh data for the same cases: a case's seed (which fixes its shape and
# test id) mixed with the run's (tests/conftest.py's NATTN_TEST_SEED, printed in pytest's
# header: set it to replay a run's data).
RUN_SEED = int(os.environ.get("NATTN_TEST_SEED", "0"))


def data_seed(seed: int) -> int:
    """The generator seed of a case's data in this run."""
    return (seed + 1_000_003 * RUN_SEED) % 2**62


def make_inputs(case: GpuCase, device="cuda"):
    """Fresh random inputs (data_seed); q/k/v in the case's memory layout, all requiring grad."""
    g = torch.Generator(device=device).manual_seed(data_seed(case.seed))
    b, sp, h, hk, d, dv = case.batch, case.spatial, case.heads, case.heads_kv, case.dim, case.dim_v

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(case.dtype)

    if case.layout == "fused":  # one projection output, sliced: token stride > H * D
        width = h * d + hk * d + hk * dv
        buf = rnd(b, *sp, width).requires_grad_(True)
        q = buf[..., : h * d].unflatten(-1, (h, d))
        k = buf[..., h * d : h * d + hk * d].unflatten(-1, (hk, d))
        v = buf[..., h * d + hk * d :].unflatten(-1, (hk, dv))
        leaves = [buf]
    elif case.layout == "heads_major":  # [B, H, *spatial, D] viewed heads-last
        n = len(sp)
        perm = (0, *range(2, 2 + n), 1, 2 + n)
        leaves = [rnd(b, hh, *sp, dd) for hh, dd in ((h, d), (hk, d), (hk, dv))]
        for leaf in leaves:
            leaf.requires_grad_(True)
        q, k, v = (x.permute(*perm) for x in leaves)
    elif case.layout == "axes_reversed" and len(sp) > 1:
        # [B, *reversed(spatial), H, D] viewed with the spatial axes in order: tokens are not
        # rows of one stride (the kernels' general offset path, not Params::token_rows')
        n = len(sp)
        perm = (0, *range(n, 0, -1), n + 1, n + 2)
        leaves = [rnd(b, *sp[::-1], hh, dd) for hh, dd in ((h, d), (hk, d), (hk, dv))]
        for leaf in leaves:
            leaf.requires_grad_(True)
        q, k, v = (x.permute(*perm) for x in leaves)
    else:
        q, k, v = rnd(b, *sp, h, d), rnd(b, *sp, hk, d), rnd(b, *sp, hk, dv)
        leaves = [q, k, v]
        for leaf in leaves:
            leaf.requires_grad_(True)
    t = {"query": q, "key": k, "value": v}
    if case.extra:
        t["additional_keys"] = rnd(b, case.extra, hk, d)
        t["additional_values"] = rnd(b, case.extra, hk, dv)
        leaves += [t["additional_keys"], t["additional_values"]]
    if case.rpb:
        t["rpb"] = rnd(h, *[2 * kk - 1 for kk in case.kernel]).float()
        leaves.append(t["rpb"])
    for name in ("additional_keys", "additional_values", "rpb"):
        if name in t:
            t[name].requires_grad_(True)
    return t, leaves


def rel_err(got, want):
    """Relative L2 error ``|got - want| / |want|`` in float64."""
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def check(name, got, want, tol):
    """got matches want within a relative L2 error of tol, with no NaN or infinity."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values from the cuda backend"
    err = rel_err(got, want)
    assert err <= tol, f"{name}: relative L2 error {err:.3e} > {tol:.1e}"


def detached_inputs(case: GpuCase):
    """q, k, v (in the case's layout, detached) and the RPB table or None."""
    t, _ = make_inputs(case)
    q, k, v = (t[n].detach() for n in ("query", "key", "value"))
    rpb = t["rpb"].detach() if "rpb" in t else None
    return q, k, v, rpb


def dropout_params(case: GpuCase, q, k, v, rpb, p: float):
    """The case's normalized NA parameters with dropout_p = p."""
    from nattn.params import normalize
    return normalize(q, k, v, len(case.spatial), case.kernel, case.stride, case.dilation, case.causal,
                     case.scale, rpb, dropout_p=p)


def run_backend(backend, q, k, v, rpb, params, rng, g_out, g_lse):
    """A backend's forward and backward of one call with the given dropout draw ``rng``."""
    out, lse = backend.na_forward(q, k, v, rpb, params, rng=rng)
    grads = backend.na_backward(q, k, v, rpb, out, lse, g_out, g_lse, params, rng=rng)
    return out, lse, grads


def compare_dropout(case: GpuCase, p: float, tol: float, lse_tol: float = 1e-4):
    """The cuda backend against the reference on one dropout draw (fresh random inputs and
    gradients of the output and the LSE): output within tol, the LSE (computed without
    dropout) within lse_tol, dq/dk/dv/drpb within 2 tol; at p >= 0.5 the output must also
    be far (10 tol) from the same call without dropout (the mask is there)."""
    from nattn import dropout
    from nattn.backends import BACKENDS
    cuda, ref = BACKENDS["cuda"], BACKENDS["reference"]
    q, k, v, rpb = detached_inputs(case)
    params = dropout_params(case, q, k, v, rpb, p)
    assert cuda.na_not_supported_reasons(q, k, v, rpb, params, True) == [], "cuda declined the dropout problem"
    rng = dropout.draw_rng(q.device)
    g = torch.Generator(device="cuda").manual_seed(data_seed(case.seed + 1))
    g_out = torch.randn(*q.shape[:-1], v.shape[-1], generator=g, device="cuda").to(q.dtype)
    g_lse = torch.randn(q.shape[:-1], generator=g, device="cuda")
    o_c, l_c, grads_c = run_backend(cuda, q, k, v, rpb, params, rng, g_out, g_lse)
    o_r, l_r, grads_r = run_backend(ref, q, k, v, rpb, params, rng, g_out, g_lse)
    check("out", o_c, o_r, tol)
    check("lse", l_c, l_r, lse_tol)
    for name, gc, gr in zip(("dq", "dk", "dv", "drpb"), grads_c, grads_r):
        if gr is None:
            assert gc is None, f"{name}: cuda returned a gradient the reference has not"
            continue
        check(name, gc, gr, 2 * tol)
    if p >= 0.5:  # compared where the expected difference is large: many keys dropped
        o0, _ = cuda.na_forward(q, k, v, rpb, replace(params, dropout_p=0.0))
        assert rel_err(o_c, o0) > 10 * tol, "dropout_p > 0 left the output unchanged"


def functional_call(case: GpuCase, t, p: float, backend="cuda"):
    """``(out, lse)`` of the functional NA call of ``case`` on inputs ``t`` with dropout_p = p."""
    import nattn
    return {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}[len(case.spatial)](
        t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
        is_causal=case.causal, scale=case.scale, additional_keys=t.get("additional_keys"),
        additional_values=t.get("additional_values"), rpb=t.get("rpb"), backend=backend, return_lse=True,
        dropout_p=p)


def forward_backward(case: GpuCase, backend, leaves_of=None, heads_first_grad=False):
    """Output, LSE and the gradient of every leaf of the functional call for random output and
    LSE gradients from the case's seed (the output's gradient heads-last, or a heads-first
    [B, H, *spatial, D] tensor viewed heads-last); ``leaves_of(t, leaves)`` may swap inputs."""
    t, leaves = make_inputs(case)
    if leaves_of is not None:
        t, leaves = leaves_of(t, leaves)
    out, lse = functional_call(case, t, 0.0, backend)
    g = torch.Generator(device="cuda").manual_seed(data_seed(case.seed + 1))
    shape = out.shape if not heads_first_grad else (out.shape[0], out.shape[-2], *out.shape[1:-2], out.shape[-1])
    g_out = torch.randn(shape, generator=g, device="cuda").to(out.dtype)
    if heads_first_grad:
        g_out = g_out.movedim(1, -2)
    g_lse = torch.randn(lse.shape, generator=g, device="cuda").to(lse.dtype)
    grads = torch.autograd.grad([out, lse], leaves, [g_out, g_lse])
    return out.detach(), lse.detach(), grads


def compare_gradients(case: GpuCase, tol: float, heads_first_grad=False):
    """The cuda backend's output (within tol), LSE (1e-4) and every gradient (2 tol) against
    the reference backend's on the same inputs and output gradients."""
    o_c, l_c, g_c = forward_backward(case, "cuda", heads_first_grad=heads_first_grad)
    o_r, l_r, g_r = forward_backward(case, "reference", heads_first_grad=heads_first_grad)
    check("out", o_c, o_r, tol)
    check("lse", l_c, l_r, 1e-4)
    for i, (gc, gr) in enumerate(zip(g_c, g_r)):
        check(f"grad_leaf{i}", gc, gr, 2 * tol)


def seeded_forward_backward(case: GpuCase, p: float, seed: int, backend="cuda"):
    """Output, LSE and input gradients of functional_call after ``torch.manual_seed(seed)``
    (the dropout draw), with output gradients from the case's seed."""
    t, leaves = make_inputs(case)
    torch.manual_seed(seed)
    out, lse = functional_call(case, t, p, backend)
    g = torch.Generator(device="cuda").manual_seed(data_seed(case.seed + 1))
    g_out = torch.randn(out.shape, generator=g, device="cuda").to(out.dtype)
    g_lse = torch.randn(lse.shape, generator=g, device="cuda")
    grads = torch.autograd.grad([out, lse], leaves, [g_out, g_lse])
    return out.detach(), lse.detach(), grads


POISON_ENV = "NATTN_POISON_WORKSPACES"


def _nan_filled(alloc):
    def allocate(*args, **kwargs):
        t = alloc(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t
    return allocate


def poison_kernel_buffers(monkeypatch=None):
    """Buffers that kernels must fill start as NaN: the outputs, gradients and delta the
    cuda backend, the window ops and the LayerNorm kernel allocate (nattn/_buffers.py) and
    libnattn's own stream-ordered workspaces (split-KV partials, the zero-padded copies:
    NATTN_POISON_WORKSPACES=1). A row a kernel leaves unwritten, or reads before anything
    wrote it, then fails every run instead of passing on whatever an earlier tensor left
    there. With ``monkeypatch`` until the test ends, else for the process
    (the sanitizer scripts), unless NATTN_POISON_WORKSPACES=0 asks for plain buffers (for
    compute-sanitizer's initcheck, which sees reads of never-written bytes only where nothing
    filled them first)."""
    if monkeypatch is None and os.environ.get(POISON_ENV) == "0":
        return
    from nattn import _buffers
    put = monkeypatch.setattr if monkeypatch is not None else setattr
    put(_buffers, "empty", _nan_filled(torch.empty))
    put(_buffers, "empty_like", _nan_filled(torch.empty_like))
    if monkeypatch is not None:
        monkeypatch.setenv(POISON_ENV, "1")
    else:
        os.environ[POISON_ENV] = "1"


def run_finite(cases, progress: bool = False) -> None:
    """The sanitizer scripts' sweep: each case's forward and backward with random output and
    LSE gradients, every result finite (NaN-filled buffers make an unwritten row fail here);
    ``progress`` prints each case once done (a sanitizer run cut short still says how far it
    got)."""
    for case in cases:
        t, leaves = make_inputs(case)
        out, lse = functional_call(case, t, 0.0)
        grads = torch.autograd.grad([out, lse], leaves, [torch.randn_like(out), torch.randn_like(lse)])
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), str(case)
        assert all(torch.isfinite(g).all() for g in grads), str(case)
        if progress:
            print(f"case done: {case}", flush=True)
