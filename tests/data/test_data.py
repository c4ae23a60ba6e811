"""Tasks and loaders: determinism, contiguity, splits, ListOps labels checked by an independent
evaluator, clear errors for missing files."""

from __future__ import annotations

import io
import os
import random
import statistics
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.data import DataFileNotFound, create_task
from zoo.data import listops as lo
from zoo.data.base import PROJECT_ROOT

SHARED = Path(os.environ.get("ZOO_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))


def test_duplication_rows_are_0w0w_scored_on_second_copy():
    task = create_task("duplication", batch_size=3, seq_len=12, n_symbols=9)
    b = task.batch("train", 5)
    tokens, targets = b["tokens"], b["targets"]
    assert tokens.shape == targets.shape == (3, 12)
    assert torch.equal(tokens[:, :6], tokens[:, 6:]) and (tokens[:, 0] == 0).all()
    scored = targets != -100
    assert scored[:, :6].sum() == 0 and scored[:, 6:11].all() and not scored[:, 11].any()
    assert torch.equal(targets[:, 6:11], tokens[:, 7:12])
    assert torch.equal(task.batch("train", 5)["tokens"], tokens)  # a pure function of the index
    assert not torch.equal(task.batch("train", 6)["tokens"], tokens)
    assert not torch.equal(task.batch("val", 5)["tokens"], tokens)


def test_associative_recall_targets_are_the_bound_values():
    task = create_task("associative_recall", batch_size=4, seq_len=40, n_keys=10, n_values=10, n_pairs=6)
    b = task.batch("train", 0)
    for row_tokens, row_targets in zip(b["tokens"].tolist(), b["targets"].tolist()):
        bound = dict(zip(row_tokens[0:12:2], row_tokens[1:12:2]))
        assert len(bound) == 6  # distinct keys
        scored = [(i, t) for i, t in enumerate(row_targets) if t != -100]
        assert len(scored) == (40 - 12) // 2
        for i, value in scored:
            assert i >= 12 and value == bound[row_tokens[i]] and row_tokens[i + 1] == value


def _independent_listops_value(text: str) -> int:
    """Evaluate LRA's parenthesised text with a stack over its tokens and numpy's median."""
    stack: list[list] = [["ROOT"]]
    for tok in text.replace("(", " ").replace(")", " ").split():
        if tok.startswith("["):
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            value = {"[MIN": min, "[MAX": max, "[SM": lambda a: sum(a) % 10, "[MED": lambda a: int(np.median(a))}[op](
                args
            )
            stack[-1].append(value)
        else:
            stack[-1].append(int(tok))
    assert len(stack) == 1 and len(stack[0]) == 2
    return stack[0][1]


def _depth_and_args(tree, depth=1):
    if isinstance(tree, int):
        return depth, []
    _, children = tree
    results = [_depth_and_args(c, depth + 1) for c in children]
    return max(d for d, _ in results), [len(children)] + [k for _, ks in results for k in ks]


def test_listops_labels_match_an_independent_evaluator():
    rng = random.Random(0)
    labels = []
    for _ in range(300):
        tree, label = lo.sample(rng, min_length=5, max_length=120)
        text = lo.to_string(tree)
        assert _independent_listops_value(text) == label
        assert [t for t in text.split() if t not in "()"] == lo.to_tokens(tree)  # tokens = text minus parens
        labels.append(label)
    assert set(labels) == set(range(10))


def test_listops_length_distribution_within_lra_limits():
    rng = random.Random(1)
    lengths = []
    for _ in range(40):
        tree, _ = lo.sample(rng)  # LRA defaults: 500 < length < 2000, depth 10, 10 args
        tokens = lo.to_tokens(tree)
        depth, n_args = _depth_and_args(tree)
        assert 500 < len(tokens) < 2000 and depth <= 10 and all(2 <= k <= 10 for k in n_args)
        lengths.append(len(tokens))
    assert 700 < statistics.mean(lengths) < 1400  # the reference re-implementation reports a mean of ~1,046


def test_listops_task_batches():
    task = create_task("listops", batch_size=3, seq_len=64, min_length=10, max_length=60, seed=3)
    b = task.batch("train", 2)
    assert b["tokens"].shape == (3, 64) and b["targets"].shape == (3,)
    assert torch.equal(b["pad_mask"], b["tokens"] != 0) and (b["pad_mask"].sum(1) > 10).all()
    for row, label in zip(b["tokens"].tolist(), b["targets"].tolist()):
        assert _independent_listops_value(task.decode(row)) == label
    assert torch.equal(task.batch("train", 2)["tokens"], b["tokens"])
    with pytest.raises(ValueError, match="trainer.seq_len"):
        create_task("listops", batch_size=1, seq_len=100)


def _text_file(tmp_path, n=5000, name="corpus.txt"):
    rng = np.random.default_rng(0)
    path = tmp_path / name
    path.write_bytes(bytes(rng.integers(97, 123, n).astype(np.uint8)))
    return path


def test_text_batches_are_contiguous_across_steps(tmp_path):
    path = _text_file(tmp_path)
    task = create_task("char_lm", batch_size=3, seq_len=16, path=str(path))
    raw = path.read_bytes()
    b0, b1 = task.batch("train", 0), task.batch("train", 1)
    assert torch.equal(b0["targets"][:, :-1], b0["tokens"][:, 1:])
    assert torch.equal(b1["tokens"][:, 0], b0["targets"][:, -1])  # row j of step 1 continues row j of step 0
    assert bytes(b0["tokens"][0].tolist()) == raw[:16]
    n = task.num_batches("train")
    assert task.starts_stream(0) and task.starts_stream(n) and not task.starts_stream(1)
    # data parallel: ranks read disjoint lanes, and 2 ranks x 3 rows = 1 process x 6 rows
    wide = create_task("char_lm", batch_size=6, seq_len=16, path=str(path)).batch("train", 4)
    halves = [task.batch("train", 4, rank=r, world_size=2)["tokens"] for r in range(2)]
    assert torch.equal(torch.cat(halves), wide["tokens"])
    val = list(task.eval_batches("val", 0))
    assert len(val) == task.num_batches("val") >= 1


def test_char_vocab_roundtrip(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world, héllo\n" * 50, encoding="utf-8")
    task = create_task("char_lm", batch_size=2, seq_len=8, path=str(path), vocab="chars")
    assert task.vocab_size == len(set(path.read_text()))
    assert task.decode(task.encode("héllo")) == "héllo"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        task.encode("Z")


def test_enwik8_standard_split_and_small_files(tmp_path):
    path = _text_file(tmp_path, 1000, "enwik8")
    task = create_task("enwik8", batch_size=2, seq_len=8, path=str(path), split=[900, 50, 50])
    assert task.bounds == {"train": (0, 900), "val": (900, 950), "test": (950, 1000)}
    assert task.vocab_size == 256
    with pytest.raises(ValueError, match="data.split"):
        create_task("enwik8", batch_size=2, seq_len=8, path=str(path))  # 90M/5M/5M does not fit 1000 bytes
    from zoo.data.text import STANDARD_SPLIT, split_bounds

    assert split_bounds(100_000_000, STANDARD_SPLIT, "enwik8") == {
        "train": (0, 90_000_000),
        "val": (90_000_000, 95_000_000),
        "test": (95_000_000, 100_000_000),
    }
    text8 = create_task("text8", batch_size=2, seq_len=8, path=str(path), split=[0.9, 0.05, 0.05])
    assert text8.bounds["train"] == (0, 900)


def test_missing_file_names_path_and_config_key(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataFileNotFound) as info:
        create_task("char_lm", batch_size=2, seq_len=8, path=str(missing))
    assert str(missing) in str(info.value) and "data.path" in str(info.value)


def _imdb_tarball(tmp_path):
    path = tmp_path / "aclImdb.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "test"):
            for polarity in ("pos", "neg"):
                for i in range(6):
                    data = f"{polarity} review {i} of {split}".encode()
                    info = tarfile.TarInfo(f"aclImdb/{split}/{polarity}/{i}_{7 if polarity == 'pos' else 2}.txt")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return path


def test_imdb_bytes_from_tarball(tmp_path):
    path = _imdb_tarball(tmp_path)
    task = create_task("imdb", batch_size=4, seq_len=32, path=str(path), val_size=4)
    assert task.vocab_size == 257 and task.n_classes == 2
    assert len(task.splits["train"][1]) == 8 and len(task.splits["val"][1]) == 4 and len(task.splits["test"][1]) == 12
    b = task.batch("train", 0)
    for row, label in zip(b["tokens"].tolist(), b["targets"].tolist()):
        text = task.decode(row)
        assert text.startswith("pos" if label == 1 else "neg")
    assert torch.equal(b["pad_mask"], b["tokens"] != 0)


def test_tiny_shakespeare_from_shared_data():
    path = SHARED / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        pytest.skip(f"{path} absent (set ZOO_DATA_DIR)")
    task = create_task("char_lm", batch_size=2, seq_len=32, path=str(path), vocab="chars")
    assert task.vocab_size == 65
    assert task.decode(task.batch("train", 0)["tokens"][0].tolist()).startswith("First Citizen")


@pytest.mark.slow
def test_imdb_from_shared_data():
    path = SHARED / "imdb" / "aclImdb_v1_labeled.tar.gz"
    if not path.is_file():
        pytest.skip(f"{path} absent (set ZOO_DATA_DIR)")
    task = create_task("imdb", batch_size=8, seq_len=256, path=str(path))
    assert (
        len(task.splits["train"][1]) == 24_000
        and len(task.splits["val"][1]) == 1000
        and len(task.splits["test"][1]) == 25_000
    )
    assert task.splits["test"][1].float().mean() == 0.5
