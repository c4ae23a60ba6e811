"""Position schemes the paper configurations need: Al-Rfou et al. 2018's learned table at every layer's input
(``learned``, ``every_layer``) and the Sparse Transformer's factorised positions (``factorized``)."""

from __future__ import annotations

import pytest
import torch

import zoo

SIZE = dict(vocab_size=20, d_model=16, n_layers=3, n_heads=2, d_ff=32, dropout=0.0, max_len=32)


def test_every_layer_adds_one_table_per_layer_at_that_layers_input():
    per_layer = zoo.create_model("vanilla_lm", position={"name": "learned", "every_layer": True}, **SIZE).eval()
    once = zoo.create_model("vanilla_lm", position={"name": "learned"}, **SIZE).eval()
    extra = sum(p.numel() for p in per_layer.parameters()) - sum(p.numel() for p in once.parameters())
    assert extra == (SIZE["n_layers"] - 1) * SIZE["max_len"] * SIZE["d_model"]
    tokens = torch.randint(0, 20, (2, 10))
    with torch.no_grad():
        once.load_state_dict({k: v for k, v in per_layer.state_dict().items() if k != "position.layer_tables"})
        per_layer.position.layer_tables.zero_()  # with zero tables it is the model with one table
        assert torch.allclose(per_layer(tokens).logits, once(tokens).logits, atol=1e-6)
        # a vector at layer 3's table, position 4: the outputs before position 4 cannot change (causal)
        per_layer.position.layer_tables[1, 4] = 1.0
        changed = (per_layer(tokens).logits - once(tokens).logits).abs().amax(-1)[0]
    assert changed[:4].max() < 1e-6 and changed[4] > 1e-3


def test_every_layer_continues_a_cached_sequence_at_the_right_positions():
    model = zoo.create_model("vanilla_lm", position={"name": "learned", "every_layer": True}, **SIZE).eval()
    tokens = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        full = model(tokens).logits
        first = model(tokens[:, :7], state=model.init_state(2))
        rest = model(tokens[:, 7:], state=first.state)
    assert torch.allclose(torch.cat([first.logits, rest.logits], 1), full, atol=1e-5)


def test_every_layer_is_refused_where_nothing_attaches_it():
    model = zoo.create_model(
        "vanilla_classifier", position={"name": "learned", "every_layer": True}, **{**SIZE, "n_classes": 3}
    )
    with pytest.raises(ValueError, match="need a model that attaches them"):
        model(torch.randint(0, 20, (1, 5)))


def test_factorized_is_the_sum_of_the_within_block_and_block_vectors():
    from zoo.position.factorized import FactorizedPosition

    position = FactorizedPosition(8, 40, stride=16)
    assert position.within.weight.shape == (16, 8) and position.block.weight.shape == (3, 8)  # ceil(40 / 16)
    x = torch.zeros(1, 5, 8)
    out = position(x, offset=14)  # positions 14 ... 18 cross a block boundary
    for k, i in enumerate(range(14, 19)):
        assert torch.equal(out[0, k], position.within.weight[i % 16] + position.block.weight[i // 16])
    with pytest.raises(ValueError, match="raise max_len"):
        position(torch.zeros(1, 5, 8), offset=36)


def test_sparse_transformer_preset_uses_the_factorised_table():
    config = zoo.preset_config("sparse_transformer")
    assert config.position == {"name": "factorized", "stride": config.attention["stride"]}
