"""One benchmark run: measure this machine's rates, then per problem verify every NA row on
a smaller copy and time every row, forward (and forward+backward), against the floors."""

from __future__ import annotations

import gc
import time
from typing import List

import torch

from . import gpu_state, report
from .floors import BWD_FACTOR, floors, measure_rates
from .problems import Problem, cpu_copy, shrink
from .progress import Progress
from .rows import LAYOUTS, DenseRow, FlexPeerRow, NattnRow, Row, make_inputs
from .timing import median_ms, rotation_count
from .verify import check

VERIFY_TOKENS = {"cuda": 4096, "cpu": 256}


def _short(e: Exception) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:140]}"


def _reasons_text(e: Exception) -> str:
    """A NoBackendError's reasons on one line (its first line only says that none fits)."""
    lines = [l.strip() for l in str(e).strip().splitlines()]
    return "; ".join(lines[1:])[:200] if len(lines) > 1 else _short(e)


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _grad_targets(inputs):
    return [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]


def _compile_counters():
    """(graphs compiled, graph breaks) so far: a graph break inside flex means eager flex."""
    try:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    except Exception:  # pragma: no cover - dynamo unavailable
        return 0, 0


def time_row(row: Row, p: Problem, device, dtype, backprop: bool, n_sets: int, graphs: bool = False) -> dict:
    """Forward (and forward+backward) medians of one row; errors are recorded, not raised.
    ``graphs``: time CUDA-graph replays (the GPU's time without the host's)."""
    result = {}
    graphs0, breaks0 = _compile_counters()
    sets, grads = [], []
    try:
        for s in range(n_sets):
            t = make_inputs(p, device, dtype, requires_grad=backprop, seed=100 + s)
            sets.append(row.prepare(p, t))
        with torch.no_grad():
            out = row.forward(*sets[0])
        if backprop:
            g = torch.Generator(device=device).manual_seed(5)
            grads = [torch.randn(out.shape, generator=g, device=device, dtype=torch.float32).to(out.dtype)
                     for _ in range(n_sets)]
        del out

        def fwd(*inputs):
            with torch.no_grad():
                row.forward(*inputs)

        result["fwd_ms"] = median_ms(fwd, sets, device, graphs=graphs)
        if backprop:
            def fwd_bwd(i, *inputs):
                out = row.forward(*inputs)
                torch.autograd.grad(out, _grad_targets(inputs), grads[i])

            indexed = [(i,) + tuple(s) for i, s in enumerate(sets)]
            result["fwd_bwd_ms"] = median_ms(fwd_bwd, indexed, device, graphs=graphs)
    except Exception as e:  # OOM, unsupported on this machine, compile failure: shown in the row
        result["error"] = True
        result["note"] = _short(e)
    finally:
        sets.clear()
        grads.clear()
        _free(device)
    graphs1, breaks1 = _compile_counters()
    result["compiled_graphs"], result["graph_breaks"] = graphs1 - graphs0, breaks1 - breaks0
    if result["graph_breaks"] and "note" not in result:
        result["note"] = f"{result['graph_breaks']} graph break(s): part of it ran eagerly"
    return result


def build_rows(args, device) -> List[Row]:
    layout = getattr(args, "layout", LAYOUTS[0])
    rows: List[Row] = [NattnRow(None, layout)]
    rows += [NattnRow(name, layout) for name in args.backend]
    if not args.no_peers:
        rows += [DenseRow(), FlexPeerRow()]
    return rows


