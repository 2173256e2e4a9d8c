"""Image-classification fine-tuning of timm models (``scripts/finetune_image.py``, ``aft-hub finetune-image``).

Models: any timm name (``aft_conv_tiny``, ``test_aft_conv``, ... after ``import aft_hub.timm_models``; fresh, or
``--pretrained`` where timm has weights), a published repo (``hf-hub:<org>/<name>``, ``local-dir:<folder>``), or an
AFT model initialised from a DeiT checkpoint (``--init-from-deit``, through :mod:`aft_hub.convert`). Data:
Fashion-MNIST (Debian ``dataset-fashion-mnist``), ``digits`` (scikit-learn's bundled 8 x 8 digits, no download),
an image folder or an HF ``datasets`` image dataset, through timm's data pipeline (``resolve_model_data_config`` +
``create_transform``, at the model's input size; optional mixup / cutmix with ``timm.data.Mixup``). Top-1 on the
validation split; checkpoints, exact resume, DDP under ``torchrun`` / ``accelerate launch``, progress bar and the
publish-ready folder as in :mod:`aft_hub.train.lm`.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .distributed import DistInfo, all_reduce_sum, cleanup_distributed, resolve_mixed_precision, setup_distributed
from .image_data import EvalSampler, ImageSplits, MicroBatchSampler, SeededTransform, load_image_data
from .loop import LoopConfig, TrainLoop, autocast, seed_everything, unwrap
from .loop import at_least_f32 as _f32
from .publish import card_info, command_line, eval_result, publish_folder
from .schedule import build_optimizer, build_schedule

logger = logging.getLogger(__name__)

__all__ = ["build_parser", "build_image_model", "data_transforms", "evaluate_top1", "finetune_image", "main"]

RESUME_MAY_CHANGE = (
    "resume", "out_dir", "progress", "eval_interval", "eval_batch_size", "ckpt_interval", "stop_after", "device",
    "batch_size", "grad_accum", "world_size", "verbose", "publish", "workers", "repo_id",
    "mixed_precision",
)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The command line of ``finetune_image`` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog="finetune_image", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("data")
    g.add_argument("--data", default="fashion-mnist", help="'fashion-mnist[:<idx folder>]', 'digits' (scikit-learn's "
                   "bundled 8x8 digits, 1,797 images, fixed stratified 80/20 split), an image folder, a datasets "
                   "save_to_disk directory, or hf:<name>")
    g.add_argument("--image-column", default=None, help="image column of a datasets source")
    g.add_argument("--label-column", default=None, help="label column of a datasets source")
    g.add_argument("--limit-train", type=int, default=None, help="use the first N training images")
    g.add_argument("--limit-val", type=int, default=None, help="use the first N validation images")
    g.add_argument("--workers", type=int, default=0, help="data-loader worker processes")
    g = p.add_argument_group("model")
    g.add_argument("--model", default="aft_conv_tiny", help="timm name, hf-hub:<repo> or local-dir:<folder>")
    g.add_argument("--pretrained", action="store_true", help="load timm's weights for a plain timm name")
    g.add_argument("--init-from-deit", default=None, metavar="DEIT",
                   help="instead of --model: an AFT model initialised from this DeiT/ViT (safetensors file, folder or "
                   "timm name; --pretrained fetches timm's weights) by aft_hub.convert")
    g.add_argument("--deit-mixer", choices=("conv", "full"), default="conv", help="AFT mixer of --init-from-deit")
    g.add_argument("--deit-heads", type=int, default=None, help="AFT-conv heads of --init-from-deit")
    g.add_argument("--deit-kernel-size", type=int, default=11, help="AFT-conv kernel of --init-from-deit")
    g.add_argument("--img-size", type=int, default=None, help="input size (default: the model's)")
    g.add_argument("--drop-path", type=float, default=0.0)
    g.add_argument("--drop", type=float, default=0.0, help="dropout before the classifier")
    g = p.add_argument_group("augmentation")
    g.add_argument("--crop-scale-min", type=float, default=0.35, help="RandomResizedCrop minimum area")
    g.add_argument("--hflip", type=float, default=0.5)
    g.add_argument("--aa", default=None, help="timm auto-augment policy, e.g. rand-m9-mstd0.5")
    g.add_argument("--reprob", type=float, default=0.0, help="random-erasing probability")
    g.add_argument("--mixup", type=float, default=0.0, help="mixup alpha (0: off)")
    g.add_argument("--cutmix", type=float, default=0.0, help="cutmix alpha (0: off)")
    g.add_argument("--mixup-prob", type=float, default=1.0)
    g.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=float, default=1.0, help="passes over the training set")
    g.add_argument("--steps", type=int, default=None, help="optimiser updates (overrides --epochs)")
    g.add_argument("--batch-size", type=int, default=64, help="images per micro-batch per process")
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--min-lr-ratio", type=float, default=0.01)
    g.add_argument("--warmup", type=int, default=50, help="warmup updates")
    g.add_argument("--weight-decay", type=float, default=0.05)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.999)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--opt-factory", choices=("torch", "timm"), default="torch",
                   help="torch AdamW, or timm.optim.create_optimizer_v2")
    g.add_argument("--opt", default="adamw", help="timm optimiser name (with --opt-factory timm)")
    g.add_argument("--sched", choices=("cosine", "timm"), default="cosine",
                   help="warmup + cosine, or timm.scheduler.create_scheduler_v2 (cosine)")
    g.add_argument("--mixed-precision", choices=("no", "bf16"), default=None)
    g.add_argument("--grad-checkpointing", action="store_true")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("evaluation, checkpoints, output")
    g.add_argument("--eval-interval", type=int, default=0, help="evaluate every N updates (0: end only)")
    g.add_argument("--eval-batch-size", type=int, default=128)
    g.add_argument("--ckpt-interval", type=int, default=200, help="checkpoint every N updates (0: end only)")
    g.add_argument("--out-dir", default="out/image", help="checkpoint and final folder (<out-dir>/final)")
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


def _validate(args: argparse.Namespace) -> None:
    for name in ("batch_size", "grad_accum", "eval_batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}.")
    if args.steps is None and not args.epochs > 0:
        raise ValueError(f"--epochs must be positive, got {args.epochs}.")
    if (args.mixup > 0 or args.cutmix > 0) and args.batch_size % 2:
        raise ValueError(f"Mixup/cutmix need an even --batch-size per process, got {args.batch_size}.")
    if not 0 < args.crop_scale_min <= 1:
        raise ValueError(f"--crop-scale-min must lie in (0, 1], got {args.crop_scale_min}.")
    if args.dtype == "float64" and args.mixed_precision == "bf16":
        raise ValueError("--dtype float64 and --mixed-precision bf16 exclude each other.")
    if args.init_from_deit and (args.drop_path or args.drop):
        raise ValueError("--drop-path / --drop are not available with --init-from-deit (the conversion fixes the "
                         "model's arguments).")


def _import_timm_models() -> None:
    try:
        import aft_hub.timm_models  # noqa: F401  (registers aft_* with timm)
    except ImportError as err:  # the vision front end is optional for plain timm models
        logger.debug("aft_hub.timm_models not importable: %s", err)


def init_from_deit(args: argparse.Namespace, num_classes: int):
    """Hook to :func:`aft_hub.convert.vit_to_aft`: an AFT model of the DeiT's width and depth whose patch embedding,
    norms, MLPs, V and output projections come from the DeiT ``args.init_from_deit`` (a ``.safetensors`` state
    dict, a timm folder / ``local-dir:`` folder, or a timm name: random weights, or timm's with ``--pretrained``).

    Returns:
        ``(model, report)``: the timm AFT model and the conversion report.
    """
    import timm

    try:
        from aft_hub.convert import load_state_dict, vit_to_aft
    except ImportError as err:
        raise ValueError("--init-from-deit needs aft_hub.convert, which this installation lacks.") from err
    source = args.init_from_deit
    path = Path(source.split(":", 1)[1] if source.startswith("local-dir:") else source)
    overlay: dict[str, Any] = {}
    if path.is_file():
        state_dict = load_state_dict(path)
    else:
        if path.is_dir():
            deit = timm.create_model(f"local-dir:{path.resolve()}", pretrained=True)
        elif timm.is_model(source):
            deit = timm.create_model(source, pretrained=args.pretrained)
        else:
            raise ValueError(f"--init-from-deit {source!r} is not a safetensors file, a folder or a timm model name.")
        state_dict = deit.state_dict()
        overlay = {k: deit.pretrained_cfg[k] for k in ("mean", "std", "interpolation")
                   if deit.pretrained_cfg.get(k) is not None}
    options: dict[str, Any] = {"mixer": args.deit_mixer, "kernel_size": args.deit_kernel_size}
    if args.deit_heads is not None:
        options["heads"] = args.deit_heads
    return vit_to_aft(state_dict, num_classes=num_classes, img_size=args.img_size, source_name=str(source),
                      pretrained_cfg_overlay=overlay, seed=args.seed, **options)


def build_image_model(args: argparse.Namespace, num_classes: int) -> tuple[nn.Module, Any]:
    """The one function that builds the image model from the command-line options.

    Returns:
        ``(model, conversion report or None)``.
    """
    import timm

    _import_timm_models()
    if args.init_from_deit:
        return init_from_deit(args, num_classes)
    kwargs: dict[str, Any] = {"num_classes": num_classes}
    if args.img_size is not None:
        kwargs["img_size"] = args.img_size
    if args.drop_path:
        kwargs["drop_path_rate"] = args.drop_path
    if args.drop:
        kwargs["drop_rate"] = args.drop
    from_repo = args.model.startswith(("hf-hub:", "local-dir:"))
    try:
        return timm.create_model(args.model, pretrained=from_repo or args.pretrained, **kwargs), None
    except RuntimeError as err:
        if "Unknown model" in str(err):
            raise ValueError(f"timm has no model {args.model!r} (AFT models need aft_hub.timm_models).") from err
        raise


def data_transforms(model: nn.Module, args: argparse.Namespace):
    """timm's training and evaluation transforms at the model's input size, and the data config."""
    from timm.data import create_transform, resolve_model_data_config

    cfg = resolve_model_data_config(model)
    if args.img_size is not None:
        cfg["input_size"] = (cfg["input_size"][0], args.img_size, args.img_size)
    train_tf = create_transform(
        **cfg, is_training=True, scale=(args.crop_scale_min, 1.0), hflip=args.hflip, auto_augment=args.aa,
        re_prob=args.reprob,
    )
    eval_tf = create_transform(**cfg, is_training=False)
    return train_tf, eval_tf, cfg


@torch.no_grad()
def evaluate_top1(model: nn.Module, loader: DataLoader, info: DistInfo, dtype: torch.dtype) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy over the whole loader, summed over ranks."""
    model = unwrap(model)
    was_training = model.training
    model.eval()
    correct, loss, count = 0.0, 0.0, 0.0
    for x, y in loader:
        x, y = x.to(info.device, dtype), y.to(info.device)
        logits = _f32(model(x))
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += len(y)
    model.train(was_training)
    correct, loss, count = all_reduce_sum([correct, loss, count], info)
    return {"val_top1": 100.0 * correct / count, "val_loss": loss / count, "val_images": count}


class _TrainBatches:
    """``step -> accum micro-batches`` over a persistent, prefetching DataLoader."""

    def __init__(self, dataset, *, args, info: DistInfo, dtype: torch.dtype, collate=None) -> None:
        self.dataset, self.args, self.info, self.dtype = dataset, args, info, dtype
        self._it: Iterator | None = None
        self._next_step = -1

    def _loader(self, start_micro: int) -> Iterator:
        sampler = MicroBatchSampler(len(self.dataset), micro_batch=self.args.batch_size, info=self.info,
                                    seed=self.args.seed, start=start_micro)
        loader = DataLoader(self.dataset, batch_sampler=sampler, num_workers=self.args.workers,
                            pin_memory=self.info.device.type == "cuda", generator=torch.Generator(),
                            persistent_workers=False)
        return iter(loader)

    def close(self) -> None:
        """Stop the loader's worker processes."""
        self._it = None

    def __call__(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._it is None or step != self._next_step:
            self._it = self._loader(step * self.args.grad_accum)
        self._next_step = step + 1
        for _ in range(self.args.grad_accum):
            x, y = next(self._it)
            yield x.to(self.info.device, self.dtype, non_blocking=True), y.to(self.info.device, non_blocking=True)


def finetune_image(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune as the options say; returns the metrics (the folder is written by rank 0)."""
    _validate(args)
    bf16 = resolve_mixed_precision(args.mixed_precision) == "bf16"
    if args.dtype == "float64" and bf16:
        raise ValueError("--dtype float64 cannot run under bf16 mixed precision.")
    info = setup_distributed(args.device)
    try:
        return _finetune(args, info, bf16)
    finally:
        cleanup_distributed()


def _finetune(args: argparse.Namespace, info: DistInfo, bf16: bool) -> dict[str, Any]:
    from timm.data import Mixup
    from timm.loss import SoftTargetCrossEntropy

    out_dir = Path(args.out_dir)
    data: ImageSplits = load_image_data(args.data, limit_train=args.limit_train, limit_val=args.limit_val,
                                        **({"image_column": args.image_column, "label_column": args.label_column}
                                           if not args.data.startswith("fashion-mnist") and args.data != "digits"
                                           else {}))
    seed_everything(args.seed)  # identical initial weights on every rank
    model, conversion = build_image_model(args, len(data.classes))
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    model = model.to(dtype)
    if args.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise ValueError(f"{type(model).__name__} has no set_grad_checkpointing().")
        model.set_grad_checkpointing(True)
    model.to(info.device)
    train_tf, eval_tf, data_cfg = data_transforms(model, args)
    n_params = sum(p.numel() for p in model.parameters())

    global_batch = args.batch_size * args.grad_accum * info.world_size
    per_epoch = len(data.train) // (args.batch_size * info.world_size) // args.grad_accum
    if per_epoch < 1 and args.steps is None:
        raise ValueError(f"{len(data.train)} training images make less than one update of {global_batch}.")
    total = args.steps if args.steps is not None else max(1, math.ceil(args.epochs * per_epoch))

    optimizer = build_optimizer(model, lr=args.lr, weight_decay=args.weight_decay, betas=(args.beta1, args.beta2),
                                factory=args.opt_factory, opt=args.opt)
    schedule = build_schedule(optimizer, total_steps=total, warmup_steps=min(args.warmup, total - 1),
                              min_lr_ratio=args.min_lr_ratio, kind=args.sched)
    seed_everything(args.seed + 1 + info.rank)
    if info.distributed:
        ids = [info.device.index] if info.device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)

    mixup = None
    if args.mixup > 0 or args.cutmix > 0:
        mixup = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, prob=args.mixup_prob,
                      label_smoothing=args.smoothing, num_classes=len(data.classes))
        criterion: nn.Module = SoftTargetCrossEntropy()
    else:
        criterion = nn.CrossEntropyLoss(label_smoothing=args.smoothing)

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
        x, y = batch
        if mixup is not None:
            x, y = mixup(x, y)
        return criterion(_f32(m(x)), y), len(x)

    train_batches = _TrainBatches(SeededTransform(data.train, train_tf), args=args, info=info, dtype=dtype)
    val_loader = DataLoader(SeededTransform(data.val, eval_tf),
                            batch_sampler=EvalSampler(len(data.val), args.eval_batch_size, info),
                            num_workers=args.workers)

    def evaluate() -> dict[str, float]:
        return evaluate_top1(model, val_loader, info, dtype)

    def postfix(loss: float, last: dict[str, float]) -> dict[str, str]:
        d = {"loss": f"{loss:.3f}"}
        if "val_top1" in last:
            d["top1"] = f"{last['val_top1']:.2f}"
        return d

    run_config = {k: v for k, v in vars(args).items() if k != "func"}
    run_config.update(world_size=info.world_size, global_batch=global_batch, total_steps=total, bf16=bf16)
    loop = TrainLoop(
        model=model, optimizer=optimizer, schedule=schedule, info=info,
        cfg=LoopConfig(total_steps=total, accum=args.grad_accum, grad_clip=args.grad_clip, bf16=bf16,
                       eval_interval=args.eval_interval, ckpt_interval=args.ckpt_interval, stop_after=args.stop_after,
                       out_dir=out_dir, unit="img", progress=args.progress),
        run_config=run_config, micro_batches=train_batches, loss_fn=loss_fn, evaluate=evaluate, postfix=postfix,
    )
    if args.resume is not None:
        path = out_dir / "checkpoint.safetensors" if args.resume == "auto" else Path(args.resume)
        if path.exists():
            loop.resume(path, ignore=RESUME_MAY_CHANGE)
        elif args.resume != "auto":
            raise ValueError(f"--resume {args.resume}: no such checkpoint.")
    start = time.perf_counter()
    try:
        history = loop.fit()
    finally:
        train_batches.close()
    metrics: dict[str, Any] = {
        "step": loop.step,
        "total_steps": total,
        "finished": loop.finished,
        "epochs": loop.step * global_batch / len(data.train),
        "train_loss_last": history.train[-1]["loss"] if history.train else None,
        "images": history.units,
        "train_seconds": history.train_seconds,
        "images_per_second": loop.units_per_second,
        "params": n_params,
        "world_size": info.world_size,
        "data": data.name,
        "classes": data.classes,
        "train_images": len(data.train),
        "val_images_total": len(data.val),
        "input_size": list(data_cfg["input_size"]),
        "architecture": model_name(unwrap(model), args),
    }
    if conversion is not None:
        metrics["conversion"] = {"summary": conversion.summary(), "source": conversion.source,
                                 "target": conversion.target, "copied": len(conversion.copied),
                                 "initialised": len(conversion.initialised), "dropped": len(conversion.dropped)}
    if loop.finished:
        with autocast(info.device, bf16):
            metrics.update(evaluate())
        history.evals.append({"step": loop.step, "val_top1": metrics["val_top1"], "val_loss": metrics["val_loss"]})
        logger.info("final: top-1 %.2f %% on %d images", metrics["val_top1"], metrics["val_images"])
    metrics["wall_seconds"] = time.perf_counter() - start
    metrics["history"] = history.to_dict()
    metrics["config"] = run_config
    if info.is_main and loop.finished and args.publish:
        metrics["final_dir"] = str(_publish(unwrap(model), data, data_cfg, metrics, history, args, out_dir / "final"))
    return metrics


def model_name(model: nn.Module, args: argparse.Namespace) -> str:
    """A short name: the timm architecture (or the repo's last path part)."""
    arch = getattr(model, "pretrained_cfg", {}).get("architecture")
    return arch or args.model.split(":", 1)[-1].rstrip("/").split("/")[-1]


def _publish(model: nn.Module, data: ImageSplits, data_cfg: dict, metrics: dict[str, Any], history, args,
             folder: Path) -> Path:
    model = model.float()
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": tuple(data_cfg["input_size"]),
                            "num_classes": len(data.classes), "label_names": list(data.classes)}
    name = metrics["architecture"]
    dataset = {"fashion-mnist": "Fashion-MNIST", "digits": "scikit-learn digits"}.get(data.name, data.name)
    base = args.model.split(":", 1)[1] if args.model.startswith("hf-hub:") and not args.init_from_deit else None
    title = f"{name}-{Path(data.name).name}"
    card = card_info(
        title=title,
        training_data=(f"{dataset}: {metrics['train_images']:,} training images, {len(data.classes)} classes "
                       f"({', '.join(data.classes[:12])}{', ...' if len(data.classes) > 12 else ''}), at "
                       f"{data_cfg['input_size'][1]} x {data_cfg['input_size'][2]} through timm's transforms"),
        training_command=command_line(build_parser(), args, "python scripts/finetune_image.py"),
        base_model=base,
        conversion=metrics["conversion"]["summary"] if "conversion" in metrics else None,
        datasets=["zalando-datasets/fashion_mnist"] if data.name == "fashion-mnist" else
        ([data.name[3:]] if data.name.startswith("hf:") else None),
        eval_results=[eval_result(Path(data.name).name, dataset, "test" if data.name == "fashion-mnist" else
                                  "validation", "accuracy", metrics["val_top1"] / 100, "top-1 accuracy")],
    )
    return publish_folder(model, folder, kind="vision", card=card, metrics=metrics, history=history,
                          repo_id=args.repo_id or f"<your-org>/{title}", title=f"{name} on {dataset}")


def main(argv: Sequence[str] | None = None) -> int:
    """``finetune_image`` command line (see :mod:`aft_hub.train.cli`)."""
    from .cli import run_finetune_image

    return run_finetune_image(build_parser().parse_args(argv))
