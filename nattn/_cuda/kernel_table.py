"""The one table of compiled kernels.

This file is the single source of truth for:
  * which kernel instances are compiled (family x dtype x NA dim x head-dim bucket),
  * the C struct the Python side packs for every call (``PROBLEM_FIELDS``),
  * the generated instantiation files, the generated dispatch table and CMake's source list.

It is imported by the Python backend and also run as a plain script by CMake at
configure time (``python kernel_table.py --out DIR``), so it must not import torch or
anything from nattn.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ABI_VERSION = 5  # 3: attention dropout (dropout_threshold, dropout_p_bits, rng_ptr); 4: allow_tf32; 5: query_range

# dtype code shared by C and Python (the index into this tuple).
DTYPES = ("float32", "float16", "bfloat16")
CPP_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "nattn::bf16_t"}
NA_DIMS = (1, 2, 3)
# Head-dim buckets: an instance with bucket B runs any head dim D (and D_v) that is a
# multiple of 8 with D <= B (the SIMT kernels load 8 channels at a time; one thread
# holds 16 channels, so B / 16 threads share a query).
HEAD_DIM_BUCKETS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Family:
    name: str
    min_arch: int  # lowest SM (e.g. 50) that the family's code may target
    dtypes: Tuple[str, ...]
    head_dims: Tuple[int, ...]
    na_dims: Tuple[int, ...]
    # Built only when one of these archs is requested (arch-specific code such as sm_90a);
    # empty: whenever the family is compiled at all.
    only_archs: Tuple[str, ...] = ()
    backward: bool = True  # has its own backward (else another family's runs)
    prepare: bool = False  # has a prepare step that may decline a problem
    # Tile configurations per NA dim, each (query box, key box) as per-axis extents; one
    # instance per configuration (empty: the family's tiles are not template parameters).
    tiles: Tuple[Tuple[int, Tuple[Tuple[int, ...], Tuple[int, ...]]], ...] = ()
    # Tiled families: the tile pairs that also get a backward instance (empty: all of them).
    backward_tiles: Tuple[Tuple[int, Tuple[Tuple[int, ...], Tuple[int, ...]]], ...] = ()
    # Tiled families: (tile pair, head dims) for pairs built at fewer head dims than the family's.
    tile_head_dims: Tuple[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], Tuple[int, ...]], ...] = ()
    # Head dims with a backward instance (empty: all of the family's).
    backward_head_dims: Tuple[int, ...] = ()
    # Tiled families: pairs whose forward runs only when a call names it (never the default).
    named_forward_tiles: Tuple[Tuple[int, Tuple[Tuple[int, ...], Tuple[int, ...]]], ...] = ()

    def tile_has_head_dim(self, tile, head_dim: int) -> bool:
        return tile is None or all(head_dim in dims for t, dims in self.tile_head_dims if t == tuple(tile))

    def tiles_for(self, na_dim: int):
        return [t for n, t in self.tiles if n == na_dim] or [None]


# The Hopper family's (query box, key box) pairs. 128 queries (even along axis 0, one half
# per consumer warpgroup) with 64 or 128 keys for large windows; 64 queries (one consumer
# warpgroup, several CTAs per SM) with key boxes shaped to small windows' unions (an 8 x 8
# query box with a 7 x 7 window needs 14 x 14 keys: two 7 x 16 boxes; a 16 x 4 box with a
# 13 x 13 window 28 x 16 keys: four). The library picks one per problem by the keys its
# boxes walk per query (src/sm90_dispatch.cu, sm90_tile_cost); the first pair of an NA dim
# is its default; measured in docs/dev/PERF.md.
SM90_TILES = (
    (1, ((128,), (128,))),
    (2, ((8, 16), (8, 16))), (2, ((8, 16), (4, 16))), (2, ((8, 16), (8, 8))),
    (3, ((2, 8, 8), (2, 8, 8))), (3, ((4, 4, 8), (2, 4, 16))), (3, ((4, 8, 4), (4, 2, 16))),
    (3, ((4, 4, 8), (4, 2, 16))),
    (1, ((128,), (64,))), (3, ((2, 8, 8), (1, 8, 8))),
    (1, ((64,), (128,))),
    (2, ((8, 8), (7, 16))), (2, ((8, 8), (4, 24))),
    (3, ((2, 4, 8), (1, 5, 16))),
    (3, ((4, 4, 8), (2, 4, 8))), (2, ((16, 8), (8, 8))),
    (2, ((8, 8), (14, 16))), (3, ((2, 4, 8), (8, 10, 16))),
    (2, ((16, 8), (4, 24))),
    (2, ((16, 4), (7, 16))),
    (2, ((32, 4), (7, 16))),
    (2, ((8, 8), (20, 20))),
)
# The 64-query pairs (one consumer warpgroup, two CTAs per SM: <= 168 registers a thread)
# hold their accumulators without spilling only at these head dims.
SM90_TILE_HEAD_DIMS = (
    (((64,), (128,)), (32, 64)), (((8, 8), (7, 16)), (32, 64)), (((8, 8), (4, 24)), (32, 64)),
    (((2, 4, 8), (1, 5, 16)), (32, 64)), (((16, 4), (7, 16)), (32, 64)),
    # The backward pairs with 96- and 112-token column boxes (S / dP accumulators of 64 x 96
    # or 64 x 112 beside dQ's or dK's and dV's): head dims up to 64.
    (((16, 8), (4, 24)), (32, 64)), (((32, 4), (7, 16)), (32, 64)),
    # The strip pairs (forward_strips.cuh: a 64-query box whose key box is its window union,
    # up to 7 x 9 or 7 x 7 x 9; mma.sync on each warp's two query rows).
    (((8, 8), (14, 16)), (32, 64)), (((2, 4, 8), (8, 10, 16)), (32, 64)),
    # The square pair (forward_squares.cuh: 8 x 8 queries, the 20 x 20 union of windows up to
    # 13 x 13; mma.sync on each warp's 4 x 4 queries): its tiles fit two CTAs an SM at 64.
    (((8, 8), (20, 20)), (32, 64)),
    # Head dim 256 (O alone is 128 registers a thread) only with 64-key boxes, whose CTAs run
    # their boxes one after the other (forward.cuh); the pairs with larger key boxes stop at 128.
    (((128,), (128,)), (32, 64, 128)), (((8, 16), (8, 16)), (32, 64, 128)),
    (((2, 8, 8), (2, 8, 8)), (32, 64, 128)), (((4, 4, 8), (2, 4, 16)), (32, 64, 128)),
    (((4, 8, 4), (4, 2, 16)), (32, 64, 128)), (((4, 4, 8), (4, 2, 16)), (32, 64, 128)),
)
# The pairs with a backward (csrc/include/nattn/sm90/backward_*.cuh): a 128-token box and a
# 64-token box. The dQ pass walks 64-key boxes from 128-query boxes; the dK/dV pass swaps
# the roles (128 keys per CTA walking 64-query boxes), which keeps both passes' accumulators
# (S, dP and a head-dim-wide dQ, or dK and dV) within a consumer warpgroup's registers.
# The first pair of an NA dim is its default; another runs where it walks fewer steps
# (src/sm90_dispatch.cu, backward_steps): in 3-D each warpgroup's 2x4x8 half of a 4x4x8
# box sees fewer 2x4x8 boxes than a 1x8x8 half sees 1x8x8 ones; in 2-D an 8x8 half of a
# 16x8 box fewer 8x8 boxes than a 4x16 half 4x16 ones on large square windows; on windows of
# 10 to 13 a 16x4 half of a 32x4 box walks a 13x13 window's 28x16 union in four 7x16 boxes
# (448 tokens) where an 8x8 half of 16x8 walks five 4x24 ones (480), as the forward's 16x4 /
# 7x16 pair does.
SM90_BACKWARD_TILES = (
    (1, ((128,), (64,))), (2, ((8, 16), (4, 16))), (3, ((2, 8, 8), (1, 8, 8))),
    (3, ((4, 4, 8), (2, 4, 8))), (2, ((16, 8), (8, 8))), (2, ((16, 8), (4, 24))),
    (2, ((32, 4), (7, 16))),
)
# The backward pairs after each NA dim's first were built for the backward's walk: their
# forward runs only when named (NATTN_SM90_TILE, or a call's tile pair), not timed against
# the other forwards, so the forward's default choice (src/sm90_dispatch.cu, default_sm90)
# never takes them (a flag of their table rows, KernelEntry::forward_named_only).
# The strip pairs (windows up to 7 x 9 / 7 x 7 x 9 at stride 1) are flagged named-only too:
# the cost model never picks them; their own rule does (src/sm90_dispatch.cu,
# strips_by_default: wherever they take a problem, unless dilated 4 or more where some walk
# is not narrow).
SM90_STRIP_TILES = ((2, ((8, 8), (14, 16))), (3, ((2, 4, 8), (8, 10, 16))))
# The square pair (2-D windows of up to 13 x 13, stride 1): named only too (the cost model
# never picks it; its own rule does, forward and backward: src/sm90_dispatch.cu,
# square_pair_for). Its backward is its own dQ pass (backward_dq_squares.cuh), then its own
# dK/dV pass (backward_dkv_squares.cuh), but the tensor-core family's at head dim 64 with
# an RPB below 13 x 13 windows.
SM90_SQUARE_TILES = ((2, ((8, 8), (20, 20))),)
# The strip pairs have a backward too (named only, like their forward): their own dQ and dK/dV
# passes (backward_dq_strips.cuh, backward_dkv_strips.cuh).
# Pairs built but not yet run on a GPU (their GPU tests and sanitizer sections are written):
# the tuner and `nattn.bench --optimize` leave them out (unverified_tile_names) until a GPU
# session has run those and emptied this; a call or NATTN_SM90_TILE may still name them.
# Their forwards and backwards run only when named (KernelEntry::unverified), so that no
# default choice takes a pair before a GPU has run it.
SM90_UNVERIFIED_TILES = ()  # (the square pair passed its GPU tests in the sixty-third session)
SM90_NAMED_FORWARD_TILES = tuple(
    (n, t) for i, (n, t) in enumerate(SM90_BACKWARD_TILES)
    if any(m == n for m, _ in SM90_BACKWARD_TILES[:i])) + SM90_STRIP_TILES + SM90_SQUARE_TILES + SM90_UNVERIFIED_TILES


def unverified_tile_names() -> set:
    """The names ("q8x8_k14x16") of SM90_UNVERIFIED_TILES."""
    return {Instance("sm90", "bfloat16", n, 64, t).tile_name for n, t in SM90_UNVERIFIED_TILES}

# simt: every GPU from SM50, every dtype and head dim. tc: tensor cores (mma.sync, SM80+),
# head dims up to 128: fp16/bf16, and float32 through TF32 products (TF32_FAMILY; libnattn
# runs those only for calls that allow TF32, the problem's allow_tf32 field, else SIMT's exact
# fp32). sm90: Hopper (TMA + wgmma, sm_90a code), head dims
# 32/64/128/256 exactly (D == D_v; 256: forward pairs with 64-key boxes, its backward the pairs'
# 64-token box on both sides, sm90/backward_wide.cuh), forward with
# every tile pair, backward with the pairs of SM90_BACKWARD_TILES, the strip and square pairs.
# libnattn picks the most specialised family that takes a problem at run time (src/api.cu)
# and falls back to the next one otherwise.
FAMILIES = (
    Family("simt", 50, DTYPES, HEAD_DIM_BUCKETS, NA_DIMS),
    Family("tc", 80, DTYPES, (16, 32, 64, 128), NA_DIMS),
    Family("sm90", 90, ("float16", "bfloat16"), (32, 64, 128, 256), NA_DIMS, only_archs=("9.0",),
           prepare=True, tiles=SM90_TILES, backward_tiles=SM90_BACKWARD_TILES + SM90_STRIP_TILES + SM90_SQUARE_TILES,
           tile_head_dims=SM90_TILE_HEAD_DIMS, backward_head_dims=(32, 64, 128, 256),
           named_forward_tiles=SM90_NAMED_FORWARD_TILES),
)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}

# Fields of ``struct NattnProblem`` (all int64), in order: (name, count).
# Pointers are passed as integers; absent tensors as 0. Strides are in elements,
# per tensor: batch, spatial axis 0..2 (0 when the axis does not exist), heads.
STRIDED_TENSORS = ("q", "k", "v", "out", "grad_out", "dq", "dk", "dv")
PROBLEM_FIELDS: Tuple[Tuple[str, int], ...] = (
    ("abi_version", 1),
    ("device", 1),  # CUDA device index the pointers live on
    ("dtype", 1),
    ("na_dim", 1),
    ("batch", 1),
    ("heads", 1),
    ("heads_kv", 1),
    ("dim", 1),
    ("dim_v", 1),
    ("spatial", 3),
    ("kernel", 3),
    ("stride", 3),
    ("dilation", 3),
    ("causal", 3),
    ("q_ptr", 1),
    ("k_ptr", 1),
    ("v_ptr", 1),
    ("out_ptr", 1),
    ("lse_ptr", 1),  # float32 [B, N, H], contiguous
    ("rpb_ptr", 1),  # float32 [H, 2k-1, ...], contiguous, or 0
    ("grad_out_ptr", 1),
    ("grad_lse_ptr", 1),  # float32 [B, N, H], contiguous
    ("delta_ptr", 1),  # float32 [B, N, H] scratch for the backward
    ("dq_ptr", 1),
    ("dk_ptr", 1),
    ("dv_ptr", 1),
    ("drpb_ptr", 1),  # float32, zero-initialised by the caller
) + tuple((f"{t}_stride", 5) for t in STRIDED_TENSORS) + (
    # Per-call configuration (zeros: the library's default). A tiled family's (query box,
    # key box) extents, 1 for unused axes (sm90: a pair of SM90_TILES); the backward's dQ:
    # 1 its own deterministic pass, 2 accumulated by the dK/dV pass (KV-parallel, atomics);
    # the forward's split-KV factor (sm90: CTAs over slices of each query box's key boxes,
    # merged through their LSE; 0 or 1: none).
    ("tile", 6),
    ("dq_mode", 1),
    ("kv_splits", 1),
    # Attention dropout (docs/semantics.md, "Attention dropout"; zeros: none): the keep
    # threshold floor(p * 2^32) (an element is dropped iff its Philox word is below it), p
    # itself as the bits of a float64 (the library scales kept weights by 1 / (1 - p) and
    # checks the threshold against it), and the device pointer of the call's int64 [seed,
    # offset] tensor, read by the kernels (no host sync: CUDA graphs capture the call).
    ("dropout_threshold", 1),
    ("dropout_p_bits", 1),
    ("rng_ptr", 1),
    # ABI 4: 1 when a float32 call may run TF32 tensor-core products (TF32_FAMILY's float32
    # instances, SM80+), 0 for the SIMT family's exact fp32; 0 with 16-bit inputs.
    ("allow_tf32", 1),
    # ABI 5: the query range per axis, [lo 0..2, hi 0..2) in real coordinates (all zeros:
    # every query). A family that takes it (sm90) computes only the query boxes that hold
    # queries of the range, forward and backward; rows outside it may be left as the caller
    # filled them (the cuda backend: output 0, LSE +inf, dQ 0). Others compute every row.
    ("query_range", 6),
)
# Families whose kernels run attention dropout (the Hopper family declines a problem with it,
# which then runs on the tensor-core family where it can, else on SIMT).
DROPOUT_FAMILIES = ("tc", "simt")
# The family whose float32 instances compute in TF32 (operands rounded to a 10-bit mantissa,
# fp32 accumulation and softmax): libnattn runs them for a float32 call only when its
# allow_tf32 field is 1 (PyTorch's torch.backends.cuda.matmul switch, read per call).
TF32_FAMILY = "tc"

# The unfused window ops (na*d_qk / na*d_av and their gradients; csrc/include/nattn/window/):
# one instance per (dtype, NA dim), any head dim that is a multiple of 8, every GPU from
# SM50. Fields of ``struct NattnWindowProblem`` (all int64), in order; tensors contiguous.
WINDOW_OPS = ("dot", "sum", "inverse_sum")  # the ``op`` codes (window/params.h)
WINDOW_FIELDS: Tuple[Tuple[str, int], ...] = (
    ("abi_version", 1),
    ("device", 1),
    ("dtype", 1),
    ("op", 1),
    ("na_dim", 1),
    ("batch", 1),
    ("heads", 1),
    ("heads_kv", 1),
    ("dim", 1),
    ("spatial", 3),
    ("kernel", 3),
    ("stride", 3),
    ("dilation", 3),
    ("causal", 3),
    ("neg_inf", 1),  # dot: -inf (logits) or 0 (gradients) in slots outside a causal window
    ("a_ptr", 1),
    ("b_ptr", 1),
    ("out_ptr", 1),
)
NUM_WINDOW_FIELDS = sum(n for _, n in WINDOW_FIELDS)

NUM_PROBLEM_FIELDS = sum(n for _, n in PROBLEM_FIELDS)
FIELD_OFFSETS: Dict[str, int] = {}
_o = 0
for _name, _n in PROBLEM_FIELDS:
    FIELD_OFFSETS[_name] = _o
    _o += _n
del _o
# The ABI versions the Python side calls, with their problem-field counts. Each version
# appended fields, so an older library reads a prefix of the same array: ABI 2 is ABI 3
# without the dropout fields (such a library has no dropout; the cuda backend declines it),
# ABI 3 is ABI 4 without allow_tf32 (such a library runs float32 on its SIMT family only).
ABI_PROBLEM_FIELDS: Dict[int, int] = {2: FIELD_OFFSETS["dropout_threshold"], 3: FIELD_OFFSETS["allow_tf32"],
                                      4: FIELD_OFFSETS["query_range"], ABI_VERSION: NUM_PROBLEM_FIELDS}


def _pad3(extents) -> Tuple[int, int, int]:
    return tuple(extents) + (1,) * (3 - len(extents))


@dataclass(frozen=True)
class Instance:
    family: str
    dtype: str
    na_dim: int
    head_dim: int
    tile: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None  # (query box, key box)

    @property
    def has_backward(self) -> bool:
        fam = FAMILY_BY_NAME[self.family]
        if not fam.backward or (fam.backward_head_dims and self.head_dim not in fam.backward_head_dims):
            return False
        return not fam.backward_tiles or (self.na_dim, self.tile) in fam.backward_tiles

    @property
    def forward_named_only(self) -> bool:
        """Whether the forward runs only when a call names this tile pair."""
        return (self.na_dim, self.tile) in FAMILY_BY_NAME[self.family].named_forward_tiles

    @property
    def unverified(self) -> bool:
        """Whether no GPU has run this tile pair yet: its backward too runs only when named."""
        return self.family == "sm90" and (self.na_dim, self.tile) in SM90_UNVERIFIED_TILES

    @property
    def tile_name(self) -> str:
        """"q8x16_k4x32" (empty for untiled families)."""
        if not self.tile:
            return ""
        q, k = self.tile
        return f"q{'x'.join(map(str, q))}_k{'x'.join(map(str, k))}"

    @property
    def stem(self) -> str:
        base = f"{self.family}_{self.dtype}_na{self.na_dim}d_hd{self.head_dim}"
        return f"{base}_{self.tile_name}" if self.tile else base

    @property
    def template_args(self) -> str:
        args = f"{CPP_TYPES[self.dtype]}, {self.na_dim}, {self.head_dim}"
        if self.tile:
            q, k = (", ".join(map(str, _pad3(b))) for b in self.tile)
            args += f", nattn::{self.family}::Tile<{q}, {k}>"
        return args


def _subset(env_value: str, allowed: Sequence, cast) -> Tuple:
    """Parse a developer subset like "bfloat16,float16" or "32;64"; empty means all."""
    if not env_value:
        return tuple(allowed)
    picked = tuple(cast(x.strip()) for x in env_value.replace(";", ",").split(",") if x.strip())
    bad = [x for x in picked if x not in allowed]
    if bad:
        raise ValueError(f"unknown values {bad}; accepted: {list(allowed)}")
    return picked


def _arch_list(archs: str) -> List[str]:
    return [a.strip() for a in archs.replace(",", ";").split(";") if a.strip()]


def instances(dtypes: str = "", head_dims: str = "", na_dims: str = "", archs: str = "",
              families: str = "") -> List[Instance]:
    """Every instance to compile, optionally restricted (NATTN_DTYPES / HEAD_DIMS / NA_DIMS /
    FAMILIES; simt is always kept).

    ``archs`` ("8.0;9.0") drops families whose arch-specific code none of them runs; empty
    keeps every family (the table as a whole, e.g. for tests)."""
    wanted = set(_arch_list(archs))
    # simt stays in every build: libnattn falls back to it for whatever the others decline.
    keep = set(_subset(families, [f.name for f in FAMILIES], str)) | {"simt"}
    out = []
    for fam in FAMILIES:
        if fam.name not in keep or (wanted and fam.only_archs and not wanted & set(fam.only_archs)):
            continue
        for dt in _subset(dtypes, DTYPES, str):
            for nd in _subset(na_dims, fam.na_dims, int):
                for hd in _subset(head_dims, HEAD_DIM_BUCKETS, int):
                    if dt in fam.dtypes and hd in fam.head_dims:
                        out.extend(Instance(fam.name, dt, nd, hd, t) for t in fam.tiles_for(nd)
                                   if fam.tile_has_head_dim(t, hd))
    return out


def window_instances(dtypes: str = "", na_dims: str = "") -> List[Tuple[str, int]]:
    """The (dtype, NA dim) instances of the unfused window ops to compile."""
    return [(dt, nd) for dt in _subset(dtypes, DTYPES, str) for nd in _subset(na_dims, NA_DIMS, int)]


def head_dim_bucket(dim: int, buckets: Sequence[int]):
    """The smallest compiled bucket that holds ``dim`` channels, or None."""
    fits = [b for b in buckets if b >= dim]
    return min(fits) if fits else None


# ----------------------------------------------------------------------------- codegen
_HEADER = "// Generated by nattn/_cuda/kernel_table.py; do not edit.\n"


def problem_header() -> str:
    lines = [_HEADER, "#pragma once", "#include <stdint.h>", "",
             f"#define NATTN_ABI_VERSION {ABI_VERSION}",
             f"#define NATTN_NUM_PROBLEM_FIELDS {NUM_PROBLEM_FIELDS}", "",
             "// Packed by the Python side as one int64 array (see PROBLEM_FIELDS).",
             "typedef struct NattnProblem {"]
    for name, n in PROBLEM_FIELDS:
        lines.append(f"  int64_t {name}{f'[{n}]' if n > 1 else ''};")
    lines += ["} NattnProblem;", "",
              f"#define NATTN_NUM_WINDOW_FIELDS {NUM_WINDOW_FIELDS}", "",
              "// The unfused window ops' call (see WINDOW_FIELDS), one int64 array.",
              "typedef struct NattnWindowProblem {"]
    for name, n in WINDOW_FIELDS:
        lines.append(f"  int64_t {name}{f'[{n}]' if n > 1 else ''};")
    lines += ["} NattnWindowProblem;", ""]
    return "\n".join(lines)


def window_instance_source(dtype: str, na_dim: int) -> str:
    return "\n".join([
        f'{_HEADER}#include "nattn/window/kernels.cuh"', "",
        "namespace nattn { namespace window {",
        f"template void launch_window<{CPP_TYPES[dtype]}, {na_dim}>(const WindowParams&, cudaStream_t);",
        "} }", ""])


def window_table_source(insts: Sequence[Tuple[str, int]]) -> str:
    lines = [_HEADER, '#include "nattn/common/registry.h"', '#include "nattn/window/params.h"', "",
             "namespace nattn { namespace window {", "const WindowEntry kWindowKernels[] = {"]
    for dt, nd in insts:
        lines.append(f"  {{{DTYPES.index(dt)}, {nd}, &launch_window<{CPP_TYPES[dt]}, {nd}>}},")
    if not insts:
        lines.append("  {0, 0, nullptr},")
    lines += ["};", f"const int kNumWindowKernels = {len(insts)};", "} }", ""]
    return "\n".join(lines)


def instance_source(inst: Instance) -> str:
    fam = FAMILY_BY_NAME[inst.family]
    args = inst.template_args
    lines = [f"{_HEADER}#include \"nattn/{inst.family}/kernels.cuh\"", "",
             f"namespace nattn {{ namespace {inst.family} {{",
             f"template void launch_forward<{args}>(const Params&, cudaStream_t);"]
    if inst.has_backward:
        lines.append(f"template void launch_backward<{args}>(const Params&, cudaStream_t);")
    if fam.prepare:
        lines.append(f"template const char* prepare_forward<{args}>(const Params&, void*);")
    if fam.prepare and inst.has_backward:
        lines.append(f"template const char* prepare_backward<{args}>(const Params&, void*);")
    lines += ["} }", ""]
    return "\n".join(lines)


def table_source(insts: Sequence[Instance]) -> str:
    lines = [_HEADER, '#include "nattn/common/registry.h"']
    for fam in sorted({i.family for i in insts}):
        lines.append(f'#include "nattn/{fam}/launch.h"')
    lines += ["", "namespace nattn {", "const KernelEntry kKernels[] = {"]
    for i in insts:
        fam = FAMILY_BY_NAME[i.family]
        code = DTYPES.index(i.dtype)
        ns, args = f"{i.family}::", i.template_args
        backward = f"&{ns}launch_backward<{args}>" if i.has_backward else "nullptr"
        prepare = f"&{ns}prepare_forward<{args}>" if fam.prepare else "nullptr"
        prepare_bwd = f"&{ns}prepare_backward<{args}>" if fam.prepare and i.has_backward else "nullptr"
        q, k = (("{" + ", ".join(map(str, _pad3(b))) + "}") for b in (i.tile or ((0, 0, 0), (0, 0, 0))))
        named = "true" if i.forward_named_only else "false"
        unverified = "true" if i.unverified else "false"
        lines.append(
            f'  {{"{i.family}", {code}, {i.na_dim}, {i.head_dim}, '
            f"&{ns}launch_forward<{args}>, {backward}, {prepare}, {prepare_bwd}, {q}, {k}, {named}, {unverified}}},")
    if not insts:
        lines.append("  {nullptr, 0, 0, 0, nullptr, nullptr, nullptr, nullptr, {0, 0, 0}, {0, 0, 0}, false, false},")
    lines += ["};", f"const int kNumKernels = {len(insts)};", "}  // namespace nattn", ""]
    return "\n".join(lines)


def _write_if_changed(path: str, text: str) -> None:
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def generate(out_dir: str, insts: Sequence[Instance],
             windows: Sequence[Tuple[str, int]] = ()) -> List[str]:
    """Write the generated sources; return the .cu files CMake must compile."""
    os.makedirs(os.path.join(out_dir, "nattn"), exist_ok=True)
    _write_if_changed(os.path.join(out_dir, "nattn", "problem.h"), problem_header())
    sources = []
    for inst in insts:
        path = os.path.join(out_dir, f"{inst.stem}.cu")
        _write_if_changed(path, instance_source(inst))
        sources.append(path)
    table = os.path.join(out_dir, "kernel_table.cu")
    _write_if_changed(table, table_source(insts))
    sources.append(table)
    for dt, nd in windows:
        path = os.path.join(out_dir, f"window_{dt}_na{nd}d.cu")
        _write_if_changed(path, window_instance_source(dt, nd))
        sources.append(path)
    table = os.path.join(out_dir, "window_table.cu")
    _write_if_changed(table, window_table_source(windows))
    sources.append(table)
    return sources


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the generated sources")
    ap.add_argument("--dtypes", default=os.environ.get("NATTN_DTYPES", ""))
    ap.add_argument("--head-dims", default=os.environ.get("NATTN_HEAD_DIMS", ""))
    ap.add_argument("--na-dims", default=os.environ.get("NATTN_NA_DIMS", ""))
    ap.add_argument("--families", default=os.environ.get("NATTN_FAMILIES", ""))
    ap.add_argument("--config", help="also write the build configuration JSON here")
    ap.add_argument("--archs", default="", help="archs recorded in the configuration")
    ap.add_argument("--toolkit", default="", help="CUDA toolkit version recorded")
    a = ap.parse_args(argv)
    insts = instances(a.dtypes, a.head_dims, a.na_dims, a.archs, a.families)
    windows = window_instances(a.dtypes, a.na_dims)
    sources = generate(a.out, insts, windows)
    if a.config:
        config = {
            "archs": [x for x in a.archs.replace(",", ";").split(";") if x],
            "toolkit": a.toolkit,
            "families": sorted({i.family for i in insts}),
            "dtypes": sorted({i.dtype for i in insts}, key=DTYPES.index),
            "head_dims": sorted({i.head_dim for i in insts}),
            "na_dims": sorted({i.na_dim for i in insts}),
            "instances": [i.stem for i in insts],
            "tiles": sorted({f"na{i.na_dim}d:{i.tile_name}" for i in insts if i.tile}),
            "window_ops": [f"{dt}:na{nd}d" for dt, nd in windows],
            "abi_version": ABI_VERSION,
        }
        _write_if_changed(a.config, json.dumps(config, indent=1) + "\n")
    print(";".join(sources))


if __name__ == "__main__":
    main()
