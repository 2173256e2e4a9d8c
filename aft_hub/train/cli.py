"""Command-line front of :mod:`aft_hub.train`: ``register(subparsers)`` adds ``train-lm`` and ``finetune-image``
to the ``aft-hub`` command; ``scripts/train_lm.py`` and ``scripts/finetune_image.py`` call the same functions."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

__all__ = ["register", "run_train_lm", "run_finetune_image", "train_lm_main", "finetune_image_main"]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s",
                        stream=sys.stderr)


def _summary(metrics: dict[str, Any], keys: tuple[str, ...]) -> str:
    return json.dumps({k: metrics[k] for k in keys if k in metrics}, indent=2)


def run_train_lm(args: argparse.Namespace) -> int:
    """Run a parsed ``train-lm`` command line; rank 0 prints a JSON summary."""
    from .lm import train_lm

    _setup_logging(args.verbose)
    metrics = train_lm(args)
    if _rank() == 0:
        print(_summary(metrics, ("step", "finished", "val_bpc", "test_bpc", "train_bpc_last", "tokens",
                                 "tokens_per_second", "params", "world_size", "final_dir")))
    return 0


def run_finetune_image(args: argparse.Namespace) -> int:
    """Run a parsed ``finetune-image`` command line; rank 0 prints a JSON summary."""
    from .image import finetune_image

    _setup_logging(args.verbose)
    metrics = finetune_image(args)
    if _rank() == 0:
        print(_summary(metrics, ("step", "finished", "val_top1", "val_loss", "train_loss_last", "images",
                                 "images_per_second", "params", "world_size", "final_dir")))
    return 0


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def train_lm_main(argv: list[str] | None = None) -> int:
    from .lm import build_parser

    return run_train_lm(build_parser().parse_args(argv))


def finetune_image_main(argv: list[str] | None = None) -> int:
    from .image import build_parser

    return run_finetune_image(build_parser().parse_args(argv))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``train-lm`` and ``finetune-image`` to an ``argparse`` sub-command set.

    Usage in ``aft_hub/cli.py``::

        from .train.cli import register as register_train
        register_train(sub)          # after sub = parser.add_subparsers(...)
        ...
        args.func(args)              # each sub-command sets func

    Both sub-commands define their own ``-v/--verbose``.
    """
    from . import image, lm

    p = subparsers.add_parser("train-lm", help="train a byte-level AFT language model (bpc on val/test)",
                              description=lm.__doc__.split("\n\n")[0], conflict_handler="resolve")
    lm.build_parser(p)
    p.set_defaults(func=run_train_lm)
    p = subparsers.add_parser("finetune-image", help="fine-tune a timm AFT image model (top-1)",
                              description=image.__doc__.split("\n\n")[0], conflict_handler="resolve")
    image.build_parser(p)
    p.set_defaults(func=run_finetune_image)
