"""Pathfinder and Path-X: are the two dots joined by one dashed contour?

Task: Linsley et al. 2018 ("Learning long-range spatial dependencies with horizontal gated
recurrent units", NeurIPS), used by the Long Range Arena (Tay et al. 2020, arXiv:2011.04006) at
32 x 32 (Pathfinder, 1,024 pixel tokens) and 128 x 128 (Path-X, 16,384). Each image holds two long
dashed contours, a few short distractor contours and two endpoint dots; the label says whether
both dots sit on the same contour. Difficulty grows with the contour length (the released sets:
6 "baseline", 9 and 14 paddles).

Generator (written from that description; our own code and geometry): a contour is a chain of
pixels, each an 8-neighbour of the previous, following a heading that turns by at most
``max_turn`` degrees per paddle (smooth, as the originals' "continuity"); it is drawn in dashes of
``paddle_length`` pixels with one blank pixel between dashes. Every pixel of a contour (and of its
dots) keeps a Chebyshev distance of at least ``margin + 1`` = 3 from every other contour, so two
contours never touch, while within a contour the drawn pixels are never more than 2 apart. Hence
"connected" has a pixel-level meaning the tests check with a flood fill: the dots are joined by a
path of lit pixels with steps of Chebyshev distance <= 2 (jumping a dash gap) iff the label is 1.
Both classes draw the same things (two long contours, the same distractors, two dots), so only
the connection tells them apart. Labels are balanced in every batch; (seed, split, index) fix the
images. Deviations from the released images: binary intensities (no anti-aliasing or contrast
jitter) and pixel-chain paddles instead of rendered rotated bars.

Released layout (``data.path``): a directory such as ``pathfinder32/curv_contour_length_14`` with
``metadata/*.npy`` (text, one image per line: ``<dir> <file> <index> <label> ...``) and the PNGs
under ``<dir>/<file>``. Lines are read in sorted metadata-file order and split 80 / 10 / 10 into
train / val / test; PNGs are read on demand (Pillow).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import TASK, DataFileNotFound, Task, check_split, find_directory, seed_int
from zoo.data.images import check_raster, read_png

MARGIN = 2  # blank pixels (Chebyshev) kept between different contours, at least
JUMP = 2  # the largest Chebyshev step inside one contour (across a one-pixel dash gap)


@dataclass
class PathfinderStyle:
    """Geometry of generated images; :meth:`for_size` scales the 32 x 32 defaults."""

    size: int = 32
    contour_length: int = 14  # paddles per long contour: the difficulty knob (6, 9, 14 released)
    paddle_length: int = 2  # lit pixels per dash
    distractor_length: int = 4  # paddles per distractor contour
    n_distractors: int = 4
    max_turn: float = 30.0  # degrees the heading may turn per paddle
    marker_radius: float = 1.5

    @classmethod
    def for_size(cls, size: int, contour_length: int = 14) -> PathfinderStyle:
        scale = size / 32
        return cls(
            size=size,
            contour_length=contour_length,
            paddle_length=max(2, round(2 * scale)),
            distractor_length=max(2, contour_length // 3),
            n_distractors=max(1, round(4 * scale)),
            marker_radius=max(1.0, 1.5 * scale**0.5),
        )


class _Canvas:
    """Lit pixels, and each pixel's zone: 0 free, k = within the margin of contour k only, -1 =
    within the margin of two contours (no contour may take it then)."""

    def __init__(self, size: int):
        self.size = size
        self.zone = np.zeros((size, size), dtype=np.int16)
        self.lit = np.zeros((size, size), dtype=bool)

    def free_for(self, y: int, x: int, owner: int) -> bool:
        return 0 <= y < self.size and 0 <= x < self.size and int(self.zone[y, x]) in (0, owner)

    def claim(self, pixels: list[tuple[int, int]], owner: int, lit: list[tuple[int, int]]) -> None:
        for y, x in pixels:
            window = self.zone[max(0, y - MARGIN) : y + MARGIN + 1, max(0, x - MARGIN) : x + MARGIN + 1]
            other = (window != 0) & (window != owner)
            window[window == 0] = owner
            window[other] = -1
        for y, x in lit:
            self.lit[y, x] = True


def _grow(
    rng: random.Random,
    canvas: _Canvas,
    owner: int,
    n_paddles: int,
    paddle_length: int,
    max_turn: float,
    tries: int = 40,
) -> list[tuple[int, int]] | None:
    """A contour's pixel chain (n_paddles dashes and the gaps between them), or None."""
    period = paddle_length + 1
    n_pixels = n_paddles * period - 1  # ends on a lit pixel
    for _ in range(tries):
        y, x = rng.randrange(canvas.size), rng.randrange(canvas.size)
        if not canvas.free_for(y, x, owner):
            continue
        heading = rng.uniform(0, 2 * math.pi)
        fy, fx = float(y), float(x)
        path, taken = [(y, x)], {(y, x)}
        while len(path) < n_pixels:
            if len(path) % period == 0:  # a new paddle: turn a little
                heading += math.radians(rng.uniform(-max_turn, max_turn))
            moved = False
            sign = rng.choice((-1, 1))
            for bend in (0, 1, -1, 2, -2, 3, -3):  # blocked ahead: steer up to 3 x 15 degrees aside
                trial = heading + sign * math.radians(15 * bend)
                dy, dx = math.sin(trial), math.cos(trial)
                step = max(abs(dy), abs(dx))  # a Chebyshev-unit step: always an 8-neighbour
                ny, nx = round(fy + dy / step), round(fx + dx / step)
                if (ny, nx) not in taken and canvas.free_for(ny, nx, owner):
                    heading, fy, fx, moved = trial, fy + dy / step, fx + dx / step, True
                    break
            if not moved:
                break
            path.append((ny, nx))
            taken.add((ny, nx))
        if len(path) == n_pixels:
            return path
    return None


