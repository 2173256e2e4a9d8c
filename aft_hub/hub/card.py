"""Model cards: metadata (``ModelCardData``) plus a Jinja template from ``model_cards/``, rendered by
huggingface_hub's :class:`~huggingface_hub.ModelCard`.

What a card states comes from two places only: the model itself (architecture, parameter count, input size,
classes) and :class:`CardInfo`, which the user fills with what they know (training data and command, measured
evaluation results, the checkpoint it was initialised from). Whatever is missing is reported as "not recorded",
never guessed.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import EvalResult, ModelCard, ModelCardData

logger = logging.getLogger(__name__)

__all__ = [
    "ARXIV_ID",
    "CardInfo",
    "render_card",
    "template_path",
    "validate_card",
    "CARD_KINDS",
]

ARXIV_ID = "2105.14103"
CARD_KINDS = ("vision", "lm")
_PIPELINE_TAGS = {"vision": "image-classification", "lm": "text-generation"}
_LIBRARIES = {"vision": "timm", "lm": "transformers"}
_TEMPLATE_FILES = {"vision": "vision.md", "lm": "lm.md"}

_DEFAULT_LIMITATIONS = {
    "vision": [
        "An image classifier for the classes listed in `config.json` only; it was not evaluated for any other use.",
        "Accuracy on data unlike the training data is unknown; evaluate on your own data before relying on it.",
        "No official code or weights of the AFT paper exist; this is an independent implementation, and its "
        "figures are not the paper's.",
    ],
    "lm": [
        "A byte-level language model: it continues text statistically and states no facts reliably; do not use its "
        "output as true without checking.",
        "Outputs may reproduce biases and content of its training text.",
        "No official code or weights of the AFT paper exist; this is an independent implementation, and its "
        "figures are not the paper's.",
    ],
}


@dataclasses.dataclass
class CardInfo:
    """What a model card says beyond what the model itself tells. Every field is optional; nothing is invented.

    Args:
        title: the card's heading (default: the repo name).
        description: one paragraph on what the model is.
        license: an SPDX-like Hub license id.
        datasets: Hub dataset ids the model was trained on (card metadata).
        training_data: a sentence on the training data (shown in the card).
        training_command: the command line that trained the model.
        base_model: Hub id of the checkpoint the weights were initialised from (conversions).
        conversion: a short Markdown summary of a conversion (what was copied, initialised, dropped).
        eval_results: *measured* results, as :class:`huggingface_hub.EvalResult` or dicts of its fields
            (``dataset_type``, ``dataset_name``, ``metric_type``, ``metric_value``, optional ``dataset_split``,
            ``task_type`` ...).
        tags: extra tags (``"aft"`` and the paper are always added).
        limitations: extra limitations, after the defaults of the card kind.
        language: language code(s) of a language model's training text.
    """

    title: str | None = None
    description: str | None = None
    license: str = "apache-2.0"
    datasets: list[str] = dataclasses.field(default_factory=list)
    training_data: str | None = None
    training_command: str | None = None
    base_model: str | None = None
    conversion: str | None = None
    eval_results: list[EvalResult] = dataclasses.field(default_factory=list)
    tags: list[str] = dataclasses.field(default_factory=list)
    limitations: list[str] = dataclasses.field(default_factory=list)
    language: str | list[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.datasets, str):
            self.datasets = [self.datasets]
        if isinstance(self.tags, str):
            self.tags = [self.tags]
        self.eval_results = [_as_eval_result(result) for result in self.eval_results]
        for name in ("title", "description", "license", "training_data", "training_command", "base_model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"CardInfo.{name} must be a string, got {type(value).__name__}.")
        if not self.license:
            raise ValueError("CardInfo.license must name a license (e.g. 'apache-2.0').")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CardInfo:
        """Build from a mapping (e.g. a JSON file), rejecting unknown keys."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"Unknown card field(s) {unknown}; the fields are {sorted(fields)}.")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> CardInfo:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


def _as_eval_result(result: EvalResult | Mapping[str, Any]) -> EvalResult:
    if isinstance(result, EvalResult):
        value = result.metric_value
    elif isinstance(result, Mapping):
        missing = [k for k in ("dataset_type", "dataset_name", "metric_type", "metric_value") if k not in result]
        if missing:
            raise ValueError(f"An evaluation result needs {missing}; got {sorted(result)}.")
        value = result["metric_value"]
        result = EvalResult(**{"task_type": "", **dict(result)})
    else:
        raise TypeError(f"eval_results entries must be EvalResult or dict, got {type(result).__name__}.")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"metric_value must be a finite number that was measured, got {value!r}.")
    return result


def template_path(kind: str) -> Path:
    """The Jinja template of a card kind: installed with the package, else ``model_cards/`` of the source tree."""
    if kind not in CARD_KINDS:
        raise ValueError(f"Unknown card kind {kind!r}; expected one of {CARD_KINDS}.")
    name = _TEMPLATE_FILES[kind]
    installed = importlib.resources.files("aft_hub.hub") / "model_cards" / name
    if installed.is_file():
        return Path(str(installed))
    source = Path(__file__).resolve().parents[2] / "model_cards" / name
    if source.is_file():
        return source
    raise FileNotFoundError(f"Model card template {name} not found (looked in {installed} and {source}).")


