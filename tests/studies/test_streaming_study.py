"""The streaming study's measurements, without training: the four modes see what they claim to see, a rotary
model's rolled caches are numbered by place, the recomputed attention weights are the layer's own, the sink
mass is read from them, and the report's verdict reads the modes' bpc from the rows.

A one-layer model makes the modes comparable exactly (any weights): its keys and values come from the
embeddings alone, so a window cache holds exactly what re-computing on the window would, and every mode
agrees while the stream is shorter than the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zoo
from zoo.position.base import POSITION
from zoo.studies import StudyPaths, create_study
from zoo.studies.streaming_modes import MODES, Stream, attention_weights, mode_models, sink_mass

TINY = dict(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, dropout=0.0)


@torch.no_grad()
def test_the_modes_see_what_they_claim_and_the_window_caches_stay_constant():
    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", **TINY, position="none").eval()
    stream = torch.randint(0, 12, (61,))
    runs = {mode: Stream(mode, m, 12) for mode, m in mode_models(model, 12, 3).items()}
    cache = {mode: [] for mode in MODES}
    for start in (0, 30):
        for mode, run in runs.items():
            run.run(stream, start, start + 30)
            cache[mode].append(run.cache_mib())
    nll = {mode: np.asarray(run.nll) for mode, run in runs.items()}
    np.testing.assert_allclose(nll["window"], nll["recompute"], rtol=1e-4, atol=1e-5)
    for mode in ("window", "sinks", "recompute"):  # within the window every mode sees the whole past
        np.testing.assert_allclose(nll[mode][:13], nll["dense"][:13], rtol=1e-4, atol=1e-5)
    assert not np.allclose(nll["sinks"][20:], nll["window"][20:])  # past the window the sinks are seen
    assert cache["window"][0] == cache["window"][1] and cache["sinks"][0] == cache["sinks"][1]
    assert cache["dense"][1] == 2 * cache["dense"][0] and cache["recompute"] == [0.0, 0.0]


def test_a_rotary_model_numbers_its_rolled_cache_by_the_place_in_it():
    """The window and sinks modes renumber the cache (StreamingLLM's rule); dense and recompute count the
    stream, and a model without a renumbering position is left as it is."""
    rotary = zoo.create_model("vanilla_lm", **TINY, position="rope")
    renumbered = {mode: model.position.cache_positions for mode, model in mode_models(rotary, 8, 2).items()}
    assert renumbered == {"dense": False, "window": True, "sinks": True, "recompute": False}
    plain = zoo.create_model("vanilla_lm", **TINY, position="none")
    assert not any(model.position.cache_positions for model in mode_models(plain, 8, 2).values())


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
@torch.no_grad()
def test_recomputed_weights_give_the_layers_output(position):
    torch.manual_seed(0)
    part = POSITION.get(position)(16, 64, n_heads=2)
    attn = zoo.create_attention("vanilla", d_model=16, n_heads=2, causal=True, position=part).eval()
    x = torch.randn(2, 12, 16)
    weights = attention_weights(attn, x)  # [b, h, t, t]
    values = attn.split_heads(attn.to_v(x))
    out = attn.to_out(attn.merge_heads(weights @ values))
    torch.testing.assert_close(out, attn(x).out, atol=1e-5, rtol=1e-4)
    assert torch.all(weights.triu(1) == 0)


@torch.no_grad()
def test_mass_on_the_first_keys_per_layer_and_head():
    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", vocab_size=11, d_model=16, n_layers=2, n_heads=2, d_ff=32, position="rope")
    rows = sink_mass(model.eval(), torch.randint(0, 11, (3, 20)), first=10, sinks=2)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    uniform = float((2 / torch.arange(11, 21, dtype=torch.float64)).mean())
    assert all(r["uniform"] == pytest.approx(uniform) and 0 <= r["mass"] <= 1 for r in rows)
    assert rows[0]["ratio"] == pytest.approx(rows[0]["mass"] / uniform)


def test_verdict_reads_the_modes_bpc_over_the_last_half(tmp_path):
    study = create_study("streaming", StudyPaths(out=tmp_path, runs=tmp_path))
    assert "the claim shows**" in study.verdict("rope", dict(dense=5.0, window=3.0, sinks=2.1, recompute=2.1))
    assert "shows in part" in study.verdict("rope", dict(dense=5.0, window=2.1, sinks=2.1, recompute=2.1))
    assert "does not show" in study.verdict("none", dict(dense=4.2, window=3.9, sinks=3.8, recompute=2.8))
    assert "not enough rows" in study.verdict("none", dict(dense=4.2))
