#!/usr/bin/env python
"""Conversions (same as ``aft-hub convert``): timm <-> transformers folders, DeiT/ViT -> AFT initialisation.

    python scripts/convert.py timm-to-hf aft_conv_small --checkpoint run/model.safetensors out/aft-conv-small
    python scripts/convert.py vit-to-aft deit_tiny_patch16_224 --pretrained out/aft-from-deit
    python scripts/convert.py --help
"""

import sys

from aft_hub.convert.cli import main

if __name__ == "__main__":
    sys.exit(main())