def _disc(cy: int, cx: int, radius: float, size: int) -> list[tuple[int, int]]:
    r = int(math.ceil(radius))
    return [
        (cy + dy, cx + dx)
        for dy in range(-r, r + 1)
        for dx in range(-r, r + 1)
        if dy * dy + dx * dx <= radius * radius + 1e-9 and 0 <= cy + dy < size and 0 <= cx + dx < size
    ]


def generate(rng: random.Random, style: PathfinderStyle, connected: bool, max_tries: int = 200) -> np.ndarray:
    """One [size, size] uint8 image (0 / 255) whose dots are joined iff ``connected``."""
    period = style.paddle_length + 1
    for _ in range(max_tries):
        canvas = _Canvas(style.size)
        contours = []
        for owner in (1, 2):  # the two long contours
            path = _grow(rng, canvas, owner, style.contour_length, style.paddle_length, style.max_turn)
            if path is None:
                break
            contours.append(path)
            canvas.claim(path, owner, [p for i, p in enumerate(path) if i % period != style.paddle_length])
        if len(contours) < 2:
            continue
        ends = [(1, contours[0][0]), (1, contours[0][-1])] if connected else [(1, contours[0][0]), (2, contours[1][-1])]
        discs = [(owner, _disc(*end, style.marker_radius, style.size)) for owner, end in ends]
        whole = len(_disc(style.size, style.size, style.marker_radius, 3 * style.size))
        if any(len(disc) < whole for _, disc in discs):  # a dot cut by the border: draw again
            continue
        placed = True
        for owner, disc in discs:  # one at a time, so the second dot also keeps clear of the first
            placed = placed and all(canvas.free_for(y, x, owner) for y, x in disc)
            if placed:
                canvas.claim(disc, owner, disc)
        if not placed:
            continue
        for k in range(style.n_distractors):  # best effort: a crowded canvas may take fewer
            path = _grow(rng, canvas, 3 + k, style.distractor_length, style.paddle_length, style.max_turn, tries=10)
            if path is not None:
                canvas.claim(path, 3 + k, [p for i, p in enumerate(path) if i % period != style.paddle_length])
        image = canvas.lit.astype(np.uint8) * 255
        return image
    raise RuntimeError(
        f"could not place two contours of {style.contour_length} paddles in {style.size} x {style.size} "
        f"after {max_tries} tries; lower data.contour_length"
    )


