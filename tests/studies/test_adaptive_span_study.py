"""The adaptive-span study without training: each mode reaches the app, the spans are read per layer and head
from the model's own statistics, and the verdict (short spans at no worse bpc; the layer pattern) from the rows."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import zoo
from zoo.app.compose import compose
from zoo.app.resolve import model_config
from zoo.studies import StudyPaths, create_study
from zoo.studies.adaptive_span import curve_label, span_table


def study(tmp_path, **options):
    return create_study("adaptive_span", StudyPaths(out=tmp_path, runs=tmp_path), **options)


def test_the_mode_reaches_the_model(tmp_path):
    cfg = compose(study(tmp_path, max_span=64, l1=0.0).overrides("dynamic"))
    attention = model_config(OmegaConf.to_container(cfg, resolve=True)).attention
    set_here = {"name": "adaptive_span", "mode": "dynamic", "max_span": 64, "ramp": 32, "l1": 0.0}
    assert {k: attention[k] for k in set_here} == set_here  # the preset's other options merged beneath


def test_span_table_reads_every_layer_and_head():
    torch.manual_seed(0)
    model = zoo.create_model("adaptive_span_lm", vocab_size=11, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                             attention={"mode": "fixed", "max_span": 16, "ramp": 4})
    assert span_table(model, torch.randint(0, 11, (2, 8))) == [[16.0, 16.0], [16.0, 16.0]]


def test_verdict_and_labels(tmp_path):
    s = study(tmp_path)
    summary = [dict(mode="learned", val_bpc="3.2", span_mean="1.0"), dict(mode="fixed", val_bpc="3.6", span_mean="256")]
    assert "are short** (mean 1.0 of S = 256) **at no worse bpc" in s.verdict(summary, [[0.0, 1.0], [2.0, 3.0]])
    assert "layer pattern does not show" in s.verdict(summary, [[0.0], [3.0]])
    assert "layer pattern shows" in s.verdict(summary, [[0.0], [100.0]])
    assert "not enough rows" in s.verdict(summary[:1], [[0.0]])
    assert curve_label(s.options.settings_key()) == "L1 2e-06, 600 steps"
    with pytest.raises(ValueError, match="modes"):
        study(tmp_path, modes=["sliding"])
