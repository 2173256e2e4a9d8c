"""Conversions: timm <-> transformers folders (lossless) and DeiT/ViT -> AFT initialisation; safetensors only.

Pickle weights are refused unless asked for (then read with ``torch.load(weights_only=True)``); a checkpoint that
does not fit the model raises a ValueError naming every mismatched key.
"""

from .folders import timm_to_transformers_folder, transformers_to_timm_folder, vit_to_aft_folder
from .io import check_state_dict, load_state_dict, save_state_dict
from .sources import LoadedModel, load_model, load_timm_model
from .vit import ConversionReport, infer_vit_config, vit_to_aft

__all__ = [
    "timm_to_transformers_folder",
    "transformers_to_timm_folder",
    "vit_to_aft_folder",
    "vit_to_aft",
    "infer_vit_config",
    "ConversionReport",
    "load_state_dict",
    "save_state_dict",
    "check_state_dict",
    "load_model",
    "load_timm_model",
    "LoadedModel",
]
