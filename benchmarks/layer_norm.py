"""libnattn's forward LayerNorm (nattn/nn/fast_norm.py) beside torch's kernel on the NA models'
norm shapes (channels-last rows at batch 128, 224x224), GPU time per call and the share of
the memory floor (each element read and written once at the HBM rate given).

    python benchmarks/layer_norm.py [--hbm-tbs 4.8]
"""

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from nattn.nn import fast_norm

# (rows, channels): NAT-Tiny's four stages (56^2 .. 7^2 tokens, 64 .. 512 channels), Swin-T's first,
# NAT-Base's last two (512 and 1024 channels)
SHAPES = [(128 * 56 * 56, 64), (128 * 28 * 28, 128), (128 * 14 * 14, 256), (128 * 7 * 7, 512), (128 * 56 * 56, 96),
          (128 * 14 * 14, 512), (128 * 7 * 7, 1024)]
# (input dtype, output dtype, round): a bf16 norm; a block norm under autocast (float32 residual
# rounded to bf16 first); autocast's float32 norm of a bf16 activation
MODES = [(torch.bfloat16, torch.bfloat16, False), (torch.float32, torch.bfloat16, True),
         (torch.bfloat16, torch.float32, False)]


def torch_side(x, w, b, out_dtype, round_to_out):
    if round_to_out:
        return F.layer_norm(x.to(out_dtype), x.shape[-1:], w.to(out_dtype), b.to(out_dtype))
    if out_dtype == torch.float32:
        return F.layer_norm(x.float(), x.shape[-1:], w, b)
    return F.layer_norm(x, x.shape[-1:], w.to(x.dtype), b.to(x.dtype))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="the memory rate of the floor, TB/s")
    args = ap.parse_args()
    print("| rows x channels | in -> out | torch ms | nattn ms | speed-up | nattn of floor |")
    print("|---|---|---|---|---|---|")
    with torch.no_grad():
        for rows, c in SHAPES:
            for x_dt, out_dt, rnd in MODES:
                x = torch.randn(rows, c, device="cuda").to(x_dt)
                w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
                if not rnd and out_dt == x_dt:  # torch's norm takes parameters of the input's dtype
                    w, b = w.to(x_dt), b.to(x_dt)
                ours = do_bench(lambda: fast_norm.layer_norm(x, w, b, 1e-5, out_dt, rnd), warmup=10, rep=50)
                theirs = do_bench(lambda: torch_side(x, w, b, out_dt, rnd), warmup=10, rep=50)
                floor = rows * c * (x.element_size() + torch.empty(0, dtype=out_dt).element_size()) / args.hbm_tbs / 1e9
                name = f"{str(x_dt)[6:]} -> {str(out_dt)[6:]}{' (rounded first)' if rnd else ''}"
                print(f"| {rows} x {c} | {name} | {theirs:.4f} | {ours:.4f} | {theirs / ours:.1f}x | "
                      f"{floor / ours:.0%} |", flush=True)


if __name__ == "__main__":
    main()
