"""Pixels to and from files and pictures: PNG read/write (Pillow, a matplotlib dependency), intensity
sequences back to images, and sample grids (``experiments/sample.py``, Pathfinder's PNG layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import Tensor


def tokens_to_image(values: Tensor | np.ndarray, size: int) -> np.ndarray:
    """[S * S * 3] intensities (channels interleaved) -> [S, S, 3] uint8 (ids past 255 clipped)."""
    values = np.clip(np.asarray(values, dtype=np.int64), 0, 255).astype(np.uint8)
    return values.reshape(size, size, 3)


def image_grid(rows: list[list[np.ndarray]], gap: int = 2, scale: int = 2) -> np.ndarray:
    """Images [S, S, 3] arranged in rows (white gaps), each pixel repeated ``scale`` x ``scale``."""
    size = rows[0][0].shape[0] * scale
    columns = max(len(r) for r in rows)
    grid = np.full((len(rows) * (size + gap) + gap, columns * (size + gap) + gap, 3), 255, dtype=np.uint8)
    for i, row in enumerate(rows):
        for j, image in enumerate(row):
            y, x = gap + i * (size + gap), gap + j * (size + gap)
            grid[y : y + size, x : x + size] = image.repeat(scale, 0).repeat(scale, 1)
    return grid


def write_png(path: str | Path, pixels: np.ndarray) -> Path:
    """Save an [H, W] or [H, W, 3] uint8 array as PNG (Pillow, a matplotlib dependency)."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(path)
    return path


def read_png(path: str | Path) -> np.ndarray:
    """A PNG as an [H, W] uint8 grayscale array (Pillow)."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("L"), dtype=np.uint8)
