"""The backbone-memory study: its loop scores by where the source lies, delays beyond the memory are refused
before anything runs, and the verdict reads memory against no memory from the rows."""

from __future__ import annotations

import pytest
import torch

from zoo.models.base import ModelOutput
from zoo.studies import StudyPaths, create_study
from zoo.studies.backbone_memory import BackboneMemory, Options, Regressor, split_errors, stream


def test_a_delay_beyond_the_memory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mem_len"):
        create_study("backbone_memory", StudyPaths(out=tmp_path, runs=tmp_path), ks=[9], mem_len=8)


def test_errors_are_split_by_where_the_source_lies():
    """A prediction right only where the source is inside the current segment scores 0 there and the
    target's own square (> 0) where it lies in an earlier segment; positions t < k are not scored."""
    options = Options(segment=4, segments=3, features=2, ks=[2], mem_len=4)
    pieces = stream(3, options, 2, torch.Generator().manual_seed(0))
    outputs = []
    for index, piece in enumerate(pieces):
        t = torch.arange(4 * index, 4 * index + 4)
        inside = (t - 2) >= 4 * index
        outputs.append(ModelOutput(torch.where(inside[None, :, None], piece["targets"], torch.zeros(()))))
    totals = split_errors(outputs, pieces, 2)
    assert totals["in_sse"] == 0.0 and totals["earlier_sse"] > 0
    # t >= 2 scored: t = 2, 3, 6, 7, 10, 11 see their source in the segment, t = 4, 5, 8, 9 in the one before
    assert (totals["in_n"], totals["earlier_n"]) == (3 * 6, 3 * 4)


def test_only_the_memory_presets_carry_state_between_calls():
    options = Options(d_model=16, layers=1, heads=2, mem_len=8, ks=[2])
    xl, vanilla = Regressor("transformer_xl", options), Regressor("vanilla_lm", options)
    for model in (xl, vanilla):
        model.reset(2)
        model(torch.randn(2, 4, options.features))
    assert xl.backbone.state is not None and vanilla.backbone.state is None


def test_verdict_reads_memory_against_no_memory():
    def row(preset, mse):
        return dict(preset=preset, k="24", delay="beyond segment", mse=mse)

    recalls = BackboneMemory.verdict([row("gtrxl", "0.01"), row("vanilla_lm", "1.0")])
    assert "recall beyond the segment** (worst" in recalls and "vanilla_lm cannot" in recalls
    assert "do not all recall" in BackboneMemory.verdict([row("gtrxl", "0.5"), row("vanilla_lm", "1.0")])
    assert "not enough rows" in BackboneMemory.verdict([row("gtrxl", "0.01")])
