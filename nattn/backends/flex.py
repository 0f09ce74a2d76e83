"""The flex backend: torch's ``flex_attention`` with a neighborhood mask over tiled tokens.

The backend is *composite*: :meth:`FlexBackend.na_composite` is differentiable torch code
(tile permutations as views, compiled flex with the LSE), and the functional API calls it
directly outside ``torch.compile``, so autograd runs flex's own compiled backward kernel.
Inside a user's ``torch.compile`` region the custom ops are used instead: their forward
runs flex once; their backward recomputes that forward under autograd and differentiates
it, LSE gradient included (one extra forward). Our op's implementation runs below torch's
autograd dispatch key, so :func:`_autograd_enabled` puts the key back for the
recomputation (``torch.enable_grad`` alone is not enough there).

On CPU flex runs only when asked (``backend="flex"``) and only forward: torch's flex has
no CPU backward.
"""

from __future__ import annotations

import itertools
import math
import types
from contextlib import contextmanager

import torch

from . import register_backend
from .base import Backend
from .flex_mask import MaskCache

try:  # flex_attention arrived in torch 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - depends on the installed torch
    flex_attention = create_block_mask = None

try:  # torch >= 2.9 asks for the LSE this way; older ones take return_lse=True
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # pragma: no cover
    AuxRequest = None

_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Uncompiled flex (the CPU path, or compile=False) materializes every score: B * H * N^2 of
# them, about 20 bytes each at peak (measured on the CPU, float32 and bfloat16; 27 for
# float64). Above this many scores (~0.7 GiB) the backend refuses; docs/backends.md.
EAGER_MAX_SCORES = 2**25


@contextmanager
def _autograd_enabled():
    """Re-include the autograd dispatch keys that a custom op's implementation runs without."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in torch._C.DispatchKey.__members__.values():
        if key.name.startswith("Autograd") and exclude.has(key):
            exclude = exclude.remove(key)
    include = torch._C._dispatch_tls_local_include_set()
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


def _flex_with_lse(q, k, v, score_mod, block_mask, scale, enable_gqa):
    if AuxRequest is not None:
        out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                  enable_gqa=enable_gqa, return_aux=AuxRequest(lse=True))
        return out, aux.lse
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          enable_gqa=enable_gqa, return_lse=True)


def _flex_out(q, k, v, score_mod, block_mask, scale, enable_gqa):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          enable_gqa=enable_gqa)


_compiled_count = itertools.count()


def flex_function(compiled: bool, with_lse: bool = True):
    """A flex call ``f(q, k, v, score_mod, block_mask, scale, enable_gqa)``; compiled on request.

    Each compiled one gets a code object of its own: dynamo keeps compiled code, and counts
    recompilations against its limit (8), per code object. One per problem signature keeps
    the signatures of a model (and the benchmark's problems) from evicting each other into
    torch's eager flex, which materializes every score.
    """
    base = _flex_with_lse if with_lse else _flex_out
    if not compiled:
        return base
    code = base.__code__.replace(co_name=f"{base.__name__}_{next(_compiled_count)}")
    # dynamic=False: static shapes, one compilation per signature (dynamic kernels measured
    # 1.6x slower on mid-2d-k13); the mask is built per signature anyway.
    return torch.compile(types.FunctionType(code, base.__globals__, code.co_name), dynamic=False)


class FlexBackend(Backend):
    """``compile``: None compiles on CUDA only; False forces eager (tests); True always compiles."""

    name = "flex"
    composite = True  # na_composite is differentiable torch code: autograd uses flex's own backward

    def __init__(self, compile=None, cache_size: int = 32):
        self.compile = compile
        self.masks = MaskCache(cache_size)

    # ------------------------------------------------------------------ checks
    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        if flex_attention is None:
            return [f"torch {torch.__version__} has no flex_attention (needs torch >= 2.5)"]
        reasons = []
        device = q.device.type
        if device == "cpu":
            if not explicit:
                reasons.append("flex runs on CPU only when asked (backend='flex')")
            tensors = [q, k, v] + ([rpb] if rpb is not None else [])
            if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                reasons.append("torch's flex_attention has no CPU backward (inputs require grad)")
        elif device == "cuda":
            if q.dtype not in _CUDA_DTYPES:
                reasons.append(f"flex on CUDA needs float16, bfloat16 or float32, got {q.dtype}")
            for name, dim in (("head dim", q.shape[-1]), ("value head dim", v.shape[-1])):
                if dim < 16 or dim & (dim - 1):
                    reasons.append(f"flex on CUDA needs a power-of-two {name} >= 16, got {dim}")
        else:
            reasons.append(f"flex supports cpu and cuda devices, got {device}")
        if device in ("cpu", "cuda") and not self._use_compiled(q.device):
            scores = q.shape[0] * q.shape[-2] * math.prod(q.shape[1 : 1 + params.na_dim]) ** 2
            if scores > EAGER_MAX_SCORES:
                reasons.append(
                    f"uncompiled flex_attention (the CPU path) materializes all B*H*N^2 = {scores} "
                    f"scores (~20 bytes each), over the limit of {EAGER_MAX_SCORES}; "
                    "use backend='reference', whose memory does not grow with N^2"
                )
        return reasons

    # ------------------------------------------------------------------ compute
    def _use_compiled(self, device: torch.device) -> bool:
        return device.type == "cuda" if self.compile is None else bool(self.compile)

    def _mask(self, q, params):
        spatial = tuple(q.shape[1 : 1 + params.na_dim])
        compiled = self._use_compiled(q.device)

        def build(entry):
            n = entry.layout.num_positions
            if compiled:  # compiled builder: never materializes the N x N mask
                return create_block_mask(entry.mask_mod(), None, None, n, n, device=q.device, _compile=True)
            return create_block_mask(entry.mask_mod(), None, None, n, n, device=q.device)

        return self.masks.get(spatial, params, q.device, build)

    def _flex(self, mask, device):
        if mask.flex is None:  # one compiled function per problem signature (see flex_function)
            mask.flex = flex_function(self._use_compiled(device))
        return mask.flex

    def _flex_positions(self, mask, qp, kp, vp, rpb, params):
        """flex on tiled positions ``[B, H, P, D]``: ``(out [B, H, P, D_v], lse [B, H, P])``."""
        score_mod = mask.rpb_score_mod(rpb) if rpb is not None else None
        try:
            return self._flex(mask, qp.device)(qp, kp, vp, score_mod, mask.block_mask,
                                               params.scale, qp.shape[1] != kp.shape[1])
        finally:
            mask.release_rpb()

    def na_forward(self, q, k, v, rpb, params):
        mask = self._mask(q, params)
        layout = mask.layout
        with torch.no_grad():
            qp, kp, vp = (layout.to_positions(t) for t in (q, k, v))
            out, lse = self._flex_positions(mask, qp, kp, vp, rpb, params)
            out, lse = layout.from_positions(out), layout.from_positions(lse)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return out.to(q.dtype).contiguous(), lse.to(lse_dtype).contiguous()

    def na_composite(self, q, k, v, rpb, params):
        """Differentiable forward ``(out, lse)``: tile permutations and flex, all under autograd.

        Gradients flow through flex's own (compiled) backward kernel and the permutations'
        views, with no recomputation; :func:`nattn.functional.neighborhood_attention` calls
        this outside ``torch.compile`` instead of the custom op.
        """
        mask = self._mask(q, params)
        layout = mask.layout
        qp, kp, vp = (layout.to_positions(t) for t in (q, k, v))
        out, lse = self._flex_positions(mask, qp, kp, vp, rpb, params)
        out, lse = layout.from_positions(out), layout.from_positions(lse)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return out.to(q.dtype).contiguous(), lse.to(lse_dtype).contiguous()

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params):
        """Recompute flex on the tiled positions under autograd and differentiate it there.

        The gradients are taken with respect to the tiled tensors and gathered back, so the
        permutation costs one gather each way (no scatter-add through the index tables).
        """
        if q.device.type == "cpu":
            raise NotImplementedError(
                "flex backend: torch's flex_attention has no CPU backward; use backend='reference' on CPU"
            )
        mask = self._mask(q, params)
        layout = mask.layout
        inputs = [layout.to_positions(t.detach()).detach().requires_grad_(True) for t in (q, k, v)]
        if rpb is not None:
            inputs.append(rpb.detach().requires_grad_(True))
        with _autograd_enabled():
            o, l = self._flex_positions(mask, *inputs[:3], inputs[3] if rpb is not None else None, params)
            g_out = layout.to_positions(grad_out.to(o.dtype)).contiguous()
            if grad_lse is None:
                g_lse = torch.zeros_like(l)
            else:
                g_lse = layout.to_positions(grad_lse.to(l.dtype)[..., None])[..., 0].contiguous()
            grads = torch.autograd.grad([o, l], inputs, [g_out, g_lse], allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs)]
        dq, dk, dv = (layout.from_positions(g).contiguous() for g in grads[:3])
        drpb = grads[3] if rpb is not None else None
        return dq, dk, dv, drpb


register_backend(FlexBackend())
