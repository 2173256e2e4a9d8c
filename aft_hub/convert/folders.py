"""Folder-to-folder conversions, each written atomically in safetensors.

* :func:`timm_to_transformers_folder`: a timm AFT model (name + checkpoint, timm folder, weights file) -> the
  transformers folder (``AftForImageClassification``), which timm also loads (``local-dir:`` / ``hf-hub:``).
* :func:`transformers_to_timm_folder`: a transformers AFT folder -> timm's native layout (timm keys, timm config).
* :func:`vit_to_aft_folder`: a timm DeiT/ViT -> an AFT model initialised from it (see :mod:`aft_hub.convert.vit`),
  plus ``conversion.json`` with the report.

All are lossless where they only move weights: the logits of the written model equal the source's exactly.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from .io import atomic_folder, load_state_dict, write_timm_folder
from .sources import CONVERSION_REPORT, load_model
from .vit import ConversionReport, vit_to_aft

logger = logging.getLogger(__name__)

__all__ = [
    "timm_to_transformers_folder",
    "transformers_to_timm_folder",
    "vit_to_aft_folder",
    "FOLDER_FORMATS",
]

FOLDER_FORMATS = ("transformers", "timm")


def _aft_timm_model(source: str | os.PathLike[str], **kwargs: Any):
    from ..hf import AftVisionPreTrainedModel, transformers_to_timm
    from ..vision import AftVisionTransformer

    model = load_model(source, **kwargs).model
    if isinstance(model, AftVisionPreTrainedModel):
        model = transformers_to_timm(model)
    if not isinstance(model, AftVisionTransformer):
        raise TypeError(f"{source} is a {type(model).__name__}, not an aft_hub AFT vision model.")
    return model.eval()


def _write(model: Any, out: Path, fmt: str) -> None:
    from ..hf import timm_to_transformers

    if fmt == "transformers":
        timm_to_transformers(model).save_pretrained(out)
    elif fmt == "timm":
        write_timm_folder(model, out)
    else:
        raise ValueError(f"format must be one of {FOLDER_FORMATS}, got {fmt!r}.")


def timm_to_transformers_folder(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    allow_pickle: bool = False,
    overwrite: bool = False,
    **timm_kwargs: Any,
) -> Path:
    """Write the transformers folder of a timm AFT model (``config.json`` for both libraries, ``aft.`` keys).

    Args:
        source: a timm name (with ``checkpoint``), a timm folder, or a ``.safetensors`` file (with
            ``model_name=``).
        out: the folder to write.
        checkpoint: weights for a timm name.
        allow_pickle: accept pickle weights (``torch.load(weights_only=True)``).
        overwrite: replace an existing folder.
        timm_kwargs: ``timm.create_model`` arguments (``num_classes``, ``model_name`` of a bare file, ...).
    """
    model = _aft_timm_model(source, checkpoint=checkpoint, allow_pickle=allow_pickle, **timm_kwargs)
    out = Path(out).absolute()
    with atomic_folder(out, overwrite) as tmp:
        _write(model, tmp, "transformers")
    logger.info("Wrote the transformers folder %s from %s", out, source)
    return out


def transformers_to_timm_folder(
    source: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Write timm's native folder (timm keys, timm ``config.json``) of a transformers AFT image folder."""
    model = _aft_timm_model(source)
    out = Path(out).absolute()
    with atomic_folder(out, overwrite) as tmp:
        _write(model, tmp, "timm")
    logger.info("Wrote the timm folder %s from %s", out, source)
    return out


def vit_to_aft_folder(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    pretrained: bool = False,
    allow_pickle: bool = False,
    base_model: str | None = None,
    fmt: str = "transformers",
    overwrite: bool = False,
    **options: Any,
) -> tuple[Path, ConversionReport]:
    """Initialise an AFT model from a timm DeiT/ViT and write it with ``conversion.json``.

    Args:
        source: a timm ViT/DeiT name (random weights unless ``pretrained``, which downloads timm's), a timm folder,
            or a ``.safetensors`` state dict of one.
        out: the folder to write.
        pretrained: load the named model's pretrained weights (network access).
        allow_pickle: accept a pickle state dict (``torch.load(weights_only=True)``).
        base_model: Hub id of the source weights for the model card (default: timm's ``hf_hub_id`` of a
            ``pretrained`` name; none for random or local weights).
        fmt: ``"transformers"`` (the folder both libraries load) or ``"timm"`` (timm keys and config).
        overwrite: replace an existing folder.
        options: :func:`~aft_hub.convert.vit.vit_to_aft` options (``mixer``, ``heads``, ``kernel_size``,
            ``num_classes``, ``copy_qk``, ...).
    """
    import timm

    if fmt not in FOLDER_FORMATS:
        raise ValueError(f"format must be one of {FOLDER_FORMATS}, got {fmt!r}.")
    path = Path(source)
    overlay: dict[str, Any] = {}
    if path.is_file():
        state_dict = load_state_dict(path, allow_pickle=allow_pickle)
        name = path.name
    else:
        if path.is_dir():
            vit = timm.create_model(f"local-dir:{path.resolve()}", pretrained=True)
        elif timm.is_model(str(source)):
            vit = timm.create_model(str(source), pretrained=pretrained)
            if pretrained and base_model is None:
                base_model = vit.pretrained_cfg.get("hf_hub_id") or None
        else:
            raise ValueError(f"{source!r} is not a file, a folder or a registered timm model name.")
        state_dict = vit.state_dict()
        name = str(source)
        overlay = {k: vit.pretrained_cfg[k] for k in ("mean", "std", "crop_pct", "interpolation", "crop_mode")
                   if vit.pretrained_cfg.get(k) is not None}  # fmt: skip
    model, report = vit_to_aft(state_dict, source_name=name, pretrained_cfg_overlay=overlay, **options)
    with torch.no_grad():
        probe = model(torch.zeros(1, *model.pretrained_cfg["input_size"]))
    if not torch.isfinite(probe).all():
        raise RuntimeError("The converted model produces non-finite logits; the source weights are unusable.")
    out = Path(out).absolute()
    with atomic_folder(out, overwrite) as tmp:
        _write(model, tmp, fmt)
        data = dict(report.to_dict(), base_model=base_model, summary=report.summary())
        (tmp / CONVERSION_REPORT).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return out, report
