#!/usr/bin/env python
"""Fine-tune a timm AFT image model on Fashion-MNIST, scikit-learn's digits, an image folder or an HF datasets image
dataset; top-1.

    python scripts/finetune_image.py --model aft_conv_tiny --img-size 64 --epochs 1
    python scripts/finetune_image.py --model test_aft_conv --img-size 32 --data digits --steps 100
    python scripts/finetune_image.py --model local-dir:out/published --data path/to/image_folder
    torchrun --nproc_per_node=2 scripts/finetune_image.py --batch-size 32      # same global batch as 64 x 1
    accelerate launch --multi_gpu --num_processes 2 scripts/finetune_image.py --batch-size 32
    python scripts/finetune_image.py --resume                 # continue from <out-dir>/checkpoint.safetensors

All options: ``python scripts/finetune_image.py --help`` (same as ``aft-hub finetune-image``).
"""

from __future__ import annotations

import sys

from aft_hub.train.cli import finetune_image_main


def main(argv: list[str] | None = None) -> int:
    return finetune_image_main(argv)


if __name__ == "__main__":
    sys.exit(main())
