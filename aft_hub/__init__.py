"""aft_hub: the Attention Free Transformer (Zhai et al., arXiv:2105.14103) for PyTorch, timm and transformers.

``import aft_hub`` registers the AFT-ViT models with timm and the AFT configs/models with transformers' Auto classes.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

# timm_models registers the aft_* models with timm; hf registers "aft" / "aft_vision" with the Auto classes
from . import hf, layers, ops, timm_models  # noqa: E402

__all__ = ["__version__", "ops", "layers", "timm_models", "hf"]
