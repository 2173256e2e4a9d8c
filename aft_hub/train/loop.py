"""The training loop shared by the LM and the image scripts: gradient accumulation, DDP, bf16 autocast, gradient
clipping, periodic evaluation and checkpoints, a progress bar, and exact resume."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .distributed import DistInfo, all_reduce_sum
from .schedule import Schedule

logger = logging.getLogger(__name__)

__all__ = [
    "History",
    "LoopConfig",
    "TrainLoop",
    "at_least_f32",
    "autocast",
    "config_mismatch",
    "seed_everything",
    "unwrap",
]


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global generator and torch's (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def at_least_f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or unchanged when it is float64 (losses of float64 runs stay float64)."""
    return x if x.dtype == torch.float64 else x.float()


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on the device when ``enabled``, else a null context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def config_mismatch(saved: dict[str, Any], current: dict[str, Any], ignore: Iterable[str]) -> dict[str, tuple]:
    """Keys whose values differ between a checkpoint's configuration and this run's (``ignore`` left out)."""
    skip = set(ignore)
    keys = (set(saved) | set(current)) - skip
    return {k: (saved.get(k), current.get(k)) for k in sorted(keys) if saved.get(k) != current.get(k)}


@dataclass
class History:
    """Per-update training losses and evaluation results (JSON-serialisable)."""

    train: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    units: float = 0.0  # tokens or images consumed so far
    train_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"train": self.train, "evals": self.evals, "units": self.units, "train_seconds": self.train_seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        return cls(list(d["train"]), list(d["evals"]), float(d["units"]), float(d["train_seconds"]))


@dataclass
class LoopConfig:
    """Settings of :class:`TrainLoop`.

    Attributes:
        total_steps: optimiser updates of the whole run.
        accum: micro-batches per update (per process).
        grad_clip: clip the global gradient norm to this (0 disables).
        bf16: run forward passes under bf16 autocast.
        eval_interval: evaluate every this many updates (0: only at the end).
        ckpt_interval: checkpoint every this many updates (0: only at the end).
        stop_after: end this invocation after this many updates (a checkpoint is written), None for no limit.
        out_dir: where ``checkpoint.safetensors`` goes.
        unit: what the throughput counts (``"tok"`` or ``"img"``).
        progress: show a tqdm bar on rank 0.
    """

    total_steps: int
    accum: int = 1
    grad_clip: float = 1.0
    bf16: bool = False
    eval_interval: int = 0
    ckpt_interval: int = 0
    stop_after: int | None = None
    out_dir: Path = Path("out")
    unit: str = "tok"
    progress: bool = True


