"""The copy-at-distance task (zoo/data/copy_at_distance.py); its study is tested in tests/studies."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo.data import copy_at_distance as task

ROOT = Path(__file__).resolve().parents[2]


def test_copies_and_chain_are_what_the_docstring_says():
    """About copy_prob of the positions past D repeat the letter D back, and every other letter is a
    successor of the one before it in the chain's table (the local structure)."""
    text = task.generate(20_000, distance=50, copy_prob=0.5, seed=3)
    table = task.transition_table(16, 3, 0)
    ids = [task.ALPHABET.index(c) for c in text]
    same = sum(ids[t] == ids[t - 50] for t in range(50, len(ids))) / (len(ids) - 50)
    assert 0.5 < same < 0.65  # copies plus chance agreements of the chain
    off_chain = [t for t in range(1, len(ids)) if ids[t] not in dict(table[ids[t - 1]])]
    assert off_chain and all(t >= 50 and ids[t] == ids[t - 50] for t in off_chain)
    assert task.generate(500, seed=3, distance=50) == text[:500]  # a seed gives one text


def test_no_copies_before_the_distance_and_none_at_p_zero():
    table = task.transition_table(16, 3, 0)
    ids = [task.ALPHABET.index(c) for c in task.generate(3_000, distance=50, copy_prob=0.0)]
    assert all(ids[t] in dict(table[ids[t - 1]]) for t in range(1, len(ids)))


def test_oracle_separates_the_windows():
    """The copies are worth more than a bit per letter at p = 0.5; without copies the two agree."""
    text = task.generate(20_000, distance=200, copy_prob=0.5)
    bits = task.oracle_bits(text, distance=200, copy_prob=0.5)
    assert bits["short"] - bits["full"] > 1.0
    plain = task.generate(5_000, distance=200, copy_prob=0.0)
    same = task.oracle_bits(plain, distance=200, copy_prob=0.0)
    assert same["full"] == pytest.approx(same["short"])


def test_splits_round_trip_in_the_authors_layout(tmp_path):
    texts = task.write_splits(tmp_path, (300, 100, 100), distance=20)
    line = (tmp_path / "train.txt").read_text().splitlines()
    assert len(line) == 1 and line[0].split() == list(texts["train"])  # one token per letter, one line
    assert task.read_split(tmp_path / "valid.txt") == texts["valid"] != texts["test"]
    with pytest.raises(FileNotFoundError, match="write the splits first"):
        task.read_split(tmp_path / "nothing.txt")


@pytest.mark.parametrize(
    "options, message",
    [({"distance": 1}, "distance"), ({"copy_prob": 1.5}, "copy_prob"), ({"n_symbols": 40}, "n_symbols")],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        task.generate(10, **options)
