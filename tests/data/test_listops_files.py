"""ListOps read from LRA's released TSV files (data.path): tokenised as LRA's input pipeline (parentheses
dropped, ']' a token, whitespace split), cut at trainer.seq_len, labels from Target; bad files are named."""

from __future__ import annotations

import pytest
import torch

from zoo.data import TASK
from zoo.data.listops import TOKEN_ID, source_tokens

ROWS = [
    ("( ( ( ( [MAX 2 ) 9 ) ( ( [MIN 4 ) 7 ) ] ) ] )", 9),  # the left-nested text LRA's generator writes
    ("( ( [SM 3 ) 5 ] )", 8),
    ("( ( ( [MED 1 ) 2 ) 3 ] )", 2),
]


def write_dir(tmp_path, rows=ROWS):
    for split in ("train", "val", "test"):
        lines = ["Source\tTarget"] + [f"{source}\t{label}" for source, label in rows]
        (tmp_path / f"basic_{split}.tsv").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_released_files_are_tokenised_as_lra_reads_them(tmp_path):
    task = TASK.get("listops")(path=str(write_dir(tmp_path)), seq_len=9, batch_size=3, seed=0)
    batch = task.batch("test", 0)
    first = ["[MAX", "2", "9", "[MIN", "4", "7", "]", "]"]
    assert source_tokens(ROWS[0][0]) == first
    assert batch["tokens"][0].tolist() == [TOKEN_ID[t] for t in first] + [0]
    assert batch["targets"].tolist() == [9, 8, 2] and batch["pad_mask"][0].sum() == 8
    short = TASK.get("listops")(path=str(tmp_path), seq_len=4, batch_size=1, seed=0)  # LRA's [:max_length]
    assert short.batch("val", 0)["tokens"][0].tolist() == [TOKEN_ID[t] for t in first[:4]]
    assert task.num_batches("val") == 1 and task.batch("train", 0)["tokens"].shape == (3, 9)
    assert sorted(task.batch("train", 0)["targets"].tolist()) == [2, 8, 9]  # one epoch: each row once


def test_bad_files_are_named(tmp_path):
    (tmp_path / "basic_train.tsv").write_text("Source\tTarget\n( 1 )\t1\n")
    with pytest.raises(Exception, match="lacks basic_val.tsv"):
        TASK.get("listops")(path=str(tmp_path), seq_len=8, batch_size=1)
    write_dir(tmp_path, [("( [POW 2 3 ] )", 8)])
    with pytest.raises(ValueError, match=r"outside the ListOps vocabulary: \['\[POW'\]"):
        TASK.get("listops")(path=str(tmp_path), seq_len=8, batch_size=1)
    torch.manual_seed(0)
