"""aft_hub: the Attention Free Transformer (Zhai et al., arXiv:2105.14103) for PyTorch, timm and transformers."""

from __future__ import annotations

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

from . import layers, ops  # noqa: E402

__all__ = ["__version__", "ops", "layers"]
