"""The Llama-gap study and its one loop (zoo/studies/reference_loop.py): every model of a seed sees the same
batches, the schedule is our trainer's shape, the scores are bits per token, transformer_pp and HF's Llama are
built the same shape (equal with weights copied), the ablation's cells change only what they name at equal
parameters, and the verdict reads the paired difference against the margin."""

from __future__ import annotations

import math

import pytest
import torch

import zoo
from zoo.studies import StudyPaths, create_study
from zoo.studies.llama_gap import ablation_overrides
from zoo.studies.reference_loop import (
    OURS,
    LoopSettings,
    build_llama,
    learning_rate,
    llama_sink_rows,
    next_token_loss,
    random_windows,
    segment_bpc,
    segments_of,
)


def study(tmp_path, **options):
    return create_study("llama_gap", StudyPaths(out=tmp_path, runs=tmp_path / "runs"), **options)


def test_schedule_warms_up_then_decays_and_batches_depend_on_the_seed_alone():
    rates = [learning_rate(step, 100, 1e-3, 10) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3) and rates[10] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:])) and rates[-1] < 1e-5
    stream, settings = torch.arange(1000), LoopSettings(batch_size=3, length=8, seed=5)
    first = random_windows(stream, settings, torch.Generator().manual_seed(5))
    assert torch.equal(first, random_windows(stream, settings, torch.Generator().manual_seed(5)))
    assert not torch.equal(first, random_windows(stream, settings, torch.Generator().manual_seed(6)))
    assert torch.equal(first[:, 1:] - first[:, :-1], torch.ones(3, 7, dtype=torch.long))  # contiguous windows


def test_segment_bpc_is_the_mean_next_token_loss_in_bits():
    torch.manual_seed(0)
    model = zoo.create_model("transformer_pp", vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    segments = segments_of(torch.randint(0, 11, (100,)), 12)  # 8 segments of 12, the last 4 tokens left out
    assert segments.shape == (8, 12) and segments_of(torch.arange(100), 12, limit=3).shape == (3, 12)
    with torch.no_grad():
        expected = float(next_token_loss(model.eval(), segments, OURS)) / math.log(2)
    assert segment_bpc(model, OURS, segments, batch_size=3) == pytest.approx(expected, rel=1e-5)


def test_ablation_cells_change_what_they_name_at_equal_parameters(tmp_path):
    s = study(tmp_path, d_model=32, n_layers=1, length=16)
    base, _ = s.build("vanilla_lm", 11, 0)
    cell, _ = s.build("rmsnorm/swiglu/gpt2", 11, 0)
    assert cell.config.norm["name"] == "rmsnorm" and cell.config.init["name"] == "gpt2"
    assert cell.config.feed_forward == {"name": "swiglu", "two_thirds": True, "bias": True}
    assert (base.config.position["name"], base.config.norm["name"]) == ("rope", "layernorm")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(count(cell) - count(base)) / count(base) < 0.01
    assert ablation_overrides("layernorm/mlp/default") == {"norm": "layernorm", "init": "default"}
    drawn, _ = s.build("transformer_pp_llama_init", 11, 0)  # the preset drawn as HF Llama draws its weights
    assert drawn.config.init == {"name": "gpt2", "scale_depth": False}
    linear = drawn.stack.blocks[0].attention.to_out.weight
    assert abs(float(linear.detach().std()) - 0.02) < 0.005  # N(0, 0.02), not scaled by depth
    with pytest.raises(ValueError, match="norm/feed_forward/init"):
        study(tmp_path, ablation=["rmsnorm/gelu/default"])


def test_transformer_pp_and_hf_llama_are_built_the_same_shape(tmp_path):
    pytest.importorskip("transformers")
    import zoo.convert

    s = study(tmp_path, d_model=32, n_layers=2, length=16)
    ours, _ = s.build("transformer_pp", 11, 0)
    theirs, kind = s.build("llama", 11, 0)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    copied = zoo.convert.from_llama(theirs).eval()  # its weights in our preset: the same losses
    batch = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(next_token_loss(copied, batch, OURS), next_token_loss(theirs.eval(), batch, kind))
    assert copied.stack.blocks[0].feed_forward.hidden == ours.stack.blocks[0].feed_forward.hidden == 85  # 8 d / 3
    assert copied.config.tie_embeddings and ours.config.tie_embeddings


def test_llama_sink_rows_read_its_own_attention_weights():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    llama = build_llama(11, 32, d_model=16, n_layers=2, n_heads=2, intermediate=32, eager=True).eval()
    rows = llama_sink_rows(llama, torch.randint(0, 11, (2, 20)), first=10, sinks=2)
    assert len(rows) == 4 and all(0 <= r["mass"] <= 1 for r in rows)


def rows(offsets: dict[str, float]) -> list[dict[str, str]]:
    return [dict(kind="model", model=model, seed=str(seed), bpc=str(2.0 + offset + 0.01 * seed),
                 parameters="1000", load_1min="1.0") for model, offset in offsets.items() for seed in (0, 1, 2)]


def test_verdict_reads_the_paired_difference_against_the_margin(tmp_path):
    s = study(tmp_path, ablation=[], timing_rounds=0)
    report = s.report(rows({"transformer_pp": 0.01, "llama": 0.0, "vanilla_lm": 0.2}))
    assert "transformer_pp - HF Llama = +0.010 bpc" in report and "within 0.02 bpc on the mean" in report
    assert "vanilla_lm (rope) - HF Llama = +0.200 bpc" in report and (tmp_path / "gap.png").stat().st_size > 0
    assert "not within 0.02" in s.report(rows({"transformer_pp": 0.05, "llama": 0.0}))
    assert "not enough rows" in s.report(rows({"vanilla_lm": 0.0}))