def render_card(
    kind: Literal["vision", "lm"],
    info: CardInfo,
    *,
    repo_id: str,
    num_params: int,
    details: Sequence[tuple[str, str]],
    input_size: Sequence[int] | None = None,
    remote_code: bool = False,
    extra_tags: Sequence[str] = (),
    template: str | Path | None = None,
) -> ModelCard:
    """Render a model card.

    Args:
        kind: ``"vision"`` (image classification; library timm) or ``"lm"`` (text generation; library
            transformers).
        info: what the user knows about the model.
        repo_id: ``ORG/NAME`` used in the usage snippets.
        num_params: parameter count of the model.
        details: (label, value) rows of the "Model details" table, taken from the model's configuration.
        input_size: (C, H, W) of a vision model.
        remote_code: whether the repo carries code for ``trust_remote_code=True``.
        extra_tags: tags from the model (e.g. the variant).
        template: a template file to use instead of the packaged one.
    """
    from .. import __version__

    if kind not in CARD_KINDS:
        raise ValueError(f"Unknown card kind {kind!r}; expected one of {CARD_KINDS}.")
    if kind == "vision" and (input_size is None or len(input_size) != 3):
        raise ValueError(f"A vision card needs input_size (C, H, W), got {input_size!r}.")
    tags = _unique(
        ["aft", "attention-free-transformer", f"arxiv:{ARXIV_ID}", _PIPELINE_TAGS[kind], "timm", "transformers"]
        + (["custom_code"] if remote_code else [])
        + ["safetensors", *extra_tags, *info.tags]
    )
    if kind == "lm":
        tags.remove("timm")
    model_name = repo_id.split("/")[-1]
    card_data = ModelCardData(
        library_name=_LIBRARIES[kind],
        license=info.license,
        tags=tags,
        pipeline_tag=_PIPELINE_TAGS[kind],
        datasets=list(info.datasets) or None,
        base_model=info.base_model,
        language=info.language,
        eval_results=[_with_task(r, kind) for r in info.eval_results] or None,
        model_name=model_name if info.eval_results else None,
    )
    eval_rows = [
        {
            "dataset": r.dataset_name,
            "split": r.dataset_split or "not recorded",
            "metric": r.metric_name or r.metric_type,
            "value": r.metric_value,
        }
        for r in info.eval_results
    ]
    path = Path(template) if template is not None else template_path(kind)
    card = ModelCard.from_template(
        card_data,
        template_path=str(path),
        title=info.title or model_name,
        description=info.description or "",
        repo_id=repo_id,
        num_params=int(num_params),
        details=list(details),
        input_size=list(input_size) if input_size is not None else None,
        remote_code=remote_code,
        package_version=__version__,
        training_data=info.training_data,
        training_command=info.training_command,
        conversion=info.conversion,
        eval_rows=eval_rows,
        limitations=_DEFAULT_LIMITATIONS[kind] + list(info.limitations),
    )
    validate_card(str(card), kind=kind)
    return card


def _with_task(result: EvalResult, kind: str) -> EvalResult:
    if not result.task_type:
        result = dataclasses.replace(result, task_type=_PIPELINE_TAGS[kind])
    return result


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


def validate_card(text: str, *, kind: Literal["vision", "lm"] | None = None) -> dict[str, Any]:
    """Check a rendered card's metadata offline; returns the metadata. Raises ValueError naming what is wrong.

    The YAML must parse to a mapping with ``library_name``, ``license``, ``pipeline_tag`` (strings), ``tags`` (a
    list of strings with ``"aft"`` and ``arxiv:2105.14103``); ``datasets`` and ``base_model`` when present must be
    strings or lists of strings; a ``model-index`` must hold numeric results.
    """
    card = ModelCard(text)  # parses the YAML front matter; raises ValueError when it is malformed
    data = card.data.to_dict()
    problems = []
    for key in ("library_name", "license", "pipeline_tag"):
        if not isinstance(data.get(key), str) or not data[key]:
            problems.append(f"{key} must be a non-empty string")
    tags = data.get("tags")
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        problems.append("tags must be a list of strings")
    else:
        for required in ("aft", f"arxiv:{ARXIV_ID}"):
            if required not in tags:
                problems.append(f"tags must include {required!r}")
    for key in ("datasets", "base_model", "language"):
        value = data.get(key)
        if value is not None and not (
            isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        ):
            problems.append(f"{key} must be a string or a list of strings")
    if kind is not None and data.get("pipeline_tag") != _PIPELINE_TAGS[kind]:
        problems.append(f"pipeline_tag must be {_PIPELINE_TAGS[kind]!r} for a {kind} model")
    for entry in data.get("model-index", []) or []:
        for result in entry.get("results", []):
            for metric in result.get("metrics", []):
                value = metric.get("value")
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    problems.append(f"metric {metric.get('type')!r} has a non-numeric value {value!r}")
    if f"arxiv.org/abs/{ARXIV_ID}" not in card.text:
        problems.append(f"the card text must cite arXiv:{ARXIV_ID}")
    if problems:
        raise ValueError("Invalid model card metadata: " + "; ".join(problems) + ".")
    return data
