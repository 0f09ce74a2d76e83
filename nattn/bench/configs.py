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
    from .._cuda import kernel_table, library
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
    tc = (getattr(lib, "tf32", {}).get(p.na_dim, []) if name == "float32" else  # its TF32 instances (ABI 4)
          lib.kernels.get(("tc", name, p.na_dim), []))
    if tc and max(p.dim, dim_v) <= max(tc):
        tf32 = "; float32 in TF32, while torch.backends.cuda.matmul allows TF32" if name == "float32" else ""
        lines.append(f"  tc: 1 configuration (SM80+; 16-query boxes{tf32})")
    try:
        configs = BACKENDS["cuda"].sm90_configs(q, k, v, params)
    except ValueError as e:  # a build without kernels for this dtype / head dim, say
        return lines + [f"  libnattn: {e}"]
    if not configs:
        lines.append("  sm90: none compiled for this dtype, NA dim and head dim")
        return lines
    minimum = lib.sm90_min_window_head.get((p.na_dim, p.dim), lib.sm90_min_window.get(p.na_dim))
    runs = "runs by default" if minimum is not None and params.window_size >= minimum else \
        f"runs by default from {minimum} keys per query (this window: {params.window_size})"
    chosen = _default_passes(q, k, v, params, bool(p.rpb))
    if chosen is not None:
        runs = {(True, True): "runs by default, forward and backward",
                (True, False): "runs the forward by default; the backward runs another family, measured faster "
                               "on such problems",
                (False, True): "runs the backward by default; the forward runs another family, measured faster "
                               "on such problems",
                (False, False): "not the default here: another family measured faster on such problems"}[chosen]
    lines.append(f"  sm90 (compute capability 9.0; {runs}; name one per call with backend='cuda:<name>', or "
                 "NATTN_SM90_TILE=<name> process-wide; cost: keys walked per query times the query rows its boxes cover per query, 64-key boxes counted 1.15x, "
                 "64-query boxes 1.3x in 1-D, 1.5x in 3-D, 0.6x in 2-D at head dim 32, 1-D key boxes copied in "
                 "two or more pieces (box x dilation above 256) 2x, strip pairs the keys their warps' strips "
                 "walk; backward: the pair has a backward; backward default: the pair the backward runs, the one "
                 "walking the fewest steps; named only: the cost model never picks its forward (the strip pairs "
                 "run by their own rule: wherever they take a problem, unless dilated 4 or more where some "
                 "walk is not narrow)):")
    unverified = kernel_table.unverified_tile_names()
    width = max(len(c["name"]) for c in configs)
    for c in configs:
        flags = [f for f, on in (("default", c["default"]), ("backward", c["backward"]),
                                 ("backward default", c["backward_default"]),
                                 ("named only", c.get("named_only", False)),
                                 ("not yet run on a GPU", c["name"] in unverified)) if on]
        note = f"declined: {c['declined']}" if c["declined"] else ", ".join(flags)
        lines.append(f"    {c['name']:<{width}}  cost {c['keys']:>8}  {note}".rstrip())
    return lines


def _default_passes(q, k, v, params, rpb: bool):
    """Whether libnattn's own rules (which depend on how the boxes fit the problem) run the
    forward and the backward on the Hopper family: a (forward, backward) pair of bools, or
    None where this build cannot say."""
    from ..backends import BACKENDS
    try:
        answers = tuple(BACKENDS["cuda"].sm90_preferred(q, k, v, params, rpb=rpb, backward=b) for b in (False, True))
    except ValueError:
        return None
    return None if None in answers else tuple(bool(a) for a in answers)


def dry_run(problems, dtype_name: str) -> str:
    dtype = DTYPES[dtype_name or "bf16"]  # the GPU default
    out = []
    for p in problems:
        out.append(f"{p.name}: spatial {p.spatial}, window {p.kernel}, stride {p.stride}, dilation {p.dilation}, "
                   f"heads {p.heads}, head dim {p.dim}, {dtype_name or 'bf16'}")
        out += family_lines(p, dtype)
    return "\n".join(out)


def optimize(problems, args) -> str:
    """``--optimize``: time the cuda backend's default choice beside every Hopper tile pair
    that takes each problem and, where its query tiles do not fill the GPU, split-KV, each
    named per call (``backend="cuda:<pair>"``, ``"cuda:kv=2"``; forward, or forward +
    backward with ``--backprop``, where the KV-parallel dQ of the default pair is timed too),
    and print the best with its speedup, then a table. Needs a 9.0 GPU."""
    from .._cuda import kernel_table
    from ..backends import BACKENDS
    from ..backends.cuda import split_kv_configurations
    from .rows import LAYOUTS, NattnRow
    from .run import time_row

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("--optimize times the Hopper family's configurations: it needs a compute capability 9.0 GPU")
    device, dtype = torch.device("cuda"), DTYPES[args.dtype or "bf16"]
    out, table = [], []
    key = "fwd_bwd_ms" if args.backprop else "fwd_ms"
    for p in problems:
        q = torch.empty(p.batch, *p.spatial, p.heads, p.dim, dtype=dtype, device="meta")
        k = torch.empty(p.batch, *p.spatial, p.heads_kv or p.heads, p.dim, dtype=dtype, device="meta")
        v = torch.empty(p.batch, *p.spatial, p.heads_kv or p.heads, p.dim_v or p.dim, dtype=dtype, device="meta")
        params = normalize(q, k, v, p.na_dim, p.kernel, p.stride, p.dilation, p.causal, None)
        try:
            unverified = kernel_table.unverified_tile_names()  # built, not yet run on a GPU
            configs = [c for c in BACKENDS["cuda"].sm90_configs(q, k, v, params)
                       if not c["declined"] and c["name"] not in unverified]
        except RuntimeError as e:  # not a Hopper problem (head dims, dtype): nothing to search
            out.append(f"{p.name}: no sm90 configurations ({e})")
            continue
        names = ["cuda"] + [f"cuda:{c['name']}" for c in configs]
        names += [f"cuda:{c}" for c in split_kv_configurations(q.shape, device)]
        if args.backprop:
            names.append("cuda:dq=atomic")
        out.append(f"{p.name}: the default and {len(names) - 1} configuration(s)")
        timed = []
        for name in names:
            row = NattnRow(name, getattr(args, "layout", LAYOUTS[0]))
            r = time_row(row, p, device, dtype, args.backprop, 1, args.cuda_graphs)
            timed.append((name, r.get(key), r.get("note", "")))
        default = timed[0][1]
        best = min((t for t in timed if t[1] is not None), key=lambda t: t[1], default=None)
        for name, ms, note in timed:
            flags = [f for f, on in (("default", name == "cuda"), ("best", best and name == best[0])) if on]
            value = f"{ms:.3f} ms" if ms is not None else f"failed: {note}"
            out.append(f"  {name:<24} {value} {' '.join(flags)}".rstrip())
        if best is not None and default:
            out.append(f"  best {best[0]}: {default / best[1]:.2f}x the default")
            table.append(f"| {p.name} | {default:.3f} | {best[0]} | {best[1]:.3f} | {default / best[1]:.2f} |")
    if table:
        what = "forward + backward" if args.backprop else "forward"
        out += ["", f"| problem | default ms ({what}) | best configuration | best ms | speedup |",
                "|---|---|---|---|---|"] + table
    return "\n".join(out)
