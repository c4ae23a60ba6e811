"""Per-layer hybrids: ``attention=[...]`` gives each layer its own mechanism (cycled over the layers).

Every contract holds per layer: a hybrid language model streams exactly (token by token and in
segments == one call) with each layer's own state; positions inside attention reach every layer (or a
layer that cannot take them refuses, named); options given without a name apply to every layer; a
stack that re-applies one block refuses a list; ``describe`` reports each layer; the command line takes
the same list (``model.attention=[...]``) and trains.
"""

from __future__ import annotations

import json

import pytest
import torch
from support.app_cli import TOY, train_main
from test_streaming import stream

import zoo
from zoo.app.paper import describe
from zoo.attention.base import ATTENTION

VOCAB = 24
HYBRIDS = {
    "local_local_vanilla": ["local_1d", "local_1d", "vanilla"],
    "sparse_fixed_vanilla": ["sparse_fixed", {"name": "vanilla", "max_cache": 0}],
    "grouped_every_layer": [{"name": "local_1d", "n_kv_heads": 2}, {"name": "vanilla", "n_kv_heads": 1}],
    "linear_additive_xl": ["linear", "additive", "xl_rel"],
}


def lm(attention, n_layers=4, **extra):
    parts = []
    for part in attention:
        part = {"name": part} if isinstance(part, str) else dict(part)
        parts.append({**ATTENTION.get(part["name"]).contract_options(), **part})
    torch.manual_seed(0)
    return zoo.create_model(
        "vanilla_lm",
        vocab_size=VOCAB,
        d_model=32,
        n_heads=4,
        d_ff=48,
        n_layers=n_layers,
        dropout=0.0,
        attention=parts,
        **extra,
    ).eval()


def tokens_for(t, seed=0):
    return torch.randint(0, VOCAB, (2, t), generator=torch.Generator().manual_seed(seed))


