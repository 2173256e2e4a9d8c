"""Training and fine-tuning on real data: byte-level AFT language models (:mod:`.lm`, bits per byte) and timm image
models (:mod:`.image`, top-1), with one shared loop (:mod:`.loop`), safetensors checkpoints with exact resume
(:mod:`.checkpoint`), DDP from the launcher's environment (:mod:`.distributed`), AdamW + warmup/cosine or timm's
factories (:mod:`.schedule`) and publish-ready output folders (:mod:`.publish`).

Command lines: ``scripts/train_lm.py`` / ``scripts/finetune_image.py``, or ``aft-hub train-lm`` /
``aft-hub finetune-image`` once :func:`aft_hub.train.cli.register` is hooked into ``aft_hub.cli``. Submodules are
imported on use, so ``import aft_hub.train`` stays light.
"""

from __future__ import annotations

from .checkpoint import CHECKPOINT_NAME, load_checkpoint, read_checkpoint_metadata, save_checkpoint
from .distributed import DistInfo, setup_distributed
from .schedule import Schedule, WarmupCosine, build_optimizer, build_schedule

__all__ = [
    "CHECKPOINT_NAME",
    "DistInfo",
    "Schedule",
    "WarmupCosine",
    "build_optimizer",
    "build_schedule",
    "load_checkpoint",
    "read_checkpoint_metadata",
    "save_checkpoint",
    "setup_distributed",
]
