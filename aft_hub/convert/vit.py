"""DeiT / ViT -> AFT initialisation, the paper's fine-tuning recipe (arXiv:2105.14103, section 4.1).

"Initialised from DeiT except position embedding, CLS token and the Q/K projections": the AFT model gets the same
width, depth, patch size and MLP ratio as the source; the patch embedding, every LayerNorm, the MLPs, the V and
output projections of each block, the final norm and (when the class count matches) the head are copied. Q and K are
initialised (AFT's K of AFT-conv has one channel per head and no counterpart at all; the paper re-learns Q too), as
are the AFT position biases / kernels. A position embedding and class token are copied only when the target keeps
them with the same shape (AFT-full with ``class_token``/``pos_embed='learn'``); AFT-conv has neither, so they are
dropped. Everything is reported in a :class:`ConversionReport`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["ConversionReport", "vit_to_aft", "infer_vit_config", "aft_architecture_for"]


@dataclasses.dataclass
class ConversionReport:
    """What a conversion did with every tensor.

    Attributes:
        source: what was converted (a timm name or a file).
        target: the timm architecture of the result.
        copied: ``(source key, target key)`` pairs copied unchanged (V rows of a fused ``qkv`` count as copied).
        initialised: target keys that got a fresh initialisation.
        dropped: source keys (or row ranges of them) with no place in the target.
    """

    source: str
    target: str
    copied: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    initialised: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """One Markdown paragraph for the model card."""
        return (
            f"Converted from `{self.source}` to `{self.target}` with aft_hub's DeiT/ViT initialisation (the AFT "
            f"paper's fine-tuning recipe): {len(self.copied)} tensors copied (patch embedding, norms, MLPs, V and "
            f"output projections, head where it fits), {len(self.initialised)} initialised (Q/K projections, AFT "
            f"biases and whatever else has no counterpart), {len(self.dropped)} source tensors dropped."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "copied": [list(pair) for pair in self.copied],
            "initialised": list(self.initialised),
            "dropped": list(self.dropped),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def infer_vit_config(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Width, depth, patch size, MLP ratio, classes and input size of a timm ViT/DeiT state dict.

    Raises:
        ValueError: when the keys are not those of a timm ``VisionTransformer``.
    """
    required = ["patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight", "norm.weight"]
    missing = [k for k in required if k not in state_dict]
    if missing:
        raise ValueError(
            f"Not a timm ViT/DeiT state dict: missing {missing}. Expected timm's VisionTransformer keys "
            f"(patch_embed.proj, blocks.N.attn.qkv, blocks.N.mlp, norm)."
        )
    proj = state_dict["patch_embed.proj.weight"]
    embed_dim, in_chans, patch_h, patch_w = proj.shape
    if patch_h != patch_w:
        raise ValueError(f"Only square patches are supported, got {patch_h} x {patch_w}.")
    depth = 1 + max(int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k)))
    hidden = state_dict["blocks.0.mlp.fc1.weight"].shape[0]
    prefix = sum(1 for k in ("cls_token", "dist_token") if k in state_dict)
    if "reg_token" in state_dict:
        prefix += state_dict["reg_token"].shape[1]
    img_size = None
    if "pos_embed" in state_dict:
        grid_tokens = state_dict["pos_embed"].shape[1] - prefix
        if grid_tokens <= 0 or "no_embed_class" in state_dict:
            grid_tokens = state_dict["pos_embed"].shape[1]
        side = math.isqrt(grid_tokens)
        if side * side == grid_tokens:
            img_size = side * patch_h
    head = state_dict.get("head.weight")
    return dict(
        embed_dim=int(embed_dim),
        in_chans=int(in_chans),
        patch_size=int(patch_h),
        depth=depth,
        mlp_ratio=hidden / embed_dim,
        num_classes=int(head.shape[0]) if head is not None else 0,
        img_size=img_size,
        qkv_bias="blocks.0.attn.qkv.bias" in state_dict,
        class_token="cls_token" in state_dict,
    )


def aft_architecture_for(mixer: str, embed_dim: int) -> str:
    """A registered timm name of the right mixer and size; the full constructor arguments go with it anyway."""
    if mixer == "conv":
        names = {192: "aft_conv_tiny", 384: "aft_conv_small", 768: "aft_conv_base_32_25"}
        return names.get(embed_dim, "aft_conv_small")
    if mixer == "full":
        return "aft_full_tiny" if embed_dim <= 192 else "aft_full_small"
    raise ValueError(f"DeiT/ViT initialisation targets mixer 'conv' or 'full', got {mixer!r}.")


