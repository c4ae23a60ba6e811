"""Images read in their published layouts, as pixel sequences.

- ``cifar10``: CIFAR-10 (Krizhevsky 2009) for density modelling, as in the Image Transformer
  (Parmar et al. 2018, arXiv:1802.05751) and the Sparse Transformer (Child et al. 2019,
  arXiv:1904.10509): each 32 x 32 RGB image is 3,072 intensities with the channels interleaved in
  raster order (R, G, B of pixel 0, then pixel 1, ...), a language model over 256 values, scored in
  bits per dimension. Layout read: the python version's directory ``cifar-10-batches-py`` with the
  pickle batches ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` (dicts with ``b'data'``
  [10000, 3072] uint8, channel planes R | G | B each row-major, and ``b'labels'``).
- ``imagenet64`` (``imagenet64.py``): downsampled ImageNet (Chrabaszcz et al. 2017, arXiv:1707.08819; van den Oord et
  al. 2016): ``train_data_batch_1..10.npz`` and ``val_data.npz``, each with ``data`` [n, 3 * S * S]
  uint8 (channel planes) and ``labels``; S = ``data.image_size`` (64: 12,288 dimensions; the 32, 16
  and 8 releases share the layout). Train batches are read one file at a time (a 64 x 64 file is
  about 1.5 GB), walking the files in a seeded order with a seeded permutation inside each.
- ``cifar10_gray``: the Long Range Arena "Image" task (Tay et al. 2020, arXiv:2011.04006): CIFAR-10
  converted to 8-bit grayscale (ITU-R 601 luma weights 0.2989, 0.5870, 0.1140; TensorFlow's conversion back
  to 8 bits, x 255.5 truncated, as LRA's pipeline: ``to_grayscale``), the 1,024
  pixels as tokens, 10-way classification.

Deviations: the language models see a start token (id 256) before the first intensity, so every one
of the 3 * S * S dimensions is predicted and bits/dim averages over all of them (vocabulary 257;
the start id is never a target). ``val`` is a seeded hold-out of ``val_size`` training images for
CIFAR-10 (``test`` is ``test_batch``); downsampled ImageNet releases no third split, so its ``val``
and ``test`` both read ``val_data.npz`` (the split the papers report).

The pickle batches are unpickled with an allowlist (numpy arrays, dtypes, plain containers only):
reading a data file never runs code from it.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from einops import rearrange
from torch import Tensor

from zoo.attention.base import ATTENTION
from zoo.config import require
from zoo.data.base import TASK, DataFileNotFound, Task, check_split, find_directory, seeded_generator
from zoo.data.pixels import image_grid, read_png, tokens_to_image, write_png

CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
START = 256  # the start token of the image language models
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)


class _DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers; refuses any other global (no code runs)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a data batch holds only arrays, lists and dicts"
        )


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(data [n, 3072] uint8 channel planes, labels [n]) of one CIFAR-10 python pickle batch."""
    if not path.is_file():
        raise DataFileNotFound(
            f"CIFAR-10 batch file missing: {path} (data.path must be the cifar-10-batches-py directory with "
            f"{', '.join(CIFAR_TRAIN)}, {CIFAR_TEST})"
        )
    with open(path, "rb") as f:
        try:
            batch = _DataOnlyUnpickler(f, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise ValueError(f"{path} is not a CIFAR-10 python batch: {exc}") from None
    if not isinstance(batch, dict):
        raise ValueError(
            f"{path} is not a CIFAR-10 python batch (expected a dict with b'data' and b'labels', got "
            f"{type(batch).__name__})"
        )
    for key in (b"data", b"labels"):
        if key not in batch:
            raise ValueError(f"{path} has no {key!r} key (found {sorted(batch)}); is it a CIFAR-10 python batch?")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    require(
        data.ndim == 2 and data.shape[1] == 3072,
        f"{path}: b'data' must be [n, 3072] (32 x 32 x 3), got {list(data.shape)}",
    )
    require(len(labels) == len(data), f"{path}: {len(data)} images but {len(labels)} labels")
    return data, labels


def read_cifar10(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train": (data, labels) of the five training batches, "test": test_batch}."""
    directory = find_directory(path)
    missing = [name for name in CIFAR_TRAIN + (CIFAR_TEST,) if not (directory / name).is_file()]
    if missing:
        raise DataFileNotFound(
            f"{directory} lacks the CIFAR-10 batch file(s) {', '.join(missing)} (data.path must be the "
            "cifar-10-batches-py directory)"
        )
    train = [read_cifar_batch(directory / name) for name in CIFAR_TRAIN]
    return {
        "train": (np.concatenate([d for d, _ in train]), np.concatenate([lab for _, lab in train])),
        "test": read_cifar_batch(directory / CIFAR_TEST),
    }


def interleave_channels(planes: np.ndarray | Tensor, size: int) -> Tensor:
    """[n, 3 * S * S] channel planes -> [n, S * S * 3]: R, G, B of each pixel in raster order."""
    return rearrange(torch.as_tensor(planes), "n (c h w) -> n (h w c)", c=3, h=size, w=size)


def to_grayscale(planes: np.ndarray, size: int) -> Tensor:
    """[n, 3 * S * S] uint8 channel planes -> [n, S * S] uint8 luma, as LRA's pipeline makes it:
    ``tf.image.rgb_to_grayscale`` on uint8 scales to [0, 1] (x / 255, float32), takes the weighted sum and
    converts back by ``convert_image_dtype``, which multiplies by 255.5 and truncates (not a rounding: a
    luma of 100.6 becomes 100). Checked pixel for pixel against TensorFlow (results/lra_nystromformer)."""
    rgb = rearrange(torch.as_tensor(planes).float() * (1.0 / 255.0), "n (c p) -> n c p", c=3)
    r, g, b = (rgb[:, k] * weight for k, weight in enumerate(GRAY_WEIGHTS))
    luma = r + g + b  # float32, summed in channel order
    return (luma * 255.5).clamp(0, 255).to(torch.uint8)  # the cast truncates


def split_holdout(n: int, val_size: int, seed: int, name: str) -> tuple[Tensor, Tensor]:
    """(train rows, val rows): a seeded hold-out of ``val_size`` of ``n`` rows."""
    require(0 < val_size < n, f"data.val_size must be in [1, {n - 1}] for {n} training images, got {val_size}")
    order = torch.randperm(n, generator=seeded_generator(seed, f"{name}-val"))
    return order[val_size:].sort().values, order[:val_size].sort().values


def check_raster(config: Any, data: str, rows: int, width: int) -> None:
    """Refuse an attention whose layout does not read the image raster (rows x width) as it is: the
    mechanism says (``Attention.check_layout``; local_2d checks its width and height)."""
    options = dict(config.attention)
    ATTENTION.get(options.pop("name")).check_layout(options, rows=rows, width=width, data=data)


class ImageTask(Task):
    """Shared batching over in-memory image splits: ``self.splits[split] = (rows [n, t], labels)``."""

    image_size: int = 32
    raster_width: int = 32  # columns of the raster a 2D attention must see (3 x S for RGB)

    def check_model(self, config: Any) -> None:
        check_raster(config, self.registry_name, self.seq_len // self.raster_width, self.raster_width)

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split)
        if split == "train":
            return None
        return max(1, len(self.splits[split][1]) // (self.batch_size * world_size))

    def pick(self, split: str, index: int, rank: int, world_size: int) -> Tensor:
        n, rows = len(self.splits[split][1]), self.batch_size * world_size
        offset = torch.arange(self.batch_size) + rank * self.batch_size
        if split != "train":
            return (offset + index * rows) % n
        epoch, position = divmod(index, max(1, n // rows))
        perm = torch.randperm(n, generator=seeded_generator(self.seed, f"{self.registry_name}-train", epoch))
        return perm[(offset + position * rows) % n]


class ImageLMTask(ImageTask):
    """A language model over an image's intensities (start token + 3 * S * S values)."""

    kind = "lm"
    metric = "bpd"
    vocab_size = 257

    def check_length(self) -> None:
        dims = 3 * self.image_size**2
        self.raster_width = 3 * self.image_size
        require(
            self.seq_len == dims,
            f"data {self.registry_name!r} models {self.image_size} x {self.image_size} x 3 = {dims} "
            f"dimensions per image; set trainer.seq_len={dims} (got {self.seq_len})",
        )

    def lm_batch(self, pixels: Tensor) -> dict[str, Tensor]:
        """[b, D] uint8 intensities -> tokens [START, x_0 .. x_{D-2}], targets x_0 .. x_{D-1}."""
        targets = pixels.long()
        start = torch.full((len(targets), 1), START, dtype=torch.long)
        return {"tokens": torch.cat([start, targets[:, :-1]], dim=1), "targets": targets}

    def decode(self, tokens: list[int]) -> str:
        return " ".join(str(int(t)) if int(t) != START else "<start>" for t in tokens)

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split)
        return self.lm_batch(self.splits[split][0][self.pick(split, index, rank, world_size)])


@TASK.register("cifar10")
class CIFAR10Task(ImageLMTask):
    """CIFAR-10 pixels as a 3,072-token sequence (channels interleaved in raster order), scored in bits
    per dimension; read from the python pickle batches (data.path = the cifar-10-batches-py directory).
    Needs trainer.seq_len=3072 (see experiment=paper/image_transformer_cifar10, paper/sparse_cifar10)."""

    data_dir_path = "cifar-10-batches-py"

    @dataclass
    class Options:
        path: str = ""  # the cifar-10-batches-py directory
        val_size: int = 5000  # training images held out for validation

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.check_length()
        raw = read_cifar10(self.options.path)
        data, labels = raw["train"]
        train, val = split_holdout(len(data), self.options.val_size, self.seed, "cifar10")
        pixels = interleave_channels(data, 32)
        self.splits = {
            "train": (pixels[train], torch.as_tensor(labels)[train]),
            "val": (pixels[val], torch.as_tensor(labels)[val]),
            "test": (interleave_channels(raw["test"][0], 32), torch.as_tensor(raw["test"][1])),
        }


@TASK.register("cifar10_gray")
class CIFAR10GrayTask(ImageTask):
    """LRA "Image": CIFAR-10 in 8-bit grayscale, 1,024 pixel tokens, 10 classes; read from the python
    pickle batches (data.path = the cifar-10-batches-py directory). Needs trainer.seq_len=1024."""

    data_dir_path = "cifar-10-batches-py"

    kind = "classifier"
    metric = "accuracy"
    vocab_size = 256
    n_classes = 10

    @dataclass
    class Options:
        path: str = ""  # the cifar-10-batches-py directory
        val_size: int = 5000  # training images held out for validation (LRA trains on 45,000)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        require(
            self.seq_len == 1024,
            f"data 'cifar10_gray' is 32 x 32 = 1024 grayscale pixels; set trainer.seq_len=1024 (got {self.seq_len})",
        )
        raw = read_cifar10(self.options.path)
        data, labels = raw["train"]
        train, val = split_holdout(len(data), self.options.val_size, self.seed, "cifar10_gray")
        gray, labels = to_grayscale(data, 32), torch.as_tensor(labels)
        self.splits = {
            "train": (gray[train], labels[train]),
            "val": (gray[val], labels[val]),
            "test": (to_grayscale(raw["test"][0], 32), torch.as_tensor(raw["test"][1])),
        }

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split)
        pixels, labels = self.splits[split]
        pick = self.pick(split, index, rank, world_size)
        tokens = pixels[pick].long()
        return {"tokens": tokens, "targets": labels[pick], "pad_mask": torch.ones_like(tokens, dtype=torch.bool)}


def synthetic_cifar10(directory: str | Path, per_batch: int = 1000, seed: int = 0) -> Path:
    """Write a CIFAR-10-shaped synthetic set in the published pickle layout (``data_batch_1..5``,
    ``test_batch``), for runs and tests where the real files are absent.

    Class k is a sinusoidal grating at angle 18k degrees, with a class colour tint, random phase,
    frequency jitter and pixel noise: learnable in grayscale, visible in a sample grid."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    tints = np.stack([np.roll([1.0, 0.6, 0.3], k % 3) for k in range(10)]) * np.linspace(1.0, 0.6, 10)[:, None]
    for name in CIFAR_TRAIN + (CIFAR_TEST,):
        labels = rng.integers(0, 10, per_batch)
        angle = np.deg2rad(18.0 * labels)[:, None, None]
        freq = rng.uniform(0.35, 0.5, (per_batch, 1, 1))
        phase = rng.uniform(0, 2 * np.pi, (per_batch, 1, 1))
        wave = 0.5 + 0.5 * np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)  # [n, 32, 32]
        rgb = wave[:, None] * tints[labels][:, :, None, None] * 255 + rng.normal(0, 12, (per_batch, 3, 32, 32))
        data = np.clip(rgb, 0, 255).astype(np.uint8).reshape(per_batch, 3072)  # channel planes, as released
        with open(directory / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels.tolist(), b"data": data}, f, protocol=2)
    return directory



__all__ = [
    "CIFAR10GrayTask",
    "CIFAR10Task",
        "image_grid",
    "interleave_channels",
    "read_cifar10",
    "read_png",
    "to_grayscale",
    "tokens_to_image",
    "write_png",
]
