"""Which backend to try first for a problem: the one place dispatch heuristics live.

Every backend still answers its own capability check; this only orders the candidates.
Numbers come from the H200 runs logged in docs/dev/PERF.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator, List, Optional, Sequence

import torch

from ..params import NAParams

# 16-bit problems with head dims > 128, or on GPUs before SM80, run the SIMT kernels. Measured on
# the H200 (third session, flex at 16-bit / TF32 speed): they win at 49 keys (DiNAT 7x7: 0.34 ms
# vs 0.49 ms flex forward); flex wins from 169 keys on (13x13 at D=64: 1.15 vs 2.16 ms) and by
# 30x at 2048+ keys. 100 splits that.
SIMT_MAX_WINDOW = 100
# float32 without TF32 runs the SIMT kernels too, and flex then runs exact fp32 matmuls, which
# are slower still. Measured on the H200 (torch 2.11, forward, ms, SIMT vs flex; PERF.md tenth
# session): 169 keys (128x128 B4 H8 D64) 5.44 vs 13.07, 245 (16x32x32, 5x7x7) 3.65 vs 13.12,
# 1024 (1-D 8192 D128) 8.91 vs 7.11, 1089 (128x128 B1 H8 D64) 8.24 vs 7.22: the ratio crosses 1
# near 850 keys.
SIMT_FP32_MAX_WINDOW = 800
# fp16/bf16 with head dims <= 128 on SM80+ run the tensor-core kernels. Measured on the
# H200 against nattn's flex backend (forward / forward+backward, ms; PERF.md, third session):
# 49 keys 0.16 / 0.70 vs 0.57 / 1.86; 169 keys (13x13) 0.45 / 2.10 vs 1.29 / 4.04; 245 keys
# (5x7x7) 0.44 / 2.00 vs 0.67 / 2.41; 567 keys (7x9x9, same grid) 0.81 / 3.84 vs 0.89 / 3.50,
# about even. Earlier runs had flex well ahead at 2048 keys (1-D: 2.9 vs 0.75 forward) and 6400
# (80x80: 59 vs 23), where its 128-wide tiles keep the tensor cores busier than 16-query warp
# boxes. 400 sits where the forward+backward ratio crosses 1 between 245 and 567 keys.
TC_MAX_WINDOW = 400
TC_DTYPES = (torch.float16, torch.bfloat16)
TC_MAX_HEAD_DIM = 128


# Whether the call being dispatched needs gradients, when the tensors cannot say: inside a
# custom op (autograd below it) a deferred choice (backends/deferred.py) sets it.
_grads_hint: "contextvars.ContextVar[Optional[bool]]" = contextvars.ContextVar("nattn_grads_hint", default=None)


@contextlib.contextmanager
def grads_hint(flag: Optional[bool]) -> Iterator[None]:
    token = _grads_hint.set(flag)
    try:
        yield
    finally:
        _grads_hint.reset(token)


def needs_grads(*tensors) -> bool:
    """Whether a call on these tensors will be differentiated (grad mode and an input that
    requires grad), unless a deferred choice says so."""
    hint = _grads_hint.get()
    if hint is not None:
        return hint
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors if t is not None)


# Head dims of the Hopper (sm90) family's instances: D == D_v, one of these (compute
# capability 9.0). Other head dims run on zero-padded copies
# (padded_hopper_head_dim).
SM90_HEAD_DIMS = (32, 64, 128, 256)


@functools.lru_cache(maxsize=None)
def _capability(index) -> tuple:
    try:
        return tuple(torch.cuda.get_device_capability(index))
    except (RuntimeError, AssertionError):  # no usable CUDA runtime: no tensor-core kernels either
        return (0, 0)


def _capability_major(index) -> int:
    return _capability(index)[0]


def _sm90_min_window(dtype_name: str, na_dim: int, backward: bool = False, head_dim: int = 0):
    """libnattn's window from which its Hopper family runs a forward at this head dim (or a
    backward; None: not in this build)."""
    from .._cuda import library
    lib = library.load()
    if lib is None or ("sm90", dtype_name, na_dim) not in lib.kernels:
        return None
    if backward:
        return lib.sm90_min_window_backward_head.get((na_dim, head_dim), lib.sm90_min_window_backward.get(na_dim))
    return lib.sm90_min_window_head.get((na_dim, head_dim), lib.sm90_min_window.get(na_dim))


def _sm90_has_backward(dtype_name: str, na_dim: int, head_dim: int) -> bool:
    from .._cuda import library
    lib = library.load()
    return lib is not None and (dtype_name, na_dim, head_dim) in lib.sm90_backward


def _native_hopper_dims(q, v) -> bool:
    """D == D_v, one of the Hopper instances' head dims (SM90_HEAD_DIMS)."""
    dim_v = v.shape[-1] if v is not None else q.shape[-1]
    return q.shape[-1] == dim_v and dim_v in SM90_HEAD_DIMS


def _hopper_gpu_dtype(q):
    """The dtype name ("bfloat16", "float16") of 16-bit tensors on a compute capability 9.0
    GPU, else None."""
    if getattr(q, "dtype", None) not in TC_DTYPES or _capability(q.device.index or 0) != (9, 0):
        return None
    return str(q.dtype).replace("torch.", "")


def hopper_dtype(q, v=None):
    """The dtype name ("bfloat16", "float16") when the Hopper family's kernels could take
    these tensors (a compute capability 9.0 GPU, 16-bit, D == D_v among SM90_HEAD_DIMS), else
    None; whether this build has them is the library's to say."""
    return _hopper_gpu_dtype(q) if _native_hopper_dims(q, v) else None


def _sm90_instances(dtype_name: str, na_dim: int) -> tuple:
    """The head dims of this build's Hopper instances for a dtype and NA dim, and the window
    from which libnattn runs other head dims zero-padded on them (0: only forwards above
    head dim 128, at any window; None: an older build, which never pads)."""
    from .._cuda import library
    lib = library.load()
    if lib is None:
        return (), None
    table = getattr(lib, "sm90_padded_min_window", None)  # empty or absent: an older build
    return tuple(lib.kernels.get(("sm90", dtype_name, na_dim), ())), table.get(na_dim, 0) if table else None


def padded_hopper_head_dim(q, params: NAParams, v=None, training: bool = False) -> Optional[int]:
    """The Hopper instance head dim libnattn runs this problem at with zero-padded copies of
    its tensors (docs/kernels.md, "Head dims without an instance"): D != D_v, or a head dim
    between the family's (48, 72, 96, ...), on a 9.0 GPU in fp16/bf16, from the library's
    padded minimum window for the NA dim (none in 1-D, where flex wins; forwards with a head
    dim above 128, which the tensor-core family does not take, at any window). None: native
    head dims, or no padding."""
    dtype_name = _hopper_gpu_dtype(q)
    if dtype_name is None or _native_hopper_dims(q, v):
        return None
    need = max(q.shape[-1], v.shape[-1] if v is not None else q.shape[-1])
    na_dim = len(params.kernel_size)
    dims, minimum = _sm90_instances(dtype_name, na_dim)
    dims = [d for d in dims if d >= need and (not training or _sm90_has_backward(dtype_name, na_dim, d))]
    if minimum is None or not dims:
        return None
    hd = dims[0]
    if need > TC_MAX_HEAD_DIM:  # no tensor-core instance: the padded Hopper kernels at any window
        return hd
    own = _sm90_min_window(dtype_name, na_dim, backward=training, head_dim=hd)
    return hd if minimum > 0 and own is not None and params.window_size >= max(minimum, own) else None


def runs_hopper(q, params: NAParams, v=None) -> bool:
    """Would libnattn run this call on its Hopper family (a 9.0 GPU, fp16/bf16, D == D_v in
    SM90_HEAD_DIMS, a window at least its measured minimum; other head dims zero-padded,
    padded_hopper_head_dim), the backward too when the call needs gradients? Measured on
    the H200 (docs/dev/PERF.md, fifth session): from those windows on its forward and
    forward + backward beat flex (FLUX 80x80: 69.9 vs 217 ms forward + backward;
    HunyuanVideo 18x24x24: 341 vs 844; 1-D w2048: 2.71 vs 2.76)."""
    dtype_name = hopper_dtype(q, v)
    training = needs_grads(q, v)
    if dtype_name is None:
        return padded_hopper_head_dim(q, params, v, training) is not None
    dim_v = q.shape[-1]
    if training and not _sm90_has_backward(dtype_name, len(params.kernel_size), dim_v):
        return False
    minimum = _sm90_min_window(dtype_name, len(params.kernel_size), backward=training, head_dim=dim_v)
    return minimum is not None and params.window_size >= minimum


def _tf32_allowed() -> bool:
    """PyTorch's TF32 switch (nattn/_tf32.py): with it off flex runs float32 in exact fp32 too."""
    from .. import _tf32
    return _tf32.allowed()


def _tf32_runs(q) -> bool:
    """A float32 call that libnattn would run on its TF32 kernels: torch allows TF32 now
    (nattn/_tf32.py) and the loaded library has them (ABI 4)."""
    if getattr(q, "dtype", None) != torch.float32:
        return False
    from .. import _tf32
    from .._cuda import library
    lib = library.load()
    return lib is not None and bool(getattr(lib, "tf32", None)) and _tf32.allowed()


def runs_tensor_cores(q, v=None) -> bool:
    """Would libnattn run this problem on its tensor-core family (fp16/bf16, or float32 while
    torch allows TF32, D and D_v <= 128, SM80+)? The window from which flex goes first is then
    TC_MAX_WINDOW, measured with bf16; the TF32 instances take the same limit, not measured yet
    (tensor cores run TF32 at half their bf16 rate, for flex's fp32 matmuls as for these)."""
    dim = max(q.shape[-1], v.shape[-1]) if v is not None else q.shape[-1]
    if dim > TC_MAX_HEAD_DIM or (getattr(q, "dtype", None) not in TC_DTYPES and not _tf32_runs(q)):
        return False
    return _capability_major(q.device.index or 0) >= 8


def na_auto_order(order: Sequence[str], q, params: NAParams, v=None) -> List[str]:
    """The registered automatic order, adjusted for this problem (fastest first)."""
    order = list(order)
    if q.device.type == "cuda" and "cuda" in order and "flex" in order:
        if runs_hopper(q, params, v):
            return order  # cuda first: its Hopper family beats flex on every window it takes
        if runs_tensor_cores(q, v):
            limit = TC_MAX_WINDOW
        elif getattr(q, "dtype", None) == torch.float32 and not _tf32_allowed():
            limit = SIMT_FP32_MAX_WINDOW
        else:
            limit = SIMT_MAX_WINDOW
        if params.window_size > limit:
            order.remove("flex")
            order.insert(order.index("cuda"), "flex")
    return order
