"""Tiny files in the published layouts (AAN TSV, IMDb tarball, downsampled-ImageNet npz, released
Pathfinder directory; CIFAR-10 batches are :func:`zoo.data.images.synthetic_cifar10`), for tests
and toy runs on machines without the real data. The contents are synthetic but learnable."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import numpy as np

from zoo.data.images import synthetic_cifar10, write_png
from zoo.data.pathfinder import PathfinderStyle, generate


def write_aan(directory: str | Path, n: int = 12, seed: int = 0) -> Path:
    """new_aan_pairs.{train,eval,test}.tsv: label, id1, id2, text1, text2 (no header)."""
    directory = Path(directory)
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval", "test"):
        lines = []
        for i in range(n):
            label = i % 2
            a = "cites shared words " * int(rng.integers(1, 4))
            b = ("cites shared words " if label else "nothing in common ") * int(rng.integers(1, 4))
            lines.append(f"{float(label)}\tdoc{i}a\tdoc{i}b\t{a}\t{b}")
        (directory / f"new_aan_pairs.{split}.tsv").write_text("\n".join(lines) + "\n")
    return directory


def write_imdb(path: str | Path, per_class: int = 8) -> Path:
    """An aclImdb tarball (aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "test"):
            for polarity in ("pos", "neg"):
                for i in range(per_class):
                    data = (f"{polarity} " * 5).encode()
                    info = tarfile.TarInfo(f"aclImdb/{split}/{polarity}/{i}_5.txt")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return path


def write_imagenet(directory: str | Path, size: int = 8, n: int = 6, files: int = 2) -> Path:
    """train_data_batch_<k>.npz and val_data.npz with 'data' [n, 3 * size^2] and 'labels'."""
    directory = Path(directory)
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(1, files + 1):
        np.savez(
            directory / f"train_data_batch_{k}.npz",
            data=rng.integers(0, 256, (n, 3 * size * size), dtype=np.uint8),
            labels=rng.integers(1, 1001, n),
            mean=np.zeros(3 * size * size),
        )
    np.savez(
        directory / "val_data.npz",
        data=rng.integers(0, 256, (n, 3 * size * size), dtype=np.uint8),
        labels=rng.integers(1, 1001, n),
    )
    return directory


def write_pathfinder_release(directory: str | Path, n: int = 20, size: int = 32, contour_length: int = 6) -> Path:
    """A released-layout directory: metadata/0.npy text lines + imgs/0/sample_<i>.png."""
    directory = Path(directory)
    style = PathfinderStyle.for_size(size, contour_length)
    rng = random.Random(0)
    (directory / "metadata").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        label = i % 2
        write_png(directory / "imgs" / "0" / f"sample_{i}.png", generate(rng, style, bool(label)))
        lines.append(f"imgs/0 sample_{i}.png {i} {label} {contour_length} 1.5 2")
    (directory / "metadata" / "0.npy").write_text("\n".join(lines) + "\n")
    return directory


def write_lra_data_dir(root: str | Path, *, imdb: str | Path | None = None, cifar_per_batch: int = 1200) -> Path:
    """A ``data_dir`` holding every LRA file layout the lra_* experiments read by default:
    ``imdb/aclImdb_v1_labeled.tar.gz`` (a link to ``imdb`` when given, else tiny),
    ``lra_release/tsv_data/new_aan_pairs.*.tsv`` and ``cifar-10-batches-py`` (synthetic). Sizes leave
    training data beside the experiments' default hold-outs (1,000 reviews, 5,000 images)."""
    root = Path(root)
    tarball = root / "imdb" / "aclImdb_v1_labeled.tar.gz"
    if not tarball.exists():
        if imdb:
            tarball.parent.mkdir(parents=True, exist_ok=True)
            tarball.symlink_to(Path(imdb).resolve())
        else:
            write_imdb(tarball, per_class=600)
    write_aan(root / "lra_release" / "tsv_data", n=16)
    synthetic_cifar10(root / "cifar-10-batches-py", per_batch=cifar_per_batch)
    return root
