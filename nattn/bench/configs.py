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
    try:
        configs = BACKENDS["cuda"].sm90_configs(q, k, v, params)
    except ValueError as e:  # a build without kernels for this dtype / head dim, say
        return lines + [f"  libnattn: {e}"]
    if not configs:
        lines.append("  sm90: none compiled for this dtype, NA dim and head dim")
        return lines
    minimum = lib.sm90_min_window.get(p.na_dim)
    runs = "runs by default" if minimum is not None and params.window_size >= minimum else \
        f"runs by default from {minimum} keys per query (this window: {params.window_size})"
    lines.append(f"  sm90 (compute capability 9.0; {runs}; force one with NATTN_SM90_TILE=<name>; cost: keys "
                 "walked per query, 64-key boxes counted 1.15x, 64-query boxes 1.3x; backward: the pair the "
                 "backward uses):")
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


def optimize(problems, args) -> str:
    """``--optimize``: time every tile pair of the Hopper family that takes each problem (the
    forward, and forward + backward with ``--backprop``) on this GPU, and print them beside
    the default with the best one's speedup. Needs a compute capability 9.0 GPU."""
    import os

    from ..backends import BACKENDS
    from .rows import NattnRow
    from .run import time_row

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("--optimize times the Hopper family's configurations: it needs a compute capability 9.0 GPU")
    device, dtype = torch.device("cuda"), DTYPES[args.dtype or "bf16"]
    out = []
    saved = {k: os.environ.get(k) for k in ("NATTN_FAMILY", "NATTN_SM90_TILE")}
    try:
        os.environ["NATTN_FAMILY"] = "sm90"  # below the default minimum window too
        for p in problems:
            q = torch.empty(p.batch, *p.spatial, p.heads, p.dim, dtype=dtype, device="meta")
            k = torch.empty(p.batch, *p.spatial, p.heads_kv or p.heads, p.dim, dtype=dtype, device="meta")
            v = torch.empty(p.batch, *p.spatial, p.heads_kv or p.heads, p.dim_v or p.dim, dtype=dtype, device="meta")
            params = normalize(q, k, v, p.na_dim, p.kernel, p.stride, p.dilation, p.causal, None)
            configs = [c for c in BACKENDS["cuda"].sm90_configs(q, k, v, params) if not c["declined"]]
            out.append(f"{p.name}: {len(configs)} sm90 configuration(s)")
            timed = []
            for c in configs:
                os.environ["NATTN_SM90_TILE"] = c["name"]
                r = time_row(NattnRow("cuda"), p, device, dtype, args.backprop, 1)
                ms = r.get("fwd_bwd_ms" if args.backprop else "fwd_ms")
                timed.append((c, ms, r.get("note", "")))
            default = next((ms for c, ms, _ in timed if c["default"]), None)
            best = min((t for t in timed if t[1] is not None), key=lambda t: t[1], default=None)
            for c, ms, note in timed:
                mark = " default" if c["default"] else ""
                mark += " best" if best is not None and c is best[0] else ""
                value = f"{ms:.3f} ms" if ms is not None else f"failed: {note}"
                out.append(f"  {c['name']:<16} {value}{mark}")
            if best is not None and default:
                out.append(f"  best {best[0]['name']}: {default / best[1]:.2f}x the default")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return "\n".join(out)
