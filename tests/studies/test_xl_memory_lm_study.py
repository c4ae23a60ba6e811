"""The Transformer-XL memory study without training: each model's overrides reach the app (memory on, off,
vanilla), the first-quarter bpc is read from the right positions, and the verdict from the rows."""

from __future__ import annotations

import math

import torch
from omegaconf import OmegaConf

import zoo
from zoo.app.compose import compose
from zoo.app.resolve import model_config
from zoo.studies import StudyPaths, create_study
from zoo.studies.xl_memory_lm import quarter_bpc


def study(tmp_path, **options):
    return create_study("xl_memory_lm", StudyPaths(out=tmp_path, runs=tmp_path), **options)


def test_each_model_reaches_the_app_with_its_memory(tmp_path):
    s = study(tmp_path, segment=16)
    built = {}
    for name in ("xl_memory", "xl_no_memory"):  # (vanilla_lm: the plain preset, carry_state off)
        cfg = compose(s.overrides(name))
        built[name] = (model_config(OmegaConf.to_container(cfg, resolve=True)).attention, cfg.trainer.carry_state)
    assert built["xl_memory"] == ({"name": "xl_rel", "mem_len": 16}, True)
    assert built["xl_no_memory"] == ({"name": "xl_rel", "mem_len": 0}, False)
    assert "trainer.carry_state=false" in s.overrides("vanilla_lm")


@torch.no_grad()
def test_first_quarter_is_the_first_positions_of_each_segment():
    class Uniform(torch.nn.Module):  # every position uniform over 4 symbols, except position 0 of a segment
        def init_state(self, batch):
            return None

        def forward(self, tokens, state=None):
            logits = torch.zeros(*tokens.shape, 4)
            logits[:, 0, 0] = 100.0  # the first position is sure of symbol 0 (and wrong unless it comes)
            return zoo.models.base.ModelOutput(logits=logits, state=None)

    stream = torch.full((8 * 33,), 1)
    bpc, early = quarter_bpc(Uniform(), stream, segment=8, memory=False)
    assert early > bpc > 0  # the sure, wrong first position weighs more in the first quarter
    assert math.isclose(bpc, (7 * 2 + 100 / math.log(2)) / 8, rel_tol=1e-3)


def test_verdict_from_the_rows(tmp_path):
    def rows(memory: float) -> list[dict[str, str]]:
        values = (("xl_memory", "32", memory, memory + 0.03), ("xl_memory", "128", 0.0, 0.0),
                  ("xl_no_memory", "0", 2.85, 3.03), ("vanilla_lm", "0", 2.92, 3.09))
        return [dict(settings="k", kind="eval", model=m, eval_memory=e, eval_bpc=str(b), eval_bpc_first_quarter=str(q),
                     train_seconds="1") for m, e, b, q in values]

    s = study(tmp_path)
    assert "claim shows**: with memory 2.740 bpc against 2.850" in s.verdict(rows(2.74))
    assert "does not show" in s.verdict(rows(2.9))
