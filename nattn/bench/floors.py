"""The FLOP and memory floors of a problem, from rates measured on this machine at the start
of a run.

- copy rate: a large device-to-device copy, counting bytes read plus bytes written;
- dense rate: torch's dense SDPA (flash/cuDNN on a GPU) on a large square problem.

Per problem, the *FLOP floor* is the dense kernel's throughput applied to the NA work:
the dense SDPA time of that same problem times ``na_flops / dense_flops`` (``W / N``), or
``na_flops / dense rate`` when the dense row was not measured. The *memory floor* reads
q, k, v and writes the output once at the copy rate (forward+backward: also reads
out and dO and writes dq, dk, dv). The floor is the larger of the two.
Forward+backward work is counted as 3.5x the forward (backward: 5 products instead of 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .problems import Problem
from .timing import median_ms

BWD_FACTOR = 3.5  # forward+backward matrix-product work over forward work


@dataclass
class Rates:
    copy_bytes_per_s: float
    dense_flops_per_s: float
    device: str

    def to_dict(self):
        return {"copy_TBps": self.copy_bytes_per_s / 1e12, "dense_TFLOPps": self.dense_flops_per_s / 1e12,
                "device": self.device}


def measure_rates(device: torch.device, dtype: torch.dtype) -> Rates:
    big = device.type == "cuda"
    n = (1 << 29) if big else (1 << 24)  # 1 GiB / 64 MiB of float16
    src = torch.randn(n, device=device, dtype=torch.float16)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), [()], device, target_ms=100)
    copy = 2 * src.numel() * src.element_size() / (ms * 1e-3)
    src = dst = None  # free the 2 GiB before the dense measurement
    b, h, s, d = (1, 16, 8192, 128) if big else (1, 2, 1024, 64)
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v), [()], device, target_ms=100)
    dense = 4 * b * h * s * s * d / (ms * 1e-3)
    name = torch.cuda.get_device_name(device) if big else "cpu"
    return Rates(copy, dense, name)


@dataclass
class Floors:
    flop_ms: float
    memory_ms: float

    @property
    def ms(self) -> float:
        return max(self.flop_ms, self.memory_ms)

    def to_dict(self):
        return {"flop_ms": self.flop_ms, "memory_ms": self.memory_ms, "floor_ms": self.ms}


def floors(p: Problem, rates: Rates, elem_bytes: int, dense_ms: Optional[float], backward: bool) -> Floors:
    ins, outs = p.io_elements()
    nbytes = (ins + outs) * elem_bytes
    work = p.na_flops() * (BWD_FACTOR if backward else 1.0)
    if backward:
        nbytes += (2 * ins + 2 * outs) * elem_bytes  # read q,k,v,out,dO; write dq,dk,dv
    if dense_ms is not None:
        flop_ms = dense_ms * p.na_flops() / p.dense_flops()
    else:
        flop_ms = work / rates.dense_flops_per_s * 1e3
    return Floors(flop_ms, nbytes / rates.copy_bytes_per_s * 1e3)
