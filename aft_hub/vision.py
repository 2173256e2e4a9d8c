"""AFT vision transformer: the DeiT/ViT recipe with the attention replaced by an AFT token mixer.

Paper: "An Attention Free Transformer", Zhai et al., arXiv:2105.14103 (ImageNet experiments, section 4.1).

:class:`AftVisionTransformer` is the one vision model class of aft_hub. It implements timm's model API
(``forward_features``, ``forward_head``, ``forward_intermediates``, ``reset_classifier``, ...) and is registered with
timm by :mod:`aft_hub.timm_models`; the transformers front end wraps the same class. Its constructor takes plain,
JSON-serialisable arguments only (see :attr:`AftVisionTransformer.config_kwargs`), so a config can rebuild it.

Token mixers (``mixer``):

* ``'conv'``: AFT-conv, h heads with s x s relative-bias kernels on the token grid. No position embedding, no class
  token: the model is fully convolutional and accepts any input whose sides are multiples of the patch size.
* ``'simple'``: AFT-simple (no position bias); fully convolutional like AFT-conv.
* ``'full'``: AFT-full with a factorised absolute bias w = u v^T over the T tokens (the paper: class token, learned
  position embedding, T = 197 at 224 x 224, d' = 128).
* ``'local'``: AFT-local, the absolute bias restricted to a 2-D window on the token grid (|di|, |dj| < window).

AFT-full / AFT-local (and any model with ``pos_embed='learn'``) have parameters tied to the token count of
``img_size``: another input size raises a ``ValueError`` (no resampling).

Output layout (timm's "standard" model contract): ``forward_features`` returns the normalised patch tokens as an
NCHW map (B, C, H / p, W / p); a class token, if any, takes part in the mixing but is dropped from that map and the
head pools the patch tokens (``global_pool='avg'``, the default of every registered model). ``global_pool='token'``
(class-token models only) instead classifies from the class token: ``forward_features`` then returns the token
sequence (B, 1 + H W / p^2, C) (``output_fmt`` 'NLC').
"""

import fnmatch
import logging
from functools import partial
from typing import Any

import torch
from timm.layers import register_notrace_function, register_notrace_module
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from .layers import AftBlock, AftConv, AftConv1d, AftFull, AftLocal, AftSimple, ConvKernel, LayerScale, PositionBias

__all__ = ["AftVisionTransformer", "MIXER_TYPES", "POOL_TYPES", "init_vision_weights"]

_logger = logging.getLogger(__name__)

MIXER_TYPES = ("conv", "simple", "full", "local")
POOL_TYPES = ("", "avg", "max", "avgmax", "token")
_POS_EMBED_TYPES = ("learn", "none")

# torch.fx (timm's feature extraction and tests): the mixers are leaves, so the operators' input checks (Python
# control flow on shapes) are never traced.
for _mixer_cls in (AftFull, AftSimple, AftLocal, AftConv, AftConv1d):
    register_notrace_module(_mixer_cls)


@register_notrace_function
def token_grid(x: torch.Tensor, patch_size: int, fixed_grid: tuple[int, int] | None) -> tuple[int, int]:
    """The (H, W) patch grid of an image batch (B, C, H, W), after checking its size.

    A leaf for torch.fx (it runs on the real input; fx only wraps public names); scriptable.
    """
    if x.dim() != 4:
        raise ValueError(f"Expected an image batch of shape (B, C, H, W), got {x.dim()} dimensions.")
    H = x.shape[-2]
    W = x.shape[-1]
    if H % patch_size != 0 or W % patch_size != 0:
        raise ValueError(f"Input size {H}x{W} is not divisible by the patch size {patch_size}.")
    gh = H // patch_size
    gw = W // patch_size
    if fixed_grid is not None:
        if gh != fixed_grid[0] or gw != fixed_grid[1]:
            raise ValueError(
                f"This model has parameters for a fixed {fixed_grid[0]}x{fixed_grid[1]} token grid (input "
                f"{fixed_grid[0] * patch_size}x{fixed_grid[1] * patch_size}: absolute position bias or embedding); "
                f"got a {H}x{W} input ({gh}x{gw} tokens). Resize the input, build the model with img_size={H}x{W}, "
                f"or use an AFT-conv / AFT-simple model, which accept any size."
            )
    return gh, gw


def _to_2tuple(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}.")
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}.")


