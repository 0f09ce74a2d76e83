"""``python -m nattn.bench ... --dry-run``: the kernel configurations each family has for a
problem, from libnattn's kernel table, without running anything (no GPU needed)."""

from __future__ import annotations

from typing import List

import torch

from ..params import normalize
from .cli import DTYPES
from .problems import Problem


def family_lines(p: Problem, dtype: torch.dtype) -> List[str]:
    """What each family offers for ``p`` in ``dtype``: SIMT and tc (one configuration each),
    and the Hopper family's tile pairs with the keys they walk per query, the default, the
    pairs with a backward and the ones it declines (with the reason)."""
    from .._cuda import library
    from ..backends import BACKENDS
    lib = library.load()
    if lib is None:
        return [f"  libnattn is not built ({library.load_error()})"]
    dim_v = p.dim_v or p.dim
    heads_kv = p.heads_kv or p.heads
    q = torch.empty(p.batch, *p.spatial, p.heads, p.dim, dtype=dtype, device="meta")
    k = torch.empty(p.batch, *p.spatial, heads_kv, p.dim, dtype=dtype, device="meta")
    v = torch.empty(p.batch, *p.spatial, heads_kv, dim_v, dtype=dtype, device="meta")
    params = normalize(q, k, v, p.na_dim, p.kernel, p.stride, p.dilation, p.causal, None)
    name = str(dtype).replace("torch.", "")
    lines = [f"  simt: 1 configuration (every GPU from SM50, head dims up to {max(lib.kernels.get(('simt', name, p.na_dim), [0]))})"]
    tc = lib.kernels.get(("tc", name, p.na_dim), [])
    if tc and max(p.dim, dim_v) <= max(tc):
        lines.append("  tc: 1 configuration (SM80+; 16-query boxes)")
    configs = BACKENDS["cuda"].sm90_configs(q, k, v, params)
    if not configs:
        lines.append("  sm90: none compiled for this dtype, NA dim and head dim")
        return lines
    minimum = lib.sm90_min_window.get(p.na_dim)
    runs = "runs by default" if minimum is not None and params.window_size >= minimum else \
        f"runs by default from {minimum} keys per query (this window: {params.window_size})"
    lines.append(f"  sm90 (compute capability 9.0; {runs}; force one with NATTN_SM90_TILE=<name>; cost: keys "
                 "walked per query, 64-key boxes counted 1.15x; backward: the pair the backward uses):")
    width = max(len(c["name"]) for c in configs)
    for c in configs:
        flags = [f for f, on in (("default", c["default"]), ("backward", c["backward"])) if on]
        note = f"declined: {c['declined']}" if c["declined"] else ", ".join(flags)
        lines.append(f"    {c['name']:<{width}}  cost {c['keys']:>8}  {note}".rstrip())
    return lines


def dry_run(problems, dtype_name: str) -> str:
    dtype = DTYPES[dtype_name or "bf16"]  # the GPU default
    out = []
    for p in problems:
        out.append(f"{p.name}: spatial {p.spatial}, window {p.kernel}, stride {p.stride}, dilation {p.dilation}, "
                   f"heads {p.heads}, head dim {p.dim}, {dtype_name or 'bf16'}")
        out += family_lines(p, dtype)
    return "\n".join(out)
