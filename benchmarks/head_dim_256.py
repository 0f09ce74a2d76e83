"""Where a head-dim-256 forward + backward's time goes on the Hopper family (its backward's
wide passes, csrc/include/nattn/sm90/backward_wide.cuh): per kernel under torch.profiler, GPU
ms, bf16; then head dims above 128 without an instance (192: zero-padded to 256).

    python benchmarks/head_dim_256.py [--iters 10]

Side by side with flex and dense attention: ``python -m nattn.bench -i 64 64 -b 2 -n 8 -d 256
-w 33 --backprop --cuda-graphs`` (docs/dev/PERF.md, twenty-ninth session).
"""

from padded_head_dims import main

# (batch, *spatial, heads), window, D, D_v
PROBLEMS = [
    ((2, 64, 64, 8), (33, 33), 256, 256),
    ((1, 16, 32, 32, 8), (9, 15, 15), 256, 256),
    ((1, 8192, 8), (1024,), 256, 256),
    ((2, 64, 64, 8), (33, 33), 192, 192),
]


if __name__ == "__main__":
    main(PROBLEMS, __doc__)
