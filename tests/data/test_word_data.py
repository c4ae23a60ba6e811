"""Word-level data (WikiText / PTB layouts) and split directories for character data, on small files
the tests write."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.data import DataFileNotFound, create_task
from zoo.data.word import EOS, UNK

TRAIN = "the cat sat on the mat\n\n = heading = \nthe dog sat <unk> \n"
VALID = "the cat ate the fish\n"  # 'ate', 'fish' are not in the training file
TEST = "the dog sat on the cat\n"


def write_wikitext(directory, train=TRAIN, valid=VALID, test=TEST):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (directory / f"wiki.{name}.tokens").write_text(text, encoding="utf-8")
    return directory


def test_vocabulary_from_train_with_eos_and_unk(tmp_path):
    path = write_wikitext(tmp_path / "wt")
    with pytest.warns(UserWarning, match="2 words of wiki.valid.tokens are not in the training vocabulary"):
        task = create_task("wikitext2", batch_size=1, seq_len=4, path=str(path))
    assert task.itos[0] == EOS
    assert task.itos[1] == "the"  # the most frequent word comes first
    assert task.itos.index("sat") < task.itos.index("cat")
    # by count (the 3; sat and = twice), ties by first appearance (cat, on, mat once each)
    assert task.itos.index("cat") < task.itos.index("on") < task.itos.index("mat")
    assert UNK in task.itos and "ate" not in task.itos
    assert task.oov == {"train": 0, "val": 2, "test": 0}
    assert task.describe()["oov"]["val"] == 2
    start, end = task.bounds["train"]
    words = [task.itos[i] for i in task.data[start:end]]
    # four lines, each ending in <eos> (an empty line is just <eos>)
    assert words == "the cat sat on the mat".split() + [EOS, EOS, "=", "heading", "="] + [
        EOS
    ] + "the dog sat <unk>".split() + [EOS]
    start, end = task.bounds["val"]
    assert [task.itos[i] for i in task.data[start:end]] == ["the", "cat", UNK, "the", UNK, EOS]
    assert task.metric == "ppl"


def test_missing_split_file_is_named(tmp_path):
    path = write_wikitext(tmp_path / "wt")
    (path / "wiki.test.tokens").unlink()
    with pytest.raises(DataFileNotFound, match="missing the test file wiki.test.tokens"):
        create_task("wikitext103", batch_size=1, seq_len=4, path=str(path))
    with pytest.raises(DataFileNotFound, match="not a directory"):
        create_task("wikitext103", batch_size=1, seq_len=4, path=str(path / "wiki.train.tokens"))


def test_ptb_files(tmp_path):
    for name in ("train", "valid", "test"):
        (tmp_path / f"ptb.{name}.txt").write_text(" a b c <unk> \n a b \n")
    task = create_task("ptb_word", batch_size=2, seq_len=3, path=str(tmp_path))
    assert task.vocab_size == 5  # <eos>, a, b, c, <unk>
    assert task.oov["test"] == 0


def test_evaluation_scores_the_whole_split_in_contiguous_lanes(tmp_path):
    words = [f"w{i % 37}" for i in range(1000)]
    text = "\n".join(" ".join(words[i : i + 10]) for i in range(0, 1000, 10)) + "\n"
    path = write_wikitext(tmp_path / "wt", train=text, valid=text, test=text)
    task = create_task("wikitext103", batch_size=3, seq_len=16, path=str(path))
    n = task.bounds["val"][1] - task.bounds["val"][0]
    batches = list(task.eval_batches("val", None))
    scored = sum(int(b["targets"].numel()) for b in batches)
    assert n - 1 - scored == (n - 1) % 3  # only the remainder of the lane split is left out
    assert batches[-1]["tokens"].shape[1] < 16  # the last batch is shorter, not dropped
    # row j of batch i + 1 continues row j of batch i (memory can carry)
    for a, b in zip(batches, batches[1:]):
        assert torch.equal(a["targets"][:, -1], b["tokens"][:, 0])
    # training keeps whole segments, contiguous too
    t0, t1 = task.batch("train", 0), task.batch("train", 1)
    assert torch.equal(t0["targets"][:, -1], t1["tokens"][:, 0])


def test_word_task_trains_through_the_app(tmp_path):
    from zoo.app.compose import compose
    from zoo.app.run import run

    words = [f"w{i % 50}" for i in range(3000)]
    text = "\n".join(" ".join(words[i : i + 12]) for i in range(0, 3000, 12)) + "\n"
    path = write_wikitext(tmp_path / "wt", train=text, valid=text, test=text)
    cfg = compose(
        [
            "experiment=tiny",
            "data=wikitext103",
            f"data.path={path}",
            "model=transformer_xl",
            "trainer.max_steps=60",
            "trainer.eval_every=0",
            "trainer.eval_batches=0",
            "trainer.seq_len=16",
            "trainer.batch_size=4",
            "logger=none",
            "trainer.progress=false",
            "trainer.checkpoints=false",
            "trainer.device=cpu",
        ]
    )
    value = run(cfg, run_dir=tmp_path / "run")
    assert np.isfinite(value) and 1.0 < value < 52  # perplexity of the whole validation split, below uniform (52 words)


def test_char_lm_directory_uses_the_split_files(tmp_path):
    (tmp_path / "ptb.char.train.txt").write_text("a b c a b c a b c a b c\n" * 20)
    (tmp_path / "ptb.char.valid.txt").write_text("c b a\n" * 10)
    (tmp_path / "ptb.char.test.txt").write_text("a a b\n" * 10)
    task = create_task("char_lm", batch_size=2, seq_len=4, path=str(tmp_path), vocab="chars")
    assert task.itos == sorted(set("a b c\n"))
    start, end = task.bounds["val"]
    assert task.decode(task.data[start:end].tolist()) == "c b a\n" * 10
    start, end = task.bounds["test"]
    assert task.decode(task.data[start:end].tolist()) == "a a b\n" * 10
    byte_task = create_task("char_lm", batch_size=2, seq_len=4, path=str(tmp_path), vocab="bytes")
    assert byte_task.bounds["train"] == (0, len("a b c a b c a b c a b c\n" * 20))


def test_char_lm_directory_refuses_missing_or_unseen(tmp_path):
    (tmp_path / "train.txt").write_text("abc" * 50)
    (tmp_path / "test.txt").write_text("abc" * 10)
    with pytest.raises(DataFileNotFound, match="no val file"):
        create_task("char_lm", batch_size=1, seq_len=4, path=str(tmp_path))
    (tmp_path / "val.txt").write_text("abz")
    with pytest.raises(ValueError, match="not in the training file"):
        create_task("char_lm", batch_size=1, seq_len=4, path=str(tmp_path), vocab="chars")
    assert create_task("char_lm", batch_size=1, seq_len=4, path=str(tmp_path)).vocab_size == 256


def test_char_lm_directory_trains_through_the_app(tmp_path):
    from zoo.app.compose import compose
    from zoo.app.run import run

    text = "abcde fghij " * 60
    for name in ("train.txt", "valid.txt", "test.txt"):
        (tmp_path / name).write_text(text)
    cfg = compose(
        [
            "experiment=tiny",
            "data=char_lm",
            f"data.path={tmp_path}",
            "data.vocab=chars",
            "trainer.max_steps=2",
            "trainer.eval_every=0",
            "trainer.eval_batches=0",
            "trainer.seq_len=16",
            "trainer.batch_size=2",
            "logger=none",
            "trainer.progress=false",
            "trainer.checkpoints=false",
            "trainer.device=cpu",
        ]
    )
    value = run(cfg, run_dir=tmp_path / "run")
    assert np.isfinite(value) and value > 0  # bits per character on valid.txt
