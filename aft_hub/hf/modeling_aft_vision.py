"""The AFT image models for transformers (Zhai et al., "An Attention Free Transformer", arXiv:2105.14103).

:class:`AftVisionModel` and :class:`AftForImageClassification` hold the timm model itself, an
:class:`~aft_hub.vision.AftVisionTransformer` built by ``timm.create_model(config.architecture, ...)``, as their
attribute ``aft``: the state-dict keys are ``aft.`` + timm's keys, every computation is the timm model's, and
:func:`aft_hub.timm_models.checkpoint_filter_fn` lets timm load the weights these classes save. The same
``config.json`` serves both libraries (see :mod:`aft_hub.hf.configuration_aft_vision`).

Preprocessing: transformers' ``TimmWrapperImageProcessor`` built from the config's ``pretrained_cfg`` (timm's
evaluation transform: resize to ``input_size / crop_pct``, centre crop, normalise). Its settings live in
``config.json``, which ``AutoImageProcessor.from_pretrained`` and ``pipeline("image-classification")`` read, so no
separate processor file is saved (see :func:`build_image_processor`).

Conversions: :func:`timm_to_transformers` and :func:`transformers_to_timm` move weights between a timm model and
these classes without changing a number.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.initialization import no_init_weights
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndNoAttention,
    ImageClassifierOutputWithNoAttention,
)
from transformers.utils import can_return_tuple

from ..vision import AftVisionTransformer, init_vision_weights
from .configuration_aft_vision import AftVisionConfig

logger = logging.getLogger(__name__)

__all__ = [
    "AftVisionPreTrainedModel",
    "AftVisionModel",
    "AftForImageClassification",
    "build_image_processor",
    "timm_to_transformers",
    "transformers_to_timm",
]


def _create_timm_model(config: AftVisionConfig, num_classes: int) -> AftVisionTransformer:
    """``timm.create_model`` of the config's architecture and arguments: the model timm itself would build from the
    config.json (same class, arguments and ``pretrained_cfg``)."""
    import timm

    from .. import timm_models  # noqa: F401  (registers the aft_* names with timm)

    if not timm.is_model(config.architecture):
        raise ValueError(
            f"AftVisionConfig.architecture {config.architecture!r} is not a registered timm model; use an aft_hub "
            f"name such as 'aft_conv_tiny' (see aft_hub.timm_models)."
        )
    model = timm.create_model(
        config.architecture,
        pretrained=False,
        pretrained_cfg=config.timm_pretrained_cfg(num_classes),
        **config.model_kwargs(num_classes),
    )
    if not isinstance(model, AftVisionTransformer):
        raise ValueError(
            f"AftVisionConfig.architecture {config.architecture!r} builds a {type(model).__name__}, not an aft_hub "
            f"AftVisionTransformer."
        )
    return model


# ----------------------------------------------------------------------------------------------------------------
# pretrained model
# ----------------------------------------------------------------------------------------------------------------


class AftVisionPreTrainedModel(PreTrainedModel):
    """Weight initialisation, activation checkpointing and loading for the AFT image models.

    Subclasses hold the timm model as ``self.aft`` (state-dict keys ``aft.`` + timm's keys).
    """

    config: AftVisionConfig
    config_class = AftVisionConfig
    base_model_prefix = "aft"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["AftBlock"]

    aft: AftVisionTransformer

    def _init_weights(self, module: nn.Module) -> None:
        """timm's initialisation of every parameter (:func:`aft_hub.vision.init_vision_weights`): a model built
        from an empty or partial state dict gets the same distributions as a fresh timm model.

        transformers runs this inside ``initialization.guard_torch_init_functions``, so the ``torch.nn.init``
        calls skip tensors that were loaded from a checkpoint.
        """
        init_vision_weights(module)

    def _set_gradient_checkpointing(
        self,
        enable: bool = True,
        gradient_checkpointing_func: Callable = checkpoint,
        every_n_layers: int = 1,
    ) -> None:
        """Hand activation checkpointing to the timm model (``set_grad_checkpointing``): every block is recomputed
        in the backward pass with ``torch.utils.checkpoint`` (non-reentrant), whatever
        ``gradient_checkpointing_kwargs`` say."""
        if enable and every_n_layers != 1:
            raise ValueError("AFT image models checkpoint every block: every_n_layers must be 1.")
        self.aft.set_grad_checkpointing(enable)
        self.gradient_checkpointing = enable

    def _features(
        self, pixel_values: torch.Tensor, output_hidden_states: bool | list[int] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The timm model's final features and, when asked, the blocks' outputs."""
        if pixel_values is None:
            raise ValueError("pixel_values are required: a (batch, channels, height, width) image tensor.")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if not output_hidden_states:
            return self.aft.forward_features(pixel_values), None
        indices = list(output_hidden_states) if isinstance(output_hidden_states, (list, tuple)) else None
        features, intermediates = self.aft.forward_intermediates(pixel_values, indices=indices)
        return features, tuple(intermediates)


# ----------------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------------


class AftVisionModel(AftVisionPreTrainedModel):
    """The AFT vision transformer without a classifier: features and pooled features.

    The timm model is built with ``num_classes=0``, and the ``config.json`` this class saves says so to timm:
    ``timm.create_model("local-dir:PATH", pretrained=True)`` gives the same headless model.
    """

    def __init__(self, config: AftVisionConfig) -> None:
        super().__init__(config)
        self.aft = _create_timm_model(config, num_classes=0)
        self.gradient_checkpointing = False
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_hidden_states: bool | list[int] | None = None,
    ) -> BaseModelOutputWithPoolingAndNoAttention:
        r"""
        Args:
            pixel_values: (B, in_chans, H, W) images, normalised as the image processor does. Models with absolute
                positions (mixer "full" / "local", `pos_embed="learn"`) need H, W = img_size; the others accept any
                multiple of the patch size.
            output_hidden_states: also return every block's output (`True`), or those of the listed block indices.

        Returns:
            `last_hidden_state`: the final normalised features, (B, C, H / p, W / p) (the class token is dropped),
            or the token sequence (B, 1 + H W / p^2, C) when `global_pool == "token"`; `pooler_output`: (B, C),
            the pooled features the classifier reads; `hidden_states`: the blocks' outputs (B, C, H / p, W / p),
            before the final norm, one per block (no embedding entry).
        """
        features, hidden_states = self._features(pixel_values, output_hidden_states)
        pooled = self.aft.forward_head(features, pre_logits=True)
        return BaseModelOutputWithPoolingAndNoAttention(
            last_hidden_state=features, pooler_output=pooled, hidden_states=hidden_states
        )


