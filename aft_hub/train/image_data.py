"""Image-classification data for fine-tuning: Fashion-MNIST idx files, scikit-learn's bundled ``digits``, an image
folder, or an HF ``datasets`` image dataset; per-sample seeded augmentation and a step-indexed, rank-aware batch
sampler.

Every base dataset returns ``(PIL RGB image, int label)``; :class:`SeededTransform` applies timm's transform with
the python, numpy and torch generators seeded from ``(seed, epoch, position)``, so an image gets the same
augmentation whatever the process count, the number of data-loader workers, or where a run was resumed.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import random
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from .distributed import DistInfo

logger = logging.getLogger(__name__)

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "DIGITS_CLASSES",
    "ImageSplits",
    "ArrayImages",
    "read_idx",
    "load_fashion_mnist",
    "load_digits",
    "load_image_folder",
    "load_hf_images",
    "load_image_data",
    "SeededTransform",
    "MicroBatchSampler",
    "EvalSampler",
]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
DIGITS_CLASSES = tuple(str(d) for d in range(10))


@dataclass
class ImageSplits:
    """Train and validation datasets of ``(PIL image, label)`` and the class names."""

    train: Dataset
    val: Dataset
    classes: list[str]
    name: str


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (the MNIST format; gzip-compressed or not) into a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file (magic {raw[:4].hex()}).")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but holds {data.size} values.")
    return data.reshape(shape)


class ArrayImages(Dataset):
    """Grayscale or RGB images in a uint8 array (N, H, W[, 3]) with labels, returned as RGB PIL images."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels.")
        self.images, self.labels = images, labels.astype(np.int64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        arr = self.images[i]
        img = Image.fromarray(arr, "L" if arr.ndim == 2 else "RGB")
        return img.convert("RGB"), int(self.labels[i])


def _find(root: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (root / name).exists():
            return root / name
    raise ValueError(
        f"Fashion-MNIST file {stem}[.gz] not found in {root}. Install the Debian package: "
        "apt-get install dataset-fashion-mnist (files in /usr/share/datasets/fashion-mnist), or pass its folder."
    )


def load_fashion_mnist(root: str | os.PathLike = FASHION_MNIST_DIR, *, limit_train: int | None = None,
                       limit_val: int | None = None) -> ImageSplits:
    """Fashion-MNIST: 60,000 training and 10,000 test images (28 x 28 grayscale, 10 classes); the test set
    serves as validation. ``limit_*`` keep the first N images of a split."""
    root = Path(root)
    train = ArrayImages(read_idx(_find(root, "train-images-idx3-ubyte"))[:limit_train],
                        read_idx(_find(root, "train-labels-idx1-ubyte"))[:limit_train])
    val = ArrayImages(read_idx(_find(root, "t10k-images-idx3-ubyte"))[:limit_val],
                      read_idx(_find(root, "t10k-labels-idx1-ubyte"))[:limit_val])
    return ImageSplits(train, val, list(FASHION_MNIST_CLASSES), "fashion-mnist")


def load_digits(*, val_fraction: float = 0.2, seed: int = 0, limit_train: int | None = None,
                limit_val: int | None = None) -> ImageSplits:
    """scikit-learn's bundled handwritten digits (``sklearn.datasets.load_digits``, no download): 1,797 images of
    8 x 8 pixels, 10 classes, ink levels 0..16 scaled to 0..255. ``val_fraction`` of each class is held out, picked
    by a permutation seeded with ``seed``, so the split is stratified and the same on every machine; both splits
    keep the bundled order (which cycles through the digits). ``limit_*`` keep the first N images of a split. The
    images are small; timm's transforms resize them to the model's input size (and make them 3-channel)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ValueError("The 'digits' data needs scikit-learn (pip install scikit-learn).") from err
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}.")
    bunch = sklearn_digits()
    images = np.rint(np.asarray(bunch.images, dtype=np.float64) * (255 / 16)).clip(0, 255).astype(np.uint8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    rng = np.random.default_rng(seed)
    is_val = np.zeros(len(labels), dtype=bool)
    for c in range(len(DIGITS_CLASSES)):
        members = np.flatnonzero(labels == c)
        is_val[rng.permutation(members)[: int(round(len(members) * val_fraction))]] = True
    train_idx, val_idx = np.flatnonzero(~is_val)[:limit_train], np.flatnonzero(is_val)[:limit_val]
    return ImageSplits(ArrayImages(images[train_idx], labels[train_idx]),
                       ArrayImages(images[val_idx], labels[val_idx]), list(DIGITS_CLASSES), "digits")


class _Subset(Dataset):
    def __init__(self, base: Dataset, indices: Sequence[int]) -> None:
        self.base, self.indices = base, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.base[self.indices[i]]


def _holdout(base: Dataset, val_fraction: float, seed: int = 0) -> tuple[Dataset, Dataset]:
    n = len(base)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, int(round(n * val_fraction)))
    return _Subset(base, sorted(perm[n_val:])), _Subset(base, sorted(perm[:n_val]))


def load_image_folder(root: str | os.PathLike, *, val_fraction: float = 0.1) -> ImageSplits:
    """An image folder (``class_name/image.png``) read by timm's ``ImageDataset``. With ``train/`` and
    ``val/`` (or ``validation/``, ``test/``) sub-folders these are the splits; otherwise a fixed random
    ``val_fraction`` of the images is held out."""
    from timm.data import ImageDataset

    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"Image folder {root} does not exist.")
    val_dir = next((root / n for n in ("val", "validation", "test") if (root / n).is_dir()), None)
    if (root / "train").is_dir() and val_dir is not None:
        train, val = ImageDataset(str(root / "train")), ImageDataset(str(val_dir))
        classes = _folder_classes(train)
        if _folder_classes(val) != classes:
            raise ValueError(f"{root}/train and {val_dir} hold different class folders.")
    else:
        full = ImageDataset(str(root))
        classes = _folder_classes(full)
        train, val = _holdout(full, val_fraction)
    if len(classes) < 2:
        raise ValueError(f"Image folder {root} has {len(classes)} class folder(s); fine-tuning needs at least 2.")
    return ImageSplits(train, val, classes, str(root))


def _folder_classes(ds) -> list[str]:
    mapping = ds.reader.class_to_idx
    return [name for name, _ in sorted(mapping.items(), key=lambda kv: kv[1])]


class _HFImages(Dataset):
    def __init__(self, ds, image_col: str, label_col: str) -> None:
        self.ds, self.image_col, self.label_col = ds, image_col, label_col

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        row = self.ds[int(i)]
        img = row[self.image_col]
        if not isinstance(img, Image.Image):
            img = Image.fromarray(np.asarray(img))
        return img.convert("RGB"), int(row[self.label_col])


def load_hf_images(source: str, *, config: str | None = None, image_column: str | None = None,
                   label_column: str | None = None, val_fraction: float = 0.1) -> ImageSplits:
    """An HF ``datasets`` image-classification dataset: a ``save_to_disk`` directory or a name for
    ``load_dataset``. The image and label columns are found by name (``image``/``img``, ``label``/``labels``)
    unless given; the splits ``train`` and ``validation``/``test``, else a held-out fraction of ``train``."""
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ValueError("HF datasets sources need the 'datasets' package (pip install datasets).") from err
    path = Path(source)
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
    else:
        ds = datasets.load_dataset(source, config)
    if isinstance(ds, datasets.Dataset):
        ds = datasets.DatasetDict({"train": ds})
    if "train" not in ds:
        raise ValueError(f"Dataset {source!r} has no train split; its splits are {list(ds)}.")
    cols = ds["train"].column_names
    image_column = image_column or next((c for c in ("image", "img", "pixel_values") if c in cols), None)
    label_column = label_column or next((c for c in ("label", "labels", "fine_label") if c in cols), None)
    if image_column not in cols or label_column not in cols:
        raise ValueError(f"Dataset {source!r}: cannot find image/label columns among {cols}; pass them explicitly.")
    feature = ds["train"].features[label_column]
    if hasattr(feature, "names"):
        classes = list(feature.names)
    else:
        classes = [str(i) for i in range(int(max(ds["train"][label_column])) + 1)]
    val_name = next((n for n in ("validation", "valid", "val", "test") if n in ds), None)
    if val_name is not None:
        train, val = _HFImages(ds["train"], image_column, label_column), _HFImages(ds[val_name], image_column,
                                                                                     label_column)
    else:
        train, val = _holdout(_HFImages(ds["train"], image_column, label_column), val_fraction)
    return ImageSplits(train, val, classes, source)


def load_image_data(source: str, *, limit_train: int | None = None, limit_val: int | None = None,
                    **kwargs: Any) -> ImageSplits:
    """``fashion-mnist`` (or ``fashion-mnist:<folder of idx files>``), ``digits`` (scikit-learn's bundled 8 x 8
    digits, see :func:`load_digits`), an image folder, a datasets ``save_to_disk`` directory, or ``hf:<name>``."""
    if source == "fashion-mnist" or source.startswith("fashion-mnist:"):
        root = source.split(":", 1)[1] if ":" in source else FASHION_MNIST_DIR
        return load_fashion_mnist(root, limit_train=limit_train, limit_val=limit_val)
    if source == "digits":
        return load_digits(limit_train=limit_train, limit_val=limit_val)
    if source.startswith("hf:"):
        splits = load_hf_images(source[3:], **kwargs)
    elif Path(source).is_dir() and ((Path(source) / "dataset_dict.json").exists()
                                    or (Path(source) / "dataset_info.json").exists()):
        splits = load_hf_images(source, **kwargs)
    elif Path(source).is_dir():
        splits = load_image_folder(source, val_fraction=kwargs.get("val_fraction", 0.1))
    else:
        raise ValueError(
            f"Image data {source!r} is neither 'fashion-mnist', 'digits', an image folder, a datasets directory nor "
            "'hf:<name>'."
        )
    if limit_train is not None:
        splits.train = _Subset(splits.train, range(min(limit_train, len(splits.train))))
    if limit_val is not None:
        splits.val = _Subset(splits.val, range(min(limit_val, len(splits.val))))
    return splits


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    py, np_state, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)  # the CPU generator only: transforms run on the CPU
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(th)


class SeededTransform(Dataset):
    """``base[i]`` through ``transform``; keys ``(i, seed)`` seed every generator for that one sample (the
    caller's generator states are restored afterwards), a plain ``i`` does not."""

    def __init__(self, base: Dataset, transform: Callable[[Image.Image], torch.Tensor]) -> None:
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        if isinstance(key, tuple):
            i, seed = key
            img, label = self.base[i]
            with _seeded(seed):
                return self.transform(img), label
        img, label = self.base[key]
        return self.transform(img), label


def _mix(*values: int) -> int:
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
    return h % (2**63 - 1)


class MicroBatchSampler(Sampler[list[tuple[int, int]]]):
    """Endless micro-batches of ``(index, sample seed)`` keys, starting at global micro-batch ``start``.

    Each epoch is a permutation seeded by ``(seed, epoch)``; global micro-batch ``g`` covers positions
    ``[j * B * W, (j + 1) * B * W)`` of epoch ``g // per_epoch`` (``j = g % per_epoch``, the incomplete tail is
    dropped) and rank ``r`` takes the ``B`` positions from ``j * B * W + r * B``. With W processes of batch B the
    union of a micro-batch over ranks equals the single-process micro-batch of size ``B * W``.

    Args:
        n: dataset size.
        micro_batch: samples per micro-batch per process (B).
        info: process placement (W, r).
        seed: data seed.
        start: first global micro-batch (``step * accum`` when resuming).
        shuffle: permute each epoch (False: natural order).
    """

    def __init__(self, n: int, *, micro_batch: int, info: DistInfo, seed: int, start: int = 0,
                 shuffle: bool = True) -> None:
        self.n, self.B, self.W, self.r = n, micro_batch, info.world_size, info.rank
        self.seed, self.start, self.shuffle = seed, start, shuffle
        self.per_epoch = n // (micro_batch * info.world_size)
        if self.per_epoch < 1:
            raise ValueError(
                f"The training set ({n} images) is smaller than one global micro-batch "
                f"({micro_batch} x {info.world_size} processes)."
            )

    def _perm(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(_mix(self.seed, epoch))).tolist()

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        g = self.start
        epoch, perm = -1, []
        while True:
            e, j = divmod(g, self.per_epoch)
            if e != epoch:
                epoch, perm = e, self._perm(e)
            lo = j * self.B * self.W + self.r * self.B
            yield [(perm[p], _mix(self.seed, e, p, 1)) for p in range(lo, lo + self.B)]
            g += 1

    def __len__(self) -> int:  # endless; DataLoader only needs this for its own length
        return 2**62


class EvalSampler(Sampler[list[int]]):
    """Rank-strided batches over a whole evaluation set (indices ``r, r + W, ...``), no padding."""

    def __init__(self, n: int, batch_size: int, info: DistInfo) -> None:
        self.indices = list(range(info.rank, n, info.world_size))
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        for i in range(0, len(self.indices), self.batch_size):
            yield self.indices[i : i + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)
