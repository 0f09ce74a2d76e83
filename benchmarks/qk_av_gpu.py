"""The unfused ops (na2d_qk, softmax, na2d_av) beside the fused op on a DiNAT layer, with
the time to write the logits once (the unfused pair's memory floor: it must write and read
B * N * H * W logits). bf16, forward, ms (CUDA events, 20 repetitions after a warm-up).

    python benchmarks/qk_av_gpu.py
"""

import torch

import nattn


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    b, n, h, d, kernel = 32, 56, 4, 32, 7
    q, k, v = (torch.randn(b, n, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def unfused():
        with torch.no_grad():
            w = nattn.na2d_qk(q * d ** -0.5, k, kernel).float().softmax(-1).to(q.dtype)
            return nattn.na2d_av(w, v, kernel)

    def fused():
        with torch.no_grad():
            return nattn.na2d(q, k, v, kernel)

    logits = torch.empty(b, n, n, h, kernel * kernel, device="cuda", dtype=torch.bfloat16)
    t_u, t_f, t_w = timed(unfused), timed(fused), timed(lambda: logits.fill_(1.0))
    print(f"DiNAT {n}x{n} k{kernel} B{b} H{h} D{d} bf16 forward: unfused qk + softmax + av {t_u:.3f} ms, "
          f"fused {t_f:.3f} ms, writing the logits once {t_w:.3f} ms")


if __name__ == "__main__":
    main()