def test_the_list_is_cycled_over_the_layers_and_rebuilds_from_the_stored_config():
    model = lm(["local_1d", "local_1d", "local_1d", "vanilla"], n_layers=8)
    names = [block.attention.registry_name for block in model.stack.blocks]
    assert names == ["local_1d"] * 3 + ["vanilla"] + ["local_1d"] * 3 + ["vanilla"]
    again = zoo.create_model(**model.config.to_dict())
    again.load_state_dict(model.state_dict())
    x = tokens_for(20)
    torch.testing.assert_close(again.eval()(x).logits, model(x).logits)
    assert "local_1d+local_1d+local_1d+vanilla" in model.signature


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_hybrid_streams_exactly_with_each_layers_own_state(name):
    model = lm(HYBRIDS[name], position="none" if "xl_rel" in str(HYBRIDS[name]) else "sinusoidal")
    total = 40  # within the bounded memories of the contract options (XL, max_cache: exact for 40)
    tokens = tokens_for(total)
    with torch.no_grad():
        whole = model(tokens).logits
        one_by_one, state = stream(model, tokens, [1] * total)
        segments, _ = stream(model, tokens, [7, 1, 19, total - 27])
    torch.testing.assert_close(one_by_one, whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(segments, whole, atol=1e-4, rtol=1e-4)
    for block, layer_state in zip(model.stack.blocks, state.layers):  # each layer keeps its mechanism's state
        assert type(layer_state.attention) is type(block.attention.init_state(2))


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_positions_inside_attention_reach_every_layer_of_a_hybrid(position):
    model = lm(["local_1d", "vanilla", "sparse_strided"], n_layers=3, position=position)
    assert all(block.attention.position is model.position for block in model.stack.blocks)
    tokens = tokens_for(30)
    with torch.no_grad():
        torch.testing.assert_close(stream(model, tokens, [1] * 30)[0], model(tokens).logits, atol=1e-4, rtol=1e-4)
        # the position part acts in every layer: removing it from one layer changes the output
        before = model(tokens).logits
        model.stack.blocks[1].attention.__dict__["position"] = None
        assert not torch.allclose(model(tokens).logits, before, atol=1e-4)


def test_a_layer_that_refuses_a_position_is_named():
    # a causal mechanism whose flags say it applies no rotation (chosen by flags, not by name)
    refuser = next(n for n in zoo.list_attention() if ATTENTION.get(n).supports_causal
                   and "rotary" not in ATTENTION.get(n).position_kinds and ATTENTION.get(n).length_option is None)
    with pytest.raises(ValueError, match=rf"layer 1 \({refuser}\).*cannot take position 'rope'"):
        lm(["vanilla", refuser], n_layers=2, position="rope")


def test_options_without_a_name_apply_to_every_layer_and_a_name_swaps_the_hybrid():
    hybrid = ["local_1d", "vanilla"]
    grouped = zoo.create_model("vanilla_lm", vocab_size=VOCAB, attention=hybrid, n_layers=2)
    config = zoo.config.merge_config(grouped.config.to_dict(), {"attention": {"n_kv_heads": 2}})
    assert [part["n_kv_heads"] for part in config["attention"]] == [2, 2]
    model = zoo.create_model(**config)
    assert all(block.attention.n_kv_heads == 2 for block in model.stack.blocks)
    swapped = zoo.config.merge_config(grouped.config.to_dict(), {"attention": "lsh"})
    assert swapped["attention"] == {"name": "lsh"}


def test_a_stack_that_reapplies_one_block_refuses_a_per_layer_list():
    with pytest.raises(ValueError, match="does not build one block per layer"):
        zoo.create_model("universal_transformer", vocab_size=VOCAB, attention=["local_1d", "vanilla"])
    # one part written as a list of one is not a hybrid: every stack takes it
    zoo.create_model("universal_transformer", vocab_size=VOCAB, attention=["vanilla"])


def test_an_empty_or_malformed_list_is_refused():
    with pytest.raises(ValueError, match="at least one part"):
        zoo.create_model("vanilla_lm", attention=[])
    with pytest.raises(ValueError, match=r"attention\[1\] must be a name or a dict"):
        zoo.create_model("vanilla_lm", attention=["vanilla", 3])


def test_describe_reports_each_layer_of_a_hybrid():
    info = describe(
        ["experiment=tiny", "model=vanilla_lm", "model.attention=[local_1d,{name:vanilla,n_kv_heads:2}]"]
        + ["model.n_layers=3", "trainer.seq_len=512"]
    )
    assert [row["attention"] for row in info["layers"]] == ["local_1d", "vanilla", "local_1d"]
    local, dense = info["layers"][0], info["layers"][1]
    assert local["keys_per_query"] < dense["keys_per_query"] == pytest.approx(513 / 2)
    assert info["axes"]["attention"][1] == {"name": "vanilla", "n_kv_heads": 2}


def test_the_command_line_trains_a_hybrid(tmp_path, monkeypatch):
    run = tmp_path / "run"
    argv = [*TOY, "model.n_layers=4", "model.attention=[local_1d,local_1d,local_1d,vanilla]", f"hydra.run.dir={run}"]
    assert train_main(argv, monkeypatch) == 0
    model_config = json.loads((run / "config.json").read_text())["model_config"]
    assert [part["name"] for part in model_config["attention"]] == ["local_1d"] * 3 + ["vanilla"]
    assert json.loads((run / "result.json").read_text())["attention"] == "local_1d+local_1d+local_1d+vanilla"


def test_a_hybrid_is_shared_and_loaded_back_with_its_model_card(tmp_path):
    model = lm(["local_1d", {"name": "vanilla", "n_kv_heads": 2, "qk_norm": "rmsnorm"}], n_layers=3)
    model.save_pretrained(tmp_path)
    again = zoo.from_pretrained(tmp_path)
    x = tokens_for(10)
    torch.testing.assert_close(again(x).logits, model(x).logits, rtol=0, atol=0)
    assert "attention per layer [`local_1d`" in (tmp_path / "README.md").read_text()


def test_options_given_alone_on_the_command_line_apply_to_every_layer():
    """+attention.n_kv_heads=2 (the attention group left to the preset) tweaks every layer's part."""
    from zoo.app.compose import compose
    from zoo.app.resolve import as_dict, model_config

    argv = ["experiment=tiny", "model=vanilla_lm", "model.attention=[local_1d,vanilla]", "+attention.n_kv_heads=2"]
    config = model_config(as_dict(compose(argv)))
    assert config.attention == [{"name": "local_1d", "n_kv_heads": 2}, {"name": "vanilla", "n_kv_heads": 2}]
