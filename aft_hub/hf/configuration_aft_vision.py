"""AftVisionConfig: the configuration of the AFT image models for transformers (Zhai et al., arXiv:2105.14103).

The config holds exactly the constructor arguments of :class:`~aft_hub.vision.AftVisionTransformer` (the one vision
model class, also registered with timm) except ``num_classes``, which is the transformers label count
``num_labels`` (``len(id2label)``), plus timm's name and data configuration of the model. So one ``config.json``
serves both libraries.

``config.json`` layout (what :meth:`AftVisionConfig.save_pretrained` writes)::

    {
      # --- read by transformers (AutoConfig -> AftVisionConfig) ---------------------------------------------------
      "model_type": "aft_vision",
      "architectures": ["AftForImageClassification"],
      "id2label": {"0": "cat", ...}, "label2id": {"cat": 0, ...},   # omitted by transformers for 2 default labels
      "img_size": 224, "patch_size": 16, "in_chans": 3, "embed_dim": 192, "depth": 12, "mlp_ratio": 4.0,
      "mixer": "conv", "heads": 192, "kernel_size": 11, "window": 7, "bias_rank": 128, "class_token": false,
      "pos_embed": "none", "qkv_bias": true, "init_values": null, "drop_rate": 0.0, "pos_drop_rate": 0.0,
      "proj_drop_rate": 0.0, "drop_path_rate": 0.0,
      "image_processor_type": "TimmWrapperImageProcessor",            # read by AutoImageProcessor
      # --- read by both -----------------------------------------------------------------------------------------
      "global_pool": "avg",
      "architecture": "aft_conv_tiny",        # timm: the registered name it builds; transformers: a field
      "pretrained_cfg": {"input_size": [3, 224, 224], "mean": [...], "std": [...], "crop_pct": 0.875,
                         "interpolation": "bicubic", "crop_mode": "center", "fixed_input_size": false, ...},
                                              # timm: data config; transformers: the image processor's transform
      # --- read by timm (derived from the fields above; rewritten on every save, checked on load) ----------------
      "num_classes": 10,                      # = num_labels (0 when saved by AftVisionModel); timm's head size
      "label_names": ["cat", ...],            # = id2label in index order
      "num_features": 192,                    # = embed_dim (informational for timm)
      "model_args": {"img_size": 224, ...}    # every model field except num_classes: timm.create_model kwargs
    }

* transformers: ``AutoConfig`` / ``AutoModelForImageClassification`` (once ``aft_hub.hf`` is imported) read the
  fields; the derived timm keys come back as keyword arguments and must agree with the fields (``ValueError``
  otherwise, so a hand-edited file cannot mean one model to timm and another to transformers).
  ``AutoImageProcessor`` and ``pipeline("image-classification")`` find ``pretrained_cfg`` in ``config.json``
  (transformers treats such a folder like a timm checkpoint) and build a ``TimmWrapperImageProcessor`` from it:
  timm's own evaluation transform, so both libraries preprocess identically. No ``preprocessor_config.json``.
* timm: ``timm.create_model("local-dir:PATH" or "hf-hub:ORG/NAME", pretrained=True)`` (after importing
  ``aft_hub.timm_models``; without ``pretrained=True`` timm builds the architecture only)
  read ``architecture``, ``pretrained_cfg``, ``num_classes``, ``label_names`` and ``model_args``, and load
  ``model.safetensors`` through :func:`aft_hub.timm_models.checkpoint_filter_fn`, which strips the ``aft.`` prefix
  of the transformers keys. ``model_args`` never holds ``num_classes`` (transformers' TimmWrapper would otherwise
  receive it twice). A folder saved by the headless ``AftVisionModel`` (``architectures == ["AftVisionModel"]``)
  has no head weights and says ``num_classes: 0``, so timm builds it without a classifier too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import PretrainedCfg
from transformers import GenerationConfig, PreTrainedConfig

from ..vision import MIXER_TYPES, POOL_TYPES
from .configuration_aft import BASE_CONFIG_KWARGS

logger = logging.getLogger(__name__)

__all__ = ["AftVisionConfig", "MODEL_ARG_NAMES", "IMAGE_PROCESSOR_TYPE", "TIMM_DERIVED_KEYS"]

# The constructor arguments of AftVisionTransformer that the config stores as fields (all but num_classes, which is
# num_labels, and device / dtype). tests/test_hf_vision.py checks this against the constructor's signature.
MODEL_ARG_NAMES = (
    "img_size",
    "patch_size",
    "in_chans",
    "global_pool",
    "embed_dim",
    "depth",
    "mlp_ratio",
    "mixer",
    "heads",
    "kernel_size",
    "window",
    "bias_rank",
    "class_token",
    "pos_embed",
    "qkv_bias",
    "init_values",
    "drop_rate",
    "pos_drop_rate",
    "proj_drop_rate",
    "drop_path_rate",
)

# The image processor transformers builds from config.json: timm's evaluation transform of `pretrained_cfg`.
IMAGE_PROCESSOR_TYPE = "TimmWrapperImageProcessor"

# Keys that to_dict() derives for timm (and AutoImageProcessor); accepted back only when they agree with the fields.
TIMM_DERIVED_KEYS = ("num_classes", "label_names", "num_features", "model_args", "image_processor_type")

_POS_EMBED_TYPES = ("learn", "none")
_CROP_MODES = ("center", "squash", "border")
_PRETRAINED_CFG_KEYS = frozenset(f.name for f in dataclasses.fields(PretrainedCfg))
# where timm finds the weights: set by timm itself when it loads a folder or a Hub repo, never stored
_SOURCE_KEYS = frozenset({"url", "file", "state_dict", "hf_hub_id", "hf_hub_filename", "source"})
# carried at the top level of config.json (checked against the fields when a pretrained_cfg repeats them)
_TOP_LEVEL_KEYS = frozenset({"architecture", "num_classes", "label_names"})
# the data recipe a timm model's pretrained_cfg contributes to the config (the rest the config derives)
_TIMM_DATA_KEYS = (
    "input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std", "label_descriptions", "license",
    "description", "origin_url", "paper_name", "paper_ids", "notes",
)  # fmt: skip

# Keyword arguments that PreTrainedConfig itself consumes: shared with the language-model config.
_BASE_KWARGS = BASE_CONFIG_KWARGS


class AftVisionConfig(PreTrainedConfig):
    r"""Configuration of [`AftVisionModel`] and [`AftForImageClassification`]: a vision transformer whose token
    mixer is AFT, the model timm registers as `aft_*`. The model fields are the arguments of
    `aft_hub.vision.AftVisionTransformer`; the defaults are the paper's best tiny model, AFT-conv with 192 heads and
    11 x 11 kernels (timm `aft_conv_tiny`). The classifier has `num_labels` (= `len(id2label)`) outputs. See the
    module docstring for the `config.json` layout shared with timm.

    Use [`AftVisionConfig.from_timm_architecture`] for any registered timm name (`"aft_full_small"`,
    `"test_aft_local"`, ...).

    Args:
        architecture (`str`, *optional*):
            The timm name timm builds the model with (`model_args` override all its arguments, so it names the
            family). Defaults to `"aft_{mixer}_tiny"`.
        img_size (`int` or `list[int]`, *optional*, defaults to 224):
            Nominal input size; fixes the token count of models with absolute positions (`mixer` "full" / "local"
            or `pos_embed="learn"`).
        patch_size (`int`, *optional*, defaults to 16):
            Side of the square patches.
        in_chans (`int`, *optional*, defaults to 3):
            Input channels.
        global_pool (`str`, *optional*, defaults to `"avg"`):
            Pooling before the classifier: `"avg"`, `"max"`, `"avgmax"`, `"token"` (class token) or `""` (none).
        embed_dim (`int`, *optional*, defaults to 192):
            Channels d.
        depth (`int`, *optional*, defaults to 12):
            Number of blocks.
        mlp_ratio (`float`, *optional*, defaults to 4.0):
            Hidden size of the MLPs over d.
        mixer (`str`, *optional*, defaults to `"conv"`):
            Token mixer: `"conv"`, `"simple"`, `"full"` or `"local"`.
        heads (`int`, *optional*, defaults to 192):
            AFT-conv heads (must divide `embed_dim`).
        kernel_size (`int`, *optional*, defaults to 11):
            AFT-conv kernel side (odd).
        window (`int`, *optional*, defaults to 7):
            AFT-local window on the token grid.
        bias_rank (`int`, *optional*, defaults to 128):
            d' of the factorised AFT-full / AFT-local position bias; `None` for a dense bias.
        class_token (`bool`, *optional*, defaults to `False`):
            Prepend a learned class token ("full" / "simple" only).
        pos_embed (`str`, *optional*, defaults to `"none"`):
            `"learn"` for a learned absolute position embedding, `"none"` for none.
        qkv_bias (`bool`, *optional*, defaults to `True`):
            Biases in the Q, K, V projections.
        init_values (`float`, *optional*):
            Layer-scale initial value; `None` for no layer-scale.
        drop_rate (`float`, *optional*, defaults to 0.0):
            Dropout before the classifier.
        pos_drop_rate (`float`, *optional*, defaults to 0.0):
            Dropout after the embedding.
        proj_drop_rate (`float`, *optional*, defaults to 0.0):
            Dropout after the mixers' output projections and in the MLPs.
        drop_path_rate (`float`, *optional*, defaults to 0.0):
            Stochastic depth, rising linearly to this value over the blocks.
        pretrained_cfg (`dict`, *optional*):
            timm's data configuration (fields of `timm.models.PretrainedCfg`: `input_size`, `mean`, `std`,
            `crop_pct`, `interpolation`, `crop_mode`, ...), merged over defaults derived from the model fields
            (ImageNet mean / std, crop 0.875, bicubic). The image processor applies timm's evaluation transform of
            it.
        num_classes (`int`, *optional*):
            timm's name for `num_labels`; accepted when no `id2label` is given, or when it agrees with it.

    Example:

    ```python
    >>> import aft_hub.hf
    >>> from aft_hub.hf import AftForImageClassification, AftVisionConfig

    >>> config = AftVisionConfig.from_timm_architecture("test_aft_conv", id2label={0: "cat", 1: "dog"})
    >>> model = AftForImageClassification(config)
    ```"""

    model_type = "aft_vision"
    attribute_map: ClassVar[dict[str, str]] = {"hidden_size": "embed_dim", "num_hidden_layers": "depth"}

    architecture: str | None = None
    img_size: int | list[int] = 224
    patch_size: int = 16
    in_chans: int = 3
    global_pool: str = "avg"
    embed_dim: int = 192
    depth: int = 12
    mlp_ratio: float = 4.0
    mixer: str = "conv"
    heads: int = 192
    kernel_size: int = 11
    window: int = 7
    bias_rank: int | None = 128
    class_token: bool = False
    pos_embed: str = "none"
    qkv_bias: bool = True
    init_values: float | None = None
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    pretrained_cfg: dict[str, Any] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        derived = {k: kwargs.pop(k) for k in TIMM_DERIVED_KEYS if k in kwargs}
        model_type = kwargs.pop("model_type", self.model_type)
        if model_type != self.model_type:
            raise ValueError(
                f"AftVisionConfig got model_type {model_type!r}; it reads configs of model_type {self.model_type!r}."
            )
        allowed = _BASE_KWARGS | set(GenerationConfig._get_default_generation_params())
        unknown = sorted(k for k in kwargs if k not in allowed)
        if unknown:
            raise ValueError(
                f"AftVisionConfig got unknown keyword argument(s) {unknown}; the fields are "
                f"{sorted(f.name for f in dataclasses.fields(self))}."
            )
        if kwargs.get("num_labels") is not None:
            # an explicit label count (``from_pretrained(path, num_labels=N)``) replaces the saved labels
            derived.pop("num_classes", None)
            derived.pop("label_names", None)
        num_classes = derived.get("num_classes")
        if num_classes is not None:
            if not _is_int(num_classes) or num_classes < 0:
                raise ValueError(f"AftVisionConfig.num_classes must be an int >= 0, got {num_classes!r}.")
            if self.id2label is None and kwargs.get("num_labels") is None:
                kwargs["num_labels"] = num_classes  # timm's name for the label count
        if kwargs.get("num_labels") is not None and (not _is_int(kwargs["num_labels"]) or kwargs["num_labels"] < 0):
            raise ValueError(f"AftVisionConfig.num_labels must be an int >= 0, got {kwargs['num_labels']!r}.")
        if (
            isinstance(self.img_size, (tuple, list))
            and len(self.img_size) == 2
            and self.img_size[0] == self.img_size[1]
        ):
            self.img_size = self.img_size[0]
        elif isinstance(self.img_size, tuple):
            self.img_size = list(self.img_size)
        self._validate_model_fields()
        self.pretrained_cfg, repeated = self._resolve_pretrained_cfg(self.pretrained_cfg)
        super().__post_init__(**kwargs)
        self._validate_labels()
        self._check_derived(repeated, where="pretrained_cfg")
        self._check_derived(derived, where="config")

    # ---- validation --------------------------------------------------------------------------------------------

    def _validate_model_fields(self) -> None:
        if self.mixer not in MIXER_TYPES:
            raise ValueError(f"AftVisionConfig.mixer must be one of {MIXER_TYPES}, got {self.mixer!r}.")
        if self.architecture is None:
            self.architecture = f"aft_{self.mixer}_tiny"
        if not isinstance(self.architecture, str) or not self.architecture:
            raise ValueError(f"AftVisionConfig.architecture must be a timm model name, got {self.architecture!r}.")
        for name in ("patch_size", "in_chans", "embed_dim", "depth", "heads", "kernel_size", "window"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"AftVisionConfig.{name} must be an int >= 1, got {value!r}.")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"AftVisionConfig.kernel_size must be odd, got {self.kernel_size}.")
        hw = self.image_hw
        if hw is None:
            raise ValueError(f"AftVisionConfig.img_size must be an int or a pair of ints, got {self.img_size!r}.")
        if hw[0] < 1 or hw[1] < 1 or hw[0] % self.patch_size or hw[1] % self.patch_size:
            raise ValueError(
                f"AftVisionConfig.img_size {self.img_size!r} must be positive and divisible by patch_size "
                f"{self.patch_size}."
            )
        if self.global_pool not in POOL_TYPES:
            raise ValueError(f"AftVisionConfig.global_pool must be one of {POOL_TYPES}, got {self.global_pool!r}.")
        if self.pos_embed not in _POS_EMBED_TYPES:
            raise ValueError(f"AftVisionConfig.pos_embed must be one of {_POS_EMBED_TYPES}, got {self.pos_embed!r}.")
        for name in ("class_token", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"AftVisionConfig.{name} must be a bool, got {getattr(self, name)!r}.")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("AftVisionConfig.global_pool='token' needs a class token (class_token=True).")
        if self.class_token and self.mixer in ("conv", "local"):
            raise ValueError(
                f"AftVisionConfig.class_token must be False for mixer={self.mixer!r}, which works on the 2-D token "
                "grid."
            )
        if self.mixer == "conv" and self.embed_dim % self.heads:
            raise ValueError(
                f"AftVisionConfig.embed_dim ({self.embed_dim}) must be divisible by heads ({self.heads})."
            )
        if self.bias_rank is not None and (not _is_int(self.bias_rank) or self.bias_rank < 1):
            raise ValueError(
                f"AftVisionConfig.bias_rank must be an int >= 1, or None for a dense bias, got {self.bias_rank!r}."
            )
        if not _is_number(self.mlp_ratio) or self.mlp_ratio <= 0:
            raise ValueError(f"AftVisionConfig.mlp_ratio must be a number > 0, got {self.mlp_ratio!r}.")
        if self.init_values is not None and (not _is_number(self.init_values) or self.init_values <= 0):
            raise ValueError(
                f"AftVisionConfig.init_values must be a number > 0, or None for no layer-scale, got "
                f"{self.init_values!r}."
            )
        for name in ("drop_rate", "pos_drop_rate", "proj_drop_rate", "drop_path_rate"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ValueError(f"AftVisionConfig.{name} must be a number in [0, 1), got {value!r}.")

    def _validate_labels(self) -> None:
        n = self.num_labels or 0
        if sorted(self.id2label) != list(range(n)):
            raise ValueError(
                f"AftVisionConfig.id2label must map each class index 0..{n - 1} to a name, got keys "
                f"{sorted(self.id2label)}."
            )
        if self.label2id is None:
            self.label2id = {label: i for i, label in self.id2label.items()}
        elif any(self.label2id.get(label) != i for i, label in self.id2label.items()):
            raise ValueError(
                "AftVisionConfig.label2id must be the inverse of id2label (distinct names, one per class index)."
            )

    def _default_pretrained_cfg(self) -> dict[str, Any]:
        h, w = self.image_hw
        rgb = self.in_chans == 3
        return {
            "input_size": [self.in_chans, h, w],
            "interpolation": "bicubic",
            "crop_pct": 0.875,
            "crop_mode": "center",
            "mean": list(IMAGENET_DEFAULT_MEAN) if rgb else [0.5] * self.in_chans,
            "std": list(IMAGENET_DEFAULT_STD) if rgb else [0.5] * self.in_chans,
            "paper_ids": "arXiv:2105.14103",
            "paper_name": "An Attention Free Transformer",
        }

    def _resolve_pretrained_cfg(self, given: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Defaults from the model fields, overlaid with ``given``; the architecture's facts checked and set.

        Returns:
            The data configuration, and the top-level keys (``architecture``, ``num_classes``, ``label_names``) that
            ``given`` repeated, to be checked against the fields.
        """
        if given is not None and not isinstance(given, dict):
            raise ValueError(f"AftVisionConfig.pretrained_cfg must be a dict or None, got {type(given).__name__}.")
        given = dict(given or {})
        for key in _SOURCE_KEYS & given.keys():
            logger.debug("pretrained_cfg[%r] (a weight location) is not stored in the config.", key)
            del given[key]
        unknown = sorted(set(given) - _PRETRAINED_CFG_KEYS)
        if unknown:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg has unknown key(s) {unknown}; allowed are the fields of timm's "
                f"PretrainedCfg: {sorted(_PRETRAINED_CFG_KEYS - _SOURCE_KEYS)}."
            )
        # facts of the architecture: a given value must agree, then the config sets them
        h, w = self.image_hw
        fixed = self.fixed_input_size
        if "fixed_input_size" in given and given.pop("fixed_input_size") != fixed:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['fixed_input_size'] must be {fixed} for this model (mixer "
                f"{self.mixer!r}, pos_embed {self.pos_embed!r})."
            )
        for key, value in (("first_conv", "patch_embed.proj"), ("classifier", "head")):
            if given.get(key, value) != value:
                raise ValueError(f"AftVisionConfig.pretrained_cfg[{key!r}] must be {value!r}, got {given[key]!r}.")
        # timm-written configs repeat these top-level keys inside pretrained_cfg
        repeated = {key: given.pop(key) for key in sorted(_TOP_LEVEL_KEYS & given.keys())}
        cfg = self._default_pretrained_cfg()
        cfg.update({k: _to_lists(v) for k, v in given.items() if v is not None or k in ("pool_size",)})

        input_size = cfg["input_size"]
        if (
            not isinstance(input_size, list)
            or len(input_size) != 3
            or not all(_is_int(v) and v > 0 for v in input_size)
        ):
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['input_size'] must be [channels, height, width], got {input_size!r}."
            )
        if input_size[0] != self.in_chans:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['input_size'] has {input_size[0]} channels, in_chans is "
                f"{self.in_chans}."
            )
        if input_size[1] % self.patch_size or input_size[2] % self.patch_size:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['input_size'] {input_size} is not divisible by patch_size "
                f"{self.patch_size}."
            )
        if fixed and input_size[1:] != [h, w]:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['input_size'] {input_size} must match img_size {self.img_size!r}: "
                f"this model has parameters for a fixed token grid."
            )
        for key in ("mean", "std"):
            value = cfg[key]
            if not isinstance(value, list) or len(value) != self.in_chans or not all(_is_number(v) for v in value):
                raise ValueError(
                    f"AftVisionConfig.pretrained_cfg[{key!r}] must be a list of {self.in_chans} numbers, got "
                    f"{value!r}."
                )
        if any(v <= 0 for v in cfg["std"]):
            raise ValueError(f"AftVisionConfig.pretrained_cfg['std'] must be > 0, got {cfg['std']!r}.")
        if not _is_number(cfg["crop_pct"]) or cfg["crop_pct"] <= 0:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['crop_pct'] must be a number > 0, got {cfg['crop_pct']!r}."
            )
        if cfg["crop_mode"] not in _CROP_MODES:
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['crop_mode'] must be one of {_CROP_MODES}, got {cfg['crop_mode']!r}."
            )
        if not isinstance(cfg["interpolation"], str):
            raise ValueError(
                f"AftVisionConfig.pretrained_cfg['interpolation'] must be a string, got {cfg['interpolation']!r}."
            )
        cfg["fixed_input_size"] = fixed
        cfg["pool_size"] = [input_size[1] // self.patch_size, input_size[2] // self.patch_size]
        cfg["first_conv"] = "patch_embed.proj"
        cfg["classifier"] = "head"
        return cfg, repeated

    def _check_derived(self, derived: dict[str, Any], where: str) -> None:
        """The timm keys of a saved config.json must describe the same model as the fields."""
        expected = dict(self.timm_keys(), architecture=self.architecture)
        for key, value in derived.items():
            if key == "model_args":
                if not isinstance(value, dict):
                    raise ValueError(f"AftVisionConfig.model_args must be a dict, got {type(value).__name__}.")
                if "num_classes" in value:
                    raise ValueError(
                        "AftVisionConfig.model_args must not hold num_classes (it is the top-level num_classes, and "
                        "transformers' TimmWrapper would receive it twice)."
                    )
                for name, v in value.items():
                    if name not in expected["model_args"]:
                        raise ValueError(f"AftVisionConfig.model_args has an unknown argument {name!r}.")
                    if _normalise_size(v) != _normalise_size(expected["model_args"][name]):
                        raise ValueError(
                            f"AftVisionConfig.model_args[{name!r}] is {v!r} but the field {name} is "
                            f"{getattr(self, name)!r}; the two must agree (timm reads model_args, transformers the "
                            "field)."
                        )
                continue
            if key == "label_names" and value is not None:
                value = list(value.values()) if isinstance(value, dict) else list(value)
            if key == "image_processor_type" and value != IMAGE_PROCESSOR_TYPE:
                raise ValueError(
                    f"AftVisionConfig.image_processor_type must be {IMAGE_PROCESSOR_TYPE!r} (the preprocessing is "
                    f"timm's transform of pretrained_cfg), got {value!r}."
                )
            if value != expected[key]:
                name = f"AftVisionConfig.{key}" if where == "config" else f"AftVisionConfig.pretrained_cfg[{key!r}]"
                raise ValueError(
                    f"{name} is {value!r} but the config implies {expected[key]!r} (num_classes = num_labels, "
                    "label_names = id2label in order, num_features = embed_dim)."
                )

    # ---- derived values ----------------------------------------------------------------------------------------

    @property
    def image_hw(self) -> tuple[int, int] | None:
        """``img_size`` as (height, width), None when it is malformed."""
        size = self.img_size
        if _is_int(size):
            return size, size
        if isinstance(size, (list, tuple)) and len(size) == 2 and all(_is_int(v) for v in size):
            return int(size[0]), int(size[1])
        return None

    @property
    def fixed_input_size(self) -> bool:
        """Whether the model has parameters for one token grid (absolute position bias or embedding)."""
        return self.mixer in ("full", "local") or self.pos_embed == "learn"

    def model_kwargs(self, num_classes: int | None = None) -> dict[str, Any]:
        """The arguments of :class:`~aft_hub.vision.AftVisionTransformer` (``num_classes`` defaults to
        ``num_labels``)."""
        kwargs = {name: getattr(self, name) for name in MODEL_ARG_NAMES}
        kwargs["num_classes"] = self.num_labels if num_classes is None else num_classes
        return kwargs

    @property
    def timm_num_classes(self) -> int:
        """The classifier size timm builds from this config.json: ``num_labels``, or 0 for a folder the headless
        ``AftVisionModel`` saved (``architectures == ["AftVisionModel"]``), which has no head weights."""
        return 0 if self.architectures == ["AftVisionModel"] else (self.num_labels or 0)

    def timm_keys(self) -> dict[str, Any]:
        """The keys timm (and AutoImageProcessor) read from config.json, derived from the fields."""
        num_classes = self.timm_num_classes
        return {
            "num_classes": num_classes,
            "label_names": [self.id2label[i] for i in range(num_classes)],
            "num_features": self.embed_dim,
            "model_args": {name: _to_lists(getattr(self, name)) for name in MODEL_ARG_NAMES},
            "image_processor_type": IMAGE_PROCESSOR_TYPE,
        }

    def timm_pretrained_cfg(self, num_classes: int | None = None) -> dict[str, Any]:
        """The ``pretrained_cfg`` timm gives a model loaded from this config.json: the data configuration plus the
        architecture, ``num_classes`` (default ``num_labels``) and, when the classes are the labels, their names."""
        num_labels = self.num_labels or 0
        num_classes = num_labels if num_classes is None else num_classes
        cfg = dict(self.pretrained_cfg, architecture=self.architecture, num_classes=num_classes)
        if num_classes == num_labels and num_classes > 0:
            cfg["label_names"] = [self.id2label[i] for i in range(num_labels)]
        return cfg

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.update(self.timm_keys())
        return output

    # ---- construction from timm --------------------------------------------------------------------------------

    @classmethod
    def from_timm_model(cls, model: Any, **kwargs: Any) -> AftVisionConfig:
        """The config of a timm :class:`~aft_hub.vision.AftVisionTransformer`: its arguments, timm name and data
        configuration, and its labels.

        Labels come from ``pretrained_cfg['label_names']`` when it names each class, else ``LABEL_i``.

        Args:
            model: the timm model (``timm.create_model`` of an aft_hub name, or an AftVisionTransformer).
            kwargs: config fields that override the model's (``id2label``, ``architecture``, ...); a
                ``pretrained_cfg`` is merged over the model's.
        """
        from ..vision import AftVisionTransformer

        if not isinstance(model, AftVisionTransformer):
            raise TypeError(
                f"Expected an aft_hub AftVisionTransformer (a timm aft_* model), got {type(model).__name__}."
            )
        args: dict[str, Any] = model.config_kwargs
        num_classes = args.pop("num_classes")
        timm_cfg = {k: v for k, v in dict(getattr(model, "pretrained_cfg", None) or {}).items() if v is not None}
        label_names = timm_cfg.get("label_names")
        data_cfg = {k: _to_lists(timm_cfg[k]) for k in _TIMM_DATA_KEYS if k in timm_cfg}
        if len(data_cfg.get("mean", ())) != model.in_chans or len(data_cfg.get("std", ())) != model.in_chans:
            data_cfg.pop("mean", None)  # the registry's RGB statistics do not fit other channel counts
            data_cfg.pop("std", None)
        if "input_size" in data_cfg:
            size = data_cfg["input_size"][1:]
            if model.fixed_input_size or size[0] % model.patch_size or size[1] % model.patch_size:
                size = list(model.img_size)
            data_cfg["input_size"] = [model.in_chans, *size]
        data_cfg.update(kwargs.pop("pretrained_cfg", None) or {})
        args["pretrained_cfg"] = data_cfg
        if timm_cfg.get("architecture"):
            args["architecture"] = timm_cfg["architecture"]
        if "id2label" not in kwargs and "num_labels" not in kwargs:
            if label_names is not None and len(label_names) == num_classes:
                args["id2label"] = dict(enumerate(label_names))
            else:
                args["num_labels"] = num_classes
        args.update(kwargs)
        return cls(**args)

    @classmethod
    def from_timm_architecture(cls, name: str, **kwargs: Any) -> AftVisionConfig:
        """The config of a registered timm aft_hub model name (``"aft_conv_small"``, ``"test_aft_full"``, ...).

        Args:
            name: a timm name registered by :mod:`aft_hub.timm_models`.
            kwargs: model fields (``img_size``, ``drop_path_rate``, ...), which go to ``timm.create_model``, and
                other config fields (``id2label``, ``num_labels``, ``pretrained_cfg`` merged over timm's).
        """
        import timm
        import torch

        from .. import timm_models  # noqa: F401  (registers the names)

        if not timm.is_model(name) or timm.models.get_pretrained_cfg_value(name, "first_conv") != "patch_embed.proj":
            raise ValueError(f"{name!r} is not a registered aft_hub timm model name.")
        model_args = {k: kwargs.pop(k) for k in MODEL_ARG_NAMES if k in kwargs}
        with torch.device("meta"):  # the architecture only: no memory, no initialisation
            model = timm.create_model(name, pretrained=False, **model_args)
        return cls.from_timm_model(model, **kwargs)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _to_lists(value: Any) -> Any:
    """Tuples to lists, recursively (what a JSON round trip gives)."""
    if isinstance(value, (tuple, list)):
        return [_to_lists(v) for v in value]
    return value


def _normalise_size(value: Any) -> Any:
    """A square [s, s] size as s, other sequences as lists."""
    value = _to_lists(value)
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1] and _is_int(value[0]):
        return value[0]
    return value
