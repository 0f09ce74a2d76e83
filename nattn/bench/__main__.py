"""``python -m nattn.bench`` / ``nattn-bench``: see ``--help`` and docs/performance.md."""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from . import report
    from .cli import parse
    from .plot import plot
    from .run import run

    args, problems = parse(argv)
    if args.suite == "models":
        import torch

        from .models import DEFAULT_MODELS, run_models
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        models = [m.strip() for m in args.models.split(",")] if args.models else list(DEFAULT_MODELS)
        batch = args.batch or (128 if device.type == "cuda" else 2)
        echo = None if args.no_progress else (lambda row: print(row, file=sys.stderr, flush=True))
        print(run_models(models, args.modes, batch, args.size, args.iters, device, args.plot, args.frames, echo,
                         args.fast_norm))
        return 0
    if args.dry_run:
        from .configs import dry_run
        print(dry_run(problems, args.dtype))
        return 0
    if args.optimize:
        from .configs import optimize
        print(optimize(problems, args))
        return 0
    if args.config:  # read by libnattn on every call
        import os
        os.environ["NATTN_SM90_TILE"] = args.config
    outcome = run(args, problems)
    if args.markdown:
        print()
        print(report.markdown_summary(outcome["results"], args.backprop))
    if args.json:
        report.write_json(args.json, outcome)
    if args.csv:
        report.write_csv(args.csv, outcome["results"])
    if args.plot:
        print(plot(outcome["results"], args.plot, args.backprop))
    return 1 if outcome["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
