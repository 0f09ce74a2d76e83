"""Pieces shared by the NAT-family models: the NA transformer block, its stages, weight init and
the timm feature/classifier contract. Checkpoint helpers are in ``_checkpoints``, model creation
in ``_create``."""

from __future__ import annotations

import contextlib
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import DropPath, trunc_normal_
from timm.layers import LayerNorm as _TimmLayerNorm
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint_seq
from torch import nn
from torch.nn.modules import module as torch_module  # its global forward hooks (_hooked)

from nattn._eager import autocast_off, autocast_on, eager_ok, records_graph
from nattn.nn import NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D, fast_norm, param_cast

# Defined here before the checkpoint helpers had their own file (docs named this module).
from ._checkpoints import CheckpointMismatchError  # noqa: F401
from ._create import PretrainedWeightsError  # noqa: F401

_NA = {1: NeighborhoodAttention1D, 2: NeighborhoodAttention2D, 3: NeighborhoodAttention3D}


class LayerNorm(_TimmLayerNorm):
    """The models' LayerNorm: ``nn.LayerNorm`` (eps 1e-5, as in the original NAT/DiNAT code;
    same parameters and state dict) through timm's LayerNorm, so that timm's switch
    ``timm.layers.set_fast_norm(True)``, set before a model is created, applies: under
    autocast the norms then run at the autocast dtype instead of casting activations to
    float32 and back. Off by default: it also keeps the residual stream in bf16, which the
    stem's and downsamplers' norms otherwise start in float32. The blocks' own norms are
    ``BranchLayerNorm`` (below) either way.

    Where no gradient is recorded (inference) on a CUDA tensor, the norm runs libnattn's
    LayerNorm kernel (nattn/nn/fast_norm.py: the same float32 statistics, several rows a
    warp, where torch's kernel gives each row a block; ``NATTN_LAYER_NORM_KERNEL=0`` turns
    it off), with autocast's float32 output under autocast."""

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True):
        super().__init__(num_channels, eps=eps, affine=affine)
        # timm's fast-norm flag as its LayerNorm recorded it (its attribute's name varies by version)
        self._timm_fast = bool(getattr(self, "_fast_norm", getattr(self, "fast_norm", False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting() and not self._timm_fast:
            # autocast runs the norm in float32: the 16-bit input's cast is exact, so the kernel
            # reads it as it is and writes float32
            out_dtype = torch.float32 if autocast_on(x.device.type) else None
            # outside autocast torch takes parameters of x's dtype only (else it raises)
            if out_dtype is not None or self.weight is None or self.weight.dtype == x.dtype:
                out = fast_norm.layer_norm(x, self.weight, self.bias, self.eps, out_dtype)
                if out is not None:
                    return out
        return super().forward(x)

    def add_norm(self, x: torch.Tensor, branch: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(s, self(s))`` for ``s = x + branch`` (a residual add, then this norm): one libnattn
        kernel where ``forward`` would run its kernel (inference on CUDA; the same values bit for
        bit), else torch's add and ``forward``."""
        if not torch.jit.is_scripting() and not self._timm_fast:
            out_dtype = torch.float32 if autocast_on(x.device.type) else None
            s_dtype = torch.promote_types(x.dtype, branch.dtype)
            if out_dtype is not None or self.weight is None or self.weight.dtype == s_dtype:
                fused = fast_norm.add_layer_norm(x, branch, self.weight, self.bias, self.eps, out_dtype)
                if fused is not None:
                    return fused
        s = x + branch
        return s, self(s)


class BranchLayerNorm(LayerNorm):
    """A block's pre-norm (``norm1`` / ``norm2``), whose output feeds only a Linear: under
    autocast it normalizes at the autocast dtype (torch's kernel still accumulates the
    statistics in float32) instead of running torch's float32 kernel and then casting, as
    the Linear would, to the autocast dtype. Same output dtype and one rounding of the
    output either way; the input and the affine parameters are rounded to the autocast
    dtype first. The residual stream the block adds to stays as it is (float32 under
    autocast). NAT-Tiny, batch 128, bf16, H200: 57.5 -> 54.8 ms of kernels a training step,
    18.1 -> 16.5 a forward (docs/models.md). Outside autocast, and when timm's fast norm is
    on (which does this for every norm), it is the plain norm. Same parameters and state
    dict as ``LayerNorm``; models take ``fp32_block_norms=True`` for the float32 norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if self._timm_fast or torch.jit.is_scripting() or not autocast_on(device):
            return super().forward(x)
        dt = torch.get_autocast_dtype(device)
        # the kernel rounds x, the gain and the bias to dt itself (no cast ops)
        out = fast_norm.layer_norm(x, param_cast.cast_of(self.weight), param_cast.cast_of(self.bias), self.eps,
                                   dt, round_to_out=True)
        if out is not None:
            return out
        weight = None if self.weight is None else param_cast.cast_of(self.weight).to(dt)
        bias = None if self.bias is None else param_cast.cast_of(self.bias).to(dt)
        with autocast_off(device):
            return F.layer_norm(x.to(dt), self.normalized_shape, weight, bias, self.eps)

    def add_norm(self, x: torch.Tensor, branch: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``LayerNorm.add_norm`` with this norm's autocast rounding (``forward``'s)."""
        device = x.device.type
        if self._timm_fast or torch.jit.is_scripting() or not autocast_on(device):
            return super().add_norm(x, branch)
        fused = fast_norm.add_layer_norm(x, branch, param_cast.cast_of(self.weight), param_cast.cast_of(self.bias),
                                         self.eps, torch.get_autocast_dtype(device), round_to_out=True)
        if fused is not None:
            return fused
        s = x + branch
        return s, self(s)


def branch_norm(norm_layer, dim: int, fp32_block_norms: bool) -> nn.Module:
    """A block's pre-norm: ``BranchLayerNorm`` where the model's norm is ``LayerNorm`` (unless
    ``fp32_block_norms``), else ``norm_layer`` as given."""
    if norm_layer is LayerNorm and not fp32_block_norms:
        return BranchLayerNorm(dim)
    return norm_layer(dim)


class Mlp(nn.Module):
    """``fc1 -> act -> dropout -> fc2 -> dropout``: timm's Mlp (same parameter names, same
    dropout draws), with the dropout layers only where ``drop > 0``: in an eager step every
    no-op module (timm's keeps two dropouts and an identity norm) costs host time."""

    def __init__(self, dim: int, hidden: int, act_layer=nn.GELU, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop) if drop > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(param_cast.linear(self.fc1, x))
        if self.drop is not None:
            x = self.drop(x)
        x = param_cast.linear(self.fc2, x)
        return x if self.drop is None else self.drop(x)


class NABlock(nn.Module):
    """Pre-norm block: ``x + NA(norm1(x))`` then ``x + MLP(norm2(x))``, channels last.

    ``layer_scale`` (a float) multiplies each branch by learned per-channel gains
    ``gamma1``/``gamma2`` initialised to it, as NAT-Small/Base and DiNAT-Base do.
    ``dilation=None`` means 1, as in the original NAT code (which passes ``None`` through
    for undilated blocks).
    """

    def __init__(self, dim: int, num_heads: int, kernel_size=7, dilation=1, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None, proj_drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, layer_scale: Optional[float] = None,
                 norm_layer=LayerNorm, act_layer=nn.GELU, na_dim: int = 2,
                 rel_pos_bias: bool = True, backend: Optional[str] = None, fp32_block_norms: bool = False):
        super().__init__()
        if dilation is None:
            dilation = 1
        self.norm1 = branch_norm(norm_layer, dim, fp32_block_norms)
        self.attn = _NA[na_dim](
            dim, num_heads, kernel_size, dilation=dilation, qkv_bias=qkv_bias, qk_scale=qk_scale,
            attn_drop=attn_drop, proj_drop=proj_drop, rel_pos_bias=rel_pos_bias, backend=backend,
        )
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = branch_norm(norm_layer, dim, fp32_block_norms)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        if layer_scale is not None:
            self.gamma1 = nn.Parameter(layer_scale * torch.ones(dim))
            self.gamma2 = nn.Parameter(layer_scale * torch.ones(dim))
        else:
            self.gamma1 = self.gamma2 = None

    def forward(self, x: torch.Tensor, drop_masks: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
        """``drop_masks``: this block's two rows (``[B]`` or ``[B, 1, ..]``, 0 / 1: attention
        branch, then MLP branch) of its model's one stochastic-depth draw a step
        (``ChannelsLastBackbone.one_drop_path_draw``), or None: the block draws its own masks
        as timm's DropPath does."""
        m1, m2 = (None, None) if drop_masks is None else drop_masks
        y = self.attn(self.norm1(x))
        if self._plain_adds() and not _hooked(self.norm2):
            # the add and norm2 in one kernel where the norm runs libnattn's (inference)
            x, h = self.norm2.add_norm(x, y)
        else:
            x = self._add_branch(x, y, self.gamma1, m1)
            h = self.norm2(x)
        return self._add_branch(x, self.mlp(h), self.gamma2, m2)

    def forward_chained(self, x: torch.Tensor, pending: Optional[torch.Tensor]):
        """The block on ``x + pending`` (``pending``: the previous block's MLP branch, not yet
        added, or None), as ``(x after the attention branch's add, the MLP branch)``: the block's
        output is their sum. Each residual add then runs in the kernel of the norm after it
        (``LayerNorm.add_norm``). ``NAStage`` chains its blocks this way in inference when
        every block's adds are plain (``_plain_adds``)."""
        if pending is None:
            h = self.norm1(x)
        else:
            x, h = self.norm1.add_norm(x, pending)
        x, h = self.norm2.add_norm(x, self.attn(h))
        return x, self.mlp(h)

    def _plain_adds(self) -> bool:
        """Whether both residual adds are plain ``x + branch`` (no layer scale, no stochastic
        depth at work) with the models' own norms, which can take them (``add_norm``)."""
        return (self.gamma1 is None and self.gamma2 is None and not self._drops_paths()
                and isinstance(self.norm1, LayerNorm) and isinstance(self.norm2, LayerNorm))

    def _drops_paths(self) -> bool:
        """Whether stochastic depth is at work (training with a drop rate above 0)."""
        dp = self.drop_path
        return self.training and isinstance(dp, DropPath) and dp.drop_prob > 0.0

    def drop_prob(self) -> float:
        """The probability that stochastic depth drops a branch of a sample in training."""
        dp = self.drop_path
        return dp.drop_prob if isinstance(dp, DropPath) else 0.0

    def _add_branch(self, x: torch.Tensor, y: torch.Tensor, gamma: Optional[torch.Tensor],
                    mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x + drop_path(gamma * y)`` as one ``addcmul`` of ``y`` and a small factor: the
        per-sample stochastic-depth mask (drawn as timm's DropPath draws it unless ``mask``,
        ``[B]`` or ``[B, 1, ..]`` 0 / 1, was drawn for it; its 1 / keep scale as addcmul's
        scalar) and / or the layer-scale gains. Against multiply(s) then add: one kernel, one
        pass over the activations and one autograd node less per factor (the product is not
        rounded to y's dtype before the add)."""
        dp = self.drop_path
        factor = gamma
        scale = 1.0
        if self._drops_paths():
            keep = 1.0 - dp.drop_prob
            shape = (y.shape[0],) + (1,) * (y.ndim - 1)
            if mask is None:
                factor = y.new_empty(shape).bernoulli_(keep)
            else:
                factor = mask if mask.dim() == y.ndim else mask.view(shape)
            if keep > 0.0 and dp.scale_by_keep:
                # timm divides the mask by keep (a kernel a draw); addcmul's scalar does it in
                # the add's float32 arithmetic (exact where 1 / keep is a power of two)
                scale = 1.0 / keep
            if gamma is not None:
                factor = factor * gamma  # [B, 1, .., C]: small
        if factor is None:
            return x + y
        device = x.device.type
        if torch.jit.is_scripting() or torch.compiler.is_compiling() or not autocast_on(device):
            # (compiled: inductor fuses any casts into the kernel)
            return torch.addcmul(x, y, factor, value=scale)
        # Under autocast addcmul runs at its widest input dtype through a cast kernel (and a
        # backward node) per narrower input: the bf16 branch and mask of every block, two
        # full-size casts a block. Type promotion computes the same values in the one kernel.
        with autocast_off(device):
            return torch.addcmul(x, y, factor, value=scale)


def block_dilations(depths, num_heads, dilations) -> List[List[int]]:
    """Per-block dilations, checked against the stage layout. ``None`` (for all, a stage,
    or a block) means 1, as the original NAT code passes ``dilation=None`` for NA blocks."""
    if len(depths) != len(num_heads):
        raise ValueError(f"depths {depths} and num_heads {num_heads} must have one entry per stage")
    if dilations is None:
        return [[1] * d for d in depths]
    if len(dilations) != len(depths):
        raise ValueError(f"dilations must give one dilation per block, got {dilations} for depths {depths}")
    dilations = [[1] * depth if stage is None else list(stage) for stage, depth in zip(dilations, depths)]
    if [len(d) for d in dilations] != list(depths):
        raise ValueError(f"dilations must give one dilation per block, got {dilations} for depths {depths}")
    return [[1 if d is None else d for d in stage] for stage in dilations]


def drop_path_rates(depths: List[int], rate: float) -> List[List[float]]:
    """Stochastic depth rising linearly over all blocks, split per stage."""
    total = sum(depths)
    rates = [rate * i / (total - 1) if total > 1 else 0.0 for i in range(total)]  # no tensors: meta-safe
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out


def _hooked(*modules: nn.Module) -> bool:
    """Whether a forward hook would see these modules' calls (their own or global ones): the
    fused residual adds call the norms' ``add_norm`` and the blocks' ``forward_chained``, not
    their ``forward``, so hooked modules keep the plain path."""
    if getattr(torch_module, "_global_forward_hooks", None) or getattr(torch_module, "_global_forward_pre_hooks", None):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


class NAStage(nn.Module):
    """One stage: an optional downsampler, then ``depth`` NA blocks with per-block dilations."""

    def __init__(self, dim: int, depth: int, num_heads: int, kernel_size, dilations,
                 downsample: Optional[nn.Module], drop_paths, **block_kwargs):
        super().__init__()
        self.downsample = downsample if downsample is not None else nn.Identity()
        self.blocks = nn.Sequential(*[
            NABlock(dim, num_heads, kernel_size, dilation=dilations[i], drop_path=drop_paths[i], **block_kwargs)
            for i in range(depth)
        ])

    def forward(self, x, drop_masks: Optional[Sequence[torch.Tensor]] = None):
        """``drop_masks``: two rows of the model's stochastic-depth draw per block (``2 *
        depth`` tensors, see ``NABlock.forward``), or None: each block draws its own."""
        x = self.downsample(x)
        if drop_masks is None:
            return run_blocks(self.blocks, x)
        for i, block in enumerate(self.blocks):
            x = block(x, drop_masks[2 * i:2 * i + 2])
        return x


def chains_adds(blocks: Sequence[nn.Module], x: torch.Tensor) -> bool:
    """Whether ``blocks`` run chained (``NABlock.forward_chained``): NA blocks in inference on
    CUDA, where each residual add can run in the next norm's kernel, with plain adds and no
    hooks on the blocks or their norms. The same values as the blocks' ``forward``."""
    # the structure first: a model's sequence of stages asks on every forward
    if not len(blocks) or not all(isinstance(b, NABlock) for b in blocks):
        return False
    if torch.jit.is_scripting() or not x.is_cuda or not fast_norm.fused_add_enabled() or not eager_ok(x):
        return False
    if records_graph(x, getattr(blocks[0].norm1, "weight", None)):
        return False
    return all(b._plain_adds() and not _hooked(b, b.norm1, b.norm2) for b in blocks)


def run_blocks(blocks: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``blocks(x)``, chained where ``chains_adds`` (every residual add but the last then runs
    in the next norm's kernel)."""
    if not chains_adds(blocks, x):
        return blocks(x)
    pending = None
    for block in blocks:
        x, pending = block.forward_chained(x, pending)
    return x + pending


def init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class ChannelsLastBackbone(nn.Module):
    """timm's classifier/feature contract for models whose tokens are ``[B, *spatial, C]``.

    Subclasses set ``patch_embed``, a sequence of feature modules named by ``_seq``
    (``stages`` or ``blocks``), ``norm``, ``head_drop``, ``head``, ``num_features``,
    ``global_pool`` and ``feature_info``.
    """

    _seq = "stages"

    def _sequence(self) -> nn.Sequential:
        return getattr(self, self._seq)

    @torch.jit.ignore
    def no_weight_decay_keywords(self):
        return {"rpb"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False):
        return dict(stem=r"^patch_embed", blocks=rf"^{self._seq}\.(\d+)")

    grad_checkpointing = False

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True):
        self.grad_checkpointing = enable  # recompute each stage/block in backward

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        if global_pool is not None:
            if global_pool not in ("avg", ""):
                raise ValueError(f"global_pool must be 'avg' or '', got {global_pool!r}")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = self._classifier()

    def _classifier(self) -> nn.Module:
        return nn.Linear(self.num_features, self.num_classes) if self.num_classes > 0 else nn.Identity()

    def _pyramid(self, num_classes: int, global_pool: str, embed_dim: int, depths, drop_path_rate: float):
        """Head fields of a 4-stage pyramid (width doubling per stage): ``(dims, drop path
        rates per stage)``; ``feature_info`` starts empty for the stages to fill."""
        self.num_classes = num_classes
        self.global_pool = global_pool
        dims = [embed_dim * 2 ** i for i in range(len(depths))]
        self.num_features = self.head_hidden_size = dims[-1]
        self.feature_info = []
        return dims, drop_path_rates(list(depths), drop_path_rate)

    def _add_head(self, norm_layer, drop_rate: float, feature_norms: bool = False) -> None:
        """Final norm, dropout and classifier (timm's names), then every weight's init.

        ``feature_norms=True`` adds a LayerNorm on each stage output (``feature_norms.{i}``,
        the ``norm{i}`` of the original detection/segmentation backbones), applied by
        ``forward_intermediates`` and so by ``features_only``.
        """
        if not isinstance(feature_norms, bool):
            raise TypeError(f"feature_norms must be a bool, got {feature_norms!r}")
        if feature_norms:
            self.feature_norms = nn.ModuleList(norm_layer(f["num_chs"]) for f in self.feature_info)
        self.norm = norm_layer(self.num_features)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = self._classifier()
        self.apply(init_weights)

    # Under autocast, the blocks' Linear and norm parameters are cast to the autocast dtype
    # in a few grouped ops per forward instead of one op each (nattn/nn/param_cast.py: same
    # values and gradients, ~360 fewer ops and backward nodes a NAT-Tiny step). False: the
    # per-parameter casts of autocast.
    group_casts = True
    _casts_plan = None

    def _cast_sources(self):
        """(qualified name, module, parameter name) of the blocks' norm and Linear parameters."""
        for path, block in self.named_modules():
            if isinstance(block, NABlock):  # (a replaced attn / mlp may lack these: skipped)
                attn, mlp = block.attn, block.mlp
                for sub, sub_path in ((block.norm1, "norm1"), (block.norm2, "norm2"),
                                      (getattr(attn, "qkv", None), "attn.qkv"), (getattr(attn, "proj", None), "attn.proj"),
                                      (getattr(mlp, "fc1", None), "mlp.fc1"), (getattr(mlp, "fc2", None), "mlp.fc2")):
                    if isinstance(sub, (BranchLayerNorm, nn.Linear)):
                        for name in ("weight", "bias"):
                            yield f"{path}.{sub_path}.{name}", sub, name

    def _block_casts(self, x: torch.Tensor):
        """The grouped-casts region of one forward (a no-op without autocast); while compiling,
        the same casts as ops of the graph (``param_cast.traced_casts``)."""
        if not self.group_casts:
            return contextlib.nullcontext()
        if torch.compiler.is_compiling():
            return param_cast.traced_casts(self, self._cast_sources(), x.device.type)
        plan = self._casts_plan
        if plan is None or plan.stale():
            sources = [(sub, name) for _, sub, name in self._cast_sources()]
            plan = self.__dict__["_casts_plan"] = param_cast.GroupedCasts(sources)
        return plan.active(x.device.type)

    def _apply(self, fn, *args, **kwargs):
        self.__dict__["_casts_plan"] = None  # .to() / .cuda() / .half() may move or replace parameters
        return super()._apply(fn, *args, **kwargs)

    # In training, the blocks' stochastic-depth masks come from one draw a forward (one
    # kernel for all blocks and both branches) instead of one draw each (a NAT-Tiny step:
    # 58 draws, each a launch and an allocation an eager step waits for on a slow host, and
    # 58 kernels of a compiled forward). Each sample's branch is still kept with probability
    # 1 - drop_prob, independently; the random stream differs from per-block draws. Off
    # under gradient checkpointing (each recomputed block redraws with the saved RNG state)
    # and when False: each block draws as timm's DropPath.
    one_drop_path_draw = True

    def _drop_path_rows(self, x: torch.Tensor) -> Optional[Tuple[torch.Tensor, ...]]:
        """The masks of one training forward: two ``[B, 1, ..]`` 0 / 1 rows (``x``'s rank) per
        NA block of the sequence, in block order, at ``x``'s dtype (so that a branch's residual
        add keeps the dtype it had with the block's own draw); None where the blocks draw
        their own."""
        if not (self.training and self.one_drop_path_draw) or torch.jit.is_scripting():
            return None
        probs = []
        for module in self._sequence():
            for block in (module.blocks if isinstance(module, NAStage) else (module,)):
                if not isinstance(block, NABlock):
                    return None  # a replaced block: every block draws its own
                probs += [block.drop_prob()] * 2
        if not any(probs):
            return None
        keep = self._keep_column(tuple(1.0 - p for p in probs), x.device)
        # float32 probabilities: a 16-bit keep (0.9 -> 0.8984 in bf16) would change the rate.
        # Rows shaped [B, 1, ..] as the branches broadcast them: no view op a block.
        ones = (1,) * (x.dim() - 1)
        masks = torch.bernoulli(keep.view(len(probs), 1, *ones).expand(len(probs), x.shape[0], *ones))
        return (masks if masks.dtype == x.dtype else masks.to(x.dtype)).unbind(0)

    def _keep_column(self, keeps: Tuple[float, ...], device: torch.device) -> torch.Tensor:
        """``keeps`` as a float32 ``[n, 1]`` tensor on ``device``, kept between forwards (a
        host-to-device copy a step would cost more than the draws it replaces)."""
        if torch.compiler.is_compiling():  # a constant of the graph
            return torch.tensor(keeps, dtype=torch.float32, device=device).unsqueeze(1)
        cached = self.__dict__.get("_keep_cache")
        if cached is None or cached[0] != keeps or cached[1].device != device:
            cached = self.__dict__["_keep_cache"] = (
                keeps, torch.tensor(keeps, dtype=torch.float32, device=device).unsqueeze(1))
        return cached[1]

    def _run_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """The stages (or blocks) on ``x``, with one stochastic-depth draw for all of them in
        training (``one_drop_path_draw``)."""
        seq = self._sequence()
        rows = self._drop_path_rows(x)
        if rows is None:
            return run_blocks(seq, x)  # a sequence of stages runs as seq(x)
        start = 0
        for module in seq:
            n = 2 * len(module.blocks) if isinstance(module, NAStage) else 2
            x = module(x, rows[start:start + n])
            start += n
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        with self._block_casts(x):
            x = self.patch_embed(x)
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint_seq(self._sequence(), x)
            else:
                x = self._run_sequence(x)
            return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x.mean(dim=tuple(range(1, x.dim() - 1)))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None, norm: bool = False,
        stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
    ):
        """Outputs of the selected stages (``NCHW``/``NCTHW``, or channels last with ``NHWC``)."""
        with self._block_casts(x):
            return self._intermediates(x, indices, norm, stop_early, output_fmt, intermediates_only)

    def _intermediates(self, x, indices, norm, stop_early, output_fmt, intermediates_only):
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        seq = self._sequence()
        take, max_index = feature_take_indices(len(seq), indices)
        last = len(seq) - 1
        feature_norms = getattr(self, "feature_norms", None)
        intermediates = []
        x = self.patch_embed(x)
        for i, module in enumerate(seq):
            if stop_early and i > max_index:
                break
            x = module(x)
            if i in take:
                if feature_norms is not None:  # the detection/segmentation backbones' norm{i}
                    y = feature_norms[i](x)
                else:
                    y = self.norm(x) if norm and i == last else x
                intermediates.append(y.movedim(-1, 1).contiguous() if output_fmt == "NCHW" else y)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True):
        seq = self._sequence()
        take, max_index = feature_take_indices(len(seq), indices)
        setattr(self, self._seq, seq[: max_index + 1])
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take
