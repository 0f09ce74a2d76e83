"""Why is flex slow on mid-2d-k13 in the bench? Time compiled flex on it fresh, then after a
call at another shape (what verify-on-a-smaller-copy does), with dynamic=None and False.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/flex_shape_probe.py
"""

import torch
import triton
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import nattn


def na_mask(x, y, k):
    def mask_mod(b, h, q, kv):
        qx, qy, kx, ky = q // y, q % y, kv // y, kv % y
        cx = qx.clamp(k // 2, x - 1 - k // 2)
        cy = qy.clamp(k // 2, y - 1 - k // 2)
        return ((kx - cx).abs() <= k // 2) & ((ky - cy).abs() <= k // 2)
    return create_block_mask(mask_mod, None, None, x * y, x * y, device="cuda")


def rnd(*s):
    return torch.randn(*s, device="cuda", dtype=torch.bfloat16)


def main():
    b, h, x, d, k = 4, 8, 128, 64, 13
    big = [rnd(b, h, x * x, d) for _ in range(3)]
    small = [rnd(1, 1, 64 * 64, d) for _ in range(3)]
    bm_big, bm_small = na_mask(x, x, k), na_mask(64, 64, k)
    for dyn in (False, None):
        f = torch.compile(flex_attention, dynamic=dyn)
        f(*big, block_mask=bm_big)
        t_fresh = triton.testing.do_bench(lambda: f(*big, block_mask=bm_big))
        f(*small, block_mask=bm_small)
        f(*big, block_mask=bm_big)
        t_after = triton.testing.do_bench(lambda: f(*big, block_mask=bm_big))
        print(f"row-major flex dynamic={dyn}: fresh {t_fresh:.3f} ms, after another shape {t_after:.3f} ms", flush=True)
    qs = [rnd(b, x, x, h, d) for _ in range(3)]
    nattn.na2d(*qs, k, backend="flex")
    print(f"nattn flex fresh: {triton.testing.do_bench(lambda: nattn.na2d(*qs, k, backend='flex')):.3f} ms", flush=True)
    sm = [rnd(1, 64, 64, 1, d) for _ in range(3)]
    nattn.na2d(*sm, k, backend="flex")
    print(f"nattn flex after smaller: {triton.testing.do_bench(lambda: nattn.na2d(*qs, k, backend='flex')):.3f} ms", flush=True)
    print(f"nattn cuda: {triton.testing.do_bench(lambda: nattn.na2d(*qs, k, backend='cuda')):.3f} ms", flush=True)
    g = [t.detach().requires_grad_() for t in qs]
    def fb(backend):
        out = nattn.na2d(*g, k, backend=backend)
        out.backward(torch.ones_like(out))
    fb("flex")
    print(f"nattn flex fwd+bwd: {triton.testing.do_bench(lambda: fb('flex')):.3f} ms", flush=True)
    fb("cuda")
    print(f"nattn cuda fwd+bwd: {triton.testing.do_bench(lambda: fb('cuda')):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
