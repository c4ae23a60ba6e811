"""Downsampled ImageNet (Chrabaszcz et al. 2017, arXiv:1707.08819; van den Oord et al. 2016) as pixel
sequences for density modelling: ``train_data_batch_1..10.npz`` and ``val_data.npz``, each with ``data``
[n, 3 * S * S] uint8 (channel planes) and ``labels``; S = ``data.image_size`` (64: 12,288 dimensions; the 32,
16 and 8 releases share the layout). Train batches are read one file at a time (a 64 x 64 file is about
1.5 GB), walking the files in a seeded order with a seeded permutation inside each. The release has no
third split, so ``val`` and ``test`` both read ``val_data.npz`` (the split the papers report). The task
contract, the start token and bits/dim are those of the CIFAR-10 language model (``images.py``).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import TASK, DataFileNotFound, check_split, find_directory, seeded_generator
from zoo.data.images import ImageLMTask, interleave_channels

_TRAIN_NPZ = re.compile(r"^train_data_batch_(\d+)\.npz$")


def npz_shape(path: Path, key: str) -> tuple[int, ...]:
    """The shape of array ``key`` in an .npz without loading it (reads the .npy header only)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n[: -len(".npy")] for n in archive.namelist() if n.endswith(".npy")]
            if key not in names:
                raise ValueError(
                    f"{path} has no {key!r} array (found {', '.join(sorted(names)) or 'none'}); expected the "
                    "downsampled-ImageNet keys 'data' and 'labels'"
                )
            with archive.open(f"{key}.npy") as f:
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, _, _ = read_header(f)
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not an .npz archive") from None
    return tuple(shape)


def read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        for key in ("data", "labels"):
            if key not in archive.files:
                raise ValueError(f"{path} has no {key!r} array (found {', '.join(archive.files)})")
        return np.asarray(archive["data"], dtype=np.uint8), np.asarray(archive["labels"], dtype=np.int64)


@TASK.register("imagenet64")
class ImageNet64Task(ImageLMTask):
    """Downsampled ImageNet (train_data_batch_*.npz + val_data.npz) as pixel sequences (channels
    interleaved) in bits per dimension; image_size 64 needs trainer.seq_len=12288 (the 32/16/8
    releases: 3 x size^2)."""

    data_dir_path = "imagenet64"

    @dataclass
    class Options:
        path: str = ""  # the directory of train_data_batch_*.npz and val_data.npz
        image_size: int = 64  # 64 (12,288 dimensions); the 32/16/8 releases share the layout

        def __post_init__(self) -> None:
            require(
                self.image_size in (8, 16, 32, 64),
                f"data.image_size must be 8, 16, 32 or 64 (the downsampled-ImageNet releases), got {self.image_size}",
            )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.image_size = self.options.image_size
        self.check_length()
        directory = find_directory(self.options.path)
        numbered = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _TRAIN_NPZ.match(p.name)))
        if not numbered:
            raise DataFileNotFound(
                f"{directory} holds no train_data_batch_<k>.npz files (data.path must be the "
                "downsampled-ImageNet directory)"
            )
        expected = list(range(1, numbered[-1][0] + 1))
        if [k for k, _ in numbered] != expected:
            gaps = sorted(set(expected) - {k for k, _ in numbered})
            raise DataFileNotFound(
                f"{directory} lacks train_data_batch_{', train_data_batch_'.join(map(str, gaps))}.npz"
            )
        self.train_files = [p for _, p in numbered]
        val = directory / "val_data.npz"
        if not val.is_file():
            raise DataFileNotFound(
                f"{directory} lacks val_data.npz (data.path must be the downsampled-ImageNet directory)"
            )
        dims = 3 * self.image_size**2
        self.counts = []
        for path in self.train_files + [val]:
            shape = npz_shape(path, "data")
            npz_shape(path, "labels")
            require(
                len(shape) == 2 and shape[1] == dims,
                f"{path}: 'data' is {list(shape)} but data.image_size={self.image_size} needs [n, {dims}]",
            )
            self.counts.append(shape[0])
        self.val_pixels = interleave_channels(read_npz(val)[0], self.image_size)
        self._cache: dict[int, Tensor] = {}

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split)
        return None if split == "train" else max(1, len(self.val_pixels) // (self.batch_size * world_size))

    def _train_file(self, k: int) -> Tensor:
        if k not in self._cache:
            self._cache.clear()  # one file in memory at a time
            self._cache[k] = interleave_channels(read_npz(self.train_files[k])[0], self.image_size)
        return self._cache[k]

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split)
        if split != "train":
            n = len(self.val_pixels)
            pick = (torch.arange(self.batch_size) + index * self.batch_size * world_size + rank * self.batch_size) % n
            return self.lm_batch(self.val_pixels[pick])
        counts = self.counts[:-1]
        total, rows = sum(counts), self.batch_size * world_size
        epoch, position = divmod(index, max(1, total // rows))
        file_order = torch.randperm(
            len(counts), generator=seeded_generator(self.seed, "imagenet64-files", epoch)
        ).tolist()
        starts = np.cumsum([0] + [counts[k] for k in file_order])
        out, perms = [], {}
        for p in ((torch.arange(self.batch_size) + position * rows + rank * self.batch_size) % total).tolist():
            slot = int(np.searchsorted(starts, p, side="right")) - 1
            k = file_order[slot]
            if k not in perms:
                perms[k] = torch.randperm(counts[k], generator=seeded_generator(self.seed, "imagenet64-rows", epoch, k))
            out.append(self._train_file(k)[perms[k][p - starts[slot]]])
        return self.lm_batch(torch.stack(out))
