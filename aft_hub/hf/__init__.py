"""transformers front end of aft_hub: configurations, models and their registration with the Auto classes.

Importing this package registers model_type "aft" with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM``, so that ``AutoModelForCausalLM.from_pretrained(path)`` loads a saved AFT language model.
The byte-level tokenizer is a plain ``PreTrainedTokenizerFast`` (see :func:`build_byte_tokenizer`) and needs no
registration.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_aft import AftConfig
from .modeling_aft import (
    AftCache,
    AftCausalLMOutput,
    AftForCausalLM,
    AftModel,
    AftModelOutput,
    AftPreTrainedModel,
)
from .tokenization_aft import build_byte_tokenizer

__all__ = [
    "AftConfig",
    "AftCache",
    "AftModel",
    "AftForCausalLM",
    "AftPreTrainedModel",
    "AftModelOutput",
    "AftCausalLMOutput",
    "build_byte_tokenizer",
    "register",
]


def register() -> None:
    """Register the AFT configurations and models with the transformers Auto classes (idempotent)."""
    AutoConfig.register(AftConfig.model_type, AftConfig, exist_ok=True)
    AutoModel.register(AftConfig, AftModel, exist_ok=True)
    AutoModelForCausalLM.register(AftConfig, AftForCausalLM, exist_ok=True)


register()

# ---- vision (model_type "aft_vision") --------------------------------------------------------------------------
from transformers import AutoModelForImageClassification  # noqa: E402

from .configuration_aft_vision import AftVisionConfig  # noqa: E402
from .modeling_aft_vision import (  # noqa: E402
    AftForImageClassification,
    AftVisionModel,
    AftVisionPreTrainedModel,
    build_image_processor,
    timm_to_transformers,
    transformers_to_timm,
)

__all__ += [
    "AftVisionConfig",
    "AftVisionModel",
    "AftForImageClassification",
    "AftVisionPreTrainedModel",
    "build_image_processor",
    "timm_to_transformers",
    "transformers_to_timm",
    "register_vision",
]


def register_vision() -> None:
    """Register the AFT image configuration and models with the transformers Auto classes (idempotent)."""
    AutoConfig.register(AftVisionConfig.model_type, AftVisionConfig, exist_ok=True)
    AutoModel.register(AftVisionConfig, AftVisionModel, exist_ok=True)
    AutoModelForImageClassification.register(AftVisionConfig, AftForImageClassification, exist_ok=True)


register_vision()
