"""Process-group set-up from environment variables, so one script runs alone, under ``torchrun`` and under
``accelerate launch`` (both export ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

__all__ = ["DistInfo", "setup_distributed", "cleanup_distributed", "all_reduce_sum", "resolve_mixed_precision"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job.

    Attributes:
        rank: global rank (0 when not distributed).
        world_size: number of processes.
        local_rank: rank on this machine, selects the CUDA device.
        device: the device this process computes on.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _resolve_device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda was requested but no CUDA device is available; use --device cpu.")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"Process with LOCAL_RANK {local_rank} needs its own CUDA device, but {torch.cuda.device_count()} "
                f"are visible: launch at most that many processes per machine, or pass --device cpu (gloo)."
            )
        return torch.device("cuda", local_rank)
    if device == "cpu":
        return torch.device("cpu")
    raise ValueError(f"Unknown device {device!r}: expected 'auto', 'cpu' or 'cuda'.")


def setup_distributed(device: str = "auto") -> DistInfo:
    """Join the process group described by the launcher's environment variables, if any.

    The backend is NCCL for CUDA and gloo for CPU. Without ``WORLD_SIZE`` > 1 nothing is initialised.

    Args:
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _resolve_device(device, local_rank)
    if world_size > 1:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            kwargs = {"device_id": dev} if dev.type == "cuda" else {}
            dist.init_process_group(backend=backend, **kwargs)
            logger.info("rank %d/%d joined the %s process group on %s", rank, world_size, backend, dev)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def cleanup_distributed() -> None:
    """Leave the process group (a no-op when none was initialised)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sum a few Python numbers over all processes (float64, so sums of bits stay exact enough to compare)."""
    if not info.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.tolist()


def resolve_mixed_precision(flag: str | None) -> str:
    """The mixed-precision mode: an explicit flag wins, else ``accelerate launch --mixed_precision`` (its
    ``ACCELERATE_MIXED_PRECISION`` variable), else ``"no"``. Only ``"no"`` and ``"bf16"`` are supported."""
    mode = flag if flag is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    mode = mode.lower()
    if mode not in ("no", "bf16"):
        raise ValueError(f"Mixed precision {mode!r} is not supported: use 'no' or 'bf16' (fp16 needs a grad scaler).")
    return mode
