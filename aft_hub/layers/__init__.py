"""nn.Modules built on :mod:`aft_hub.ops`, shared by the timm and transformers front ends (torch only)."""

from .block import AftBlock, DropPath, LayerScale, Mlp
from .mixers import AFT_MIXERS, AftConv, AftConv1d, AftFull, AftLocal, AftSimple, ConvKernel, PositionBias

__all__ = [
    "AftBlock",
    "DropPath",
    "LayerScale",
    "Mlp",
    "AFT_MIXERS",
    "AftConv",
    "AftConv1d",
    "AftFull",
    "AftLocal",
    "AftSimple",
    "ConvKernel",
    "PositionBias",
]
