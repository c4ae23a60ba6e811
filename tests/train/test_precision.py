"""trainer.precision=bf16 through the app on the CPU, and refusals at composition: a device or a
precision the machine cannot run is refused before any data or model is built."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("hydra")

from support.app_overrides import TINY  # noqa: E402

from zoo.app import run as app_run  # noqa: E402
from zoo.app.compose import compose  # noqa: E402
from zoo.precision import check_precision  # noqa: E402


def test_bf16_trains_on_the_cpu_through_the_app(tmp_path, text_file):
    """Before: "trainer.precision=bf16 autocast needs CUDA here", raised after the data was built."""
    seen = []

    def inside_autocast(trainer, step):
        with trainer.autocast():
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    cfg = compose([*TINY, "trainer.precision=bf16", "model=transformer_xl", "data=char_lm", f"data.path={text_file}"])
    value = app_run.run(cfg, run_dir=tmp_path, callbacks=[inside_autocast])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "finished" and result["precision"] == "bf16" and result["final_metric"] == value
    assert math.isfinite(value)
    assert seen == [(True, torch.bfloat16)] * 4


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.precision=fp16", r"trainer.precision must be fp32 or bf16, got 'fp16'"),
        ("trainer.batch_size=0", r"trainer.batch_size must be a positive int"),
        pytest.param(
            "trainer.device=cuda",
            r"trainer.device='cuda' but CUDA is not available here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent"),
        ),
    ],
)
def test_a_run_that_cannot_run_is_refused_before_data_or_model(tmp_path, monkeypatch, override, message):
    """Before: each of these was found by the trainer, after the task and the model were built."""

    def built(*args, **kwargs):
        raise AssertionError("the data was built before the configuration was checked")

    monkeypatch.setattr(app_run, "make_task", built)
    with pytest.raises(ValueError, match=message):
        app_run.run(compose([*TINY, override]), run_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written either


def test_bf16_on_a_gpu_without_it_names_the_key_and_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(
        ValueError, match=r"trainer.precision=bf16: Tesla T4 has no native bfloat16.*trainer.precision=fp32"
    ):
        check_precision("bf16", "cuda")
    check_precision("fp32", "cuda")  # fp32 runs anywhere
    check_precision("bf16", "cpu")  # CPU autocast
