"""Terminal table, Markdown summary, JSON and CSV of a benchmark run."""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import List, Optional

RED, GREEN, DIM, RESET = "\033[31m", "\033[32m", "\033[2m", "\033[0m"


def use_color(stream=sys.stdout) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or (hasattr(stream, "isatty") and stream.isatty())


def _paint(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{RESET}" if color else text


def _ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _num(x: Optional[float], fmt: str) -> str:
    if x is None:
        return "-"
    return format(x, fmt) if x >= 1 else f"{x:.2g}"


def check_text(check: dict, color: bool) -> str:
    if check is None or check.get("ok") is None:
        return "-"
    if check["ok"]:
        return _paint(f"ok {check['rel_err']:.1e}", GREEN, color)
    return _paint("MISMATCH " + check.get("message", ""), RED, color)


def problem_block(res: dict, color: bool) -> str:
    lines = [f"== {res['name']}: {res['describe']}"]
    if res.get("skipped"):
        lines.append(f"   skipped: {res['skipped']}")
        return "\n".join(lines)
    lines.append(f"   verified on a smaller copy: {res['verify_describe']}")
    for key, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        f = res["floors"].get(key)
        if f:
            lines.append(f"   floor {label}: {_ms(f['floor_ms'])} ms (FLOP {_ms(f['flop_ms'])}, memory {_ms(f['memory_ms'])})")
    head = f"   {'row':<22} {'check':<16} {'fwd ms':>9} {'TFLOP/s':>8} {'x floor':>8}"
    if res["backprop"]:
        head += f" {'fwd+bwd ms':>11} {'TFLOP/s':>8} {'x floor':>8}"
    lines.append(head)
    for row in res["rows"]:
        name = row["name"] + (f" -> {row['backend']}" if row.get("backend") and row["name"].endswith("auto") else "")
        chk = check_text(row.get("check"), color)
        pad = len(chk) - len(_strip(chk))
        line = f"   {name:<22} {chk:<{16 + pad}} {_ms(row.get('fwd_ms')):>9} {_num(row.get('fwd_tflops'), '.1f'):>8} {_num(row.get('fwd_x_floor'), '.1f'):>8}"
        if res["backprop"]:
            line += f" {_ms(row.get('fwd_bwd_ms')):>11} {_num(row.get('fwd_bwd_tflops'), '.1f'):>8} {_num(row.get('fwd_bwd_x_floor'), '.1f'):>8}"
        if row.get("note"):
            line += "  " + _paint(row["note"], RED if row.get("error") else DIM, color)
        lines.append(line)
    return "\n".join(lines)


def _strip(text: str) -> str:
    for code in (RED, GREEN, DIM, RESET):
        text = text.replace(code, "")
    return text


def markdown_summary(results: List[dict], backprop: bool) -> str:
    """A markdown table, one line per problem: each row's forward (and forward+backward) time,
    then the FLOP, memory and overall floors (milliseconds)."""
    names: List[str] = []
    for res in results:
        for row in res.get("rows", []):
            if row["name"] not in names:
                names.append(row["name"])
    cols = []
    for n in names:
        cols.append((n, "fwd_ms", f"{n} fwd"))
        if backprop:
            cols.append((n, "fwd_bwd_ms", f"{n} fwd+bwd"))
    head = ["name"] + [c[2] for c in cols] + ["FLOP floor", "memory floor", "floor"]
    if backprop:
        head.append("floor fwd+bwd")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        if res.get("skipped"):
            out.append(f"| {res['name']} | skipped: {res['skipped']} |")
            continue
        by_name = {r["name"]: r for r in res["rows"]}
        cells = [res["name"]]
        for n, key, _ in cols:
            r = by_name.get(n, {})
            v = _ms(r.get(key))
            if r.get("check") and r["check"].get("ok") is False:
                v += " (MISMATCH)"
            cells.append(v)
        f = res["floors"]["fwd"]
        cells += [_ms(f["flop_ms"]), _ms(f["memory_ms"]), _ms(f["floor_ms"])]
        if backprop:
            cells.append(_ms(res["floors"]["fwd_bwd"]["floor_ms"]))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def write_json(path: str, run: dict) -> None:
    with open(path, "w") as f:
        json.dump(run, f, indent=2, default=str)


CSV_FIELDS = ["problem", "describe", "row", "backend", "check_ok", "rel_err", "fwd_ms", "fwd_tflops",
              "fwd_x_floor", "fwd_bwd_ms", "fwd_bwd_tflops", "fwd_bwd_x_floor", "floor_fwd_ms",
              "floor_fwd_bwd_ms", "note"]


def write_csv(path: str, results: List[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for res in results:
            for row in res.get("rows", []):
                chk = row.get("check") or {}
                w.writerow({
                    "problem": res["name"], "describe": res["describe"], "row": row["name"],
                    "backend": row.get("backend"), "check_ok": chk.get("ok"), "rel_err": chk.get("rel_err"),
                    "fwd_ms": row.get("fwd_ms"), "fwd_tflops": row.get("fwd_tflops"),
                    "fwd_x_floor": row.get("fwd_x_floor"), "fwd_bwd_ms": row.get("fwd_bwd_ms"),
                    "fwd_bwd_tflops": row.get("fwd_bwd_tflops"), "fwd_bwd_x_floor": row.get("fwd_bwd_x_floor"),
                    "floor_fwd_ms": res["floors"]["fwd"]["floor_ms"],
                    "floor_fwd_bwd_ms": (res["floors"].get("fwd_bwd") or {}).get("floor_ms"),
                    "note": row.get("note", ""),
                })
