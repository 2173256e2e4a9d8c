"""Training checkpoints in one safetensors file, written atomically (temporary file, then ``os.replace``).

Layout of ``checkpoint.safetensors``:

- ``model/<name>``: the model's state dict; tied aliases (e.g. an LM head sharing the embedding) are stored once
  and listed in the metadata.
- ``optim/<param index>/<key>``: every tensor of the optimiser state; non-tensor state values, the parameter
  groups and the scheduler state go to the metadata as JSON.
- ``rng/<rank>/{python,numpy,torch,cuda<i>}``: the random-number generator states of every process.
- metadata ``aft_hub.checkpoint``: JSON with the format version, ``step``, the run configuration and any extra
  training state (loss history, tokens seen, ...).

No pickle anywhere: a checkpoint can be inspected and loaded without executing code.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .distributed import DistInfo

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_NAME",
    "FORMAT",
    "capture_rng_state",
    "restore_rng_state",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_metadata",
    "flatten_optimizer_state",
    "unflatten_optimizer_state",
]

CHECKPOINT_NAME = "checkpoint.safetensors"
FORMAT = "aft_hub.train.checkpoint/1"
_META_KEY = "aft_hub.checkpoint"


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


# ---------------------------------------------------------------------------------------------------------------
# random-number generators


def capture_rng_state() -> dict[str, torch.Tensor]:
    """This process's python, numpy, torch (and CUDA) generator states as tensors."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": torch.tensor([version, *mt], dtype=torch.int64),
        "python_gauss": torch.tensor([float("nan") if gauss is None else gauss], dtype=torch.float64),
        "numpy": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_extra": torch.tensor([np_pos, np_has_gauss, np_gauss], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }
    assert np_name == "MT19937"
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda{i}"] = s
    return state


def restore_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    py = state["python"].tolist()
    gauss = state["python_gauss"].item()
    random.setstate((py[0], tuple(py[1:]), None if np.isnan(gauss) else gauss))
    pos, has_gauss, np_gauss = state["numpy_extra"].tolist()
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), int(pos), int(has_gauss), np_gauss))
    torch.set_rng_state(state["torch"].to(torch.uint8))
    cuda = [state[f"cuda{i}"] for i in range(sum(k.startswith("cuda") for k in state))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.to(torch.uint8) for s in cuda])


# ---------------------------------------------------------------------------------------------------------------
# optimiser state <-> flat tensors + JSON


def flatten_optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``optim/<param index>/<key>`` for per-parameter state,
    ``optim/group<i>/<key>`` for tensors held by a parameter group, e.g. timm's LAMB step) and a JSON-serialisable
    rest."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in sd["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{idx}/{key}"] = value.detach().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = []
    for gi, group in enumerate(sd["param_groups"]):
        out = {}
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/group{gi}/{key}"] = value.detach().contiguous()
                out[key] = {"__tensor__": f"optim/group{gi}/{key}"}
            else:
                out[key] = list(value) if isinstance(value, tuple) else value
        groups.append(out)
    try:
        json.dumps(groups)
        json.dumps(scalars)
    except TypeError as err:
        raise ValueError(
            f"Optimizer {type(optimizer).__name__} holds state that is not JSON serialisable: {err}"
        ) from err
    return tensors, {"param_groups": groups, "scalars": scalars}


