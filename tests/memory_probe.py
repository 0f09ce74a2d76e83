"""Run one NA forward+backward in a fresh process and print the peak RSS growth in bytes.

Usage: python memory_probe.py X Y HEADS DIM KERNEL [BACKEND]. Used by test_memory_bound.py.
"""

import resource
import sys

import torch

import nattn


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak() -> None:
    """Restart the kernel's peak-RSS counter (VmHWM) from the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_bytes() -> int:
    # VmHWM belongs to this process image; ru_maxrss would also carry the parent's size
    # over fork+exec, which under pytest is far larger than what we measure.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main():
    x, y, heads, dim, kernel = map(int, sys.argv[1:6])
    backend = sys.argv[6] if len(sys.argv) > 6 else "reference"
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, x, y, heads, dim, requires_grad=True) for _ in range(3))
    g = torch.randn(1, x, y, heads, dim)
    # Warm up on a tiny problem so lazy imports and allocator pools are in the baseline.
    s = torch.randn(1, kernel, kernel, heads, dim, requires_grad=True)
    nattn.na2d(s, s, s, kernel, backend=backend).sum().backward()
    reset_peak()
    base = rss_bytes()
    out = nattn.na2d(q, k, v, kernel, backend=backend)
    out.backward(g)
    assert torch.isfinite(q.grad).all() and torch.isfinite(out).all()
    peak = peak_bytes()
    print(peak - base)


if __name__ == "__main__":
    main()
