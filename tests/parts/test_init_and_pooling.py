"""The token and position tables' initialisation (model.token_init_std, position.init_std) and the PyTorch
LRA code's pooling (pooling=padded_mean): what each sets reaches the model, the default is unchanged,
and bad values are refused with the key's name."""

from __future__ import annotations

import math

import pytest
import torch

import zoo
from zoo.config import ModelConfig
from zoo.models.base import TokenEmbedding
from zoo.models.classifier import pool

SMALL = dict(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32)


def test_default_token_table_is_read_at_rms_one_and_unchanged():
    torch.manual_seed(0)
    embedding = TokenEmbedding(50, 64)
    torch.manual_seed(0)
    expected = torch.randn(50, 64) * 64**-0.5  # the weights the table had before token_init_std existed
    torch.testing.assert_close(embedding.weight.detach(), expected)
    ids = torch.arange(50)[None]
    torch.testing.assert_close(embedding(ids)[0], expected * 8.0)


def test_plain_token_table_is_read_unscaled_at_its_std():
    embedding = TokenEmbedding(4000, 64, init_std=0.02)
    assert embedding.weight.std().item() == pytest.approx(0.02, rel=0.02)
    ids = torch.tensor([[3, 7, 3999]])
    torch.testing.assert_close(embedding(ids)[0], embedding.weight.detach()[[3, 7, 3999]])


@pytest.mark.parametrize("preset", ["vanilla_classifier", "vanilla_lm", "vanilla_seq2seq"])
def test_token_init_std_reaches_every_token_table(preset):
    model = zoo.create_model(preset, token_init_std=0.02, vocab_size=3000, d_model=32, n_layers=1, n_heads=2, d_ff=32)
    tables = [m for m in model.modules() if isinstance(m, TokenEmbedding)]
    assert tables
    for table in tables:
        assert table.scale == 1.0
        assert table.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_position_init_std_reaches_the_table_and_the_layer_tables():
    model = zoo.create_model(
        "vanilla_lm",
        vocab_size=12,
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        max_len=4096,
        position={"name": "learned", "init_std": 0.02, "every_layer": True},
    )
    assert model.position.table.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.position.layer_tables.std().item() == pytest.approx(0.02, rel=0.05)
    default = zoo.create_model("vanilla_lm", **SMALL, max_len=4096, position="learned")
    assert default.position.table.weight.std().item() == pytest.approx(1.0, rel=0.05)


def test_bad_init_values_are_refused_with_their_key():
    with pytest.raises(ValueError, match="token_init_std"):
        ModelConfig(token_init_std=-0.1)
    with pytest.raises(ValueError, match="init_std"):
        zoo.create_model("vanilla_lm", **SMALL, position={"name": "learned", "init_std": 0.0})
    with pytest.raises(ValueError, match="token_init_std"):
        ModelConfig(token_init_std=0.02, adaptive={"cutoffs": [4], "div_val": 2})
    with pytest.raises(ValueError, match="padded_mean"):
        ModelConfig(kind="classifier", pooling="max")


def test_padded_mean_is_the_sum_of_real_outputs_over_the_padded_length():
    h = torch.randn(3, 8, 5)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[0, 5:] = False
    mask[2, 1:] = False
    expected = torch.stack([h[i, mask[i]].sum(0) / 8 for i in range(3)])
    torch.testing.assert_close(pool(h, mask, "padded_mean"), expected)
    # the real-token mean does not shrink with the padding; the padded mean does, by real / padded length
    real = mask.sum(1, keepdim=True).float()
    torch.testing.assert_close(pool(h, mask, "padded_mean"), pool(h, mask, "mean") * real / 8)


@pytest.mark.parametrize("kind", ["classifier", "pair_classifier"])
def test_padded_mean_pooling_reaches_the_classifiers(kind):
    preset = "vanilla_classifier" if kind == "classifier" else "two_tower_classifier"
    models = {
        mode: zoo.create_model(preset, **SMALL, n_classes=2, pooling=mode, head="linear").eval()
        for mode in ("mean", "padded_mean")
    }
    models["padded_mean"].load_state_dict(models["mean"].state_dict())
    width = 10
    tokens = torch.randint(1, 12, (2, width) if kind == "classifier" else (2, 2, width))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[..., 6:] = False
    tokens = tokens.masked_fill(~mask, 0)
    with torch.no_grad():
        mean = models["mean"](tokens, pad_mask=mask).logits
        padded = models["padded_mean"](tokens, pad_mask=mask).logits
    assert not torch.allclose(mean, padded)
    if kind == "classifier":  # a linear head on the pooled vector: logits - bias scale by real / padded length
        bias = models["mean"].head.bias
        torch.testing.assert_close(padded - bias, (mean - bias) * 6 / width)
    assert math.isfinite(padded.sum().item())


@pytest.mark.parametrize("kind", ["classifier", "pair_classifier"])
def test_pool_length_gives_what_padding_the_input_to_it_gives(kind):
    """pool_length=L on t positions equals the same weights on the input padded to L with pooling over L
    (softmax attention masks the padded keys, and the padded outputs are zeroed before the sum): the
    PyTorch LRA code's Text / Retrieval (cut at 1,000 / 4,000, padded to 1,024 / 4,096) without the pad."""
    preset = "vanilla_classifier" if kind == "classifier" else "two_tower_classifier"
    t, padded_to = 10, 16
    common = dict(**SMALL, n_classes=3, pooling="padded_mean", head="mlp", max_len=padded_to)
    cut = zoo.create_model(preset, **common, pool_length=padded_to).eval()
    padded = zoo.create_model(preset, **common).eval()
    padded.load_state_dict(cut.state_dict())
    shape = (2, t) if kind == "classifier" else (2, 2, t)
    tokens = torch.randint(1, 12, shape)
    mask = torch.ones(shape, dtype=torch.bool)
    mask[0, ..., 7:] = False  # a row with padding of its own as well
    tokens = tokens.masked_fill(~mask, 0)
    pad = (0, padded_to - t)
    with torch.no_grad():
        got = cut(tokens, pad_mask=mask).logits
        want = padded(torch.nn.functional.pad(tokens, pad), pad_mask=torch.nn.functional.pad(mask, pad)).logits
        unpadded = padded(tokens, pad_mask=mask).logits  # divided by t instead: not the same
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, unpadded, atol=1e-4)


def test_pool_length_is_refused_without_padded_mean_and_below_the_input_length():
    with pytest.raises(ValueError, match="pool_length divides padded_mean"):
        ModelConfig(**SMALL, kind="classifier", pooling="mean", pool_length=16)
    with pytest.raises(ValueError, match="pool_length must be an int >= 0"):
        ModelConfig(**SMALL, kind="classifier", pooling="padded_mean", pool_length=-1)
    model = zoo.create_model("vanilla_classifier", **SMALL, pooling="padded_mean", pool_length=8, max_len=16)
    with pytest.raises(ValueError, match="pool_length=8 is shorter than the input"):
        model(torch.randint(1, 12, (1, 10)))
