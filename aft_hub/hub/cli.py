"""``aft-hub publish``: write a repo folder (weights, config, card, remote code) and upload it as one commit.

Hook into a parent parser with :func:`register`; ``scripts/publish.py`` runs :func:`main` standalone.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

__all__ = ["register", "build_parser", "run", "main"]

logger = logging.getLogger(__name__)

EPILOG = """\
examples:
  aft-hub publish runs/lm --repo-id me/aft-lm --dry-run --folder out/aft-lm   # write and review the folder
  aft-hub publish --folder out/aft-lm --repo-id me/aft-lm                     # upload the reviewed folder
  aft-hub publish runs/fmnist --repo-id me/aft-fmnist --private --eval-results eval.json
  aft-hub publish test_aft_conv --checkpoint w.safetensors --repo-id me/x --revision dev

SOURCE is a model folder (transformers or timm layout, e.g. from `aft-hub convert`), a timm model name (with
--checkpoint for its weights) or a .safetensors file (with --model). Without SOURCE, --folder is uploaded as it
is: do that with the folder a training run ends with (runs/.../final), whose card already holds the data, the
command and the measured results. The token comes from HF_TOKEN or `hf auth login` and is never printed.
Nothing that exists is overwritten without --overwrite: neither the folder nor a branch that holds files.
--create-pr opens a pull request against the default branch (no --revision, no --overwrite needed).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``publish`` (shared by the subcommand and ``scripts/publish.py``)."""
    parser.add_argument("source", nargs="?", help="model folder, timm model name or .safetensors file")
    parser.add_argument("--repo-id", help="ORG/NAME on the Hub (NAME alone: your namespace)")
    parser.add_argument("--folder", type=Path, help="repo folder to write (default: ./NAME)")
    parser.add_argument("--dry-run", action="store_true", help="write the folder only; no network")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder / a branch's files")
    parser.add_argument("--private", action="store_true", default=None, help="create the repo private")
    parser.add_argument("--revision", help="branch to commit to (created when missing; default main)")
    parser.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    parser.add_argument("--commit-message", help="commit message")
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip the sha256 download check")
    parser.add_argument("--no-remote-code", dest="remote_code", action="store_false",
                        help="do not bundle model code for trust_remote_code=True")  # fmt: skip
    parser.add_argument("--endpoint", help="Hub URL (default: HF_ENDPOINT or huggingface.co)")
    group = parser.add_argument_group("model source")
    group.add_argument("--checkpoint", type=Path, help="weights for a timm model name (safetensors)")
    group.add_argument("--model", dest="model_name", help="timm architecture of a bare .safetensors SOURCE")
    group.add_argument("--num-classes", type=int, help="classes of a timm model built from a name")
    group.add_argument("--allow-pickle", action="store_true",
                       help="accept pickle weights, read with torch.load(weights_only=True)")  # fmt: skip
    group = parser.add_argument_group("model card (only what you measured or know)")
    group.add_argument("--card", type=Path, help="JSON file with CardInfo fields; the options below override it")
    group.add_argument("--title")
    group.add_argument("--description")
    group.add_argument("--license")
    group.add_argument("--dataset", dest="datasets", action="append", help="Hub dataset id (repeatable)")
    group.add_argument("--training-data", help="one sentence on the training data")
    group.add_argument("--training-command", help="the command that trained the model")
    group.add_argument("--eval-results", type=Path,
                       help="JSON list of measured results: dataset_type, dataset_name, metric_type, metric_value, "
                            "optional dataset_split")  # fmt: skip
    group.add_argument("--base-model", help="Hub id of the checkpoint the weights started from")
    group.add_argument("--language", action="append", help="language code of an LM's text (repeatable)")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``publish`` to the subcommands of a parent parser; it sets ``func`` to :func:`run`."""
    parser = subparsers.add_parser(
        "publish",
        help="write a Hub repo folder (safetensors, config, card, remote code) and upload it as one commit",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser with the same options (``scripts/publish.py``)."""
    parser = argparse.ArgumentParser(
        prog="publish", description=__doc__.splitlines()[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_arguments(parser)
    return parser


def _card_info(args: argparse.Namespace, conversion: dict | None):
    from .card import CardInfo

    data = {}
    if args.card is not None:
        data = json.loads(args.card.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{args.card} must hold a JSON object of CardInfo fields.")
    if conversion:
        data.setdefault("base_model", conversion.get("base_model"))
        data.setdefault("conversion", conversion.get("summary"))
    for name in ("title", "description", "license", "training_data", "training_command", "base_model"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    if args.datasets:
        data["datasets"] = args.datasets
    if args.language:
        data["language"] = args.language if len(args.language) > 1 else args.language[0]
    if args.eval_results is not None:
        results = json.loads(args.eval_results.read_text(encoding="utf-8"))
        data["eval_results"] = results if isinstance(results, list) else [results]
    return CardInfo.from_dict({k: v for k, v in data.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    """Run ``publish``; returns the exit status (errors are reported on stderr, the folder is kept)."""
    from huggingface_hub.errors import HfHubHTTPError

    from .publish import push_to_hub, save_for_hub

    folder = args.folder
    try:
        if args.source is None:
            if folder is None or args.repo_id is None:
                raise ValueError("Without SOURCE, give --folder (an existing repo folder) and --repo-id to upload it.")
            if args.dry_run:
                raise ValueError("--dry-run without SOURCE has nothing to do.")
        else:
            from ..convert.sources import load_model

            if folder is None:
                if args.repo_id is None:
                    raise ValueError("Give --repo-id, --folder, or both.")
                folder = Path.cwd() / args.repo_id.split("/")[-1]
            kwargs = {}
            if args.num_classes is not None:
                kwargs["num_classes"] = args.num_classes
            if args.model_name is not None:
                kwargs["model_name"] = args.model_name
            loaded = load_model(args.source, checkpoint=args.checkpoint, allow_pickle=args.allow_pickle, **kwargs)
            card = _card_info(args, loaded.conversion)
            save_for_hub(
                loaded.model,
                folder,
                repo_id=args.repo_id,
                card=card,
                tokenizer=loaded.tokenizer,
                remote_code=args.remote_code,
                overwrite=args.overwrite,
            )
            print(f"wrote {folder}")
            if args.dry_run:
                return 0
            if args.repo_id is None:
                raise ValueError("--repo-id is needed to upload (or pass --dry-run).")
        result = push_to_hub(
            folder,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            create_pr=args.create_pr,
            commit_message=args.commit_message,
            overwrite=args.overwrite,
            verify=args.verify,
            endpoint=args.endpoint,
        )
    except (ValueError, TypeError, OSError, RuntimeError, HfHubHTTPError) as err:
        print(f"error: {err}", file=sys.stderr)
        if folder is not None and Path(folder).is_dir():
            print(f"the local folder {folder} is unchanged", file=sys.stderr)
        return 1
    print(f"committed {result.repo_id}@{result.revision}: {result.commit_oid}")
    if result.pr_url:
        print(f"pull request: {result.pr_url}")
    if result.verified:
        print(f"verified {len(result.verified)} files by sha256")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
