"""Reading and writing weights for the conversions: safetensors only, pickle on explicit request, shape checks."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "PICKLE_SUFFIXES",
    "load_state_dict",
    "save_state_dict",
    "check_state_dict",
    "unwrap_state_dict",
    "atomic_folder",
    "timm_config",
    "write_timm_folder",
]

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar", ".pkl", ".pickle")
_NESTED_KEYS = ("state_dict", "model", "model_ema", "module")


def unwrap_state_dict(obj: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint that nests its weights (``{'model': {...}}``, ``{'state_dict': {...}}``)."""
    for key in _NESTED_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            return dict(inner)
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"The checkpoint holds no tensors at its top level or under any of {list(_NESTED_KEYS)}.")
    return tensors


def load_state_dict(path: str | os.PathLike[str], *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Load a state dict from a ``.safetensors`` file (a folder: its ``model.safetensors``).

    Args:
        path: the weights file, or a folder holding ``model.safetensors``.
        allow_pickle: also accept pickle files (``.pth``, ``.bin``, ...). They are read with
            ``torch.load(weights_only=True)``, which refuses arbitrary objects, but pickle is still a code path an
            attacker controls, so this must be asked for explicitly.

    Raises:
        ValueError: for a pickle file without ``allow_pickle`` or an unknown file type.
        FileNotFoundError: when the file does not exist.
    """
    path = Path(path)
    if path.is_dir():
        candidate = path / "model.safetensors"
        if not candidate.is_file():
            raise FileNotFoundError(f"{path} has no model.safetensors (sharded or pickle folders are not read).")
        path = candidate
    if not path.is_file():
        raise FileNotFoundError(f"No weights file at {path}.")
    name = path.name.lower()
    if name.endswith(".safetensors"):
        return load_file(str(path), device="cpu")
    if name.endswith(PICKLE_SUFFIXES):
        if not allow_pickle:
            raise ValueError(
                f"{path} is a pickle file; loading it can execute code. Convert it to safetensors, or pass "
                f"allow_pickle=True (CLI: --allow-pickle) to read it with torch.load(weights_only=True)."
            )
        logger.warning("Reading pickle file %s with torch.load(weights_only=True).", path)
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
        if not isinstance(obj, Mapping):
            raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict.")
        return unwrap_state_dict(obj)
    raise ValueError(f"Unknown weights file type {path.name!r}: expected .safetensors (or pickle, allow_pickle).")


def save_state_dict(
    state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``state_dict`` as safetensors (tensors made contiguous; storage shared between keys is copied)."""
    path = Path(path)
    if not path.name.endswith(".safetensors"):
        raise ValueError(f"Conversions write safetensors only; {path.name!r} does not end in .safetensors.")
    seen: set[tuple[int, int]] = set()
    tensors = {}
    for key, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        ident = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        tensor = tensor.contiguous() if ident not in seen else tensor.clone().contiguous()
        seen.add(ident)
        tensors[key] = tensor
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=dict(metadata or {}, format="pt"))
    os.replace(tmp, path)
    return path


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, what: str = "checkpoint") -> None:
    """Raise a ValueError naming every missing, unexpected and mis-shaped key of ``state_dict`` for ``model``."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{k}: {what} {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(state_dict))
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if mismatched:
        problems.append("shape mismatch for " + "; ".join(mismatched))
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if problems:
        raise ValueError(f"The {what} does not fit the model: " + ". ".join(problems) + ".")


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


@contextlib.contextmanager
def atomic_folder(folder: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary sibling of ``folder``; on success it replaces ``folder``, on error it is removed.

    So a folder is either written completely or not at all, and an existing one is replaced only with
    ``overwrite`` (and only once the new one is complete).
    """
    if folder.exists() and not _is_empty_dir(folder) and not overwrite:
        raise FileExistsError(f"{folder} exists and is not empty; pass overwrite=True (CLI: --overwrite) to replace.")
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} exists and is not a directory.")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        yield tmp
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def timm_config(model: nn.Module) -> dict[str, Any]:
    """timm's own ``config.json`` for ``model`` (architecture, num_classes, model_args, pretrained_cfg, ...)."""
    from timm.models._hub import save_config_for_hf

    with tempfile.TemporaryDirectory() as tmp:
        save_config_for_hf(model, str(Path(tmp, "config.json")))
        config = json.loads(Path(tmp, "config.json").read_text(encoding="utf-8"))
    # timm 1.0.31 records num_classes in model_args too; transformers' TimmWrapper then passes it twice
    model_args = config.get("model_args")
    if isinstance(model_args, dict):
        model_args.pop("num_classes", None)
        if not model_args:
            config.pop("model_args")
    return config


def write_timm_folder(model: nn.Module, folder: Path) -> None:
    """timm's own layout in ``folder``: ``model.safetensors`` with timm keys and timm's ``config.json``."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(timm_config(model), indent=2) + "\n", encoding="utf-8")
