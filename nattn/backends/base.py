"""The contract every backend follows.

A backend says what it cannot do and why (``na_not_supported_reasons``), then computes
forward and backward from raw tensors and an :class:`~nattn.params.NAParams`. Automatic
dispatch and an explicit ``backend=`` run the same check.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..params import NAParams

Tensor = torch.Tensor

DROPOUT_REASON = "does not support dropout_p > 0 (attention dropout; the reference backend does)"


class Backend:
    """Base class; subclasses override what they implement."""

    name: str = "?"
    # True when na_composite is plain differentiable torch code: the functional API then
    # calls it directly (outside torch.compile) and autograd differentiates it, no custom op.
    composite: bool = False
    # True when the backend runs attention dropout (``params.dropout_p > 0``; NA and dense):
    # its na_forward/na_backward then take the call's ``rng`` tensor as a keyword, and its
    # dense_forward/dense_backward ``dropout_p``, ``rng`` and ``key_offset``
    # (docs/semantics.md, "Attention dropout"). The dispatch gives every other backend the
    # reason DROPOUT_REASON for such calls; calls without dropout never pass these arguments.
    supports_dropout: bool = False
    # True when na_backward takes ``grads_into=(dq, dk, dv)``: tensors (possibly strided views
    # of one packed gradient) it writes instead of allocating its own. The modules' packed
    # q/k/v path (nattn/_eager.py, NAPackedFunction) needs it: no stack copy of dq, dk, dv.
    writes_grads_into: bool = False
    # True when na_forward / na_backward run no op that autocast recasts (allocations and
    # compiled kernels only): eager calls under autocast then skip disabling it around them.
    autocast_neutral: bool = False

    def na_not_supported_reasons(
        self, q: Tensor, k: Tensor, v: Tensor, rpb: Optional[Tensor], params: NAParams,
        explicit: bool,
    ) -> List[str]:
        """Why this backend cannot run this NA problem; empty when it can.

        ``explicit`` is True when the user named this backend (some backends run on a
        device only when asked). Must look only at metadata (shape, dtype, device,
        strides) so it also works on fake tensors under ``torch.compile``.
        """
        return [f"{self.name} does not implement neighborhood attention"]

    def configured(self, text: str) -> "Backend":
        """This backend running the kernel configuration ``text`` (``"cuda:<text>"`` names,
        backends/kernel_config.py); only backends with configurations override it."""
        raise ValueError(f"backend {self.name!r} takes no kernel configuration (got {self.name}:{text})")

    def configurations(self, q, k, v, rpb, params: NAParams) -> List[str]:
        """Kernel configurations (``configured`` texts) this backend could also run the
        problem with, besides its default; the autotuner times them. None by default."""
        return []

    def backward_configurations(self, q, k, v, rpb, params: NAParams) -> List[str]:
        """The backward's configurations the autotuner chooses among (default first)."""
        return []

    def deterministic_configuration(self) -> str:
        """The configuration that pins a bitwise-reproducible backward ("" when the default
        always is); calls with ``deterministic=True`` run it."""
        return ""

    def na_forward(self, q, k, v, rpb, params: NAParams) -> Tuple[Tensor, Tensor]:
        raise NotImplementedError

    def na_composite(self, q, k, v, rpb, params: NAParams) -> Tuple[Tensor, Tensor]:
        """``(out, lse)`` under autograd; only for backends with ``composite = True``."""
        raise NotImplementedError

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params: NAParams):
        """Returns ``(dq, dk, dv, drpb)``; ``drpb`` is None when ``rpb`` is None."""
        raise NotImplementedError

    def dense_not_supported_reasons(self, q: Tensor, k: Tensor, v: Tensor, is_causal: bool, explicit: bool) -> List[str]:
        return [f"{self.name} does not implement dense attention"]

    def dense_forward(self, q, k, v, is_causal: bool, scale: float) -> Tuple[Tensor, Tensor]:
        raise NotImplementedError

    def dense_backward(self, q, k, v, out, lse, grad_out, grad_lse, is_causal: bool, scale: float):
        raise NotImplementedError
