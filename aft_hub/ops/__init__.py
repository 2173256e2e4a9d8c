"""The AFT mathematics: fast operators, plain references and causal decoding. Imports nothing else of aft_hub."""

from .decode import (
    AFTDecodeState,
    AFTFullDecodeState,
    aft_conv1d_prefill_state,
    aft_conv1d_step,
    aft_full_prefill_state,
    aft_full_step,
    aft_local_prefill_state,
    aft_local_step,
    aft_local_step_bias,
    aft_simple_prefill_state,
    aft_simple_step,
)
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
    "AFTDecodeState",
    "AFTFullDecodeState",
    "aft_simple_step",
    "aft_local_step",
    "aft_conv1d_step",
    "aft_full_step",
    "aft_simple_prefill_state",
    "aft_local_prefill_state",
    "aft_conv1d_prefill_state",
    "aft_full_prefill_state",
    "aft_local_step_bias",
]
