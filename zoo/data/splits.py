"""Corpora shipped as separate train / validation / test files, read in their published layout.

``find_split_files(directory)`` picks, for each split, the one file whose name contains ``train``,
``valid`` (or ``val``, or ``dev``) or ``test``; a missing or ambiguous split is refused with the
directory's listing. ``named_split_files(directory, names)`` takes fixed names (WikiText's
``wiki.train.tokens``, PTB's ``ptb.train.txt``) and names the first one missing.

``read_char_splits`` gives ``data=char_lm data.path=<directory>`` its three splits: the files are
concatenated in split order and the split bounds are the file boundaries (PTB character files,
text8 or enwik8 pre-split, any corpus shipped that way).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from zoo.data.base import SPLITS, DataFileNotFound, path_candidates

SPLIT_PATTERNS = {"train": r"train", "val": r"valid|val|dev", "test": r"test"}


def resolve_directory(path: str | Path) -> Path | None:
    """``path`` as a directory (as given, else relative to the project root), or None."""
    if not path:
        return None
    return next((candidate for candidate in path_candidates(path) if candidate.is_dir()), None)


def find_split_files(directory: Path) -> dict[str, Path]:
    """{split: file} for the files of ``directory`` whose names contain the split's word."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    out: dict[str, Path] = {}
    for split in SPLITS:
        matches = [p for p in files if re.search(SPLIT_PATTERNS[split], p.name.lower())]
        if split == "val":  # "val" also matches nothing else; keep files that are not another split's
            matches = [p for p in matches if not re.search(r"train|test", p.name.lower())]
        listing = ", ".join(p.name for p in files) or "nothing"
        if not matches:
            words = SPLIT_PATTERNS[split].replace("|", " / ")
            raise DataFileNotFound(
                f"data.path={directory} has no {split} file (a name containing {words}); it holds: {listing}"
            )
        if len(matches) > 1:
            raise ValueError(
                f"data.path={directory} has several {split} files ({', '.join(p.name for p in matches)}); keep one "
                f"per split"
            )
        out[split] = matches[0]
    return out


def named_split_files(directory: Path, names: dict[str, str]) -> dict[str, Path]:
    """{split: directory / name}, refusing the first missing file by name."""
    out = {}
    for split in SPLITS:
        path = directory / names[split]
        if not path.is_file():
            present = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
            raise DataFileNotFound(
                f"data.path={directory} is missing the {split} file {names[split]} (it holds: {present})"
            )
        out[split] = path
    return out


def read_char_splits(
    files: dict[str, Path], vocab: str
) -> tuple[np.ndarray, dict[str, tuple[int, int]], list[str] | None]:
    """(all tokens, {split: (start, end)}, characters or None for bytes). With ``vocab=chars`` the
    alphabet is the training file's; a character first seen in validation or test is refused."""
    if vocab == "bytes":
        parts = [np.fromfile(files[s], dtype=np.uint8) for s in SPLITS]
        itos = None
    else:
        texts = {s: files[s].read_text(encoding="utf-8") for s in SPLITS}
        itos = sorted(set(texts["train"]))
        for split in ("val", "test"):
            unseen = sorted(set(texts[split]) - set(itos))
            if unseen:
                raise ValueError(
                    f"{files[split]} has characters not in the training file {files['train'].name}: {unseen[:20]}; "
                    f"use data.vocab=bytes"
                )
        lookup = np.zeros(max(map(ord, itos)) + 1, dtype=np.int32)
        lookup[[ord(c) for c in itos]] = np.arange(len(itos))
        parts = [lookup[np.frombuffer(texts[s].encode("utf-32-le"), dtype=np.uint32)] for s in SPLITS]
    bounds, start = {}, 0
    for split, part in zip(SPLITS, parts):
        bounds[split] = (start, start + len(part))
        start += len(part)
    return np.concatenate(parts), bounds, itos