def run_problem(p: Problem, rows: List[Row], rates, device, dtype, backprop: bool, graphs: bool = False) -> dict:
    small = shrink(p, VERIFY_TOKENS[device.type], "(verify)")
    res = {"name": p.name, "describe": p.describe(), "problem": p.to_dict(), "backprop": backprop,
           "verify_describe": small.describe(), "rows": []}
    t_small = make_inputs(small, device, dtype, False, seed=7)
    ref = None
    elem = torch.empty((), dtype=dtype).element_size()
    ins, outs = p.io_elements()
    n_sets = rotation_count((ins + outs) * elem, device)
    for row in rows:
        entry = {"name": row.name}
        reason = row.reason(p, device, backward=False)
        if reason:
            entry["note"] = f"n/a: {reason}"
            res["rows"].append(entry)
            continue
        bwd_reason = row.reason(p, device, backward=True) if backprop else None
        if isinstance(row, NattnRow):
            try:
                entry["backend"] = row.resolve(p, make_inputs(small, device, dtype, False, seed=1))
            except Exception as e:
                entry.update(note=f"n/a: {_reasons_text(e)}")
                res["rows"].append(entry)
                continue
            if backprop and not bwd_reason:
                try:
                    row.resolve(p, make_inputs(small, device, dtype, True, seed=1))
                except Exception as e:
                    bwd_reason = _reasons_text(e)
        if row.is_na:
            from .verify import reference_output

            if ref is None:
                ref = reference_output(small, t_small)
            entry["check"] = check(row, small, device, dtype, ref=ref, inputs=t_small).to_dict()
        entry.update(time_row(row, p, device, dtype, backprop and not bwd_reason, n_sets, graphs))
        if bwd_reason and "note" not in entry:
            entry["note"] = f"fwd+bwd n/a: {bwd_reason}"
        res["rows"].append(entry)
    dense = next((r for r in res["rows"] if r["name"] == DenseRow.name), {})
    res["floors"] = {"fwd": floors(p, rates, elem, dense.get("fwd_ms"), False).to_dict()}
    if backprop:
        res["floors"]["fwd_bwd"] = floors(p, rates, elem, dense.get("fwd_bwd_ms"), True).to_dict()
    for entry in res["rows"]:
        work = p.dense_flops() if entry["name"] == DenseRow.name else p.na_flops()
        for key, factor, fl in (("fwd", 1.0, "fwd"), ("fwd_bwd", BWD_FACTOR, "fwd_bwd")):
            ms = entry.get(f"{key}_ms")
            if ms:
                entry[f"{key}_tflops"] = work * factor / (ms * 1e-3) / 1e12
                entry[f"{key}_x_floor"] = ms / res["floors"][fl]["floor_ms"]
    return res


def _configure_compile():
    """Many problems compile flex many times; raise dynamo's per-function recompile limit."""
    try:
        import torch._dynamo

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    except Exception:  # pragma: no cover - compile is optional for the CPU path
        pass


def run(args, problems: List[Problem]) -> dict:
    import warnings

    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    want_cuda = args.device in (None, "cuda")
    cuda = want_cuda and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    color = report.use_color()
    if args.device == "cuda" and not cuda:
        print("No CUDA device is available: running the CPU path instead.")
    if not cuda:
        print("CPU run: small problems only (nattn on the CPU backends, dense SDPA, eager flex forward); "
              "these numbers say nothing about GPU speed.")
        problems = [p if p.tokens * p.window <= 512 * 125 else cpu_copy(p) for p in problems]
    from .cli import DTYPES

    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    if getattr(args, "tf32", False):
        torch.set_float32_matmul_precision("high")
    if cuda:
        _configure_compile()
    rates = measure_rates(device, dtype)
    header = (f"nattn.bench on {rates.device}, torch {torch.__version__}, {str(dtype).replace('torch.', '')}"
              f"{' (TF32 on)' if dtype == torch.float32 and torch.get_float32_matmul_precision() != 'highest' else ''}: "
              f"copy {rates.copy_bytes_per_s / 1e12:.2f} TB/s, dense SDPA {rates.dense_flops_per_s / 1e12:.3g} TFLOP/s")
    print(header, flush=True)
    state_before = gpu_state.read(device) if cuda else None
    rows = build_rows(args, device)
    results = []
    start = time.perf_counter()
    bar = Progress(len(problems), enabled=not args.no_progress)
    for p in problems:
        bar.step(p.name)
        if args.time_budget and time.perf_counter() - start > args.time_budget:
            res = {"name": p.name, "describe": p.describe(), "problem": p.to_dict(),
                   "backprop": args.backprop, "skipped": f"time budget of {args.time_budget:.0f} s spent"}
        else:
            res = run_problem(p, rows, rates, device, dtype, args.backprop, getattr(args, "cuda_graphs", False))
        results.append(res)
        bar.write(report.problem_block(res, color))
        bar.advance()
    bar.close()
    state_after = gpu_state.read(device) if cuda else None
    if state_after is not None:  # sustained load can throttle the clock (power, heat)
        before = f"at the start {gpu_state.describe(state_before)}; " if state_before else ""
        print(f"GPU state: {before}at the end {gpu_state.describe(state_after)}")
    mismatches = [(r["name"], row["name"]) for r in results for row in r.get("rows", [])
                  if (row.get("check") or {}).get("ok") is False]
    if mismatches:
        text = "MISMATCH against the reference: " + ", ".join(f"{a} / {b}" for a, b in mismatches)
        print(report._paint(text, report.RED, color))
    return {"header": header, "device": str(device), "dtype": str(dtype), "torch": torch.__version__,
            "rates": rates.to_dict(), "backprop": args.backprop, "results": results,
            "mismatches": mismatches, "seconds": time.perf_counter() - start,
            "gpu_state": {"start": state_before, "end": state_after}}