class AftForImageClassification(AftVisionPreTrainedModel):
    """The AFT vision transformer with its linear classifier over ``num_labels`` classes (timm's ``head``).

    Fine-tune to another label set with ``from_pretrained(path, num_labels=N, ignore_mismatched_sizes=True)`` (or
    ``id2label=..., label2id=...``): the head is re-initialised, everything else loaded.
    """

    def __init__(self, config: AftVisionConfig) -> None:
        super().__init__(config)
        if not config.num_labels or config.num_labels < 1:
            raise ValueError(
                f"AftForImageClassification needs num_labels >= 1, got {config.num_labels}; use AftVisionModel for "
                "features without a classifier."
            )
        self.num_labels = config.num_labels
        self.aft = _create_timm_model(config, num_classes=config.num_labels)
        self.gradient_checkpointing = False
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | list[int] | None = None,
    ) -> ImageClassifierOutputWithNoAttention:
        r"""
        Args:
            pixel_values: (B, in_chans, H, W) images, normalised as the image processor does.
            labels: (B,) class indices for cross-entropy; with `num_labels == 1` (B,) targets for a mean-squared
                error; float (B, num_labels) targets for multi-label binary cross-entropy (transformers'
                `problem_type` convention, inferred on the first call unless the config sets it).
            output_hidden_states: also return every block's output (`True`), or those of the listed block indices.

        Returns:
            `loss` (with labels), `logits` (B, num_labels) and `hidden_states` as in [`AftVisionModel`].
        """
        features, hidden_states = self._features(pixel_values, output_hidden_states)
        logits = self.aft.forward_head(features)
        loss = self.loss_function(labels, logits, self.config) if labels is not None else None
        return ImageClassifierOutputWithNoAttention(loss=loss, logits=logits, hidden_states=hidden_states)


# ----------------------------------------------------------------------------------------------------------------
# preprocessing and conversion
# ----------------------------------------------------------------------------------------------------------------


def build_image_processor(config: AftVisionConfig) -> Any:
    """The image processor of a config: transformers' ``TimmWrapperImageProcessor`` with timm's evaluation
    transform of ``config.pretrained_cfg`` (what ``AutoImageProcessor.from_pretrained`` builds from a saved folder).

    It needs no saving of its own: ``save_pretrained`` of the model writes its settings into ``config.json``.
    """
    from transformers import TimmWrapperImageProcessor

    return TimmWrapperImageProcessor(
        pretrained_cfg=config.timm_pretrained_cfg(config.num_labels or 0), architecture=config.architecture
    )


def timm_to_transformers(model: AftVisionTransformer, **config_kwargs: Any) -> AftVisionPreTrainedModel:
    """The transformers model with the weights of a timm aft_hub model (copied, not shared).

    Args:
        model: a timm :class:`~aft_hub.vision.AftVisionTransformer` (``timm.create_model("aft_conv_small")``, a
            ``local-dir:`` / ``hf-hub:`` load, ...).
        config_kwargs: config fields to set (``id2label``, ``label2id``, ``pretrained_cfg`` merged over the timm
            model's); see :meth:`AftVisionConfig.from_timm_model`.

    Returns:
        An :class:`AftForImageClassification` (an :class:`AftVisionModel` when the timm model has no classifier),
        on the timm model's device and dtype and in its training mode, with identical outputs.
    """
    config = AftVisionConfig.from_timm_model(model, **config_kwargs)
    cls = AftForImageClassification if model.num_classes > 0 else AftVisionModel
    ref = next(model.parameters())
    with no_init_weights():  # every parameter is overwritten below
        hf_model = cls(config)
    hf_model.to(device=ref.device, dtype=ref.dtype)
    hf_model.aft.load_state_dict(model.state_dict(), strict=True)
    return hf_model.train(model.training)


def transformers_to_timm(model: AftVisionPreTrainedModel) -> AftVisionTransformer:
    """The timm model with the weights of an AFT transformers image model (copied, not shared).

    The result is what ``timm.create_model("local-dir:PATH")`` returns for the folder ``model.save_pretrained(PATH)``
    writes: same architecture name, arguments, ``pretrained_cfg`` (labels included) and weights.
    """
    if not isinstance(model, AftVisionPreTrainedModel):
        raise TypeError(f"Expected an AftVisionModel or AftForImageClassification, got {type(model).__name__}.")
    ref = next(model.parameters())
    with no_init_weights():  # every parameter is overwritten below
        timm_model = _create_timm_model(model.config, num_classes=model.aft.num_classes)
    timm_model.to(device=ref.device, dtype=ref.dtype)
    timm_model.load_state_dict(model.aft.state_dict(), strict=True)
    return timm_model.train(model.training)
