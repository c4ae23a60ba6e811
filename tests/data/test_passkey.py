"""The passkey retrieval task (zoo/data/passkey.py)."""

from __future__ import annotations

import pytest
import torch

from zoo.config import IGNORE_INDEX
from zoo.data import create_task
from zoo.data.passkey import FILLER, KEY, QUERY, passkey_batch


def test_the_key_is_hidden_once_and_asked_at_the_end():
    t, n = 64, 5
    out = passkey_batch(32, t, n_digits=n, generator=torch.Generator().manual_seed(0))
    tokens, targets, key, where = out["tokens"], out["targets"], out["key"], out["where"]
    assert tokens.shape == targets.shape == (32, t)
    rows = torch.arange(32)
    assert bool((tokens[rows, where] == KEY).all()) and bool((tokens == KEY).sum(1).eq(1).all())
    for i in range(n):
        assert torch.equal(tokens[rows, where + 1 + i], key[:, i])  # hidden right after the marker
    assert bool((tokens[:, t - n - 1] == QUERY).all()) and torch.equal(tokens[:, t - n :], key)
    scored = targets != IGNORE_INDEX
    assert scored.sum(1).eq(n).all() and torch.equal(targets[:, t - n - 1 : t - 1], key)  # read next-token
    filler = tokens.clone()
    filler[rows[:, None], where[:, None] + torch.arange(n + 1)] = -1
    filler[:, t - n - 1 :] = -1
    words = filler[filler >= 0]
    assert bool((words >= FILLER).all())  # nothing but filler words outside the two blocks
    assert len(set(where.tolist())) > 10  # the place varies


def test_filler_is_the_repeated_sentence_and_depth_places_the_key():
    out = passkey_batch(4, 40, n_digits=3, filler_symbols=5, depth=0.0)
    assert bool((out["where"] == 0).all())
    assert out["tokens"][0, 4:12].tolist() == [FILLER + i % 5 for i in range(8)]  # the sentence again and again
    end = passkey_batch(4, 40, n_digits=3, depth=1.0)
    assert bool((end["tokens"][:, 40 - 8] == KEY).all())  # just before the question
    noisy = passkey_batch(4, 200, random_filler=True, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(noisy["tokens"][0], noisy["tokens"][1])


def test_task_trains_at_one_length_and_tests_at_another():
    task = create_task("passkey", batch_size=4, seq_len=64, test_seq_len=1024)
    train, val, test = task.batch("train", 0), task.batch("val", 0), task.batch("test", 0)
    assert train["tokens"].shape == (4, 64) and val["tokens"].shape == test["tokens"].shape == (4, 1024)
    assert torch.equal(train["tokens"], task.batch("train", 0)["tokens"])
    assert not torch.equal(val["tokens"], test["tokens"]) and task.vocab_size == FILLER + 16
    assert task.metric == "accuracy" and task.num_batches("train") is None


@pytest.mark.parametrize(
    "options, message",
    [({"seq_len": 10}, "seq_len"), ({"test_seq_len": 8}, "test_seq_len"), ({"depth": 1.5}, "depth")],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        create_task("passkey", **{"batch_size": 2, "seq_len": 64, **options})


@pytest.mark.slow
def test_a_small_model_learns_to_retrieve():
    """Two layers of attention learn to copy a 2-digit key out of 30 filler tokens (the task is learnable)."""
    import zoo
    from zoo.train.steps import adam, train_step

    torch.manual_seed(0)
    task = create_task("passkey", batch_size=32, seq_len=32, n_digits=2, filler_symbols=4)
    model = zoo.create_model(
        "vanilla_lm",
        vocab_size=task.vocab_size,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        dropout=0.0,
        residual="pre_norm",
        position="learned",
        max_len=32,
    )
    opt = adam(model, lr=3e-3)
    for step in range(300):
        train_step(model, task.batch("train", step), opt)
    batch = task.batch("val", 0)
    model.eval()
    with torch.no_grad():
        logits = model(batch["tokens"]).logits
    scored = batch["targets"] != IGNORE_INDEX
    accuracy = (logits.argmax(-1)[scored] == batch["targets"][scored]).float().mean()
    assert accuracy > 0.5  # chance: 0.1