def unflatten_optimizer_state(tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_optimizer_state`: a dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split("/", 2)
        if not idx.startswith("group"):
            state.setdefault(int(idx), {})[key] = value
    for idx, values in rest["scalars"].items():
        state.setdefault(int(idx), {}).update(values)

    def restore(key: str, value: Any) -> Any:
        if isinstance(value, dict) and "__tensor__" in value:
            return tensors[value["__tensor__"]]
        return tuple(value) if key == "betas" else value

    groups = [{k: restore(k, v) for k, v in g.items()} for g in rest["param_groups"]]
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------------------------------------------------
# model state without aliases


def _model_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...], int], str] = {}
    for name, t in _unwrap(model).state_dict().items():
        key = (t.untyped_storage().data_ptr(), tuple(t.shape), tuple(t.stride()), t.storage_offset())
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[f"model/{name}"] = t.detach().contiguous()
    return tensors, aliases


# ---------------------------------------------------------------------------------------------------------------
# save / load


def _gather_rng(info: DistInfo | None) -> dict[str, torch.Tensor]:
    local = capture_rng_state()
    if info is None or not info.distributed:
        return {f"rng/0/{k}": v for k, v in local.items()}
    gathered: list[dict[str, torch.Tensor] | None] = [None] * info.world_size
    dist.all_gather_object(gathered, {k: v.cpu() for k, v in local.items()})
    return {f"rng/{r}/{k}": v for r, states in enumerate(gathered) for k, v in states.items()}


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Any | None,
    step: int,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    info: DistInfo | None = None,
) -> Path | None:
    """Write a checkpoint atomically. Under DDP every rank must call this (their RNG states are gathered);
    only rank 0 writes.

    Args:
        path: the checkpoint file (a directory means ``<dir>/checkpoint.safetensors``).
        model: the model (a DDP wrapper is unwrapped).
        optimizer: its optimiser.
        schedule: an object with ``state_dict()`` returning JSON-serialisable data, or None.
        step: number of completed optimiser updates.
        config: the run configuration (JSON-serialisable), checked on resume.
        extra: further JSON-serialisable training state.
        info: the process group description; None when not distributed.

    Returns:
        The written path on rank 0, None on other ranks.
    """
    rng = _gather_rng(info)
    if info is not None and not info.is_main:
        return None
    path = Path(path)
    if path.suffix != ".safetensors":
        path = path / CHECKPOINT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    model_t, aliases = _model_tensors(model)
    optim_t, optim_rest = flatten_optimizer_state(optimizer)
    tensors = {**model_t, **optim_t, **{k: v.cpu() for k, v in rng.items()}}
    meta = {
        "format": FORMAT,
        "step": int(step),
        "world_size": info.world_size if info is not None else 1,
        "aliases": aliases,
        "optimizer": optim_rest,
        "optimizer_class": type(optimizer).__name__,
        "schedule": schedule.state_dict() if schedule is not None else None,
        "config": config or {},
        "extra": extra or {},
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp), metadata={_META_KEY: json.dumps(meta)})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    logger.info("saved checkpoint at step %d to %s", step, path)
    return path


def read_checkpoint_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata of a checkpoint (step, config, extra, ...) without loading tensors."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise ValueError(f"No checkpoint at {path}.")
    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(_META_KEY)
    if raw is None:
        raise ValueError(f"{path} is a safetensors file but not an aft_hub training checkpoint.")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} has checkpoint format {meta.get('format')!r}; this version reads {FORMAT!r}.")
    return meta


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    schedule: Any | None = None,
    info: DistInfo | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model``/``optimizer``/``schedule`` and restore
    this rank's RNG states. Every rank reads the file.

    Returns:
        The checkpoint metadata (``step``, ``config``, ``extra``, ...) with ``rng_restored``: False when the
        checkpoint was written by a different number of processes (the caller then seeds afresh).
    """
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    meta = read_checkpoint_metadata(path)
    groups: dict[str, dict[str, torch.Tensor]] = {"model": {}, "optim": {}, "rng": {}}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            groups[name.split("/", 1)[0]][name] = f.get_tensor(name)
    target = _unwrap(model)
    state = {name[len("model/") :]: t for name, t in groups["model"].items()}
    for alias, source in meta["aliases"].items():
        state[alias] = state[source]
    missing, unexpected = target.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"Checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}.")
    if optimizer is not None:
        if meta["optimizer_class"] != type(optimizer).__name__:
            raise ValueError(
                f"Checkpoint {path} holds {meta['optimizer_class']} state, but this run uses "
                f"{type(optimizer).__name__}."
            )
        optimizer.load_state_dict(unflatten_optimizer_state(groups["optim"], meta["optimizer"]))
    if schedule is not None and meta["schedule"] is not None:
        schedule.load_state_dict(meta["schedule"])
    meta["rng_restored"] = False
    if restore_rng:
        rank = info.rank if info is not None else 0
        world = info.world_size if info is not None else 1
        if world != meta["world_size"]:
            logger.warning(
                "checkpoint was written by %d processes, this run has %d: the RNG streams (dropout, mixup) are "
                "seeded afresh, so the run continues but does not reproduce an uninterrupted run exactly",
                meta["world_size"],
                world,
            )
        else:
            prefix = f"rng/{rank}/"
            restore_rng_state({k[len(prefix) :]: v for k, v in groups["rng"].items() if k.startswith(prefix)})
            meta["rng_restored"] = True
    logger.info("resumed from %s at step %d", path, meta["step"])
    return meta
