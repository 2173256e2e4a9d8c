"""The AFT mathematics: fast operators, plain references and causal decoding. Imports nothing else of aft_hub."""

from .functional import aft_conv1d, aft_conv2d, aft_full, aft_local, aft_simple
from .reference import (
    aft_conv1d_reference,
    aft_conv2d_reference,
    aft_full_reference,
    aft_local_reference,
    aft_simple_reference,
)

__all__ = [
    "aft_full",
    "aft_simple",
    "aft_local",
    "aft_conv1d",
    "aft_conv2d",
    "aft_full_reference",
    "aft_simple_reference",
    "aft_local_reference",
    "aft_conv1d_reference",
    "aft_conv2d_reference",
]
