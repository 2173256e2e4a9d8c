"""Publishing: a repo folder (weights, config, tokenizer / preprocessing, remote code, model card), then one commit.

:func:`save_for_hub` writes the folder atomically (a temporary sibling directory renamed into place, so an error
never leaves a half-written folder); :func:`push_to_hub` uploads a folder with ``create_repo(exist_ok=True)`` and a
single ``upload_folder`` commit, then downloads every file back and compares sha256 digests; :func:`publish` does
both. Neither overwrites anything silently: an existing non-empty folder, or a repo (branch) that already holds
files, needs ``overwrite=True``. The token comes from huggingface_hub's usual sources (``HF_TOKEN``, the stored
login) or the ``token`` argument, and is never logged or written.

Folder layout:

* vision: ``model.safetensors`` (the transformers keys, ``aft.`` + timm keys; timm's loader strips the prefix),
  ``config.json`` read by both libraries (``model_type`` "aft_vision" and the transformers fields, plus timm's
  ``architecture``, ``num_classes``, ``model_args``, ``pretrained_cfg``; ``AutoImageProcessor`` builds timm's
  evaluation transform from it), ``README.md``, remote code;
* language model: ``model.safetensors``, ``config.json``, ``generation_config.json``, the byte tokenizer
  (``tokenizer.json``, ``tokenizer_config.json``), ``README.md``, remote code;
* any other timm model: timm's own export (``config.json``, ``model.safetensors``) and ``README.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..convert.io import atomic_folder, write_timm_folder
from .card import CardInfo, render_card, validate_card
from .remote_code import bundle_remote_code

logger = logging.getLogger(__name__)

__all__ = ["PublishResult", "save_for_hub", "push_to_hub", "publish", "folder_digests", "REQUIRED_FILES"]

REQUIRED_FILES = ("config.json", "model.safetensors", "README.md")


@dataclasses.dataclass
class PublishResult:
    """What :func:`publish` / :func:`push_to_hub` did.

    Attributes:
        folder: the local repo folder.
        repo_id: the Hub repo (None for a dry run).
        revision: the branch committed to (or the PR's base branch).
        commit_oid: the commit id.
        commit_url: the commit's URL.
        pr_url: the pull request's URL when ``create_pr`` was set.
        verified: file -> sha256 of every file downloaded back and found identical (empty when not verified).
    """

    folder: Path
    repo_id: str | None = None
    revision: str | None = None
    commit_oid: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None
    verified: dict[str, str] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------------
# the folder
# ----------------------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _is_timm_model(model: object) -> bool:
    return isinstance(model, nn.Module) and isinstance(getattr(model, "pretrained_cfg", None), Mapping)


@dataclasses.dataclass
class _Written:
    kind: str
    num_params: int
    details: list[tuple[str, str]]
    input_size: tuple[int, int, int] | None = None
    classes: dict[str, type] | None = None  # Auto class name -> class, for remote code
    tags: list[str] = dataclasses.field(default_factory=list)


def _write_lm(model: Any, folder: Path, tokenizer: Any) -> _Written:
    from ..hf import AftForCausalLM, AftModel
    from ..hf.configuration_aft import BYTE_VOCAB_SIZE
    from ..hf.tokenization_aft import build_byte_tokenizer

    config = model.config
    if tokenizer is None:
        if config.vocab_size != BYTE_VOCAB_SIZE:
            raise ValueError(
                f"The model has a vocabulary of {config.vocab_size}, not the {BYTE_VOCAB_SIZE}-id byte vocabulary; "
                f"pass its tokenizer."
            )
        tokenizer = build_byte_tokenizer(
            model_max_length=config.max_position_embeddings if config.has_absolute_positions else None
        )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    mixer = {
        "local": f"AFT-local, window {config.window_size}",
        "simple": "AFT-simple",
        "full": "AFT-full",
        "conv": f"AFT-conv, {config.conv_heads} heads, kernel {config.conv_kernel_size}",
    }[config.aft_type]
    if config.aft_type in ("local", "full"):
        rank = "dense" if config.position_bias_rank is None else f"rank {config.position_bias_rank}"
        mixer += f", position bias {rank}"
    context = (
        f"{config.max_position_embeddings} tokens (absolute position bias)"
        if config.has_absolute_positions
        else f"unbounded (relative position only; trained up to {config.max_position_embeddings})"
        if config.aft_type == "conv"
        else "unbounded (no position bias)"
    )
    vocab = (
        "258: bytes 0-255, then end-of-text (256) and padding (257)"
        if config.vocab_size == BYTE_VOCAB_SIZE
        else str(config.vocab_size)
    )
    details = [
        ("Token mixer", mixer),
        ("Layers", str(config.num_hidden_layers)),
        ("Width", str(config.hidden_size)),
        ("MLP width", str(config.intermediate_size)),
        ("Context", context),
        ("Vocabulary", vocab),
        ("Weights", f"`model.safetensors`, {next(model.parameters()).dtype}".replace("torch.", "")),
    ]
    classes = {"AutoConfig": type(config), "AutoModel": AftModel, "AutoModelForCausalLM": AftForCausalLM}
    return _Written("lm", _num_params(model), details, classes=classes, tags=[f"aft-{config.aft_type}"])


def _vision_details(timm_model: nn.Module, config: Mapping[str, Any]) -> tuple[list[tuple[str, str]], tuple]:
    pretrained_cfg = config.get("pretrained_cfg", {})
    input_size = tuple(int(v) for v in pretrained_cfg.get("input_size", (3, 224, 224)))
    details = [("timm architecture", f"`{config.get('architecture')}`")]
    kwargs = getattr(timm_model, "config_kwargs", None)
    if isinstance(kwargs, Mapping):
        mixer = kwargs.get("mixer")
        label = {
            "conv": f"AFT-conv, {kwargs.get('heads')} heads, kernel {kwargs.get('kernel_size')}",
            "full": f"AFT-full, position bias rank {kwargs.get('bias_rank')}",
            "local": f"AFT-local, window {kwargs.get('window')}, position bias rank {kwargs.get('bias_rank')}",
            "simple": "AFT-simple",
        }.get(mixer, str(mixer))
        details += [
            ("Token mixer", label),
            ("Blocks x width", f"{kwargs.get('depth')} x {kwargs.get('embed_dim')}"),
            ("Patch size", str(kwargs.get("patch_size"))),
            ("Class token / position embedding", f"{kwargs.get('class_token')} / {kwargs.get('pos_embed')}"),
        ]
    details += [
        ("Input size", " x ".join(str(v) for v in input_size)),
        ("Classes", str(config.get("num_classes"))),
        ("Mean / std", f"{pretrained_cfg.get('mean')} / {pretrained_cfg.get('std')}"),
        ("Weights", f"`model.safetensors`, {next(timm_model.parameters()).dtype}".replace("torch.", "")),
    ]
    return details, input_size


def _write_timm(model: nn.Module, folder: Path) -> _Written:
    write_timm_folder(model, folder)
    details, input_size = _vision_details(model, _read_json(folder / "config.json"))
    return _Written("vision", _num_params(model), details, input_size=input_size)


def _write_hf_vision(model: Any, folder: Path) -> _Written:
    """An aft_hub transformers image classifier: its ``save_pretrained`` writes one config.json for both libraries
    (transformers' fields plus timm's ``architecture``, ``num_classes``, ``model_args``, ``pretrained_cfg``)."""
    from ..hf import AftForImageClassification, AftVisionModel

    if not isinstance(model, AftForImageClassification):
        raise TypeError(f"Publish an AftForImageClassification (with its classifier), not a {type(model).__name__}.")
    model.save_pretrained(folder)
    config = _read_json(folder / "config.json")
    details, input_size = _vision_details(model.aft, config)
    classes = {
        "AutoConfig": type(model.config),
        "AutoModel": AftVisionModel,
        "AutoModelForImageClassification": AftForImageClassification,
    }
    tags = [f"aft-{model.config.mixer}"]
    return _Written("vision", _num_params(model), details, input_size=input_size, classes=classes, tags=tags)


def _write_model(model: Any, folder: Path, tokenizer: Any) -> _Written:
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        model_type = getattr(model.config, "model_type", None)
        if model_type == "aft":
            if not hasattr(model, "lm_head"):
                raise TypeError("Publish the AftForCausalLM (with its head), not the bare AftModel.")
            return _write_lm(model, folder, tokenizer)
        if model_type == "aft_vision":
            return _write_hf_vision(model, folder)
        raise TypeError(f"Cannot publish a transformers model of type {model_type!r}; aft_hub publishes its own.")
    if _is_timm_model(model):
        from ..vision import AftVisionTransformer

        if isinstance(model, AftVisionTransformer):
            from ..hf import timm_to_transformers

            return _write_hf_vision(timm_to_transformers(model), folder)
        return _write_timm(model, folder)
    raise TypeError(
        f"Cannot publish a {type(model).__name__}: expected an aft_hub transformers model (AftForCausalLM, "
        f"AftForImageClassification) or a timm model."
    )


def save_for_hub(
    model: nn.Module,
    folder: str | os.PathLike[str],
    *,
    repo_id: str | None = None,
    card: CardInfo | None = None,
    tokenizer: Any = None,
    remote_code: bool = True,
    overwrite: bool = False,
    template: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a complete repo folder for ``model``.

    Args:
        model: ``AftForCausalLM``, ``AftForImageClassification``, a timm ``AftVisionTransformer`` (converted to the
            transformers class, so both libraries load the folder) or any other timm model (timm's layout).
        folder: the folder to create.
        repo_id: ``ORG/NAME`` for the usage snippets of the card (default: ``<your-org>/<folder name>``).
        card: what the card should say beyond what the model tells (training data and command, measured results).
        tokenizer: the tokenizer of a language model (default: aft_hub's byte tokenizer for a byte vocabulary).
        remote_code: copy the model code into the folder and set ``auto_map`` so that transformers loads it with
            ``trust_remote_code=True`` where aft_hub is not installed.
        overwrite: replace an existing non-empty folder.
        template: a model-card template to use instead of the packaged one.

    Returns:
        The folder.
    """
    folder = Path(folder).absolute()
    info = card if card is not None else CardInfo()
    if not isinstance(info, CardInfo):
        raise TypeError(f"card must be a CardInfo, got {type(info).__name__}.")
    with atomic_folder(folder, overwrite) as tmp:
        written = _write_model(model, tmp, tokenizer)
        has_code = bool(remote_code and written.classes)
        if has_code:
            auto_map = bundle_remote_code(tmp, written.classes)
            config = _read_json(tmp / "config.json")
            config["auto_map"] = auto_map
            _write_json(tmp / "config.json", config)
        rendered = render_card(
            written.kind,
            info,
            repo_id=repo_id or f"<your-org>/{folder.name}",
            num_params=written.num_params,
            details=written.details,
            input_size=written.input_size,
            remote_code=has_code,
            extra_tags=written.tags,
            template=template,
        )
        rendered.save(tmp / "README.md")
        missing = [name for name in REQUIRED_FILES if not (tmp / name).is_file()]
        assert not missing, f"publish folder lacks {missing}"
    logger.info("Wrote %s (%s model, %s parameters)", folder, written.kind, f"{written.num_params:,}")
    return folder


# ----------------------------------------------------------------------------------------------------------------
# the upload
# ----------------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_digests(folder: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of every file under ``folder`` (POSIX relative paths), skipping hidden files and ``__pycache__``."""
    folder = Path(folder)
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            out[rel.as_posix()] = _sha256(path)
    return out


def push_to_hub(
    folder: str | os.PathLike[str],
    repo_id: str,
    *,
    token: str | bool | None = None,
    private: bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    overwrite: bool = False,
    verify: bool = True,
    endpoint: str | None = None,
) -> PublishResult:
    """Upload a repo folder as one commit, then check it by downloading every file back.

    Args:
        folder: a folder written by :func:`save_for_hub` (must hold config.json, model.safetensors, README.md).
        repo_id: ``ORG/NAME`` (or ``NAME`` for your own namespace).
        token: a token; default: huggingface_hub's usual sources (``HF_TOKEN``, ``hf auth login``). Never logged.
        private: create the repo private (an existing repo keeps its visibility; a warning says so).
        revision: branch to commit to (created from the default branch when missing); default ``main``.
        create_pr: open a pull request against the default branch instead of committing (never needs
            ``overwrite``; huggingface_hub opens pull requests against the default branch only).
        commit_message: default ``"Upload <kind> model with aft_hub"``.
        overwrite: allow a commit to a branch that already holds files; files the folder does not have are then
            deleted in the same commit, so the branch ends up equal to the folder.
        verify: download each file of the new commit and compare its sha256 with the local file.
        endpoint: Hub URL (default: ``HF_ENDPOINT``).

    Raises:
        FileExistsError: the branch holds files and ``overwrite`` is false.
        ValueError: the folder is incomplete or its card metadata is invalid (checked here, then by the Hub's
            ``/api/validate-yaml`` before any file is sent).
        RuntimeError: the downloaded files differ from the local ones.
        huggingface_hub.errors.HfHubHTTPError: the Hub refused a request (e.g. 401 without a valid token).
    """
    from huggingface_hub import HfApi, hf_hub_download

    folder = Path(folder)
    if create_pr and revision not in (None, "main"):
        raise ValueError(
            "A pull request is opened against the repo's default branch; drop the revision (CLI: --revision) or "
            "commit to the branch without create_pr."
        )
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder} is not a complete repo folder: missing {missing}. Write it with save_for_hub.")
    card_text = (folder / "README.md").read_text(encoding="utf-8")
    validate_card(card_text)
    if "<your-org>/" in card_text:
        logger.warning(
            "README.md's usage snippets name a placeholder repo (<your-org>/...); write the folder with "
            "repo_id=%r (CLI: --repo-id) to show the real one.", repo_id
        )  # fmt: skip
    local = folder_digests(folder)

    api = HfApi(endpoint=endpoint, token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    repo_id = repo_url.repo_id
    info = api.repo_info(repo_id)
    if private is not None and bool(info.private) != bool(private):
        logger.warning(
            "%s already exists and is %s; its visibility is not changed.", repo_id, "private" if info.private else
            "public"
        )  # fmt: skip
    branch = revision or "main"
    branches = {ref.name for ref in api.list_repo_refs(repo_id).branches}
    if branch not in branches:
        if create_pr:
            raise ValueError(f"Cannot open a pull request against {branch!r}: {repo_id} has no such branch.")
        api.create_branch(repo_id, branch=branch, exist_ok=True)
        logger.info("Created branch %s of %s", branch, repo_id)
    existing = [f for f in api.list_repo_files(repo_id, revision=branch) if f != ".gitattributes"]
    if existing and not overwrite and not create_pr:
        raise FileExistsError(
            f"{repo_id}@{branch} already holds {len(existing)} files ({', '.join(sorted(existing)[:5])}"
            f"{', ...' if len(existing) > 5 else ''}); pass overwrite=True (CLI: --overwrite) to replace them in "
            f"one commit, or create_pr=True (CLI: --create-pr) to propose the change."
        )
    kind = "language" if _read_json(folder / "config.json").get("model_type") == "aft" else "vision"
    previous = api.repo_info(repo_id, revision=branch).sha
    commit = api.upload_folder(
        folder_path=str(folder),
        repo_id=repo_id,
        revision=branch,
        commit_message=commit_message or f"Upload {kind} model with aft_hub",
        create_pr=create_pr,
        delete_patterns="*" if (overwrite and existing and not create_pr) else None,
        ignore_patterns=[".*", "**/.*", "__pycache__/*", "**/__pycache__/*"],
    )
    result = PublishResult(
        folder=folder,
        repo_id=repo_id,
        revision=branch,
        commit_oid=commit.oid,
        commit_url=commit.commit_url,
        pr_url=commit.pr_url,
    )
    if commit.oid == previous:
        logger.warning("%s@%s already equals the folder; no commit was made.", repo_id, branch)
    else:
        logger.info("Committed %d files to %s@%s: %s", len(local), repo_id, branch, commit.oid)
    if verify:
        with tempfile.TemporaryDirectory(prefix="aft_hub_verify_") as cache:
            for name, digest in local.items():
                path = hf_hub_download(
                    repo_id, name, revision=commit.oid, cache_dir=cache, token=token, endpoint=endpoint
                )
                remote = _sha256(Path(path))
                if remote != digest:
                    raise RuntimeError(
                        f"Verification failed for {repo_id}@{commit.oid}: {name} downloaded with sha256 {remote}, "
                        f"the local file has {digest}."
                    )
                result.verified[name] = remote
        logger.info("Verified %d files of %s@%s by sha256", len(result.verified), repo_id, commit.oid[:8])
    return result


def publish(
    model: nn.Module,
    repo_id: str | None,
    *,
    folder: str | os.PathLike[str] | None = None,
    card: CardInfo | None = None,
    tokenizer: Any = None,
    remote_code: bool = True,
    dry_run: bool = False,
    overwrite: bool = False,
    private: bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    token: str | bool | None = None,
    verify: bool = True,
    endpoint: str | None = None,
) -> PublishResult:
    """:func:`save_for_hub` then (unless ``dry_run``) :func:`push_to_hub`.

    ``folder`` defaults to ``./<repo name>``; ``overwrite`` allows replacing both an existing folder and a branch
    that holds files. The folder stays after the upload, also when the upload fails.
    """
    if folder is None:
        if repo_id is None:
            raise ValueError("Give a repo_id, a folder, or both.")
        folder = Path.cwd() / repo_id.split("/")[-1]
    if repo_id is None and not dry_run:
        raise ValueError("A repo_id is needed to upload; pass dry_run=True to write the folder only.")
    path = save_for_hub(
        model, folder, repo_id=repo_id, card=card, tokenizer=tokenizer, remote_code=remote_code, overwrite=overwrite
    )
    if dry_run:
        return PublishResult(folder=path, repo_id=repo_id)
    return push_to_hub(
        path,
        repo_id,
        token=token,
        private=private,
        revision=revision,
        create_pr=create_pr,
        commit_message=commit_message,
        overwrite=overwrite,
        verify=verify,
        endpoint=endpoint,
    )
