"""Attention dropout's random bits in PyTorch: Philox-4x32-10 and the keep mask.

The twin of ``csrc/include/nattn/common/philox.cuh`` (checked bit for bit against it by
``tests/test_dropout_philox.py``); docs/semantics.md, "Attention dropout", defines the
mapping. Element (batch ``b``, query head ``h``, query token ``q``, key ``k``) of a call whose
``rng`` tensor holds ``[seed, offset]``::

    words = Philox4x32_10(counter = (k >> 2, q, h + lo(offset), b + hi(offset))   (mod 2^32 each),
                          key     = (lo(seed), hi(seed)))
    kept  = words[k & 3] >= floor(p * 2^32)

``q`` is the row-major index of the query in the spatial grid, ``k`` the same for a
neighbourhood key and ``N + j`` for extra key ``j`` (``N`` spatial tokens). A kept weight is
scaled by ``1 / (1 - p)``.

uint32 arithmetic is emulated in int64 tensors (values in ``[0, 2^32)``; a 32 x 32-bit
product is formed from 16-bit halves so that nothing overflows), so the mask of any index
tensors (broadcast together) is computed on their device without a host round trip.
"""

from __future__ import annotations

import math
from typing import Tuple, Union

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10

# Seed and offset are drawn from [0, RNG_HIGH): the widest range whose size fits an int64
# (torch.compile's inductor forms high - low in int64).
RNG_HIGH = 2**63 - 1

Word = Union[torch.Tensor, int]


def _mul_hi_lo(x: torch.Tensor, m: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` 32-bit halves of ``x * m`` for uint32 ``x`` (int64 tensor) and constant ``m``."""
    a = x * (m & 0xFFFF)  # < 2^48
    b = x * (m >> 16)  # < 2^48; x * m = b * 2^16 + a
    t = a + ((b & 0xFFFF) << 16)
    return (b >> 16) + (t >> 32), t & MASK32


def philox4x32(counter, key, rounds: int = ROUNDS):
    """Philox-4x32 (``rounds`` rounds, 10 the standard) of counter words ``(c0, c1, c2, c3)``
    and key words ``(k0, k1)``: the four output words, int64 tensors in ``[0, 2^32)``.

    Words are int64 tensors (broadcast together) or Python ints, each in ``[0, 2^32)``.
    """
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) for c in counter)
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mul_hi_lo(c0, PHILOX_M0)
        hi1, lo1 = _mul_hi_lo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def drop_threshold(p: float) -> int:
    """``floor(p * 2^32)``, exact for a float ``p`` in ``[0, 1)``: a word below it drops its
    element (kept with probability ``1 - threshold / 2^32``, within ``2^-32`` of ``1 - p``)."""
    if not p > 0.0:
        return 0
    return min(math.floor(p * 4294967296.0), MASK32)


def _halves(word) -> Tuple[Word, Word]:
    """Low and high 32-bit halves of a 64-bit word (an int64 tensor or a Python int)."""
    if isinstance(word, torch.Tensor):
        return word & MASK32, (word >> 32) & MASK32
    word &= (1 << 64) - 1
    return word & MASK32, word >> 32


def _rng_words(rng) -> Tuple[Word, Word]:
    """``(seed, offset)`` of an ``rng`` tensor ``[2]`` (int64) or a pair of Python ints."""
    if isinstance(rng, torch.Tensor):
        if rng.dtype != torch.int64 or rng.shape != (2,):
            raise ValueError("rng must be an int64 tensor of shape [2] (seed, offset), "
                             f"got {rng.dtype} {tuple(rng.shape)}")
        return rng[0], rng[1]
    seed, offset = rng
    return seed, offset


def dropout_words(rng, batch, head, query, key_group):
    """The four Philox words of key group ``key_group`` (keys ``4 g .. 4 g + 3``) of each
    (batch, head, query): int64 tensors in ``[0, 2^32)``, the broadcast shape of the indices."""
    seed, offset = _rng_words(rng)
    k0, k1 = _halves(seed)
    off_lo, off_hi = _halves(offset)
    as_long = lambda x: torch.as_tensor(x, dtype=torch.int64)  # noqa: E731
    counter = (
        as_long(key_group) & MASK32,
        as_long(query) & MASK32,
        (as_long(head) + off_lo) & MASK32,
        (as_long(batch) + off_hi) & MASK32,
    )
    return philox4x32(counter, (k0, k1))


def dropout_word(rng, batch, head, query, key) -> torch.Tensor:
    """The word of each element (batch, head, query, key): index tensors broadcast together."""
    key = torch.as_tensor(key, dtype=torch.int64)
    x0, x1, x2, x3 = dropout_words(rng, batch, head, query, key >> 2)
    lane = key & 3
    low = torch.where(lane & 1 == 1, x1, x0)
    high = torch.where(lane & 1 == 1, x3, x2)
    return torch.where(lane >= 2, high, low)


def keep_mask(rng, p: float, batch, head, query, key) -> torch.Tensor:
    """Boolean keep mask of the elements (batch, head, query, key) for dropout probability ``p``
    (index tensors broadcast together; global indices as the module docstring says)."""
    return dropout_word(rng, batch, head, query, key) >= drop_threshold(p)


def draw_rng(device) -> torch.Tensor:
    """One call's ``[seed, offset]`` (int64, on ``device``) from the default generator of that
    device: ``torch.manual_seed`` makes calls reproducible, successive calls differ. A device
    tensor, so CUDA graphs and torch.compile capture the draw."""
    return torch.randint(0, RNG_HIGH, (2,), dtype=torch.int64, device=device)


def weight_factor(rng, p: float, batch: int, heads_kv: int, groups: int, queries: torch.Tensor,
                  keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What dropout multiplies attention weights by where they meet the values: ``1 / (1 - p)``
    where kept, 0 where dropped, ``[B, C, H_kv, G, W]`` in ``dtype`` (the layout of the
    reference backend's chunks: query head ``h = h_kv * G + g``) for query tokens ``queries``
    ``[C]`` and keys ``keys`` (``[C, W]``, per query, or ``[W]``, the same for every query)."""
    dev = queries.device
    b = torch.arange(batch, device=dev).view(-1, 1, 1, 1, 1)
    h = torch.arange(heads_kv * groups, device=dev).view(1, 1, heads_kv, groups, 1)
    q = queries.view(1, -1, 1, 1, 1)
    k = keys.view(1, keys.shape[0] if keys.dim() == 2 else 1, 1, 1, keys.shape[-1])
    keep = keep_mask(rng, p, b, h, q, k)
    return keep.to(dtype) * (1.0 / (1.0 - p))


# About how many int64 temporaries per attention weight computing its factor holds at once
# (int64: two float32 elements each); the reference backend sizes its chunks with it.
ELEMENTS_PER_WEIGHT = 24