def vit_to_aft(
    source: Mapping[str, torch.Tensor],
    *,
    mixer: str = "conv",
    heads: int | None = None,
    kernel_size: int = 11,
    bias_rank: int = 128,
    num_classes: int | None = None,
    img_size: int | None = None,
    copy_qk: bool = False,
    source_name: str = "state dict",
    pretrained_cfg_overlay: Mapping[str, Any] | None = None,
    seed: int | None = 0,
) -> tuple[nn.Module, ConversionReport]:
    """Build an AFT model of the same width and depth as a timm ViT/DeiT and initialise it from its weights.

    Args:
        source: the ViT/DeiT state dict (timm keys).
        mixer: ``'conv'`` (AFT-conv, no class token or position embedding) or ``'full'`` (AFT-full with class token
            and learned position embedding, like the paper's AFT-full).
        heads: AFT-conv heads (default: 32, the paper's DeiT-base fine-tuning setting, or the width when smaller).
        kernel_size: AFT-conv kernel side s (odd).
        bias_rank: d' of AFT-full's factorised position bias.
        num_classes: classes of the new head (default: the source's). With a different count the head is
            initialised and the source head dropped.
        img_size: input size (default: the source's, from its position embedding, else 224).
        copy_qk: also copy Q (and K where shapes allow); the paper re-initialises both.
        source_name: how the report names the source.
        pretrained_cfg_overlay: timm ``pretrained_cfg`` entries for the result (e.g. the source's mean/std).
        seed: seed for the fresh initialisations (None: the global generator).

    Returns:
        ``(model, report)``: a timm ``AftVisionTransformer`` (``timm.create_model`` of an aft_hub name) and the
        report of copied, initialised and dropped tensors.
    """
    import timm

    from .. import timm_models  # noqa: F401  (registers the AFT names with timm)

    cfg = infer_vit_config(source)
    embed_dim = cfg["embed_dim"]
    kwargs: dict[str, Any] = dict(
        img_size=img_size or cfg["img_size"] or 224,
        patch_size=cfg["patch_size"],
        in_chans=cfg["in_chans"],
        num_classes=cfg["num_classes"] if num_classes is None else num_classes,
        embed_dim=embed_dim,
        depth=cfg["depth"],
        mlp_ratio=cfg["mlp_ratio"],
        qkv_bias=True,
    )
    if mixer == "conv":
        heads = heads if heads is not None else min(32, embed_dim)
        kwargs.update(mixer="conv", heads=heads, kernel_size=kernel_size, class_token=False, pos_embed="none")
    elif mixer == "full":
        kwargs.update(mixer="full", bias_rank=bias_rank, class_token=True, pos_embed="learn")
    else:
        raise ValueError(f"mixer must be 'conv' or 'full' for a DeiT/ViT initialisation, got {mixer!r}.")
    architecture = aft_architecture_for(mixer, embed_dim)
    overlay = dict(pretrained_cfg_overlay or {})
    size = kwargs["img_size"]
    overlay.setdefault("input_size", (kwargs["in_chans"], size, size))
    overlay.setdefault("pool_size", (size // kwargs["patch_size"],) * 2)
    fork = torch.random.fork_rng() if seed is not None else contextlib.nullcontext()
    with fork:
        if seed is not None:
            torch.manual_seed(seed)
        model = timm.create_model(architecture, pretrained=False, pretrained_cfg_overlay=overlay, **kwargs)
    target = model.state_dict()
    report = ConversionReport(source=source_name, target=architecture)
    new_state: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def copy(src_key: str, dst_key: str, tensor: torch.Tensor | None = None, label: str | None = None) -> bool:
        value = source[src_key] if tensor is None else tensor
        if dst_key not in target or tuple(value.shape) != tuple(target[dst_key].shape):
            return False
        new_state[dst_key] = value.detach().clone().to(target[dst_key].dtype)
        report.copied.append((label or src_key, dst_key))
        return True

    direct = {
        "patch_embed.proj.weight": "patch_embed.proj.weight",
        "patch_embed.proj.bias": "patch_embed.proj.bias",
        "norm.weight": "norm.weight",
        "norm.bias": "norm.bias",
        "cls_token": "cls_token",
        "pos_embed": "pos_embed",
        "head.weight": "head.weight",
        "head.bias": "head.bias",
    }
    block_direct = ["norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                    "mlp.fc2.weight", "mlp.fc2.bias", "ls1.gamma", "ls2.gamma"]  # fmt: skip
    for src_key, dst_key in direct.items():
        if src_key in source and copy(src_key, dst_key):
            used.add(src_key)
    for i in range(cfg["depth"]):
        s, d = f"blocks.{i}.", f"blocks.{i}."
        for name in block_direct:
            if s + name in source and copy(s + name, d + name):
                used.add(s + name)
        for kind in ("weight", "bias"):
            key = f"{s}attn.proj.{kind}"
            if key in source and copy(key, f"{d}mixer.proj.{kind}"):
                used.add(key)
            key = f"{s}attn.qkv.{kind}"
            if key not in source:
                continue
            q, k, v = torch.chunk(source[key], 3, dim=0)
            parts_used = []
            if copy(key, f"{d}mixer.v.{kind}", v, label=f"{key}[v]"):
                parts_used.append("v")
            for name, part in (("q", q), ("k", k)):
                if copy_qk and copy(key, f"{d}mixer.{name}.{kind}", part, label=f"{key}[{name}]"):
                    parts_used.append(name)
            for name in ("q", "k", "v"):
                if name not in parts_used:
                    report.dropped.append(f"{key}[{name}]")
            used.add(key)
    report.dropped.extend(sorted(k for k in source if k not in used))
    report.initialised = sorted(k for k in target if k not in new_state)
    missing, unexpected = model.load_state_dict(new_state, strict=False)
    assert not unexpected and sorted(missing) == report.initialised
    logger.info(
        "%s -> %s: %d copied, %d initialised, %d dropped",
        source_name,
        architecture,
        len(report.copied),
        len(report.initialised),
        len(report.dropped),
    )
    return model, report

