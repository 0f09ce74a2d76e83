"""One cast per group of parameters under autocast, instead of one per parameter.

Under ``torch.autocast`` every ``F.linear`` casts its float32 weight and bias to the autocast
dtype: one cast op (and in training one backward node) per parameter and step. A NAT-Tiny
step has 30 blocks of four Linears and two norms, so ~360 such casts forward and as many
backward nodes, each costing host time that an eager step on a slow host waits for.

``GroupedCasts`` casts a model's block parameters in a few ops instead: the 2-D weights
concatenated per input width (``torch.cat`` along the rows), the 1-D ones (biases, norm gains)
together, each group cast once and split back into views shaped like the parameters. The
values are bit for bit what autocast computes (the same rounding of each element), and so
are the gradients (the concatenation, the cast and the split pass them back unchanged).

While a ``GroupedCasts.active(...)`` region runs, modules ask ``cast_of(p)`` for a parameter's
cast and ``linear(module, x)`` for a Linear; outside one (or for a parameter not in it) they
get the parameter itself and autocast casts as usual. The region is per thread: autograd's
recomputations (gradient checkpointing) run outside it and fall back to autocast's casts.

While ``torch.compile`` traces, ``traced_casts(root, sources, device_type)`` is the region
instead: the same concatenations, casts and splits become ops of the graph, and the grouped
parameters are replaced by their cast views for the region (torch.func's reparametrization,
which dynamo traces), so the modules need no lookup. Inductor materializes a cast weight that
feeds a matrix product as a kernel of its own: without the groups a compiled NAT-Tiny step
launched ~370 such casts (forward, and the gradients' casts back to float32), one per
parameter.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module_globals  # torch's global module hooks

from .._eager import autocast_on

_local = threading.local()


def _casts() -> Optional[Dict[int, torch.Tensor]]:
    # never active while compiling: no thread-local state for dynamo to trace
    return None if torch.compiler.is_compiling() else getattr(_local, "casts", None)


def cast_of(p: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The active region's cast of parameter ``p``, else ``p``."""
    casts = _casts()
    if casts is None or p is None:
        return p
    return casts.get(id(p), p)


def _hooked(module: nn.Module) -> bool:
    """Whether calling ``module`` would run hooks (its own or global, forward or backward)."""
    m = _module_globals
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks)


def linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; for a plain ``nn.Linear`` without hooks inside an active region,
    ``F.linear`` on the region's casts of its weight and bias (the same result)."""
    if _casts() is None or type(module) is not nn.Linear or _hooked(module):
        return module(x)
    return F.linear(x, cast_of(module.weight), cast_of(module.bias))


def _grouped(params: Iterable[Optional[torch.Tensor]]) -> List[Tuple[torch.device, Tuple[torch.Tensor, ...]]]:
    """The groups of one cast each: plain float32 ``nn.Parameter`` objects (each once), the
    2-D ones by (input width, device), the 1-D ones by device. Others are left to autocast."""
    mats: Dict[Tuple[int, torch.device], List[torch.Tensor]] = {}
    vecs: Dict[torch.device, List[torch.Tensor]] = {}
    seen = set()
    for p in params:
        if p is None or id(p) in seen or type(p) is not nn.Parameter or p.dtype != torch.float32:
            continue
        seen.add(id(p))
        if p.dim() == 2:
            mats.setdefault((p.shape[1], p.device), []).append(p)
        elif p.dim() == 1:
            vecs.setdefault(p.device, []).append(p)
    return [(dev, tuple(ts)) for (_, dev), ts in mats.items()] + [(dev, tuple(ts)) for dev, ts in vecs.items()]


try:  # torch.func.functional_call's region: swaps module attributes and restores them
    from torch.nn.utils.stateless import _reparametrize_module
except ImportError:  # pragma: no cover (torch without it: autocast's per-parameter casts)
    _reparametrize_module = None


def traced_casts(root: nn.Module, sources: Iterable[Tuple[str, nn.Module, str]], device_type: str):
    """The compile-time region (see the module's docstring): ``sources`` are (qualified name
    under ``root``, module, parameter name) triples. A no-op without autocast on
    ``device_type``."""
    if _reparametrize_module is None or not autocast_on(device_type):
        return contextlib.nullcontext()
    dt = torch.get_autocast_dtype(device_type)
    named = [(qual, module._parameters.get(name)) for qual, module, name in sources]
    names: Dict[int, List[str]] = {}
    for qual, p in named:
        if p is not None:
            names.setdefault(id(p), []).append(qual)
    swap: Dict[str, torch.Tensor] = {}
    for dev, ts in _grouped(p for _, p in named):
        if dev.type != device_type:
            continue
        for t, part in zip(ts, torch.cat(ts).to(dt).split([t.shape[0] for t in ts])):
            for qual in names[id(t)]:  # a parameter registered under several names: each of them
                swap[qual] = part
    return _reparametrize_module(root, swap) if swap else contextlib.nullcontext()


class GroupedCasts:
    """The grouped casts of the parameters ``sources`` names (``(module, parameter name)``
    pairs, a model's block parameters): ``active()`` is the region. Groups are fixed at
    construction (``stale()`` says when a module's parameter is no longer the one grouped);
    parameters that are not plain float32 ``nn.Parameter`` objects are left to autocast."""

    def __init__(self, sources: Iterable[Tuple[nn.Module, str]]):
        # what each (module, name) held, grouped or not, so that a swap either way (e.g.
        # torch.func.functional_call's and back) makes the groups stale
        sources = list(sources)
        self._dicts = tuple(module._parameters for module, _ in sources)
        self._names = tuple(name for _, name in sources)
        self._held = tuple(d.get(n) for d, n in zip(self._dicts, self._names))
        # (device, tensors, split sizes along dim 0, ids): one cat + cast + split each
        self.groups = [(dev, ts, [t.shape[0] for t in ts], [id(t) for t in ts]) for dev, ts in _grouped(self._held)]

    def stale(self) -> bool:
        """Whether a module's parameter was replaced (``load_state_dict(..., assign=True)``,
        sharding wrappers, parametrizations): the groups would then cast tensors no module
        uses, and hold them. (Moves and dtype changes go through ``Module._apply``, where the
        models drop their groups.) One pass in C over the recorded objects."""
        return any(map(operator.is_not, map(dict.get, self._dicts, self._names), self._held))

    @contextlib.contextmanager
    def active(self, device_type: str):
        """Casts the groups on ``device_type`` to its autocast dtype when autocast is on there,
        for the region's duration (not while compiling: ``traced_casts`` is that region)."""
        if (not self.groups or getattr(_local, "casts", None) is not None or torch.jit.is_scripting()
                or torch.compiler.is_compiling() or not autocast_on(device_type)):
            yield
            return
        dt = torch.get_autocast_dtype(device_type)
        casts: Dict[int, torch.Tensor] = {}
        for dev, ts, sizes, ids in self.groups:
            if dev.type != device_type:
                continue
            try:
                parts = torch.cat(ts).to(dt).split(sizes)
            except RuntimeError:  # a group's tensors moved apart behind Module._apply's back (.data)
                continue  # autocast casts them one by one, as without the groups
            casts.update(zip(ids, parts))
        _local.casts = casts
        try:
            yield
        finally:
            _local.casts = None
