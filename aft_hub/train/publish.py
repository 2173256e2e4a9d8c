"""The publish-ready folder a training run ends with.

Hook: the folder itself (weights, ``config.json``, tokenizer, remote code, model card) is written by
:func:`aft_hub.hub.publish.save_for_hub` with a :class:`aft_hub.hub.card.CardInfo` that carries the training data,
the command and the measured results; this module then adds ``metrics.json`` and ``loss_curve.png``. Models that
``save_for_hub`` does not publish (the GPT-2 baseline of ``train_lm --arch gpt2``) get ``save_pretrained`` / timm's
``save_for_hf`` and a short card written here.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from torch import nn

from .loop import History

logger = logging.getLogger(__name__)

__all__ = ["plot_loss_curve", "write_metrics", "publish_folder", "card_info", "command_line", "eval_result"]


def plot_loss_curve(history: History, path: str | os.PathLike, *, title: str, bits: bool = False) -> Path | None:
    """Training loss per update (and evaluation losses where recorded) as a PNG.

    Args:
        history: the run's history.
        path: the PNG to write.
        title: the plot title.
        bits: plot losses in bits (nats / ln 2), i.e. bits per byte for byte-level language models.

    Returns:
        The path, or None when matplotlib is not installed (a warning is logged).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no loss curve is drawn (pip install matplotlib)")
        return None
    scale = 1 / math.log(2) if bits else 1.0
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.plot([r["step"] + 1 for r in history.train], [r["loss"] * scale for r in history.train], lw=0.8, alpha=0.7,
            label="train")
    for key, label in (("val_loss", "validation"), ("test_loss", "test")):
        pts = [(r["step"], r[key] * scale) for r in history.evals if key in r]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, lw=1.2, label=label)
    ax.set_xlabel("update")
    ax.set_ylabel("bits per byte" if bits else "loss (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_metrics(folder: str | os.PathLike, metrics: dict[str, Any]) -> Path:
    """Write ``metrics.json`` (sorted keys, indented)."""
    path = Path(folder) / "metrics.json"
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return path


def command_line(parser, args, prog: str) -> str:
    """The command that reproduces ``args``: ``prog`` and every option whose value differs from its default."""
    parts = [prog]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "resume", "stop_after"):
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:  # store_true / store_false
            parts.append(flag)
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


def card_info(**fields: Any):
    """A :class:`aft_hub.hub.card.CardInfo` from keyword fields (None values dropped), or the dict itself when
    :mod:`aft_hub.hub` is not available."""
    fields = {k: v for k, v in fields.items() if v is not None}
    try:
        from aft_hub.hub.card import CardInfo
    except ImportError:
        return fields
    return CardInfo(**fields)


def _fallback_card(folder: Path, kind: str, card: Any, metrics: dict[str, Any]) -> None:
    get = card.get if isinstance(card, dict) else lambda k, d=None: getattr(card, k, d)
    lines = [
        "---",
        f"library_name: {'transformers' if kind == 'lm' else 'timm'}",
        "license: apache-2.0",
        f"pipeline_tag: {'text-generation' if kind == 'lm' else 'image-classification'}",
        "tags:",
        "- aft",
        "- arxiv:2105.14103",
        "---",
        "",
        f"# {get('title') or folder.name}",
        "",
        "Trained with the `aft_hub` package (An Attention Free Transformer, "
        "[arXiv:2105.14103](https://arxiv.org/abs/2105.14103)) as a baseline.",
        "",
        f"- **Data:** {get('training_data') or 'not recorded'}",
        f"- **Command:** `{get('training_command') or 'not recorded'}`",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items()) if isinstance(v, float)]
    (folder / "README.md").write_text("\n".join(lines) + "\n")


def publish_folder(
    model: nn.Module,
    folder: str | os.PathLike,
    *,
    kind: str,
    card: Any,
    metrics: dict[str, Any],
    history: History,
    title: str,
    tokenizer: Any = None,
    repo_id: str | None = None,
) -> Path:
    """Write the publish-ready folder: :func:`aft_hub.hub.publish.save_for_hub` (or the fallback), then
    ``metrics.json`` and ``loss_curve.png``.

    Args:
        model: the trained model (unwrapped, float32).
        folder: the folder (replaced if it exists).
        kind: ``"lm"`` or ``"vision"``.
        card: from :func:`card_info`.
        metrics: written to ``metrics.json``.
        history: for the loss curve.
        title: loss-curve title.
        tokenizer: a language model's tokenizer.
        repo_id: repo id for the card's usage snippets.
    """
    folder = Path(folder)
    written = False
    try:
        from aft_hub.hub.publish import save_for_hub
    except ImportError:
        save_for_hub = None
    if save_for_hub is not None and not isinstance(card, dict):
        try:
            save_for_hub(model, folder, repo_id=repo_id, card=card, tokenizer=tokenizer, overwrite=True)
            written = True
        except TypeError as err:  # a model aft_hub does not publish, e.g. the GPT-2 baseline
            logger.info("save_for_hub does not take this model (%s): plain export", err)
        except ImportError as err:  # a part of aft_hub.hub / aft_hub.convert missing from this installation
            logger.warning("save_for_hub is not usable here (%s): plain export with a short card", err)
    if not written:
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "lm":
            model.save_pretrained(folder)
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
        else:
            _timm_export(model, folder)
        _fallback_card(folder, kind, card, {k: v for k, v in metrics.items() if k.endswith(("bpc", "top1"))})
    plot_loss_curve(history, folder / "loss_curve.png", title=title, bits=kind == "lm")
    write_metrics(folder, metrics)
    logger.info("publish-ready folder: %s", folder)
    return folder


def _timm_export(model: nn.Module, folder: Path) -> None:
    from timm.models import save_for_hf

    labels = getattr(model, "pretrained_cfg", {}).get("label_names")
    save_for_hf(model, str(folder), safe_serialization=True, model_config={"label_names": labels} if labels else None)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.get("model_args", {}).pop("num_classes", None)  # transformers' TimmWrapper passes num_classes itself
    cfg_path.write_text(json.dumps(cfg, indent=2))


def eval_result(dataset_type: str, dataset_name: str, split: str, metric: str, value: float,
                metric_name: str | None = None) -> dict[str, Any]:
    """One measured result for the card (``huggingface_hub.EvalResult`` fields)."""
    out = {"dataset_type": dataset_type, "dataset_name": dataset_name, "dataset_split": split, "metric_type": metric,
           "metric_value": round(float(value), 4)}
    if metric_name:
        out["metric_name"] = metric_name
    return out


