"""Optimisers and learning-rate schedules: AdamW with warmup then cosine decay (nanoGPT's ``get_lr``), or timm's
``create_optimizer_v2`` / ``create_scheduler_v2`` factories. Every schedule is a pure function of the update count,
so a resumed run sets the same learning rates as an uninterrupted one."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["WarmupCosine", "Schedule", "build_optimizer", "build_schedule", "param_groups_weight_decay"]


class WarmupCosine:
    """Learning-rate multiplier: linear warmup to 1 over ``warmup`` updates, then cosine decay to ``min_ratio``
    at ``total``, constant afterwards.

    Args:
        warmup: number of warmup updates.
        total: update at which the decay ends.
        min_ratio: final learning rate as a fraction of the peak.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float = 0.1) -> None:
        if warmup < 0 or total < 1:
            raise ValueError(f"Schedule needs warmup >= 0 and total >= 1 updates, got warmup={warmup}, total={total}.")
        if not 0.0 <= min_ratio <= 1.0:
            raise ValueError(f"min_ratio must lie in [0, 1], got {min_ratio}.")
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        if step >= self.total:
            return self.min_ratio
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        return self.min_ratio + 0.5 * (1.0 - self.min_ratio) * (1.0 + math.cos(math.pi * progress))


def param_groups_weight_decay(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: matrices and convolution kernels decay, biases, norms, embeddings of size 1 and position
    biases (1-D) do not. Parameters named by the model's ``no_weight_decay()`` never decay."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    factory: str = "torch",
    opt: str = "adamw",
) -> torch.optim.Optimizer:
    """AdamW over :func:`param_groups_weight_decay`, or any optimiser from timm's registry.

    Args:
        model: the (unwrapped) model.
        lr: peak learning rate.
        weight_decay: decoupled weight decay for matrices.
        betas: Adam betas.
        factory: ``"torch"`` (AdamW) or ``"timm"`` (``timm.optim.create_optimizer_v2(model, opt, ...)``).
        opt: the timm optimiser name (``adamw``, ``lamb``, ``sgd``, ...); ignored by the torch factory.
    """
    if lr <= 0:
        raise ValueError(f"Learning rate must be positive, got {lr}.")
    if factory == "torch":
        if opt != "adamw":
            raise ValueError(f"The torch optimiser factory only builds AdamW; use --opt-factory timm for {opt!r}.")
        return torch.optim.AdamW(param_groups_weight_decay(model, weight_decay), lr=lr, betas=betas)
    if factory == "timm":
        from timm.optim import create_optimizer_v2, list_optimizers

        if opt not in list_optimizers():
            raise ValueError(f"timm has no optimiser {opt!r}; choose one of timm.optim.list_optimizers().")
        extra = {"betas": betas} if "adam" in opt or opt == "lamb" else {}
        return create_optimizer_v2(model, opt=opt, lr=lr, weight_decay=weight_decay, **extra)
    raise ValueError(f"Unknown optimiser factory {factory!r}: expected 'torch' or 'timm'.")


class Schedule:
    """Sets the learning rate of every parameter group for update ``step`` before the optimiser steps.

    ``kind="cosine"`` multiplies each group's initial learning rate by :class:`WarmupCosine`; ``kind="timm"``
    uses ``timm.scheduler.create_scheduler_v2(..., sched=timm_sched)`` stepped per update. ``state_dict`` is JSON
    serialisable, for safetensors metadata.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        total_steps: int,
        warmup_steps: int,
        min_lr_ratio: float = 0.1,
        kind: str = "cosine",
        timm_sched: str = "cosine",
    ) -> None:
        self.kind = kind
        self.optimizer = optimizer
        if kind == "cosine":
            self._fn = WarmupCosine(warmup_steps, total_steps, min_lr_ratio)
            self._base_lrs = [group.setdefault("initial_lr", group["lr"]) for group in optimizer.param_groups]
            self._step = -1
        elif kind == "timm":
            from timm.scheduler import create_scheduler_v2

            base_lr = optimizer.param_groups[0]["lr"]
            self._sched, _ = create_scheduler_v2(
                optimizer,
                sched=timm_sched,
                num_epochs=max(1, total_steps - warmup_steps),
                warmup_epochs=warmup_steps,
                warmup_lr=base_lr / (warmup_steps + 1),
                warmup_prefix=True,
                min_lr=base_lr * min_lr_ratio,
                step_on_epochs=False,
                updates_per_epoch=1,
            )
            if self._sched is None:
                raise ValueError(f"timm scheduler {timm_sched!r} gives no schedule; choose e.g. 'cosine'.")
        else:
            raise ValueError(f"Unknown schedule {kind!r}: expected 'cosine' or 'timm'.")

    def set_step(self, step: int) -> None:
        """Put the learning rate of update ``step`` (0-based) into the optimiser."""
        if self.kind == "cosine":
            for group, base in zip(self.optimizer.param_groups, self._base_lrs):
                group["lr"] = base * self._fn(step)
            self._step = step
        else:
            self._sched.step_update(num_updates=step)

    @property
    def lr(self) -> float:
        """The learning rate of the first parameter group."""
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict[str, Any]:
        if self.kind == "cosine":
            state = {"step": self._step, "base_lrs": self._base_lrs, **vars(self._fn)}
        else:
            state = dict(self._sched.state_dict())
        return {"kind": self.kind, "state": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"Checkpoint holds a {state.get('kind')!r} schedule but this run uses {self.kind!r}.")
        inner = dict(state["state"])
        if self.kind == "cosine":
            self._step, self._base_lrs = inner.pop("step"), list(inner.pop("base_lrs"))
            self._fn = WarmupCosine(**inner)
        else:
            self._sched.load_state_dict(inner)


def build_schedule(optimizer: torch.optim.Optimizer, **kwargs: Any) -> Schedule:
    """Shorthand for :class:`Schedule` (keyword arguments as there)."""
    return Schedule(optimizer, **kwargs)
