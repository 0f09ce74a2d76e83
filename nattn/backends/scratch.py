"""Scratch buffers kept between calls, per thread, for the temporaries of CPU backends.

A CPU tensor of a few MiB or more is usually fresh memory: glibc maps large blocks on
demand and returns them to the system when they are freed, so each new one costs a page
fault per 4 KiB page on first touch. The tiled backend's backward used to allocate ~50-120
MiB of such temporaries a call (its chunks' gathered rows, scores and products), and the
faults took up to half of its time (PERF.md, fortieth session). Here a named buffer lives
on in its thread and is handed out again, as a view of the shape asked for, on the next
call: the same pages, already mapped.

Buffers are kept only on the CPU, outside functorch's transforms, and up to ``LIMIT_BYTES``
per thread (other requests get plain ``torch.empty``); ``release()`` drops the calling
thread's. A name is one live
temporary at a time: a caller must be done with ``take(name, ...)``'s result before it
takes the same name again, and never return it (or a view of it) to its own caller.
"""

from __future__ import annotations

import math
import threading
from typing import Dict, Tuple

import torch

# Bytes of scratch a thread keeps between calls (beyond it, requests are plain allocations).
LIMIT_BYTES = 64 << 20


class _Buffers(threading.local):
    def __init__(self):
        self.kept: Dict[Tuple[str, torch.dtype], torch.Tensor] = {}
        self.bytes = 0


_local = _Buffers()
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def take(name: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized ``shape`` tensor: on the CPU a view of the thread's buffer ``name``
    (grown when too small, while the thread's total stays within LIMIT_BYTES)."""
    if torch.device(device).type != "cpu" or _functorch_active():
        # (functorch's transforms forbid writing into a tensor created outside them)
        return torch.empty(shape, dtype=dtype, device=device)
    n = math.prod(shape)
    key = (name, dtype)
    buf = _local.kept.get(key)
    if buf is None or buf.numel() < n:
        held = 0 if buf is None else buf.numel() * buf.element_size()
        need = n * dtype.itemsize
        if _local.bytes - held + need > LIMIT_BYTES:
            return torch.empty(shape, dtype=dtype, device=device)
        buf = torch.empty(n, dtype=dtype, device=device)
        _local.kept[key] = buf
        _local.bytes += need - held
    return buf[:n].view(shape)


def release() -> None:
    """Drop the calling thread's buffers (their memory goes back to the allocator)."""
    _local.kept.clear()
    _local.bytes = 0


def held_bytes() -> int:
    """Bytes of scratch the calling thread keeps."""
    return _local.bytes
