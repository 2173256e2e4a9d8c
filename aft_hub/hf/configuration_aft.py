"""AftConfig: the configuration of the AFT causal language model (Zhai et al., arXiv:2105.14103)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from transformers import GenerationConfig, PreTrainedConfig
from transformers.activations import ACT2FN

__all__ = ["AftConfig", "AFT_TYPES", "BYTE_VOCAB_SIZE", "BOS_EOS_TOKEN_ID", "PAD_TOKEN_ID"]

AFT_TYPES = ("local", "simple", "full", "conv")

# The byte vocabulary: ids 0..255 are the bytes themselves, then two special tokens.
BYTE_VOCAB_SIZE = 258
BOS_EOS_TOKEN_ID = 256  # "<|endoftext|>"
PAD_TOKEN_ID = 257  # "<pad>"

# Keyword arguments that are not fields but that PreTrainedConfig itself consumes, or that saved configs carry.
_BASE_KWARGS = frozenset(
    {
        "torch_dtype",
        "num_labels",
        "name_or_path",
        "_name_or_path",
        "_commit_hash",
        "output_attentions",
        "attn_implementation",
        "experts_implementation",
        "_attn_implementation_internal",
        "_experts_implementation_internal",
        "per_layer_config",
        "model_type",
        "auto_map",
        "custom_pipelines",
    }
)
BASE_CONFIG_KWARGS = _BASE_KWARGS  # public name, reused by configuration_aft_vision


class AftConfig(PreTrainedConfig):
    r"""Configuration of [`AftModel`] and [`AftForCausalLM`], a decoder-only language model whose token mixers are
    causal AFT operators. The defaults are the paper's Enwik8 model, AFT-local-32 with 24 layers of width 256 and a
    context of 1024 bytes, over a byte vocabulary (256 bytes, then `<|endoftext|>` = 256 and `<pad>` = 257).

    Args:
        aft_type (`str`, *optional*, defaults to `"local"`):
            The token mixer of every layer: `"local"` (learned pairwise bias inside a window, 0 outside), `"simple"`
            (no position bias), `"full"` (learned bias between every pair of positions) or `"conv"` (multi-head,
            relative bias kernel; no absolute position, so it generates beyond `max_position_embeddings`).
        window_size (`int`, *optional*, defaults to 32):
            The window s of AFT-local: the bias applies to keys t' with t - t' < s.
        position_bias_rank (`int`, *optional*, defaults to 256):
            Rank d' of the factorised position bias w = u v^T of AFT-local and AFT-full; `None` for a dense
            (max_position_embeddings x max_position_embeddings) bias.
        position_bias_init_std (`float`, *optional*, defaults to 0.01):
            u and v are initialised N(0, std^2).
        conv_heads (`int`, *optional*, defaults to 8):
            Heads of AFT-conv (one scalar key per head); must divide `hidden_size`.
        conv_kernel_size (`int`, *optional*, defaults to 63):
            Odd kernel size s of AFT-conv; a causal layer uses its s // 2 + 1 offsets <= 0.
        max_position_embeddings (`int`, *optional*, defaults to 1024):
            Positions of the absolute position bias of AFT-local and AFT-full (the longest context they accept).
        intermediate_size (`int`, *optional*):
            Hidden size of the MLPs, 4 * `hidden_size` when unset.
        dropout (`float`, *optional*, defaults to 0.0):
            Dropout on the embeddings, the mixer outputs and the MLPs.
        qkv_bias (`bool`, *optional*, defaults to `True`):
            Biases in the Q, K and V projections.

    Example:

    ```python
    >>> import aft_hub.hf
    >>> from aft_hub.hf import AftConfig, AftForCausalLM

    >>> config = AftConfig(num_hidden_layers=2, hidden_size=64, aft_type="conv", conv_heads=4)
    >>> model = AftForCausalLM(config)
    >>> config = model.config
    ```"""

    model_type = "aft"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache"]

    vocab_size: int = BYTE_VOCAB_SIZE
    hidden_size: int = 256
    num_hidden_layers: int = 24
    intermediate_size: int | None = None
    hidden_act: str = "gelu"
    aft_type: str = "local"
    window_size: int = 32
    position_bias_rank: int | None = 256
    position_bias_init_std: float = 0.01
    conv_heads: int = 8
    conv_kernel_size: int = 63
    max_position_embeddings: int = 1024
    qkv_bias: bool = True
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = True
    bos_token_id: int | None = BOS_EOS_TOKEN_ID
    eos_token_id: int | list[int] | None = BOS_EOS_TOKEN_ID
    pad_token_id: int | None = PAD_TOKEN_ID

    def __post_init__(self, **kwargs: Any) -> None:
        allowed = _BASE_KWARGS | set(GenerationConfig._get_default_generation_params())
        unknown = sorted(k for k in kwargs if k not in allowed)
        if unknown:
            raise ValueError(
                f"AftConfig got unknown keyword argument(s) {unknown}; the fields are "
                f"{sorted(f.name for f in dataclasses.fields(self))}."
            )
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size if _is_int(self.hidden_size) else None
        self._validate()
        super().__post_init__(**kwargs)

    def _validate(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "intermediate_size",
            "window_size",
            "conv_heads",
            "conv_kernel_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"AftConfig.{name} must be an int >= 1, got {value!r}.")
        if self.aft_type not in AFT_TYPES:
            raise ValueError(f"AftConfig.aft_type must be one of {AFT_TYPES}, got {self.aft_type!r}.")
        if self.position_bias_rank is not None and (
            not _is_int(self.position_bias_rank) or self.position_bias_rank < 1
        ):
            raise ValueError(
                f"AftConfig.position_bias_rank must be an int >= 1, or None for a dense bias, got "
                f"{self.position_bias_rank!r}."
            )
        if self.conv_kernel_size % 2 == 0:
            raise ValueError(f"AftConfig.conv_kernel_size must be odd, got {self.conv_kernel_size}.")
        if self.aft_type == "conv" and self.hidden_size % self.conv_heads:
            raise ValueError(
                f"AftConfig.hidden_size ({self.hidden_size}) must be divisible by conv_heads ({self.conv_heads})."
            )
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"AftConfig.hidden_act must be one of {sorted(ACT2FN)}, got {self.hidden_act!r}.")
        for name, low, high in (("dropout", 0.0, 1.0),):
            value = getattr(self, name)
            if not _is_number(value) or not low <= value < high:
                raise ValueError(f"AftConfig.{name} must be a number in [{low}, {high}), got {value!r}.")
        for name in ("layer_norm_eps", "position_bias_init_std"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise ValueError(f"AftConfig.{name} must be a number > 0, got {value!r}.")
        if not _is_number(self.initializer_range) or self.initializer_range < 0:
            raise ValueError(f"AftConfig.initializer_range must be a number >= 0, got {self.initializer_range!r}.")
        for name in ("qkv_bias", "use_cache", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"AftConfig.{name} must be a bool, got {getattr(self, name)!r}.")
        for name in ("bos_token_id", "pad_token_id", "eos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]
            if any(i is not None and (not _is_int(i) or i < 0) for i in ids):
                raise ValueError(f"AftConfig.{name} must be None or an int >= 0, got {value!r}.")

    @property
    def has_absolute_positions(self) -> bool:
        """Whether the mixers use an absolute position bias (AFT-local, AFT-full), which limits the context to
        `max_position_embeddings` positions."""
        return self.aft_type in ("local", "full")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
