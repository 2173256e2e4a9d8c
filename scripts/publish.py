#!/usr/bin/env python
"""Publish a model to the Hugging Face Hub (same as ``aft-hub publish``): folder, model card, one commit.

    python scripts/publish.py runs/lm --repo-id me/aft-lm --dry-run --folder out/aft-lm
    python scripts/publish.py --folder out/aft-lm --repo-id me/aft-lm
    python scripts/publish.py --help
"""

import sys

from aft_hub.hub.cli import main

if __name__ == "__main__":
    sys.exit(main())