class TrainLoop:
    """Runs updates ``start_step .. total_steps - 1``.

    Args:
        model: the model, already on its device and wrapped in DDP when distributed.
        optimizer: its optimiser.
        schedule: sets the learning rate per update.
        info: process placement.
        cfg: loop settings.
        run_config: the run's JSON configuration (stored in checkpoints, compared on resume).
        micro_batches: ``step -> iterable`` of this rank's ``accum`` micro-batches for that update.
        loss_fn: ``(model, batch) -> (mean loss, units in the batch)``.
        evaluate: ``() -> dict`` of evaluation metrics (called on every rank; must reduce over ranks itself).
        postfix: ``(mean train loss, last eval) -> dict`` for the progress bar.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        info: DistInfo,
        cfg: LoopConfig,
        run_config: dict[str, Any],
        micro_batches: Callable[[int], Iterable[Any]],
        loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]],
        evaluate: Callable[[], dict[str, float]] | None = None,
        postfix: Callable[[float, dict[str, float]], dict[str, Any]] | None = None,
    ) -> None:
        if cfg.total_steps < 1:
            raise ValueError(f"Training needs at least one update, got total_steps={cfg.total_steps}.")
        if cfg.accum < 1:
            raise ValueError(f"Gradient accumulation must be >= 1, got {cfg.accum}.")
        self.model, self.optimizer, self.schedule, self.info, self.cfg = model, optimizer, schedule, info, cfg
        self.run_config = run_config
        self.micro_batches, self.loss_fn, self.evaluate = micro_batches, loss_fn, evaluate
        self.postfix = postfix or (lambda loss, ev: {"loss": f"{loss:.4f}"})
        self.history = History()
        self.step = 0

    # -- checkpoints -------------------------------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.cfg.out_dir) / CHECKPOINT_NAME

    def save(self) -> None:
        save_checkpoint(
            self.checkpoint_path,
            model=self.model,
            optimizer=self.optimizer,
            schedule=self.schedule,
            step=self.step,
            config=self.run_config,
            extra={"history": self.history.to_dict()},
            info=self.info,
        )

    def resume(self, path: str | Path, ignore: Iterable[str] = ()) -> None:
        """Restore model, optimiser, schedule, step, history and RNG states from a checkpoint.

        Raises:
            ValueError: when the checkpoint's configuration differs from this run's outside ``ignore``.
        """
        from .checkpoint import read_checkpoint_metadata

        saved = read_checkpoint_metadata(path)["config"]
        diff = config_mismatch(saved, self.run_config, ignore)
        if diff:
            lines = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"Cannot resume from {path}: the run configuration differs ({lines}).")
        meta = load_checkpoint(path, model=self.model, optimizer=self.optimizer, schedule=self.schedule,
                               info=self.info)
        if not meta["rng_restored"]:
            seed_everything(int(self.run_config.get("seed", 0)) * 7919 + self.info.rank + meta["step"])
        self.step = int(meta["step"])
        self.history = History.from_dict(meta["extra"]["history"])

    # -- evaluation --------------------------------------------------------------------------------------------

    def run_eval(self) -> dict[str, float]:
        if self.evaluate is None:
            return {}
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), autocast(self.info.device, self.cfg.bf16):
            result = self.evaluate()
        self.model.train(was_training)
        record = {"step": self.step, **result}
        self.history.evals.append(record)
        logger.info("step %d eval %s", self.step, {k: round(v, 4) for k, v in result.items()})
        return result

    # -- training ----------------------------------------------------------------------------------------------

    def train_step(self, step: int) -> tuple[float, int]:
        """One optimiser update; returns the loss averaged over micro-batches and ranks, and the global units."""
        self.schedule.set_step(step)
        self.model.train()
        loss_sum, units = 0.0, 0
        batches = list(self.micro_batches(step))
        if len(batches) != self.cfg.accum:
            raise RuntimeError(f"expected {self.cfg.accum} micro-batches for step {step}, got {len(batches)}")
        for m, batch in enumerate(batches):
            last = m == len(batches) - 1
            sync = contextlib.nullcontext() if last or not self.info.distributed else self.model.no_sync()
            with sync:
                with autocast(self.info.device, self.cfg.bf16):
                    loss, n = self.loss_fn(self.model, batch)
                (loss / self.cfg.accum).backward()
            loss_sum += loss.detach().item()
            units += n
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, units = all_reduce_sum([loss_sum, float(units)], self.info)
        return loss_sum / (self.cfg.accum * self.info.world_size), int(units)

    def fit(self) -> History:
        """Train from ``self.step`` to ``total_steps`` (or ``stop_after`` updates), evaluating and checkpointing."""
        cfg = self.cfg
        end = cfg.total_steps if cfg.stop_after is None else min(cfg.total_steps, self.step + cfg.stop_after)
        bar = None
        if cfg.progress and self.info.is_main and self.step < end:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.total_steps, initial=self.step, unit="step", dynamic_ncols=True)
        last_eval = self.history.evals[-1] if self.history.evals else {}
        window_units, window_time = 0, 0.0
        try:
            while self.step < end:
                t0 = time.perf_counter()
                loss, units = self.train_step(self.step)
                dt = time.perf_counter() - t0
                if not math.isfinite(loss):
                    raise FloatingPointError(f"training loss became {loss} at step {self.step}; lower the lr")
                self.history.train.append({"step": self.step, "loss": loss, "lr": self.schedule.lr})
                self.history.units += units
                self.history.train_seconds += dt
                window_units, window_time = window_units + units, window_time + dt
                self.step += 1
                if cfg.eval_interval and self.step % cfg.eval_interval == 0 and self.step < cfg.total_steps:
                    last_eval = self.run_eval()
                if bar is not None:
                    rate = window_units / max(window_time, 1e-9)
                    bar.set_postfix({**self.postfix(loss, last_eval), f"{cfg.unit}/s": f"{rate:,.0f}"}, refresh=False)
                    bar.update(1)
                    if window_time > 5.0:
                        window_units, window_time = 0, 0.0
                if cfg.ckpt_interval and self.step % cfg.ckpt_interval == 0 and self.step < end:
                    self.save()
        finally:
            if bar is not None:
                bar.close()
        self.save()
        return self.history

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.total_steps

    @property
    def units_per_second(self) -> float:
        return self.history.units / max(self.history.train_seconds, 1e-9)
