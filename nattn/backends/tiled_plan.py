"""Query boxes and key boxes of the tiled backend (backends/tiled.py), axis by axis.

Along an undilated axis (a dilated one is this per dilation group) the queries are cut into
boxes of ``b`` consecutive tokens. The keys of a box's queries lie in one range of the axis
(every window is a contiguous range, windows.axis_key_interval); the plan gives every box
the same number ``U`` of keys, the longest such range, shifted to stay inside the axis. A
box of the whole problem is the product of one box per axis: its queries attend to the
product of the axes' key ranges, masked per axis to each query's own window. Per query
that is ``prod(U)`` scores where the window holds ``prod(k)``; bigger boxes waste more
scores but make bigger matrix products (``box_sizes`` weighs the two). ``Boxes`` holds a
problem's plans and hands out the index tensors (query rows, key ranges, masks, bias
indices) of its boxes chunk by chunk. A box's mask and bias indices along an axis are one of
a few patterns (the interior boxes share one, the border boxes add a few), so a problem's
distinct masks / bias indices are built once, as products of the axes' patterns, and a
chunk gathers its boxes' (chunk builds 1.6-5x faster than score by score, which problems with
too many patterns keep).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import List, NamedTuple, Optional, Tuple

import torch

from ..windows import axis_key_interval, axis_window_start

# Scores held per chunk of boxes (float32: 2 MiB; a chunk's temporaries, ~14x that, stay in
# the thread's scratch buffers between calls: backends/scratch.py).
CHUNK_SCORES = 1 << 19

# Bytes of chunk index tensors kept between calls, over every problem (the least recently
# used problem's go first): building them costs ~5-10% of a small window's forward.
CACHED_BYTES = 32 << 20

# The largest problem-wide table of box patterns (distinct masks or bias indices, ``[P, R,
# U]``) built once per problem; above it (big boxes with many border patterns) each chunk's
# are built score by score.
PATTERN_SCORES = 1 << 20

# Per-product overhead, in scores per query row of a box: a box of R query rows costs
# U * (1 + ROW_OVERHEAD / R) (CPU, float32; 7x7 windows measured best at 4x4 boxes, 13x13
# at 8x8: both hold for values between ~15 and ~30).
ROW_OVERHEAD = 20.0


@dataclass(frozen=True)
class AxisPlan:
    """One axis (or dilation group) of ``length`` tokens cut into ``boxes`` boxes of ``box``."""

    length: int
    box: int
    boxes: int
    keys: int  # U: keys per box
    key_start: torch.Tensor  # [boxes]: the first of each box's U keys
    mask: torch.Tensor  # [boxes, box, keys] bool: query (padded past length: all False) sees key
    rpb: torch.Tensor  # [boxes, box, keys]: key - query + kernel - 1, clamped into the table
    slot: torch.Tensor  # [boxes, box, kernel]: window slot t's place among the box's keys (clamped)
    slot_ok: torch.Tensor  # [boxes, box, kernel] bool: slot t holds a key (the unfused ops' slots)
    # The boxes' distinct (mask, rpb) slices: interior boxes share one, the border boxes add a
    # few. pattern [boxes] is each box's, pattern_mask / pattern_rpb [patterns, box, keys].
    pattern: torch.Tensor
    pattern_mask: torch.Tensor
    pattern_rpb: torch.Tensor


def _key_ranges(length: int, kernel: int, stride: int, causal: bool, box: int):
    first, last = axis_key_interval(length, kernel, stride, causal)
    boxes = -(-length // box)
    pad = boxes * box - length
    first = torch.cat([first, first.new_full((pad,), length)]).view(boxes, box)
    last = torch.cat([last, last.new_full((pad,), -1)]).view(boxes, box)
    lo, hi = first.amin(1), last.amax(1)
    keys = min(length, int((hi - lo).max()) + 1)
    return boxes, keys, first, last, lo


def axis_keys(length: int, kernel: int, stride: int, causal: bool, box: int) -> int:
    """U of a box of ``box`` tokens along this axis."""
    return _key_ranges(length, kernel, stride, causal, box)[1]


@lru_cache(maxsize=256)
def axis_plan(length: int, kernel: int, stride: int, causal: bool, box: int) -> AxisPlan:
    boxes, keys, first, last, lo = _key_ranges(length, kernel, stride, causal, box)
    start = torch.minimum(lo, torch.full_like(lo, length - keys))  # keep the range inside the axis
    key = start[:, None, None] + torch.arange(keys)[None, None, :]  # [boxes, 1, keys]
    mask = (key >= first[:, :, None]) & (key <= last[:, :, None])
    query = torch.arange(boxes * box).view(boxes, box, 1)
    rpb = (key - query + kernel - 1).clamp(0, 2 * kernel - 2)
    base = axis_window_start(length, kernel, stride, causal)
    base = torch.cat([base, base.new_zeros(boxes * box - length)]).view(boxes, box, 1)
    coord = base + torch.arange(kernel)  # [boxes, box, kernel]: each slot's key
    slot_ok = (coord >= 0) & (query < length) & ((coord <= query) if causal else True)
    slot = (coord - start[:, None, None]).clamp(0, keys - 1)
    both = torch.cat([mask.reshape(boxes, -1).long(), rpb.reshape(boxes, -1)], 1)
    distinct, pattern = torch.unique(both, dim=0, return_inverse=True)
    n = box * keys
    return AxisPlan(length, box, boxes, keys, start, mask, rpb, slot, slot_ok, pattern,
                    distinct[:, :n].bool().view(-1, box, keys), distinct[:, n:].view(-1, box, keys))


def _candidates(length: int) -> Tuple[int, ...]:
    """Box sizes tried along an axis: powers of two up to the axis (and the axis itself)."""
    sizes = {1 << i for i in range(11) if (1 << i) < length} | {min(length, 1024)}
    return tuple(sorted(sizes))


@lru_cache(maxsize=256)
def box_sizes(lengths: Tuple[int, ...], kernel: Tuple[int, ...], stride: Tuple[int, ...],
              causal: Tuple[bool, ...]) -> Tuple[int, ...]:
    """Per axis, the box size with the least estimated work: scores per query times the
    per-product overhead of its box's ``prod(box)`` query rows (the products run one query
    head at a time, GQA's included)."""
    per_axis = [[(b, axis_keys(n, k, s, c, b)) for b in _candidates(n)]
                for n, k, s, c in zip(lengths, kernel, stride, causal)]
    best, best_cost = None, math.inf
    for combo in itertools.product(*per_axis):
        rows = math.prod(b for b, _ in combo)
        pad = math.prod(-(-n // b) * b / n for n, (b, _) in zip(lengths, combo))  # padded query rows
        cost = math.prod(u for _, u in combo) * pad * (1 + ROW_OVERHEAD / rows)
        if cost < best_cost:
            best, best_cost = tuple(b for b, _ in combo), cost
    return best


def outer(parts: List[torch.Tensor], combine) -> torch.Tensor:
    """Per axis ``a`` a tensor ``[C, *dims_a]`` (the same number of dims for every axis) ->
    ``[C, prod(dims_a[0] over a), prod(dims_a[1] over a), ...]``: every combination of one
    entry per axis, axis 0 slowest, reduced with ``combine`` (``&``, ``+``)."""
    n, trailing = len(parts), parts[0].dim() - 1
    out = None
    for a, t in enumerate(parts):
        shape = [t.shape[0]] + [t.shape[1 + j] if i == a else 1 for j in range(trailing) for i in range(n)]
        t = t.view(shape)
        out = t if out is None else combine(out, t)
    return out.reshape(out.shape[0], *[math.prod(out.shape[1 + j * n : 1 + (j + 1) * n]) for j in range(trailing)])


class Chunk(NamedTuple):
    """The index tensors of a chunk of ``C`` boxes of ``R`` query rows and ``U`` keys each."""

    q_gather: torch.Tensor  # [C, R]: each row's token (padded rows: the axis's last token)
    q_scatter: torch.Tensor  # [C, R]: the same, padded rows pointing one past the tokens
    k_idx: torch.Tensor  # [C, U]: each box's keys
    mask: Optional[torch.Tensor]  # [C, R, U] float32: 0 where the query sees the key, -inf elsewhere
    # (padded rows see every key: finite scores that row_ok then zeroes where it matters)
    # the boxes' bias entries, [P, R, U] int64, as the P distinct patterns (interior boxes
    # share one; masked scores point one past the table) and each box's pattern [C]
    rpb_idx: Optional[torch.Tensor]
    rpb_box: Optional[torch.Tensor]
    row_ok: Optional[torch.Tensor]  # [C, R, 1] float32: 1 for real rows, 0 for padding (None: none)
    slot: Optional[torch.Tensor] = None  # [C, R, W]: window slot t's place among the box's keys
    slot_ok: Optional[torch.Tensor] = None  # [C, R, W] bool: slot t holds a key


class _KeptChunks:
    """The chunk lists kept between calls: least recently used first out, within
    CACHED_BYTES (read when a list is added, so a test may change it), one lock for threads."""

    def __init__(self):
        self.lists: "OrderedDict[tuple, Tuple[list, int]]" = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            entry = self.lists.get(key)
            if entry is None:
                return None
            self.lists.move_to_end(key)
            return entry[0]

    def put(self, key, chunks: list) -> None:
        size = sum(t.numel() * t.element_size() for ch in chunks for t in ch if t is not None)
        with self.lock:
            if size > CACHED_BYTES or key in self.lists:
                return
            while self.lists and self.bytes + size > CACHED_BYTES:
                self.bytes -= self.lists.popitem(last=False)[1][1]
            self.lists[key] = (chunks, size)
            self.bytes += size

    def clear(self) -> None:
        with self.lock:
            self.lists.clear()
            self.bytes = 0


KEPT = _KeptChunks()


@lru_cache(maxsize=16)
def boxes_for(lengths, kernel, stride, causal, with_rpb: bool, device) -> "Boxes":
    """A problem's boxes, shared by its calls (and by layers of the same shape): their small
    index tensors are built once."""
    return Boxes(lengths, kernel, stride, causal, with_rpb, device)


class Boxes:
    """One dilation group's sub-grid, cut into boxes: index tensors per chunk of boxes."""

    def __init__(self, lengths, kernel, stride, causal, with_rpb: bool, device):
        self.lengths = lengths
        self.tokens = math.prod(lengths)
        b = box_sizes(lengths, kernel, stride, causal)
        self.plans: List[AxisPlan] = [
            axis_plan(n, k, s, c, bx) for n, k, s, c, bx in zip(lengths, kernel, stride, causal, b)]
        self.count = math.prod(p.boxes for p in self.plans)
        self.rows = math.prod(p.box for p in self.plans)
        self.keys = math.prod(p.keys for p in self.plans)
        self.with_rpb = with_rpb
        self.rpb_sizes = [2 * k - 1 for k in kernel]
        self.device = device
        self.key = (lengths, kernel, stride, causal, with_rpb, str(device))
        self._patterns()

    def _patterns(self) -> None:
        """The boxes' distinct masks (additive) or bias indices, from the axes' patterns (a box's
        is the product of one per axis): ``pattern_mask`` / ``pattern_rpb`` ``[P, R, U]`` and the
        per-axis strides of a box's pattern id; None where they would outweigh the chunks'
        own (``PATTERN_SCORES``), which are then built score by score."""
        counts = [p.pattern_mask.shape[0] for p in self.plans]
        self.pattern_count = math.prod(counts)
        self.pattern_stride = [math.prod(counts[a + 1:]) for a in range(len(counts))]
        self.pattern_mask = self.pattern_rpb = None
        if self.pattern_count * self.rows * self.keys > PATTERN_SCORES:
            return
        ids = torch.arange(self.pattern_count)
        per_axis = [(ids // st) % n for st, n in zip(self.pattern_stride, counts)]
        # padded rows (masked along some axis: their windows are never empty)
        ok = outer([p.pattern_mask[i].any(-1) for p, i in zip(self.plans, per_axis)], torch.logical_and)
        rpbs = [p.pattern_rpb[i] for p, i in zip(self.plans, per_axis)] if self.with_rpb else None
        self.pattern_mask, self.pattern_rpb = self._mask_or_bias(
            [p.pattern_mask[i] for p, i in zip(self.plans, per_axis)], rpbs, ok)

    def _mask_or_bias(self, masks, rpbs, ok):
        """Per axis, boxes' masks ``[C, box, keys]`` (and, with an RPB, their bias indices
        ``rpbs``) and the rows' validity ``ok`` ``[C, R]`` -> ``(additive, None)`` ``[C, R, U]``
        (0 or -inf), or with an RPB ``(None, bias indices)`` (masked scores point one past the
        table: the tiled backend puts -inf there). Padded rows see every key of their box:
        finite scores, never a row without keys (its softmax would be NaN); the backward
        weighs them by row_ok."""
        mask = outer(masks, torch.logical_and) | ~ok[..., None]
        if rpbs is None:
            return torch.zeros(mask.shape).masked_fill_(~mask, float("-inf")), None
        mult = [math.prod(self.rpb_sizes[a + 1:]) for a in range(len(self.plans))]
        rpb_idx = outer([r * m for r, m in zip(rpbs, mult)], torch.add)
        return None, torch.where(mask, rpb_idx, math.prod(self.rpb_sizes))

    def chunks(self, scores_per_box: int, slots: bool = False):
        """Every chunk of boxes (a ``Chunk``), with ``slots`` also ``slot`` and ``slot_ok`` (the
        unfused ops' layout). The mask is additive: one add masks a chunk's scores of every
        batch entry and head, where a boolean ``masked_fill_`` broadcast over them runs ~10x
        slower (CPU). With a bias table it is None: the bias index points masked scores at a
        row of -inf. Kept for the next call within CACHED_BYTES over all problems (``KEPT``)."""
        per = max(1, CHUNK_SCORES // max(1, scores_per_box))
        key = (self.key, per, slots)
        kept = KEPT.get(key)
        if kept is not None:
            return kept
        chunks = (self._chunk(start, min(start + per, self.count), slots) for start in range(0, self.count, per))
        if self._index_bytes(slots) > CACHED_BYTES:
            return chunks  # built one at a time: their memory stays one chunk's
        chunks = list(chunks)
        KEPT.put(key, chunks)
        return chunks

    def _index_bytes(self, slots: bool) -> int:
        """About what a problem's chunks hold: 4 bytes a score (the mask; bias patterns are
        fewer), and with ``slots`` 9 a window slot (int64 place, bool)."""
        window = math.prod(p.slot.shape[-1] for p in self.plans)
        return self.count * self.rows * (4 * self.keys + (9 * window if slots else 0))

    def _chunk(self, start: int, stop: int, slots: bool):
        ids = torch.arange(start, stop)
        coords = []
        for p in reversed(self.plans):  # unravel the box index, axis 0 slowest
            coords.append(ids % p.boxes)
            ids = ids // p.boxes
        coords.reverse()
        strides = [math.prod(self.lengths[a + 1:]) for a in range(len(self.lengths))]
        # query rows: token index (gathers; padded rows clamped) and scatter index (padded: N)
        q_parts, ok_parts = [], []
        for p, c, st in zip(self.plans, coords, strides):
            qc = c[:, None] * p.box + torch.arange(p.box)[None, :]
            ok_parts.append(qc < p.length)
            q_parts.append(qc.clamp(max=p.length - 1) * st)
        q_gather = outer(q_parts, torch.add)
        ok = outer(ok_parts, torch.logical_and)
        q_scatter = torch.where(ok, q_gather, self.tokens)
        k_idx = outer([(p.key_start[c][:, None] + torch.arange(p.keys)[None, :]) * st
                        for p, c, st in zip(self.plans, coords, strides)], torch.add)
        rpb_idx = rpb_box = additive = None
        if self.pattern_mask is not None or self.pattern_rpb is not None:
            # each box's pattern (the axes' patterns' product): no score-by-score work
            box_pattern = sum(p.pattern[c] * st for p, c, st in zip(self.plans, coords, self.pattern_stride))
            if self.with_rpb:
                used, rpb_box = torch.unique(box_pattern, return_inverse=True)
                rpb_idx = self.pattern_rpb.index_select(0, used)
            else:
                additive = self.pattern_mask.index_select(0, box_pattern)
            return self._finish(q_gather, q_scatter, k_idx, additive, rpb_idx, rpb_box, ok, coords, slots)
        rpbs = [p.rpb[c] for p, c in zip(self.plans, coords)] if self.with_rpb else None
        additive, rpb_idx = self._mask_or_bias([p.mask[c] for p, c in zip(self.plans, coords)], rpbs, ok)
        if self.with_rpb:
            patterns, rpb_box = torch.unique(rpb_idx.flatten(1), dim=0, return_inverse=True)
            rpb_idx = patterns.view(-1, *rpb_idx.shape[1:])
        return self._finish(q_gather, q_scatter, k_idx, additive, rpb_idx, rpb_box, ok, coords, slots)

    def _finish(self, q_gather, q_scatter, k_idx, additive, rpb_idx, rpb_box, ok, coords, slots):
        """The chunk's tensors on the device (and the unfused ops' slots)."""
        row_ok = None if bool(ok.all()) else ok.float()[..., None]
        dev = self.device
        on = [None if t is None else t.to(dev)
              for t in (q_gather, q_scatter, k_idx, additive, rpb_idx, rpb_box, row_ok)]
        if not slots:
            return Chunk(*on)
        mult = [math.prod(p.keys for p in self.plans[a + 1:]) for a in range(len(self.plans))]
        slot = outer([p.slot[c] * m for p, c, m in zip(self.plans, coords, mult)], torch.add)
        slot_ok = outer([p.slot_ok[c] for p, c in zip(self.plans, coords)], torch.logical_and)
        return Chunk(*on, slot.to(dev), slot_ok.to(dev))
