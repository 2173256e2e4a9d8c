"""Load a model from what a user points the command line at: a repo folder, a timm name, or a weights file."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from torch import nn

from .io import check_state_dict, load_state_dict

logger = logging.getLogger(__name__)

__all__ = ["LoadedModel", "load_model", "load_timm_model", "CONVERSION_REPORT"]

CONVERSION_REPORT = "conversion.json"


@dataclasses.dataclass
class LoadedModel:
    """A model, what kind of folder or name it came from, and what travels with it.

    Attributes:
        model: the module.
        source_format: ``"transformers"``, ``"timm-folder"``, ``"timm-name"`` or ``"checkpoint"``.
        tokenizer: a language model's tokenizer when the folder has one.
        conversion: the ``conversion.json`` report of a converted folder (base model, copied/initialised/dropped).
    """

    model: nn.Module
    source_format: str
    tokenizer: Any = None
    conversion: dict[str, Any] | None = None


def _register_front_ends() -> None:
    from .. import (
        hf,  # noqa: F401  (registers the AFT transformers classes)
        timm_models,  # noqa: F401  (registers the AFT timm names)
    )


def _filter_fn_for(model: nn.Module) -> Any:
    """The ``checkpoint_filter_fn`` of a timm model's family, if it has one."""
    from ..vision import AftVisionTransformer

    if isinstance(model, AftVisionTransformer):
        from ..timm_models import checkpoint_filter_fn

        return checkpoint_filter_fn
    return getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)


def load_timm_model(
    name: str,
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    allow_pickle: bool = False,
    pretrained: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """``timm.create_model(name, **kwargs)`` with weights from ``checkpoint`` (safetensors; pickle on request).

    The checkpoint goes through the model's ``checkpoint_filter_fn`` when it has one (aft_hub's handles the
    ``aft.`` prefix of the transformers classes and fused ``qkv`` layouts) and must then fit exactly: a ValueError
    names every missing, unexpected or mis-shaped key.
    """
    import timm

    _register_front_ends()
    if checkpoint is not None and pretrained:
        raise ValueError("Give either pretrained=True or a checkpoint, not both.")
    model = timm.create_model(name, pretrained=pretrained, **kwargs)
    if checkpoint is not None:
        state_dict = load_state_dict(checkpoint, allow_pickle=allow_pickle)
        filter_fn = _filter_fn_for(model)
        if filter_fn is not None:
            state_dict = filter_fn(state_dict, model)
        check_state_dict(model, state_dict, what=f"checkpoint {checkpoint}")
        model.load_state_dict(state_dict)
    return model.eval()


def load_model(
    source: str | os.PathLike[str],
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    allow_pickle: bool = False,
    **timm_kwargs: Any,
) -> LoadedModel:
    """Load ``source``: a repo folder (transformers or timm layout), a timm model name, or a weights file.

    Args:
        source: a folder with ``config.json``; a timm model name (``aft_conv_small``, ``deit_tiny_patch16_224``);
            or a ``.safetensors`` file, which then needs ``timm_kwargs['model_name']``.
        checkpoint: weights for a timm model name.
        allow_pickle: accept pickle weights (read with ``torch.load(weights_only=True)``).
        timm_kwargs: keyword arguments of ``timm.create_model`` (``num_classes``, ...); ``model_name`` names the
            architecture of a bare weights file.
    """
    _register_front_ends()
    path = Path(source)
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ValueError(f"{path} has no config.json; it is not a model folder.")
        config = json.loads(config_path.read_text(encoding="utf-8"))
        conversion = None
        if (path / CONVERSION_REPORT).is_file():
            conversion = json.loads((path / CONVERSION_REPORT).read_text(encoding="utf-8"))
        model_type = config.get("model_type")
        if model_type == "aft":
            from transformers import AutoTokenizer

            from ..hf import AftForCausalLM

            model = AftForCausalLM.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
            return LoadedModel(model.eval(), "transformers", tokenizer=tokenizer, conversion=conversion)
        if model_type == "aft_vision":
            from ..hf import AftForImageClassification

            model = AftForImageClassification.from_pretrained(path)
            return LoadedModel(model.eval(), "transformers", conversion=conversion)
        if model_type is not None:
            raise ValueError(f"{path} holds a transformers model of type {model_type!r}, not an aft_hub model.")
        if "architecture" in config:
            import timm

            model = timm.create_model(f"local-dir:{path.resolve()}", pretrained=True, **timm_kwargs)
            return LoadedModel(model.eval(), "timm-folder", conversion=conversion)
        raise ValueError(f"{config_path} is neither a transformers nor a timm config.")
    if path.is_file():
        model_name = timm_kwargs.pop("model_name", None)
        if not model_name:
            raise ValueError(f"{path} is a weights file; name its timm architecture (CLI: --model NAME).")
        model = load_timm_model(model_name, checkpoint=path, allow_pickle=allow_pickle, **timm_kwargs)
        return LoadedModel(model, "checkpoint")
    import timm

    if not timm.is_model(str(source)):
        raise ValueError(f"{source!r} is not a folder, a file or a registered timm model name.")
    timm_kwargs.pop("model_name", None)
    model = load_timm_model(str(source), checkpoint=checkpoint, allow_pickle=allow_pickle, **timm_kwargs)
    return LoadedModel(model, "timm-name")
