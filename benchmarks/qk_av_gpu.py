"""The unfused ops (na2d_qk, softmax, na2d_av) beside the fused op on a DiNAT layer, with
the time to write the logits once (the unfused pair's memory floor: it must write and read
B * N * H * W logits). bf16, ms (CUDA events, 20 repetitions after a warm-up), forward and
forward + backward, with libnattn's window kernels and with the plain PyTorch path.

    python benchmarks/qk_av_gpu.py
"""

import torch

import nattn
from nattn import qk_av
from nattn.bench.timing import window_ms


def timed(fn, reps=20):
    fn()  # warm-up
    return window_ms(fn, torch.device("cuda"), reps)


def main():
    b, n, h, d, kernel = 32, 56, 4, 32, 7
    q, k, v = (torch.randn(b, n, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn_like(q)

    def unfused():
        w = nattn.na2d_qk(q * d ** -0.5, k, kernel).float().softmax(-1).to(q.dtype)
        return nattn.na2d_av(w, v, kernel)

    def forward(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    def training(fn):
        return lambda: torch.autograd.grad(fn(), (q, k, v), go)

    fused = lambda: nattn.na2d(q, k, v, kernel)  # noqa: E731
    logits = torch.empty(b, n, n, h, kernel * kernel, device="cuda", dtype=torch.bfloat16)
    print(f"DiNAT {n}x{n} k{kernel} B{b} H{h} D{d} bf16, ms (forward / forward + backward); "
          f"writing the logits once {timed(lambda: logits.fill_(1.0)):.3f}")
    print(f"  fused                          {timed(forward(fused)):.3f} / {timed(training(fused)):.3f}")
    for use, name in ((True, "window kernels"), (False, "plain PyTorch")):
        qk_av.USE_KERNELS = use
        print(f"  unfused qk + softmax + av, {name:15s} {timed(forward(unfused)):.3f} / "
              f"{timed(training(unfused)):.3f}")
    qk_av.USE_KERNELS = True


if __name__ == "__main__":
    main()
