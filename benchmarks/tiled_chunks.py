"""The tiled backend's chunk index tensors (backends/tiled_plan.py): the time to build every
chunk of a problem (its kept lists cleared first), best of three, CPU. Problems whose chunks
pass tiled_plan.CACHED_BYTES rebuild them on every call, so this is part of their forward.

    python benchmarks/tiled_chunks.py            # the table of docs/dev/PERF.md
    python benchmarks/tiled_chunks.py --score-by-score   # without the box patterns
"""

import argparse
import time

import torch

from nattn.backends import tiled_plan

PROBLEMS = [((56, 56), (7, 7), False), ((56, 56), (7, 7), True), ((16, 32, 32), (5, 7, 7), False),
            ((16, 32, 32), (5, 7, 7), True), ((128, 128), (13, 13), True), ((128, 128), (13, 13), False)]


def build_ms(lengths, kernel, rpb, heads_x_batch: int = 8) -> tuple:
    nd = len(lengths)
    boxes = tiled_plan.Boxes(lengths, kernel, (1,) * nd, (False,) * nd, rpb, torch.device("cpu"))
    per = max(1, tiled_plan.CHUNK_SCORES // (boxes.rows * boxes.keys * heads_x_batch))

    def build():
        tiled_plan.KEPT.clear()
        return [boxes._chunk(s, min(s + per, boxes.count), False) for s in range(0, boxes.count, per)]

    build()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        build()
        best = min(best, time.perf_counter() - start)
    return boxes, best * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--score-by-score", action="store_true", help="build without the box patterns")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.score_by_score:
        tiled_plan.PATTERN_SCORES = 0
    print("| problem | boxes x rows x keys | build ms |\n|---|---|---|")
    for lengths, kernel, rpb in PROBLEMS:
        boxes, ms = build_ms(lengths, kernel, rpb)
        name = f"{'x'.join(map(str, lengths))} {'x'.join(map(str, kernel))}{' RPB' if rpb else ''}"
        print(f"| {name} | {boxes.count} x {boxes.rows} x {boxes.keys} | {ms:.1f} |")


if __name__ == "__main__":
    main()
