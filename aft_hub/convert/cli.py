"""``aft-hub convert``: timm <-> transformers folders and DeiT/ViT -> AFT initialisation (safetensors only).

Hook into a parent parser with :func:`register`; ``scripts/convert.py`` runs :func:`main` standalone.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["register", "build_parser", "run", "main"]

EPILOG = """\
examples:
  aft-hub convert timm-to-hf aft_conv_small --checkpoint run/model.safetensors out/aft-conv-small
  aft-hub convert timm-to-hf run/model.safetensors out/x --model test_aft_conv --num-classes 10
  aft-hub convert hf-to-timm out/aft-conv-small out/aft-conv-small-timm
  aft-hub convert vit-to-aft deit_tiny_patch16_224 --pretrained out/aft-from-deit --mixer conv --heads 32
  aft-hub convert vit-to-aft deit.safetensors out/aft-full --mixer full --num-classes 10 --report report.json

Pickle inputs (.pth, .bin, ...) are refused unless --allow-pickle (then torch.load(weights_only=True)).
Outputs are safetensors; an existing output folder is replaced only with --overwrite.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``convert`` sub-subcommands (shared by the subcommand and ``scripts/convert.py``)."""
    sub = parser.add_subparsers(dest="conversion", required=True, metavar="{timm-to-hf,hf-to-timm,vit-to-aft}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("out", type=Path, help="folder to write")
        p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
        p.add_argument("--allow-pickle", action="store_true",
                       help="accept pickle weights, read with torch.load(weights_only=True)")  # fmt: skip

    p = sub.add_parser("timm-to-hf", help="timm AFT model -> transformers folder (which timm loads too)")
    p.add_argument("source", help="timm name (with --checkpoint), timm folder, or .safetensors (with --model)")
    common(p)
    p.add_argument("--checkpoint", type=Path, help="weights for a timm name")
    p.add_argument("--model", dest="model_name", help="timm architecture of a bare weights file")
    p.add_argument("--num-classes", type=int, help="classes of the timm model built from a name")

    p = sub.add_parser("hf-to-timm", help="transformers AFT image folder -> timm's native folder (timm keys)")
    p.add_argument("source", help="folder with the transformers config.json and model.safetensors")
    common(p)

    p = sub.add_parser("vit-to-aft", help="timm DeiT/ViT -> AFT initialised from it (the paper's recipe)")
    p.add_argument("source", help="timm ViT/DeiT name, timm folder, or .safetensors state dict")
    common(p)
    p.add_argument("--pretrained", action="store_true", help="download timm's weights for a source name")
    p.add_argument("--mixer", choices=("conv", "full"), default="conv", help="AFT-conv or AFT-full (default conv)")
    p.add_argument("--heads", type=int, help="AFT-conv heads (default min(32, width))")
    p.add_argument("--kernel-size", type=int, default=11, help="AFT-conv kernel side (default 11)")
    p.add_argument("--bias-rank", type=int, default=128, help="AFT-full position-bias rank d' (default 128)")
    p.add_argument("--num-classes", type=int, help="classes of the new head (default: the source's)")
    p.add_argument("--img-size", type=int, help="input size (default: the source's)")
    p.add_argument("--copy-qk", action="store_true", help="also copy Q/K where shapes allow (paper: re-initialise)")
    p.add_argument("--format", dest="fmt", choices=("transformers", "timm"), default="transformers",
                   help="folder layout (default transformers, which timm loads too)")  # fmt: skip
    p.add_argument("--base-model", help="Hub id of the source weights, for the model card")
    p.add_argument("--seed", type=int, default=0, help="seed of the fresh initialisations")
    p.add_argument("--report", type=Path, help="also write the conversion report (JSON) here")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``convert`` to the subcommands of a parent parser; it sets ``func`` to :func:`run`."""
    parser = subparsers.add_parser(
        "convert",
        help="timm <-> transformers folders, DeiT/ViT -> AFT initialisation (safetensors)",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser with the same options (``scripts/convert.py``)."""
    parser = argparse.ArgumentParser(
        prog="convert", description=__doc__.splitlines()[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``convert``; returns the exit status (errors go to stderr)."""
    from .folders import timm_to_transformers_folder, transformers_to_timm_folder, vit_to_aft_folder

    try:
        if args.conversion == "timm-to-hf":
            kwargs = {k: v for k, v in (("num_classes", args.num_classes), ("model_name", args.model_name)) if v}
            out = timm_to_transformers_folder(
                args.source, args.out, checkpoint=args.checkpoint, allow_pickle=args.allow_pickle,
                overwrite=args.overwrite, **kwargs,
            )  # fmt: skip
            print(f"wrote {out}")
        elif args.conversion == "hf-to-timm":
            out = transformers_to_timm_folder(args.source, args.out, overwrite=args.overwrite)
            print(f"wrote {out}")
        else:
            out, report = vit_to_aft_folder(
                args.source, args.out, pretrained=args.pretrained, allow_pickle=args.allow_pickle,
                base_model=args.base_model, fmt=args.fmt, overwrite=args.overwrite, mixer=args.mixer,
                heads=args.heads, kernel_size=args.kernel_size, bias_rank=args.bias_rank,
                num_classes=args.num_classes, img_size=args.img_size, copy_qk=args.copy_qk, seed=args.seed,
            )  # fmt: skip
            if args.report is not None:
                args.report.write_text(report.to_json() + "\n", encoding="utf-8")
            print(f"wrote {out} ({report.target})")
            print(f"copied {len(report.copied)}, initialised {len(report.initialised)}, dropped {len(report.dropped)}")
            for label, keys in (("initialised", report.initialised), ("dropped", report.dropped)):
                shown = ", ".join(keys[:6]) + (f", ... ({len(keys)} in all)" if len(keys) > 6 else "")
                print(f"  {label}: {shown or 'none'}")
    except (ValueError, TypeError, OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
