"""LayerNorm forward on libnattn's kernel for calls that need no gradient (inference).

torch's LayerNorm kernel gives every row a block of 128 threads: over the NA models'
channels-last activations (64-512 channels, 6k-400k rows a layer) it ran at about 1/12 of the
memory rate, a third of an eager dinat_tiny inference step on the H200 (docs/models.md).
libnattn's kernel (csrc/include/nattn/norm/layer_norm.cuh) holds a row in 4-32 lanes of a
warp and reads and writes each element once, with float32 statistics as torch's.

``add_layer_norm`` also adds a branch to ``x`` first and returns the sum with the norm (a
block's residual add and the next pre-norm in one pass: models/_common.py).

Either takes a call or returns None, and the caller then runs torch's norm: not a CUDA
tensor, a gradient to record, anything that must see torch's op (torch.compile, whose
inductor writes its own norms; torch.jit.trace; dispatch and function modes such as fake
tensors and FLOP counters; tensor subclasses), rows
whose channels are not packed or not 16-byte aligned, channels outside 8..1024 or not a
multiple of 8, no library, or ``NATTN_LAYER_NORM_KERNEL=0`` in the environment.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional, Tuple

import torch

from .. import _buffers
from .._cuda import kernel_table, library
from .._eager import eager_ok, records_graph
from ..backends.cuda import _raw_stream  # the stream's handle without a Stream object

_CODES = {torch.float32: kernel_table.DTYPES.index("float32"), torch.float16: kernel_table.DTYPES.index("float16"),
          torch.bfloat16: kernel_table.DTYPES.index("bfloat16")}
_ERR_LEN = 512
_ERR = ctypes.create_string_buffer(_ERR_LEN)  # written only when a call fails


def enabled() -> bool:
    """Whether the kernel may run (``NATTN_LAYER_NORM_KERNEL=0`` turns it off; read per call)."""
    return os.environ.get("NATTN_LAYER_NORM_KERNEL", "1") != "0"


def fused_add_enabled() -> bool:
    """Whether ``add_layer_norm`` may run (``NATTN_FUSED_ADD_NORM=0`` turns it off, leaving the
    add to torch and the norm to ``layer_norm``; read per call)."""
    return os.environ.get("NATTN_FUSED_ADD_NORM", "1") != "0"


def _param_ok(t: torch.Tensor, x: torch.Tensor, dtype: torch.dtype, channels: int) -> bool:
    return (t.dtype == dtype and t.shape == (channels,) and t.stride() == (1,) and t.device == x.device
            and t.data_ptr() % 16 == 0)


def _row_stride(x: torch.Tensor, channels: int) -> Optional[int]:
    """Elements between x's rows over its last axis (packed channels), or None when its rows
    are not one stride apart."""
    if x.is_contiguous():
        return channels
    try:
        rows = x.view(-1, channels)
    except RuntimeError:
        return None
    if rows.stride(1) != 1:
        return None
    return rows.stride(0) if rows.shape[0] > 1 else channels


def _takes(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
           out_dtype: torch.dtype, entry: str, branch: Optional[torch.Tensor] = None):
    """(library, row stride of x, parameters' dtype) when libnattn's kernel ``entry`` takes a
    norm of ``x`` (plus ``branch``) written as ``out_dtype``, else None (see the module's
    docstring). Host cost matters here (an eager inference step calls it once per norm),
    hence the cheap tests first."""
    x_code, out_code = _CODES.get(x.dtype), _CODES.get(out_dtype)
    # nothing may watch the call (compiling, tracing, dispatch / function modes such as fake
    # tensors or FLOP counters, tensor subclasses: they must see torch's op) or need its graph
    if (x_code is None or out_code is None or not x.is_cuda or x.dim() < 1 or not eager_ok(x, weight, bias, branch)
            or records_graph(x, weight, bias, branch) or not enabled()):
        return None
    channels = x.shape[-1]
    lib = library.load()
    if (getattr(lib, entry, None) is None or channels % 8 or not 8 <= channels <= lib.layer_norm_max_channels
            or x.data_ptr() % 16):
        return None
    w_dtype = weight.dtype if weight is not None else bias.dtype if bias is not None else torch.float32
    if w_dtype not in _CODES or any(t is not None and not _param_ok(t, x, w_dtype, channels) for t in (weight, bias)):
        return None
    row_stride = _row_stride(x, channels)
    if row_stride is None or row_stride < channels or (row_stride * x.element_size()) % 16:
        return None
    return lib, row_stride, w_dtype


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
               out_dtype: Optional[torch.dtype] = None, round_to_out: bool = False) -> Optional[torch.Tensor]:
    """LayerNorm of ``x`` over its last axis (``weight`` and ``bias`` of that size, or None),
    written as ``out_dtype`` (default ``x.dtype``), or None where the kernel does not take the
    call (see the module's docstring). ``round_to_out``: ``x``, ``weight`` and ``bias`` are
    first rounded to ``out_dtype``, as ``F.layer_norm(x.to(dt), ..., weight.to(dt), bias.to(dt))``
    computes (the models' block norms under autocast)."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    took = _takes(x, weight, bias, out_dtype, "layer_norm")
    if took is None:
        return None
    lib, row_stride, w_dtype = took
    out = _buffers.empty(x.shape, dtype=out_dtype, device=x.device)
    channels = x.shape[-1]
    rows = x.numel() // channels
    if not rows:
        return out
    device = x.device.index or 0
    rc = lib.layer_norm(device, x.data_ptr(), row_stride, _CODES[x.dtype], out.data_ptr(), _CODES[out_dtype],
                        0 if weight is None else weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                        _CODES[w_dtype], rows, channels, float(eps), int(round_to_out), _raw_stream(device), _ERR,
                        _ERR_LEN)
    if rc:
        raise RuntimeError(_ERR.value.decode(errors="replace"))
    return out


def add_layer_norm(x: torch.Tensor, branch: torch.Tensor, weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float, out_dtype: Optional[torch.dtype] = None,
                   round_to_out: bool = False) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(s, layer_norm(s, ...))`` with ``s = x + branch`` in one kernel (a block's residual add
    and the next pre-norm), or None where the kernel does not take the call. ``s`` is what
    torch's ``x + branch`` gives (the two dtypes' promotion, float32 arithmetic, one rounding),
    packed; the norm's arguments are ``layer_norm``'s (``out_dtype`` defaults to ``s``'s).
    Both tensors must have the same shape. ``NATTN_FUSED_ADD_NORM=0`` declines every call."""
    s_dtype = torch.promote_types(x.dtype, branch.dtype)
    out_dtype = s_dtype if out_dtype is None else out_dtype
    if (not fused_add_enabled() or branch.shape != x.shape or s_dtype not in _CODES
            or _CODES.get(branch.dtype) is None or branch.device != x.device):
        return None
    took = _takes(x, weight, bias, out_dtype, "add_layer_norm", branch)  # first: nothing watches the call
    if took is None:
        return None
    lib, row_stride, w_dtype = took
    channels = x.shape[-1]
    r_stride = _row_stride(branch, channels)
    if branch.data_ptr() % 16 or r_stride is None or r_stride < channels or (r_stride * branch.element_size()) % 16:
        return None
    s = _buffers.empty(x.shape, dtype=s_dtype, device=x.device)
    out = _buffers.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = x.numel() // channels
    if not rows:
        return s, out
    device = x.device.index or 0
    rc = lib.add_layer_norm(device, x.data_ptr(), row_stride, _CODES[x.dtype], branch.data_ptr(), r_stride,
                            _CODES[branch.dtype], s.data_ptr(), _CODES[s_dtype], out.data_ptr(), _CODES[out_dtype],
                            0 if weight is None else weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                            _CODES[w_dtype], rows, channels, float(eps), int(round_to_out), _raw_stream(device),
                            _ERR, _ERR_LEN)
    if rc:
        raise RuntimeError(_ERR.value.decode(errors="replace"))
    return s, out
