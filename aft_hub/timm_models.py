"""AFT image models for timm: ``timm.create_model('aft_conv_small')`` once this module is imported.

Paper: "An Attention Free Transformer", Zhai et al., arXiv:2105.14103. ImageNet configurations of the paper's
table 2 (DeiT recipe, 224 x 224, patch 16, 12 blocks; tiny d = 192, small d = 384) plus ablation and test variants.
Names ``aft_conv_{size}_{heads}_{kernel}``; ``aft_conv_tiny`` / ``aft_conv_small`` are the best of each size.

No AFT weights were ever published, so no name here has pretrained weights and ``pretrained=True`` raises. Weights
you trained load through ``timm.create_model('local-dir:PATH')``, ``'hf-hub:ORG/REPO'`` or ``checkpoint_path``;
:func:`checkpoint_filter_fn` also reads the checkpoints of aft_hub's transformers classes (``aft.`` prefix).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model, resolve_pretrained_cfg

from .vision import AftVisionTransformer

__all__ = ["checkpoint_filter_fn", "default_cfgs"]

_logger = logging.getLogger(__name__)

# Prefix of the AftVisionTransformer inside aft_hub's transformers classes (AftForImageClassification.aft).
HF_PREFIX = "aft."


def checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: AftVisionTransformer) -> dict[str, torch.Tensor]:
    """Map a checkpoint onto the keys of ``model`` (runs on every pretrained load).

    Handles:

    * training checkpoints that nest the weights under ``'model'``, ``'state_dict'`` or ``'model_ema'``;
    * aft_hub's transformers classes (keys ``aft.<key>``; other keys of the wrapper are dropped) and
      ``module.`` (DistributedDataParallel) prefixes;
    * the older fused layout ``blocks.N.mixer.qkv.{weight,bias}`` (rows [q; k; v], K with the mixer's key
      channels), split into ``q``, ``k``, ``v``; and ``blocks.N.attn.*`` names (timm ViT naming) for ``mixer``.
    """
    for key in ("model", "state_dict", "model_ema"):
        if key in state_dict and isinstance(state_dict[key], dict):
            state_dict = state_dict[key]
            break
    if any(k.startswith(HF_PREFIX) for k in state_dict):
        state_dict = {k[len(HF_PREFIX) :]: v for k, v in state_dict.items() if k.startswith(HF_PREFIX)}
    out: dict[str, torch.Tensor] = {}
    for k, v in state_dict.items():
        if k.startswith("module."):
            k = k[len("module.") :]
        k = re.sub(r"^blocks\.(\d+)\.attn\.", r"blocks.\1.mixer.", k)
        m = re.match(r"^(blocks\.\d+\.mixer)\.qkv\.(weight|bias)$", k)
        if m is not None:
            prefix, kind = m.groups()
            sizes = [model.state_dict()[f"{prefix}.{name}.{kind}"].shape[0] for name in ("q", "k", "v")]
            if v.shape[0] != sum(sizes):
                raise ValueError(
                    f"{k} has {v.shape[0]} rows, the model's q, k, v projections have {sizes} (sum {sum(sizes)})."
                )
            for name, part in zip(("q", "k", "v"), torch.split(v, sizes, dim=0)):
                out[f"{prefix}.{name}.{kind}"] = part
            continue
        out[k] = v
    return out


def _create_aft(variant: str, pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    if pretrained:
        cfg = resolve_pretrained_cfg(
            variant,
            pretrained_cfg=kwargs.get("pretrained_cfg"),
            pretrained_cfg_overlay=kwargs.get("pretrained_cfg_overlay"),
        )
        if not (cfg.has_weights or cfg.state_dict):
            raise RuntimeError(
                f"No pretrained weights exist for {variant}: the AFT paper (arXiv:2105.14103) published none and "
                f"aft_hub registers none. Use pretrained=False, or load weights you trained with "
                f"timm.create_model('local-dir:PATH'), 'hf-hub:ORG/REPO' or checkpoint_path=..."
            )
    return build_model_with_cfg(
        AftVisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **kwargs,
    )


def _cfg(input_size: tuple[int, int, int] = (3, 224, 224), patch_size: int = 16, **kwargs: Any) -> dict[str, Any]:
    return {
        "num_classes": 1000,
        "input_size": input_size,
        "pool_size": (input_size[1] // patch_size, input_size[2] // patch_size),
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        "paper_ids": "arXiv:2105.14103",
        "paper_name": "An Attention Free Transformer",
        "origin_url": "https://arxiv.org/abs/2105.14103",
        **kwargs,
    }


_fixed = dict(fixed_input_size=True)
_test = dict(input_size=(3, 64, 64), patch_size=8)

# No entry has url / file / hf_hub_id: no AFT weights exist.
default_cfgs = generate_default_cfgs(
    {
        "aft_full_tiny": _cfg(**_fixed),
        "aft_full_small": _cfg(**_fixed),
        "aft_conv_tiny_32_11": _cfg(),
        "aft_conv_tiny_192_11": _cfg(),
        "aft_conv_small_16_11": _cfg(),
        "aft_conv_small_384_11": _cfg(),
        "aft_conv_small_384_15": _cfg(),
        "aft_conv_tiny": _cfg(),
        "aft_conv_small": _cfg(),
        "aft_conv_base_32_25": _cfg(input_size=(3, 384, 384), crop_pct=1.0),
        "aft_simple_tiny": _cfg(),
        "aft_simple_small": _cfg(),
        "aft_local_tiny": _cfg(**_fixed),
        "aft_local_small": _cfg(**_fixed),
        "test_aft_conv": _cfg(**_test),
        "test_aft_simple": _cfg(**_test),
        "test_aft_full": _cfg(**_test, **_fixed),
        "test_aft_local": _cfg(**_test, **_fixed),
    }
)

_TINY = dict(patch_size=16, embed_dim=192, depth=12, mlp_ratio=4.0)
_SMALL = dict(patch_size=16, embed_dim=384, depth=12, mlp_ratio=4.0)
_FULL = dict(mixer="full", class_token=True, pos_embed="learn", bias_rank=128)
_LOCAL = dict(mixer="local", window=7, pos_embed="learn", bias_rank=128)
_TEST = dict(img_size=64, patch_size=8, embed_dim=32, depth=3, mlp_ratio=2.0)


def _conv(heads: int, kernel_size: int) -> dict[str, Any]:
    return dict(mixer="conv", heads=heads, kernel_size=kernel_size)


@register_model
def aft_full_tiny(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-full tiny (paper: 6.3M params, 72.4 top-1): class token, learned position embedding, d' = 128."""
    model_args = dict(**_TINY, **_FULL)
    return _create_aft("aft_full_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_full_small(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-full small (paper: 22.6M params, 79.8 top-1)."""
    model_args = dict(**_SMALL, **_FULL)
    return _create_aft("aft_full_small", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_tiny_32_11(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv tiny, 32 heads, kernel 11 (paper: 5.4M params, 73.9 top-1)."""
    model_args = dict(**_TINY, **_conv(32, 11))
    return _create_aft("aft_conv_tiny_32_11", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_tiny_192_11(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv tiny, 192 heads, kernel 11 (paper: 5.9M params, 74.8 top-1)."""
    model_args = dict(**_TINY, **_conv(192, 11))
    return _create_aft("aft_conv_tiny_192_11", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_small_16_11(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv small, 16 heads, kernel 11 (paper: 20.3M params, 80.2 top-1)."""
    model_args = dict(**_SMALL, **_conv(16, 11))
    return _create_aft("aft_conv_small_16_11", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_small_384_11(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv small, 384 heads, kernel 11 (paper: 22.5M params, 80.8 top-1)."""
    model_args = dict(**_SMALL, **_conv(384, 11))
    return _create_aft("aft_conv_small_384_11", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_small_384_15(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv small, 384 heads, kernel 15 (paper: 23.0M params, 81.0 top-1, 81.6 tested at 384)."""
    model_args = dict(**_SMALL, **_conv(384, 15))
    return _create_aft("aft_conv_small_384_15", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_tiny(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv tiny, the paper's best tiny model: 192 heads, kernel 11 (= aft_conv_tiny_192_11)."""
    model_args = dict(**_TINY, **_conv(192, 11))
    return _create_aft("aft_conv_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_small(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv small, the paper's best small model: 384 heads, kernel 15 (= aft_conv_small_384_15)."""
    model_args = dict(**_SMALL, **_conv(384, 15))
    return _create_aft("aft_conv_small", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_conv_base_32_25(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-conv base at 384, 32 heads, kernel 25 (paper: 79.7M params, 83.4 top-1 fine-tuned from DeiT-base)."""
    model_args = dict(img_size=384, patch_size=16, embed_dim=768, depth=12, mlp_ratio=4.0, **_conv(32, 25))
    return _create_aft("aft_conv_base_32_25", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_simple_tiny(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-simple tiny (ablation): no position information at all, fully convolutional."""
    model_args = dict(**_TINY, mixer="simple")
    return _create_aft("aft_simple_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_simple_small(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-simple small (ablation)."""
    model_args = dict(**_SMALL, mixer="simple")
    return _create_aft("aft_simple_small", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_local_tiny(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-local tiny (ablation): factorised bias inside a 2-D window 7 on the 14 x 14 grid, position embedding."""
    model_args = dict(**_TINY, **_LOCAL)
    return _create_aft("aft_local_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def aft_local_small(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """AFT-local small (ablation)."""
    model_args = dict(**_SMALL, **_LOCAL)
    return _create_aft("aft_local_small", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def test_aft_conv(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """Tiny AFT-conv for tests (64 x 64 input, patch 8, d = 32, 3 blocks)."""
    model_args = dict(**_TEST, **_conv(4, 3))
    return _create_aft("test_aft_conv", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def test_aft_simple(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """Tiny AFT-simple for tests."""
    model_args = dict(**_TEST, mixer="simple")
    return _create_aft("test_aft_simple", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def test_aft_full(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """Tiny AFT-full for tests (class token, position embedding, d' = 8)."""
    model_args = dict(**_TEST, **dict(_FULL, bias_rank=8))
    return _create_aft("test_aft_full", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def test_aft_local(pretrained: bool = False, **kwargs: Any) -> AftVisionTransformer:
    """Tiny AFT-local for tests (window 3 on the 8 x 8 grid, d' = 8)."""
    model_args = dict(**_TEST, **dict(_LOCAL, window=3, bias_rank=8))
    return _create_aft("test_aft_local", pretrained=pretrained, **dict(model_args, **kwargs))
