"""The ``cuda`` backend: the fused kernels of libnattn (csrc/), called through ctypes.

libnattn runs its tensor-core family (SM80+, fp16/bf16, head dims <= 128) where it applies
and its SIMT family (every GPU from SM50, every dtype and head dim) otherwise; the capability
check here reads the SIMT list, which covers every problem the library accepts.

float32 calls run the SIMT family's exact fp32 unless PyTorch's switch for TF32 in float32
matmuls is on (``torch.backends.cuda.matmul.allow_tf32 = True``, ``fp32_precision = "tf32"``,
``torch.set_float32_matmul_precision("high")``; nattn/_tf32.py), read on every call and passed
in the problem struct's ``allow_tf32`` (ABI 4): libnattn then runs the tensor-core family's
TF32 instances (SM80+, head dims <= 128; float32 in and out, fp32 accumulation and softmax).
A library from before ABI 4 reads the struct without that field and never runs TF32.

Attention dropout (``dropout_p > 0``, docs/semantics.md) runs on the tensor-core family and,
for every problem that family does not take (float32 without TF32, head dims above 128, GPUs
before SM80), on the SIMT family (``nattn_dropout_families``; ABI 3 libraries): the backend
declares ``supports_dropout`` when the loaded library has it and passes the threshold,
``dropout_p`` and the device pointer of the call's ``rng`` tensor in the problem struct (the
kernels read seed and offset from device memory: no host sync). An older library that lists
only the tensor-core family (SIMT dropout was opt-in with ``NATTN_SIMT_DROPOUT=1`` before it
was verified on a GPU) gets the problems that family cannot run declined with the reason; a
Hopper tile pair or split-KV named in the configuration is declined with dropout either way.

Imports cleanly without the compiled library: then every CUDA problem gets the reason
"libnattn is not built", and the first automatic fallback of a CUDA tensor warns once.
The per-call host path is kept lean: one int64 array packed per call, the stream read
with torch's raw getter, outputs allocated with ``torch.empty`` (so CUDA graph capture
works: no host syncs, no allocations outside torch's allocator).
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import warnings
from typing import Dict, List, Optional, Tuple

import torch

from .. import _buffers, _tf32
from .. import dropout as _dropout
from .._cuda import kernel_table, library
from . import heuristics, register_backend
from . import kernel_config
from .base import Backend

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPE_CODES = {dt: kernel_table.DTYPES.index(name) for dt, name in _DTYPE_NAMES.items()}
_FAMILY = "simt"
_MAX_GRID_YZ = 65535
_ERR_LEN = 2048
_MAX_TEMPLATES = 256  # cached problem layouts (cleared when full)
_DRPB_STAGE_BYTES = 48 * 1024  # kMaxDrpbSmemBytes (csrc/include/nattn/common/drpb.cuh)
_Problem = ctypes.c_int64 * kernel_table.NUM_PROBLEM_FIELDS
# Indices of the pointer fields, in the order _pack passes the tensors.
_PTR_SLOTS = tuple(kernel_table.FIELD_OFFSETS[f"{n}_ptr"] for n in (
    "q", "k", "v", "out", "lse", "rpb", "grad_out", "grad_lse", "delta", "dq", "dk", "dv", "drpb"))
(_Q_SLOT, _K_SLOT, _V_SLOT, _OUT_SLOT, _LSE_SLOT, _RPB_SLOT, _GRAD_OUT_SLOT, _GRAD_LSE_SLOT, _DELTA_SLOT,
 _DQ_SLOT, _DK_SLOT, _DV_SLOT, _DRPB_SLOT) = _PTR_SLOTS
_RNG_SLOT = kernel_table.FIELD_OFFSETS["rng_ptr"]
_TF32_SLOT = kernel_table.FIELD_OFFSETS["allow_tf32"]
_QUERY_RANGE_SLOT = kernel_table.FIELD_OFFSETS["query_range"]
# The families that run attention dropout (kernel_table.DROPOUT_FAMILIES): the tensor-core one
# with its limits, and the SIMT one everywhere else (older libraries list it only with
# NATTN_SIMT_DROPOUT=1).
_DROPOUT_FAMILY = "tc"
_SIMT_DROPOUT_FAMILY = "simt"

# The calls on a packed qkv (CudaBackend.na_forward_packed / na_backward_packed) take their
# template-and-offsets path unless NATTN_PACKED_CALLS=0 (read at import; benchmarks flip
# this flag): then every call goes through the q / k / v views, as before December 2026.
PACKED_CALLS = os.environ.get("NATTN_PACKED_CALLS", "1") != "0"

try:  # a raw cudaStream_t for a device index, ~10x cheaper than current_stream()
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older torch
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def _layout_reasons(name: str, t: torch.Tensor) -> List[str]:
    """Heads-last with unit channel stride and 16-byte aligned rows (8-channel vector loads)."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return [f"{name} must have stride 1 along the head dim (got strides {tuple(t.stride())}); "
                "the reference handles other layouts"]
    size = t.element_size()
    strides = [s for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1]  # size-1: unused
    # Dynamo cannot trace storage_offset(); while compiling, libnattn checks the pointer
    # alignment at run time instead (and raises naming the tensor).
    offset = 0 if torch.compiler.is_compiling() else t.storage_offset()
    if any((s * size) % 16 for s in strides) or (offset * size) % 16:
        return [f"{name} strides/offset must be multiples of 16 bytes for vector loads "
                f"(got strides {tuple(t.stride())}, offset {t.storage_offset()})"]
    return []


def _needs_copy(t: torch.Tensor) -> bool:
    if t.is_contiguous():  # the common case without building reasons: every stride is a
        size = t.element_size()  # multiple of the last dim's extent
        if (t.shape[-1] * size) % 16 == 0 and (t.storage_offset() * size) % 16 == 0:
            return False
    return bool(_layout_reasons("", t))


def _dense_f32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` as a contiguous float32 tensor (None stays None). ``t`` itself when it is one
    already, without the ``.to`` and ``.contiguous`` calls that would return it: each is an
    op through torch's dispatcher, host time on every NA call (LSE, bias)."""
    if t is None or (t.dtype == torch.float32 and t.is_contiguous()):
        return t
    return t.to(torch.float32).contiguous()


def backward_operands(out, lse, grad_out, grad_lse, rpb):
    """A backward call's tensors as libnattn reads them, and its fresh workspaces: ``(out,
    lse, grad_out, grad_lse, delta, rpb32, drpb)``, the first four dense where the kernels
    need it (copies only where not), ``delta`` the row sums' buffer, ``rpb32`` / ``drpb`` the
    float32 bias and its zeroed gradient (None without a bias)."""
    if _needs_copy(grad_out):  # e.g. expanded (stride 0) gradients of a .sum()
        grad_out = grad_out.contiguous()
    if _needs_copy(out):
        out = out.contiguous()
    lse = _dense_f32(lse)
    delta = _buffers.empty(lse.shape, dtype=torch.float32, device=lse.device)
    rpb32 = drpb = None
    if rpb is not None:
        rpb32 = _dense_f32(rpb)
        drpb = torch.zeros(rpb.shape, dtype=torch.float32, device=lse.device)
    return out, lse, grad_out, _dense_f32(grad_lse), delta, rpb32, drpb


def _packed_fields(template, qkv: torch.Tensor, k_off: int, v_off: int):
    """A packed call's NattnProblem array from its layout's template: q / k / v at qkv's
    pointer plus the layout's byte offsets, and torch's TF32 switch as ``_pack`` sets it."""
    fields = _Problem.from_buffer_copy(template)
    base = qkv.data_ptr()
    fields[_Q_SLOT], fields[_K_SLOT], fields[_V_SLOT] = base, base + k_off, base + v_off
    if qkv.dtype == torch.float32 and _tf32.allowed():
        fields[_TF32_SLOT] = 1
    return fields


def _strides(t: torch.Tensor, na_dim: int) -> Tuple[int, ...]:
    """[batch, axis 0..2, heads] element strides; 0 for size-1 and absent axes."""
    s = [st if n > 1 else 0 for st, n in zip(t.stride(), t.shape)]
    return (s[0], *s[1 : 1 + na_dim], *(0,) * (3 - na_dim), s[-2])


def _set_query_range(fields, query_range, spatial) -> None:
    """The problem struct's query_range (ABI 5): lo per axis, then hi per axis."""
    if len(query_range) != len(spatial) or any(not 0 <= lo < hi <= n for (lo, hi), n in zip(query_range, spatial)):
        raise ValueError(f"query_range must hold one (lo, hi) with 0 <= lo < hi <= size per spatial axis "
                         f"{tuple(spatial)}, got {query_range!r}")
    for a, (lo, hi) in enumerate(query_range):
        fields[_QUERY_RANGE_SLOT + a] = int(lo)
        fields[_QUERY_RANGE_SLOT + 3 + a] = int(hi)


def _per_axis(values, na_dim: int, fill: int = 1) -> Tuple[int, ...]:
    return tuple(int(v) for v in values) + (fill,) * (3 - na_dim)


def dropout_fields(p: float) -> Tuple[int, int]:
    """The problem struct's ``dropout_threshold`` and ``dropout_p_bits`` for dropout probability
    ``p``: ``floor(p * 2^32)`` (nattn/dropout.py's rule) and the bits of ``p`` as a float64
    (libnattn derives ``1 / (1 - p)`` from it and checks the threshold); ``(0, 0)`` for ``p = 0``."""
    if not p > 0:
        return 0, 0
    return _dropout.drop_threshold(p), struct.unpack("<q", struct.pack("<d", float(p)))[0]


def _check_rng(rng, q, params) -> None:
    """The call's ``rng`` ([seed, offset], int64, on q's device) for a call with dropout."""
    if rng is None:
        raise ValueError(f"dropout_p={params.dropout_p} needs the call's rng tensor [seed, offset]")
    if rng.dtype != torch.int64 or rng.shape != (2,) or rng.device != q.device or rng.stride() != (1,):
        raise ValueError("rng must be a contiguous int64 tensor [seed, offset] on the inputs' device, got "
                         f"{rng.dtype} {tuple(rng.shape)} strides {tuple(rng.stride())} on {rng.device}")


def split_kv_configurations(shape, device) -> List[str]:
    """The split-KV configurations worth timing for a query of ``shape`` ``[B, *spatial, H,
    D]`` on CUDA ``device``: kv=1 (unsplit), kv=2 and kv=4 when its 128-query tiles number
    fewer than the GPU's SMs (CudaBackend.SPLIT_KV_FACTORS; libnattn itself splits in two
    where they fill at most half of them), else none."""
    ctas = -(-math.prod(shape[1:-2]) // 128) * shape[0] * shape[-2]
    try:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    except (RuntimeError, AssertionError):  # no usable CUDA runtime: nothing to time either
        return []
    return [f"kv={n}" for n in CudaBackend.SPLIT_KV_FACTORS] if ctas < sms else []


class CudaBackend(Backend):
    name = "cuda"
    writes_grads_into = True
    autocast_neutral = True  # allocations, dtype conversions and libnattn: nothing autocast recasts

    def __init__(self):
        self._warned_missing = False
        self._arch_ok: Dict[int, Optional[str]] = {}
        self._err = ctypes.create_string_buffer(_ERR_LEN)
        self._templates: Dict[tuple, tuple] = {}
        self._packed: Dict[tuple, tuple] = {}  # packed-qkv layouts (na_forward_packed)
        self._configured: Dict[str, Backend] = {}

    def configured(self, text: str) -> Backend:
        """This backend with a kernel configuration (``"cuda:q8x16_k8x16+dq=atomic"``)."""
        view = self._configured.get(text)
        if view is None:
            view = self._configured[text] = _Configured(self, kernel_config.parse(text))
        return view

    # ------------------------------------------------------------------ capability
    @property
    def supports_dropout(self) -> bool:
        """Whether the loaded libnattn runs attention dropout (its tensor-core family; ABI 3 on).
        Which problems it runs, na_not_supported_reasons says. False without a library or with
        an older one: the dispatch then gives the usual "does not support dropout_p > 0"."""
        lib = library.load()
        if lib is None:
            return False
        families = getattr(lib, "dropout_families", ())
        return _DROPOUT_FAMILY in families or _SIMT_DROPOUT_FAMILY in families

    def _dropout_reasons(self, lib, q, v, params) -> List[str]:
        """Why libnattn cannot run this call's attention dropout: its tensor-core family does
        (float16/bfloat16, and float32 while torch allows TF32 (its TF32 instances, ABI 4), head
        dims <= 128, SM80+) and, when the library lists the SIMT family (all current builds), every
        other problem."""
        families = getattr(lib, "dropout_families", ())
        if _SIMT_DROPOUT_FAMILY in families:
            return []
        if _DROPOUT_FAMILY not in families:
            return [f"libnattn at {lib.path} has no attention dropout (dropout_p > 0): rebuild it"]
        return self._tc_reasons(lib, q, v, params)

    def _tc_reasons(self, lib, q, v, params) -> List[str]:
        """Why libnattn's tensor-core family does not run this problem (empty: it does), worded
        for the call with attention dropout that needs it."""
        head = "dropout_p > 0 runs on libnattn's tensor-core family only"
        dtype = _DTYPE_NAMES.get(q.dtype)
        tf32 = q.dtype == torch.float32 and _tf32.allowed()
        if q.dtype not in heuristics.TC_DTYPES and not tf32:
            return [f"{head}: float16/bfloat16, or float32 while torch allows TF32 (torch.backends.cuda.matmul."
                    f"allow_tf32 / fp32_precision='tf32'; got {q.dtype}"
                    f"{' with TF32 off' if q.dtype == torch.float32 else ''}, which runs the simt family: it does "
                    "not support dropout)"]
        dim = max(q.shape[-1], v.shape[-1])
        buckets = (getattr(lib, "tf32", {}).get(params.na_dim, []) if tf32 else
                   lib.kernels.get((_DROPOUT_FAMILY, dtype, params.na_dim), []))
        if tf32 and not buckets:
            return [f"{head}: float32 runs there through its TF32 kernels, which this build "
                    f"{'has not compiled' if getattr(lib, 'abi', 4) >= 4 else f'(ABI {lib.abi}) predates'} for "
                    f"{params.na_dim}-D (float32 then runs the simt family, which does not support dropout)"]
        if not buckets:
            return [f"{head}, which this build has not compiled for {dtype} {params.na_dim}-D"]
        if dim > min(heuristics.TC_MAX_HEAD_DIM, buckets[-1]):
            return [f"{head}: head dims <= {min(heuristics.TC_MAX_HEAD_DIM, buckets[-1])} for {dtype} "
                    f"{params.na_dim}-D (got D={q.shape[-1]}, D_v={v.shape[-1]}; the simt and sm90 families "
                    "do not support dropout)"]
        major, minor = heuristics._capability(q.device.index or 0)
        if major < 8:
            return [f"{head}: SM80+ (this GPU is sm_{major}{minor}, where the simt family, which does not "
                    "support dropout, runs)"]
        if os.environ.get("NATTN_FAMILY") == "simt":
            return [f"{head}: NATTN_FAMILY=simt caps libnattn at the simt family, which does not support dropout"]
        return []

    def _arch_reason(self, index: int) -> Optional[str]:
        """None when the library has code for this GPU, else why not (cached per device)."""
        if index not in self._arch_ok:
            from ..build_info import build_config

            archs = build_config()["archs"]
            reason = None
            if archs:
                major, minor = torch.cuda.get_device_capability(index)
                cap = major * 10 + minor
                built = [int(a.replace(".", "")) for a in archs]
                sass = any(a // 10 == major and a <= cap for a in built)
                ptx = max(built) <= cap  # the newest arch is also shipped as PTX
                if not (sass or ptx):
                    reason = (f"libnattn was built for archs {archs}, which cannot run on this "
                              f"GPU (sm_{cap}); rebuild with NATTN_CUDA_ARCH={major}.{minor}")
            self._arch_ok[index] = reason
        return self._arch_ok[index]

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        if q.device.type != "cuda":
            return [f"needs CUDA tensors, got device {q.device}"]
        lib = library.load()
        if lib is None:
            reason = library.load_error()
            if not explicit and not self._warned_missing:
                self._warned_missing = True
                warnings.warn(f"nattn: CUDA tensors fall back to a slower backend: {reason}",
                              RuntimeWarning, stacklevel=4)
            return [reason]
        reasons = []
        dtype = _DTYPE_NAMES.get(q.dtype)
        if dtype is None:
            return [f"dtype {q.dtype} is not supported (float32, float16, bfloat16)"]
        buckets = lib.kernels.get((_FAMILY, dtype, params.na_dim), [])
        dim, dim_v = q.shape[-1], v.shape[-1]
        if dim % 8 or dim_v % 8:
            reasons.append(f"head dims must be multiples of 8 (got D={dim}, D_v={dim_v})")
        elif not buckets or max(dim, dim_v) > buckets[-1]:
            reasons.append(
                f"no compiled {_FAMILY} kernel for {dtype}, {params.na_dim}-D, head dim "
                f"{max(dim, dim_v)} (built head dims: {buckets or 'none'})")
        for name, t in (("query", q), ("key", k), ("value", v)):
            reasons += _layout_reasons(name, t)
        if q.shape[0] > _MAX_GRID_YZ or q.shape[-2] > _MAX_GRID_YZ:
            reasons.append(f"batch and heads must be <= {_MAX_GRID_YZ} "
                           f"(got B={q.shape[0]}, H={q.shape[-2]})")
        arch = self._arch_reason(q.device.index if q.device.index is not None else 0)
        if arch:
            reasons.append(arch)
        if params.dropout_p > 0 and not reasons:
            reasons += self._dropout_reasons(lib, q, v, params)
        return reasons

    # ------------------------------------------------------------------------ calls
    def _pack(self, params, q, k, v, out, lse, rpb, grad_out=None, grad_lse=None, delta=None,
              dq=None, dk=None, dv=None, drpb=None, config=kernel_config.DEFAULT, rng=None):
        """The NattnProblem array: a cached template per layout, with this call's pointers
        (and, with dropout, its rng tensor's)."""
        # Shapes of q, k, v and every stride decide the template (the others' shapes follow
        # from q's and v's); spelled out, not a generator: ~2 us less a call.
        key = (params, q.dtype, q.device, rpb is None, config, q.shape, v.shape, q.stride(), k.stride(),
               v.stride(), out.stride(), None if grad_out is None else grad_out.stride(),
               None if dq is None else dq.stride(), None if dk is None else dk.stride(),
               None if dv is None else dv.stride())
        entry = self._templates.get(key)
        if entry is None:
            strided = (q, k, v, out, grad_out, dq, dk, dv)  # kernel_table.STRIDED_TENSORS order
            entry = self._template(params, strided, config)
            if len(self._templates) >= _MAX_TEMPLATES:
                self._templates.clear()
            self._templates[key] = entry
        template, device = entry
        fields = _Problem.from_buffer_copy(template)
        ptrs = (q, k, v, out, lse, rpb, grad_out, grad_lse, delta, dq, dk, dv, drpb)
        for i, t in zip(_PTR_SLOTS, ptrs):
            if t is not None:
                fields[i] = t.data_ptr()
        if params.dropout_p > 0:
            _check_rng(rng, q, params)
            fields[_RNG_SLOT] = rng.data_ptr()
        if q.dtype == torch.float32 and _tf32.allowed():  # torch's switch, as it stands for this call
            fields[_TF32_SLOT] = 1
        return fields, device

    @staticmethod
    def _template(params, strided, config=kernel_config.DEFAULT):
        """Everything but the pointers (0 there), for one layout and kernel configuration."""
        q, k, v = strided[:3]
        nd = params.na_dim
        device = q.device.index or 0
        vals = [
            kernel_table.ABI_VERSION, device, _DTYPE_CODES[q.dtype], nd, q.shape[0],
            q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1],
            *_per_axis(q.shape[1 : 1 + nd], nd), *_per_axis(params.kernel_size, nd),
            *_per_axis(params.stride, nd), *_per_axis(params.dilation, nd),
            *_per_axis(params.is_causal, nd, 0),
        ]
        vals += [0] * len(_PTR_SLOTS)
        for t in strided:
            vals += _strides(t, nd) if t is not None else (0, 0, 0, 0, 0)
        vals += config.fields()
        vals += (*dropout_fields(params.dropout_p), 0)  # dropout_threshold, dropout_p_bits, rng_ptr (per call)
        vals += (0,)  # allow_tf32 (per call: _pack)
        vals += (0,) * 6  # query_range (per call: na_forward)
        assert len(vals) == kernel_table.NUM_PROBLEM_FIELDS
        return _Problem(*vals), device

    def _hopper(self, q, v, params) -> Optional[str]:
        """The dtype name when this problem could run the Hopper family (heuristics.hopper_dtype)
        and this build has it, else None."""
        from .heuristics import hopper_dtype
        dtype = hopper_dtype(q, v) if q.device.type == "cuda" else None
        lib = library.load()
        return dtype if dtype and lib is not None and ("sm90", dtype, params.na_dim) in lib.kernels else None

    def configurations(self, q, k, v, rpb, params):
        """The Hopper tile pairs that take this forward, besides the default one."""
        if self._hopper(q, v, params) is None:
            return []
        try:
            configs = self.sm90_configs(q, k, v, params)
        except RuntimeError:  # an older library without the listing
            return []
        unverified = kernel_table.unverified_tile_names()
        names = [c["name"] for c in configs if not c["declined"] and not c["default"] and c["name"] not in unverified]
        return names + split_kv_configurations(q.shape, q.device)

    # Split-KV factors the tuner tries on problems with fewer 128-query CTAs than SMs.
    # Measured on the H200 (1-D 4096 tokens, window 2048, B=1, H=2, D=128: 64 CTAs for 132
    # SMs; CUDA-graph replays, PERF.md seventh session): kv=2 0.031 ms, kv=4 0.038, kv=8
    # 0.048, unsplit 0.039; with B=4 (256 CTAs) kv=4 is 1.7x slower than unsplit.
    SPLIT_KV_FACTORS = (1, 2, 4)

    def backward_configurations(self, q, k, v, rpb, params):
        """The Hopper backward's dQ: its deterministic pass (default) and the KV-parallel
        accumulation (head dims up to 128: at 256 the dQ pass is the only one). Whether a call
        may use the latter is the tuner's to decide (the call's ``deterministic=``, else
        torch's switch: autotune.deterministic), not the backend's."""
        dtype = self._hopper(q, v, params)
        if dtype is None:
            return []
        lib = library.load()
        if (dtype, params.na_dim, q.shape[-1]) not in lib.sm90_backward or q.shape[-1] > heuristics.TC_MAX_HEAD_DIM:
            return []
        return ["dq=pass", "dq=atomic"]

    def deterministic_configuration(self):
        """The Hopper backward's own dQ pass (not NATTN_SM90_DQ=atomic's KV-parallel dQ)."""
        return "dq=pass"

    def _shape_fields(self, q, k, v, params, rpb: bool = False):
        """A forward's packed fields with stand-in pointers, for the library's queries that
        read shapes, dtypes and strides only (``q``, ``k``, ``v`` may be meta tensors)."""
        out = torch.empty(v.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device="meta")
        fields, _ = self._template(params, (q, k, v, out, None, None, None, None))
        fields = _Problem.from_buffer_copy(fields)
        for slot in _PTR_SLOTS[:6 if rpb else 5]:  # q, k, v, out, lse (rpb): never dereferenced
            fields[slot] = 1 << 20
        return fields

    def sm90_configs(self, q, k, v, params) -> list:
        """The Hopper family's tile pairs for this forward problem (``Library.sm90_configs``).
        Only shapes, dtypes and strides matter: ``q``, ``k``, ``v`` may be meta tensors."""
        return self._lib().sm90_configs(self._shape_fields(q, k, v, params))

    def sm90_preferred(self, q, k, v, params, rpb: bool = False, backward: bool = False):
        """Whether libnattn's default rules run this problem (with an RPB when ``rpb``; its
        backward when ``backward``) on the Hopper family on a compute capability 9.0 GPU:
        "native", "padded" or "" (``Library.sm90_preferred``; None: an older build). Meta
        tensors are fine."""
        return self._lib().sm90_preferred(self._shape_fields(q, k, v, params, rpb), backward)

    def _call(self, lib, fn, fields, device, scale):
        n = getattr(lib, "num_fields", len(fields))
        if n != len(fields):  # an older library (kernel_table.ABI_PROBLEM_FIELDS): a prefix, its version
            if fields[_RNG_SLOT] and n <= _RNG_SLOT:  # it would not see the dropout fields (ABI 2)
                raise RuntimeError(f"libnattn at {lib.path} (ABI {lib.abi}) has no attention dropout: rebuild it")
            # ABI 3 does not read allow_tf32 either: its float32 calls run the SIMT family (exact fp32).
            fields[0] = lib.abi
        rc = fn(fields, n, scale, _raw_stream(device), self._err, _ERR_LEN)
        if rc:
            raise RuntimeError(self._err.value.decode(errors="replace"))

    def _lib(self):
        lib = library.load()
        if lib is None:
            raise RuntimeError(f"nattn cuda backend: {library.load_error()}")
        return lib

    def na_forward(self, q, k, v, rpb, params, config=kernel_config.DEFAULT, rng=None, query_range=None):
        """``query_range``: ``((lo, hi), ...)`` per spatial axis (real coordinates): only those
        queries are needed (nattn.distributed's halo ranks). The Hopper family then computes
        just the query boxes holding them; rows it leaves out read output 0 and LSE +inf (no
        probability: the backward gives them and takes from them no gradient). Other families,
        and libraries before ABI 5, compute every row."""
        lib = self._lib()
        if query_range is None:
            out = _buffers.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
            lse = _buffers.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        else:
            out = q.new_zeros(*q.shape[:-1], v.shape[-1])
            lse = torch.full(q.shape[:-1], math.inf, dtype=torch.float32, device=q.device)
        rpb32 = _dense_f32(rpb)
        fields, device = self._pack(params, q, k, v, out, lse, rpb32, config=config, rng=rng)
        if query_range is not None:
            _set_query_range(fields, query_range, q.shape[1 : 1 + params.na_dim])
        self._call(lib, lib.forward, fields, device, params.scale)
        return out, lse

    # ------------------------------------------------- calls on a packed qkv (the modules')
    # q, k and v as the views of one qkv [B, *spatial, 3, H, D]: their shapes, strides and
    # pointers follow from qkv's, so a layout seen before needs neither the views (an op a
    # call) nor _pack's key over every tensor's strides, only a template and two offsets.
    # On a 2-core CPU with a stand-in library (`benchmarks/host_overhead.py --null-library`,
    # best of five runs): the packed forward op 30.4 -> 27.0 us a call, its backward 39.5 -> 28.7.

    def _remember_packed(self, key, params, q, k, v, out, grad_out=None, dq=None, dk=None, dv=None):
        """Caches and returns a packed layout's ``(template, device, k offset, v offset[, dk
        offset, dv offset])`` (bytes from q's / dq's pointer), made from one call's views."""
        template, device = self._template(params, (q, k, v, out, grad_out, dq, dk, dv))
        offsets = [k.data_ptr() - q.data_ptr(), v.data_ptr() - q.data_ptr()]
        if dq is not None:
            offsets += [dk.data_ptr() - dq.data_ptr(), dv.data_ptr() - dq.data_ptr()]
        if len(self._packed) >= _MAX_TEMPLATES:
            self._packed.clear()
        entry = self._packed[key] = (template, device, *offsets)
        return entry

    def na_forward_packed(self, qkv, rpb, params):
        """``na_forward`` on ``qkv``'s q / k / v views: ``(out, lse)``."""
        key = ("fwd", params, qkv.dtype, qkv.device, rpb is None, qkv.shape, qkv.stride())
        entry = self._packed.get(key)
        if entry is None or params.dropout_p or not PACKED_CALLS:  # a layout's first call: through the views
            q, k, v = qkv.unbind(-3)
            out, lse = self.na_forward(q, k, v, rpb, params)
            self._remember_packed(key, params, q, k, v, out)
            return out, lse
        template, device, k_off, v_off = entry
        lib = self._lib()
        lead, heads = qkv.shape[:-3], qkv.shape[-2:]
        out = _buffers.empty(lead + heads, dtype=qkv.dtype, device=qkv.device)
        lse = _buffers.empty(lead + heads[:1], dtype=torch.float32, device=qkv.device)
        rpb32 = _dense_f32(rpb)
        fields = _packed_fields(template, qkv, k_off, v_off)
        fields[_OUT_SLOT], fields[_LSE_SLOT] = out.data_ptr(), lse.data_ptr()
        if rpb32 is not None:
            fields[_RPB_SLOT] = rpb32.data_ptr()
        self._call(lib, lib.forward, fields, device, params.scale)
        return out, lse

    def na_backward_packed(self, qkv, rpb, out, lse, grad_out, grad_lse, params):
        """``na_backward`` on ``qkv``'s views: ``(d(qkv), drpb)``, the gradients written through
        d(qkv)'s views. A bias gradient under torch's determinism switch (whose alert reads
        the views) and dropout take the views' path."""
        dqkv = _buffers.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
        views = not PACKED_CALLS or params.dropout_p
        if views or (rpb is not None and torch.are_deterministic_algorithms_enabled()):
            q, k, v = qkv.unbind(-3)
            *_, drpb = self.na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params,
                                        grads_into=dqkv.unbind(-3))
            return dqkv, drpb
        lib = self._lib()
        out, lse, grad_out, grad_lse, delta, rpb32, drpb = backward_operands(out, lse, grad_out, grad_lse, rpb)
        key = ("bwd", params, qkv.dtype, qkv.device, rpb is None, qkv.shape, qkv.stride(), out.stride(),
               grad_out.stride())
        entry = self._packed.get(key)
        if entry is None:  # a layout's first call: the template from the views
            entry = self._remember_packed(key, params, *qkv.unbind(-3), out, grad_out, *dqkv.unbind(-3))
        template, device, k_off, v_off, dk_off, dv_off = entry
        fields = _packed_fields(template, qkv, k_off, v_off)
        dbase = dqkv.data_ptr()
        fields[_DQ_SLOT], fields[_DK_SLOT], fields[_DV_SLOT] = dbase, dbase + dk_off, dbase + dv_off
        fields[_OUT_SLOT], fields[_LSE_SLOT], fields[_DELTA_SLOT] = out.data_ptr(), lse.data_ptr(), delta.data_ptr()
        fields[_GRAD_OUT_SLOT] = grad_out.data_ptr()
        if grad_lse is not None:
            fields[_GRAD_LSE_SLOT] = grad_lse.data_ptr()
        if rpb32 is not None:
            fields[_RPB_SLOT], fields[_DRPB_SLOT] = rpb32.data_ptr(), drpb.data_ptr()
        self._call(lib, lib.backward, fields, device, params.scale)
        if drpb is not None and drpb.dtype != rpb.dtype:
            drpb = drpb.to(rpb.dtype)
        return dqkv, drpb

    def _alert_drpb_not_deterministic(self, lib, q, v, rpb, params, torch_switch: bool) -> None:
        """torch's deterministic-algorithms alert (an error, or a warning with warn_only) for an
        RPB gradient libnattn sums with float atomics, or (``torch_switch`` off: the call asked
        for the deterministic configuration, ``deterministic=True``) a warning: the families
        stage a KV head's tables in fixed point (integer sums, the same in any order) when they
        fit in _DRPB_STAGE_BYTES of shared memory, at 4 bytes an entry on the tensor-core and
        Hopper families and 8 on the SIMT one (csrc/include/nattn/common/drpb_fixed.cuh)."""
        entry_bytes = 8 if self._tc_reasons(lib, q, v, params) else 4  # SIMT's int64 tables
        groups = q.shape[-2] // v.shape[-2]  # query heads a KV head: the tables one block stages
        table_bytes = groups * rpb[0].numel() * entry_bytes
        if table_bytes <= _DRPB_STAGE_BYTES:
            return
        msg = (f"nattn's RPB gradient of {groups} x {tuple(rpb.shape[1:])} bias tables "
               f"a KV head ({table_bytes} bytes at {entry_bytes} an entry, above the {_DRPB_STAGE_BYTES} "
               "its kernels sum in fixed point) is summed with float atomics, whose order may vary "
               "between runs, but " + ("torch.use_deterministic_algorithms(True) is set" if torch_switch
                                      else "the call asked for a deterministic backward"))
        if not torch_switch or torch.is_deterministic_algorithms_warn_only_enabled():
            warnings.warn(msg, UserWarning, stacklevel=4)
        else:
            raise RuntimeError(msg + "; a smaller kernel (or fewer query heads a KV head) keeps it "
                               "deterministic, or use torch.use_deterministic_algorithms(True, warn_only=True)")

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params, config=kernel_config.DEFAULT,
                    rng=None, grads_into=None, query_range=None):
        """``query_range``: the forward's (the output gradient must be zero outside it). The
        Hopper backward then computes dQ only on the query boxes holding the range's queries
        (the others' dQ reads 0) and walks only the range's queries for dK / dV."""
        lib = self._lib()
        if rpb is not None:
            torch_switch = torch.are_deterministic_algorithms_enabled()
            if torch_switch or config.dq_mode == kernel_config.DQ_MODES["pass"]:  # deterministic=True pins it
                self._alert_drpb_not_deterministic(lib, q, v, rpb, params, torch_switch)
        out, lse, grad_out, grad_lse, delta, rpb32, drpb = backward_operands(out, lse, grad_out, grad_lse, rpb)
        # Same layout as the inputs where it is dense (what the fake impl promises); no layout
        # check: a dense input passed it (same strides, offset 0), others get contiguous ones.
        if grads_into is None:
            dq, dk, dv = _buffers.empty_like(q), _buffers.empty_like(k), _buffers.empty_like(v)
        else:  # the caller's (views of a packed gradient: heads-last rows like q's)
            dq, dk, dv = grads_into
        fields, device = self._pack(params, q, k, v, out, lse, rpb32, grad_out, grad_lse, delta,
                                    dq, dk, dv, drpb, config=config, rng=rng)
        if query_range is not None:
            dq.zero_()  # the rows of query boxes the dQ pass does not launch
            _set_query_range(fields, query_range, q.shape[1 : 1 + params.na_dim])
        self._call(lib, lib.backward, fields, device, params.scale)
        if drpb is not None and drpb.dtype != rpb.dtype:
            drpb = drpb.to(rpb.dtype)
        return dq, dk, dv, drpb


class _Configured(Backend):
    """The cuda backend with one kernel configuration (``CudaBackend.configured``): the same
    checks, its configuration in every call's problem struct."""

    def __init__(self, parent: CudaBackend, config: kernel_config.KernelConfig):
        self.parent, self.config = parent, config
        self.name = kernel_config.join(parent.name, config)
        self.writes_grads_into = parent.writes_grads_into
        self.autocast_neutral = parent.autocast_neutral

    @property
    def supports_dropout(self) -> bool:
        return self.parent.supports_dropout

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        reasons = self.parent.na_not_supported_reasons(q, k, v, rpb, params, explicit)
        if params.dropout_p > 0 and not reasons and (self.config.tile is not None or self.config.kv_splits > 1):
            reasons.append("dropout_p > 0 is not supported by the sm90 family, whose configuration "
                           f"({self.config.text}) this names")
        return reasons

    def configurations(self, q, k, v, rpb, params):
        return self.parent.configurations(q, k, v, rpb, params)

    def backward_configurations(self, q, k, v, rpb, params):
        return self.parent.backward_configurations(q, k, v, rpb, params)

    def deterministic_configuration(self):
        return self.parent.deterministic_configuration()

    def na_forward(self, q, k, v, rpb, params, rng=None, query_range=None):
        return self.parent.na_forward(q, k, v, rpb, params, self.config, rng=rng, query_range=query_range)

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng=None, grads_into=None,
                    query_range=None):
        return self.parent.na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params, self.config, rng=rng,
                                       grads_into=grads_into, query_range=query_range)


register_backend(CudaBackend())