def generate_batch(
    seed: int, split: str, index: int, batch_size: int, style: PathfinderStyle, rank: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(images [b, S, S] uint8, labels [b]) with labels balanced (within one of half)."""
    rng = random.Random(seed_int(seed, "pathfinder", split, index, rank))
    labels = [(i + index) % 2 for i in range(batch_size)]
    rng.shuffle(labels)
    images = np.stack([generate(rng, style, bool(label)) for label in labels])
    return images, np.asarray(labels, dtype=np.int64)


def read_metadata(directory: Path) -> list[tuple[Path, int]]:
    """(PNG path, label) per line of every ``metadata/*.npy`` file, in sorted file order."""
    files = sorted((directory / "metadata").glob("*.npy"))
    if not files:
        raise DataFileNotFound(
            f"{directory / 'metadata'} holds no *.npy files (data.path must be a released pathfinder "
            "directory such as pathfinder32/curv_contour_length_14)"
        )
    rows = []
    for path in files:
        for line_no, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise ValueError(
                    f"{path}:{line_no}: expected '<dir> <file> <index> <label 0|1> ...', got {line[:80]!r}"
                )
            rows.append((directory / fields[0] / fields[1], int(fields[3])))
    return rows


@TASK.register("pathfinder")
class PathfinderTask(Task):
    """Pathfinder / Path-X (LRA): binary classification of images as pixel sequences, generated by our
    seeded generator when data.path is empty, else read from a released directory
    (.../pathfinder32/curv_contour_length_14: metadata/*.npy + PNGs). trainer.seq_len must be
    image_size^2 (1024 for 32, 16384 for Path-X's 128)."""

    kind = "classifier"
    metric = "accuracy"
    vocab_size = 256
    n_classes = 2
    FRACTIONS = (0.8, 0.1, 0.1)  # released layout: train / val / test in metadata order

    @dataclass
    class Options:
        path: str = ""  # "" = generate; else the released directory (.../curv_contour_length_14)
        image_size: int = 32  # 32 (Pathfinder) or 128 (Path-X); any size >= 16 generates
        contour_length: int = 14  # paddles per long contour (generator difficulty)
        eval_size: int = 2000  # generated images per val/test split

        def __post_init__(self) -> None:
            require(self.image_size >= 16, f"data.image_size must be >= 16, got {self.image_size}")
            require(
                2 <= self.contour_length <= 64, f"data.contour_length must be in [2, 64], got {self.contour_length}"
            )
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        size = self.options.image_size
        require(
            self.seq_len == size * size,
            f"data 'pathfinder' at image_size={size} is {size * size} pixel tokens; set "
            f"trainer.seq_len={size * size} (got {self.seq_len})",
        )
        self.style = PathfinderStyle.for_size(size, self.options.contour_length)
        self.rows: dict[str, list[tuple[Path, int]]] | None = None
        if self.options.path:
            rows = read_metadata(find_directory(self.options.path))
            n_train, n_val = int(len(rows) * self.FRACTIONS[0]), int(len(rows) * self.FRACTIONS[1])
            self.rows = {
                "train": rows[:n_train],
                "val": rows[n_train : n_train + n_val],
                "test": rows[n_train + n_val :],
            }
            for split, part in self.rows.items():
                require(
                    len(part) > 0, f"{self.options.path}: {len(rows)} images leave the {split} split empty (80/10/10)"
                )
            self._read(self.rows["train"][0][0])  # a wrong size or a missing file fails now, not mid-run

    def check_model(self, config) -> None:
        check_raster(config, "pathfinder", self.options.image_size, self.options.image_size)

    def _read(self, path: Path) -> np.ndarray:
        if not path.is_file():
            raise DataFileNotFound(f"pathfinder image missing: {path} (listed in metadata under data.path)")
        image = read_png(path)
        size = self.options.image_size
        require(
            image.shape == (size, size), f"{path} is {image.shape[0]} x {image.shape[1]} but data.image_size={size}"
        )
        return image

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split)
        if split == "train":
            return None
        n = len(self.rows[split]) if self.rows is not None else self.options.eval_size
        return max(1, n // (self.batch_size * world_size))

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split)
        if self.rows is None:
            images, labels = generate_batch(self.seed, split, index * world_size + rank, self.batch_size, self.style)
        else:
            rows = self.rows[split]
            start = index * self.batch_size * world_size + rank * self.batch_size
            order = range(start, start + self.batch_size)
            if split == "train":  # a seeded permutation per epoch
                epoch = start // len(rows)
                perm = np.random.default_rng(seed_int(self.seed, "pathfinder-train", epoch) % 2**32).permutation(
                    len(rows)
                )
                order = [perm[i % len(rows)] for i in order]
            picked = [rows[i % len(rows)] for i in order]
            images = np.stack([self._read(path) for path, _ in picked])
            labels = np.asarray([label for _, label in picked], dtype=np.int64)
        tokens = torch.from_numpy(images.reshape(len(images), -1).astype(np.int64))
        return {
            "tokens": tokens,
            "targets": torch.from_numpy(labels),
            "pad_mask": torch.ones_like(tokens, dtype=torch.bool),
        }
