"""What one row of the table runs: nattn through a backend, torch's dense SDPA, or the
flex recipe most users reach for (compiled flex_attention, row-major tokens, a
neighborhood mask_mod and a block mask built once).

A row prepares its inputs from a dict of heads-last tensors ``[B, *spatial, H, D]`` and
exposes ``forward(*inputs)``; NA rows can also return their output heads-last for the
check against the reference.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F

import nattn
from nattn.backends import choose_na_backend
from nattn.params import NAParams

from .problems import Problem

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def make_inputs(p: Problem, device, dtype, requires_grad: bool, seed: int) -> Dict[str, torch.Tensor]:
    """Fresh random heads-last inputs (never zeros: they hide unwritten outputs)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        x = torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)
        return x.requires_grad_(requires_grad)

    t = {"q": rnd(p.batch, *p.spatial, p.heads, p.dim),
         "k": rnd(p.batch, *p.spatial, p.heads_kv, p.dim),
         "v": rnd(p.batch, *p.spatial, p.heads_kv, p.dim_v)}
    if p.extra:
        t["ek"] = rnd(p.batch, p.extra, p.heads_kv, p.dim)
        t["ev"] = rnd(p.batch, p.extra, p.heads_kv, p.dim_v)
    if p.rpb:
        t["rpb"] = rnd(p.heads, *[2 * k - 1 for k in p.kernel])
    return t


def params_of(p: Problem) -> NAParams:
    return NAParams(p.kernel, p.stride, p.dilation, p.causal, p.dim ** -0.5, dropout_p=p.dropout)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[B, *spatial, H, D]`` -> ``[B, H, N, D]`` (a view; a leaf again for autograd)."""
    b, h, d = x.shape[0], x.shape[-2], x.shape[-1]
    return x.detach().reshape(b, -1, h, d).transpose(1, 2).requires_grad_(x.requires_grad)


class Row:
    name = "?"
    is_na = True  # computes neighborhood attention (so it is checked against the reference)

    def reason(self, p: Problem, device: torch.device, backward: bool) -> Optional[str]:
        """Why this row cannot run ``p`` here (None: it can)."""
        return None

    def prepare(self, p: Problem, t: Dict[str, torch.Tensor]) -> tuple:
        raise NotImplementedError

    def forward(self, *inputs) -> torch.Tensor:
        raise NotImplementedError

    def heads_last(self, out: torch.Tensor, p: Problem) -> torch.Tensor:
        return out


def heads_first_view(x: torch.Tensor) -> torch.Tensor:
    """The same values stored heads-first (``[B, H, *spatial, D]``, the layout of SDPA-style
    code) and viewed heads-last, as such code would pass them (a leaf again for autograd)."""
    stored = x.detach().movedim(-2, 1).contiguous()
    return stored.movedim(1, -2).requires_grad_(x.requires_grad)


LAYOUTS = ("heads-last", "heads-first")


class NattnRow(Row):
    """nattn's public API with a named backend (None: automatic choice, shown in the name), on
    heads-last tensors or on heads-first ones viewed heads-last (``layout``)."""

    def __init__(self, backend: Optional[str] = None, layout: str = LAYOUTS[0]):
        self.backend = backend
        self.layout = layout
        self.name = (f"nattn:{backend}" if backend else "nattn:auto") + (f" ({layout})" if layout != LAYOUTS[0] else "")
        self._p = None

    def _laid_out(self, t: Dict[str, torch.Tensor]):
        qkv = (t["q"], t["k"], t["v"])
        return tuple(heads_first_view(x) for x in qkv) if self.layout == LAYOUTS[1] else qkv

    def resolve(self, p: Problem, t: Dict[str, torch.Tensor]) -> str:
        """Which backend runs (raises NoBackendError with every reason when none can)."""
        return choose_na_backend(*self._laid_out(t), t.get("rpb"), params_of(p), self.backend)

    def reason(self, p, device, backward):
        return None  # the backend's own check runs in resolve()/the call, with its reasons

    def prepare(self, p, t):
        self._p = p
        return (*self._laid_out(t), t.get("ek"), t.get("ev"), t.get("rpb"))

    def forward(self, q, k, v, ek, ev, rpb):
        p = self._p
        return FUNCS[p.na_dim](q, k, v, p.kernel, stride=p.stride, dilation=p.dilation, is_causal=p.causal,
                               additional_keys=ek, additional_values=ev, rpb=rpb, backend=self.backend,
                               dropout_p=p.dropout)


class DenseRow(Row):
    """torch's dense SDPA over all tokens (and the extra ones): the work NA avoids."""

    name = "dense sdpa"
    is_na = False

    def prepare(self, p, t):
        q, k, v = _heads_first(t["q"]), _heads_first(t["k"]), _heads_first(t["v"])
        if p.extra:  # concatenated once here, outside the timed call
            k = torch.cat([k.detach(), t["ek"].detach().transpose(1, 2)], 2).requires_grad_(k.requires_grad)
            v = torch.cat([v.detach(), t["ev"].detach().transpose(1, 2)], 2).requires_grad_(v.requires_grad)
        self._gqa = p.heads != p.heads_kv
        self._dropout = p.dropout
        return q, k, v

    def forward(self, q, k, v):
        if self._gqa:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self._dropout, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self._dropout)


def row_major_mask_mod(spatial, kernel, stride, dilation, causal):
    """The closed-form neighborhood ``mask_mod`` over row-major tokens a user writes by hand:
    coordinates by div/mod, then docs/semantics.md's per-axis rule (integer arithmetic only)."""
    from nattn.backends.flex_mask import axis_in_window

    def mask_mod(b, h, q_idx, kv_idx):
        ok = None
        for a in reversed(range(len(spatial))):  # last axis varies fastest
            n, d = spatial[a], dilation[a]
            qi, ki = (q_idx % n, kv_idx % n) if a > 0 else (q_idx, kv_idx)
            q_idx, kv_idx = q_idx // n, kv_idx // n
            if d > 1:
                g = qi % d
                axis = axis_in_window(qi // d, ki // d, (n - 1 - g) // d + 1, kernel[a], stride[a], causal[a])
                axis = axis & (ki % d == g)
            else:
                axis = axis_in_window(qi, ki, n, kernel[a], stride[a], causal[a])
            ok = axis if ok is None else ok & axis
        return ok

    return mask_mod


class FlexPeerRow(Row):
    """The flex recipe without nattn: row-major tokens, a closed-form mask_mod, block mask built
    once, ``torch.compile(flex_attention, dynamic=False)`` on CUDA."""

    name = "flex (row-major)"

    def __init__(self):
        self._masks = {}  # problem signature -> (block mask, flex call), built once

    def reason(self, p, device, backward):
        from nattn.backends.flex import flex_attention

        if flex_attention is None:
            return f"torch {torch.__version__} has no flex_attention"
        if p.rpb or p.extra:
            return "the plain flex recipe has no RPB / extra keys"
        if p.dropout:
            return "flex_attention has no attention dropout"
        if device.type == "cpu" and backward:
            return "torch's flex has no CPU backward"
        return None

    def prepare(self, p, t):
        from torch.nn.attention.flex_attention import create_block_mask

        from nattn.backends.flex import flex_function

        device = t["q"].device
        cuda = device.type == "cuda"
        key = (p.spatial, p.kernel, p.stride, p.dilation, p.causal, str(device))
        if key not in self._masks:
            if len(self._masks) >= 4:
                self._masks.clear()
            mask_mod = row_major_mask_mod(p.spatial, p.kernel, p.stride, p.dilation, p.causal)
            n = p.tokens
            block_mask = create_block_mask(mask_mod, None, None, n, n, device=device, _compile=cuda)
            # As a user compiles it: torch.compile(flex_attention, dynamic=False), one per
            # problem (as if in a fresh process) so earlier problems' compilations do not interfere.
            self._masks[key] = (block_mask, flex_function(compiled=cuda, with_lse=False))
        self._block_mask, self._fn = self._masks[key]
        self._gqa, self._spatial = p.heads != p.heads_kv, p.spatial
        return _heads_first(t["q"]), _heads_first(t["k"]), _heads_first(t["v"])

    def forward(self, q, k, v):
        return self._fn(q, k, v, None, self._block_mask, None, self._gqa)

    def heads_last(self, out, p):
        return out.transpose(1, 2).reshape(out.shape[0], *p.spatial, out.shape[1], out.shape[-1])