def init_vision_weights(module: nn.Module) -> None:
    """Initialise one module of an :class:`AftVisionTransformer` (use with ``model.apply``).

    Linear layers: truncated normal (std 0.02) weights and zero biases, as DeiT; LayerNorm: ones and zeros; the
    patch projection: PyTorch's default; AFT position biases and kernels: their own ``reset_parameters`` (the paper's
    N(0, 0.01^2) factors, gamma = beta = 0); layer-scale: ``init_values``; the class token N(0, 1e-6^2) and the
    position embedding truncated normal (std 0.02).
    """
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.Conv2d, PositionBias, ConvKernel)):
        module.reset_parameters()
    elif isinstance(module, LayerScale):
        nn.init.constant_(module.gamma, module.init_values)
    elif isinstance(module, AftVisionTransformer):
        if module.cls_token is not None:
            nn.init.normal_(module.cls_token, std=1e-6)
        if module.pos_embed is not None:
            nn.init.trunc_normal_(module.pos_embed, std=0.02)


class AftPatchEmbed(nn.Module):
    """Non-overlapping p x p patches to ``embed_dim`` channels: (B, C_in, H, W) -> (B, embed_dim, H / p, W / p)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class AftVisionTransformer(nn.Module):
    """Vision transformer whose token mixer is AFT (Zhai et al., arXiv:2105.14103), with timm's model API.

    Args:
        img_size: nominal input size (int or (H, W)); fixes the token count of absolute-position models
            (``mixer`` 'full' / 'local' or ``pos_embed='learn'``), only sets defaults otherwise.
        patch_size: side p of the square patches.
        in_chans: input channels.
        num_classes: classes of the linear head; 0 for no head (pooled features).
        global_pool: '' (no pooling, ``forward`` returns the NCHW map), 'avg', 'max', 'avgmax' (over the patch
            tokens) or 'token' (the class token; needs ``class_token``).
        embed_dim: channels d.
        depth: number of blocks.
        mlp_ratio: hidden size of the MLPs over d.
        mixer: 'conv', 'simple', 'full' or 'local' (see the module docstring).
        heads: AFT-conv heads h (K has h channels; d must be divisible by h).
        kernel_size: AFT-conv kernel side s (odd).
        window: AFT-local window s: the bias applies to keys with |di| < s and |dj| < s on the grid.
        bias_rank: d' of the factorised AFT-full / AFT-local bias; None for a dense T x T bias.
        class_token: prepend a learned class token (AFT-full / AFT-simple only: the grid mixers need a pure grid).
        pos_embed: 'learn' for a learned absolute position embedding, 'none' for none.
        qkv_bias: biases in the Q, K, V projections.
        init_values: layer-scale initial value, None for no layer-scale.
        drop_rate: dropout before the classifier.
        pos_drop_rate: dropout after the embedding.
        proj_drop_rate: dropout after the mixer's output projection and inside the MLPs.
        drop_path_rate: stochastic depth, rising linearly to this value over the blocks.
        device: device of the parameters (not part of the configuration).
        dtype: dtype of the parameters (not part of the configuration).
    """

    # keep TorchScript away from Python-only properties
    __jit_unused_properties__ = ["config_kwargs"]

    def __init__(
        self,
        img_size: int | tuple[int, int] | list[int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 192,
        depth: int = 12,
        mlp_ratio: float = 4.0,
        mixer: str = "conv",
        heads: int = 192,
        kernel_size: int = 11,
        window: int = 7,
        bias_rank: int | None = 128,
        class_token: bool = False,
        pos_embed: str = "none",
        qkv_bias: bool = True,
        init_values: float | None = None,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        img_hw = _to_2tuple(img_size, "img_size")
        if mixer not in MIXER_TYPES:
            raise ValueError(f"mixer must be one of {MIXER_TYPES}, got {mixer!r}.")
        if pos_embed not in _POS_EMBED_TYPES:
            raise ValueError(f"pos_embed must be one of {_POS_EMBED_TYPES}, got {pos_embed!r}.")
        self._check_pool(global_pool, class_token)
        for name, value in (("patch_size", patch_size), ("in_chans", in_chans), ("embed_dim", embed_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}.")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}.")
        if img_hw[0] % patch_size or img_hw[1] % patch_size:
            raise ValueError(f"img_size {img_hw} must be divisible by patch_size {patch_size}.")
        if class_token and mixer in ("conv", "local"):
            raise ValueError(
                f"mixer={mixer!r} works on the 2-D token grid and cannot take a class token; use class_token=False."
            )
        if mixer == "conv" and embed_dim % heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by heads {heads}.")
        kw: dict[str, Any] = dict(device=device, dtype=dtype)

        self._config = dict(
            img_size=img_hw[0] if img_hw[0] == img_hw[1] else list(img_hw),
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            global_pool=global_pool,
            embed_dim=embed_dim,
            depth=depth,
            mlp_ratio=mlp_ratio,
            mixer=mixer,
            heads=heads,
            kernel_size=kernel_size,
            window=window,
            bias_rank=bias_rank,
            class_token=class_token,
            pos_embed=pos_embed,
            qkv_bias=qkv_bias,
            init_values=init_values,
            drop_rate=drop_rate,
            pos_drop_rate=pos_drop_rate,
            proj_drop_rate=proj_drop_rate,
            drop_path_rate=drop_path_rate,
        )
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.img_size = img_hw
        self.patch_size = patch_size
        self.mixer_type = mixer
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.output_fmt = "NLC" if global_pool == "token" else "NCHW"
        self.grad_checkpointing = False

        grid = (img_hw[0] // patch_size, img_hw[1] // patch_size)
        num_tokens = self.num_prefix_tokens + grid[0] * grid[1]
        # absolute position parameters tie the model to one token grid
        self.fixed_input_size = mixer in ("full", "local") or pos_embed == "learn"
        self.fixed_grid: tuple[int, int] | None = grid if self.fixed_input_size else None

        self.patch_embed = AftPatchEmbed(patch_size, in_chans, embed_dim, **kw)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **kw)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, embed_dim, **kw)) if pos_embed == "learn" else None
        self.pos_drop = nn.Dropout(pos_drop_rate)

        def make_mixer() -> nn.Module:
            if mixer == "conv":
                return AftConv(
                    embed_dim, heads=heads, kernel_size=kernel_size, qkv_bias=qkv_bias, proj_drop=proj_drop_rate, **kw
                )
            if mixer == "simple":
                return AftSimple(embed_dim, qkv_bias=qkv_bias, proj_drop=proj_drop_rate, **kw)
            if mixer == "full":
                return AftFull(
                    embed_dim,
                    max_len=num_tokens,
                    bias_rank=bias_rank,
                    qkv_bias=qkv_bias,
                    proj_drop=proj_drop_rate,
                    **kw,
                )
            return AftLocal(
                embed_dim,
                max_len=num_tokens,
                window=window,
                bias_rank=bias_rank,
                grid_window=True,
                qkv_bias=qkv_bias,
                proj_drop=proj_drop_rate,
                **kw,
            )

        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth decay rule
        self.blocks = nn.ModuleList(
            AftBlock(
                embed_dim,
                make_mixer(),
                mlp_ratio=mlp_ratio,
                drop=proj_drop_rate,
                drop_path=dpr[i],
                init_values=init_values,
                act_layer=nn.GELU,
                norm_layer=partial(nn.LayerNorm, eps=1e-6),
                **kw,
            )
            for i in range(depth)
        )
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=patch_size) for i in range(depth)]
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6, **kw)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **kw) if num_classes > 0 else nn.Identity()
        self.init_weights()

    # ------------------------------------------------------------------------------------------------------------
    # configuration
    # ------------------------------------------------------------------------------------------------------------

    @property
    def config_kwargs(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this model (JSON-serialisable; classifier changes included).

        ``AftVisionTransformer(**model.config_kwargs)`` has the same architecture and state-dict keys. Layers removed
        by :meth:`prune_intermediate_layers` are not represented.
        """
        return dict(self._config)

    @staticmethod
    def _check_pool(global_pool: str, class_token: bool) -> None:
        if global_pool not in POOL_TYPES:
            raise ValueError(f"global_pool must be one of {POOL_TYPES}, got {global_pool!r}.")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs a class token (class_token=True).")

    def init_weights(self) -> None:
        """(Re)initialise every parameter, see :func:`init_vision_weights`."""
        self.apply(init_vision_weights)

    # ------------------------------------------------------------------------------------------------------------
    # timm model API
    # ------------------------------------------------------------------------------------------------------------

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter-name patterns (fnmatch) to exclude from weight decay: tokens, position biases and embeddings,
        the AFT-conv kernel gamma / beta, norms and layer-scales."""
        names = {n for n, _ in self.named_parameters()}
        patterns = {
            "cls_token",
            "pos_embed",
            "blocks.*.mixer.pos_bias.*",
            "blocks.*.mixer.kernel.gamma",
            "blocks.*.mixer.kernel.beta",
            "*norm*.weight",
            "*norm*.bias",
            "blocks.*.ls*.gamma",
        }
        return {p for p in patterns if any(fnmatch.fnmatchcase(n, p) for n in names)}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups for layer-wise learning-rate decay: stem (embeddings), blocks, final norm."""
        return dict(
            stem=r"^cls_token|^pos_embed|^patch_embed",
            blocks=r"^blocks\.(\d+)" if coarse else [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass (same outputs, less memory)."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head by a new one for ``num_classes`` (0: none); optionally change the pooling.

        The new head is created on the device and with the dtype of the model, in its training mode.
        """
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}.")
        if global_pool is not None:
            self._check_pool(global_pool, self.cls_token is not None)
            self.global_pool = global_pool
            self.output_fmt = "NLC" if global_pool == "token" else "NCHW"
            self._config["global_pool"] = global_pool
        self.num_classes = num_classes
        self._config["num_classes"] = num_classes
        ref = self.patch_embed.proj.weight
        if num_classes > 0:
            self.head = nn.Linear(self.head_hidden_size, num_classes, device=ref.device, dtype=ref.dtype)
            init_vision_weights(self.head)
        else:
            self.head = nn.Identity()
        self.head.train(self.training)

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Image (B, C_in, H, W) -> tokens (B, P + H' W', C) with P prefix tokens, and the grid (H', W')."""
        hw = token_grid(x, self.patch_size, self.fixed_grid)
        x = self.patch_embed(x)  # (B, C, H', W')
        x = x.flatten(2).transpose(1, 2)  # (B, H' W', C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.pos_drop(x), hw

    def _to_map(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Tokens (B, P + H' W', C) -> patch-token map (B, C, H', W') (prefix tokens dropped)."""
        x = x[:, self.num_prefix_tokens :]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], hw[0], hw[1])

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image (B, C_in, H, W) -> normalised features, unpooled: (B, C, H / p, W / p), or the token sequence
        (B, P + H W / p^2, C) when ``global_pool == 'token'``."""
        x, hw = self._embed(x)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw=hw)
        x = self.norm(x)
        if self.global_pool == "token":
            return x
        return self._to_map(x, hw)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool the output of :meth:`forward_features` and apply the classifier.

        Args:
            x: (B, C, H', W') feature map, or the token sequence (B, P + N, C) when ``global_pool == 'token'``.
            pre_logits: return the pooled features (B, C) instead of the logits.
        """
        if self.global_pool == "token":
            x = x[:, 0]  # the class token
        elif self.global_pool != "":
            x = self._pool(x, [2, 3])
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def _pool(self, x: torch.Tensor, dims: list[int]) -> torch.Tensor:
        if self.global_pool == "avg":
            return x.mean(dim=dims)
        if self.global_pool == "max":
            return x.amax(dim=dims)
        return 0.5 * (x.mean(dim=dims) + x.amax(dim=dims))  # avgmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Features of selected blocks, and the final features.

        Args:
            x: images (B, C_in, H, W).
            indices: the last n blocks if an int, the given block indices if a list (negative from the end), all
                if None.
            norm: apply the final norm to the intermediates.
            stop_early: do not run the blocks after the last selected one.
            output_fmt: 'NCHW' (B, C, H / p, W / p) or 'NLC' (B, H W / p^2, C); prefix tokens are dropped.
            intermediates_only: return only the intermediates.

        Returns:
            The list of intermediates, or (final features as :meth:`forward_features` returns them, intermediates).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}.")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, hw = self._embed(x)
        blocks = self.blocks if torch.jit.is_scripting() or not stop_early else self.blocks[: max_index + 1]
        intermediates = []
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw=hw)
            if i in take_indices:
                y = self.norm(x) if norm else x
                if output_fmt == "NCHW":
                    intermediates.append(self._to_map(y, hw))
                else:
                    intermediates.append(y[:, self.num_prefix_tokens :])
        if intermediates_only:
            return intermediates
        x = self.norm(x)
        x = x if self.global_pool == "token" else self._to_map(x, hw)
        return x, intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm / the head if asked).

        Returns:
            The absolute indices of the kept feature blocks.
        """
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices
