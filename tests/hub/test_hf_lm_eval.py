"""lm-evaluation-harness scores a saved zoo model (``--model hf --model_args pretrained=<folder>``), offline,
on the task defined beside this file (tests/hub/lm_eval_task: a YAML over a local JSONL), and the
log-likelihood it reports for each (context, continuation) is the zoo model's own: the sum of its
log-probabilities of the continuation's bytes after the context."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.24")
pytest.importorskip("lm_eval")

import torch  # noqa: E402

import zoo  # noqa: E402
from tests.hub.hf_helpers import byte_lm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tests" / "hub" / "lm_eval_task"
TASK = "zoo_bytes_choice"


def zoo_loglikelihood(model, context: str, continuation: str) -> float:
    """log p(continuation | context) from the zoo model's logits, byte by byte."""
    ctx, cont = list(context.encode("utf-8")), list(continuation.encode("utf-8"))
    tokens = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens[:, :-1]).logits.double(), -1)[0]
    positions = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1)
    return float(logp[positions, torch.tensor(cont)].sum())


def check_against_zoo(samples: list[dict], model) -> None:
    assert len(samples) == 4
    for sample in samples:
        for (context, continuation), (loglikelihood, _greedy) in zip(sample["arguments"], sample["filtered_resps"]):
            assert float(loglikelihood) == pytest.approx(zoo_loglikelihood(model, context, continuation), abs=1e-4)


def test_the_harness_hf_model_reads_the_folder_and_scores_as_the_zoo(tmp_path):
    """The fast case: the harness's ``hf`` model (HFLM, what ``--model hf`` builds) on the folder, its
    log-likelihood requests batched and padded as the harness does, against the zoo's own."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    byte_lm().save_pretrained(tmp_path / "m")
    rows = [json.loads(line) for line in (TASKS / f"{TASK}.jsonl").read_text().splitlines()]
    pairs = [(row["context"], choice) for row in rows for choice in row["choices"]]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    harness = HFLM(pretrained=str(tmp_path / "m"), device="cpu", batch_size=3)
    scores = harness.loglikelihood(requests)
    model = zoo.from_pretrained(tmp_path / "m")
    for (context, continuation), (loglikelihood, _greedy) in zip(pairs, scores):
        assert loglikelihood == pytest.approx(zoo_loglikelihood(model, context, continuation), abs=1e-4)


@pytest.mark.slow
def test_lm_eval_scores_a_saved_zoo_model_with_its_own_loglikelihoods(tmp_path, monkeypatch):
    """simple_evaluate over the task YAML (its dataset read from the local JSONL; over a few seconds)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(REPO)  # the task's data_files are paths from the repository root
    byte_lm().save_pretrained(tmp_path / "m")
    result = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tmp_path / 'm'}",
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        log_samples=True,
        device="cpu",
        batch_size=2,
    )
    assert 0.0 <= result["results"][TASK]["acc,none"] <= 1.0
    check_against_zoo(result["samples"][TASK], zoo.from_pretrained(tmp_path / "m"))


@pytest.mark.slow
def test_the_harness_command_line_scores_a_saved_zoo_model(tmp_path):
    """``python -m zoo.hub.harness run --model hf --model_args pretrained=<folder>`` (lm-eval's own CLI after
    ``import zoo``), written samples equal to the zoo's log-likelihoods."""
    byte_lm().save_pretrained(tmp_path / "m")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable, "-m", "zoo.hub.harness", "run", "--model", "hf",
        "--model_args", f"pretrained={tmp_path / 'm'}", "--tasks", TASK, "--include_path", str(TASKS),
        "--device", "cpu", "--batch_size", "2", "--log_samples", "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=REPO, env=env, timeout=600)
    written = sorted((tmp_path / "out").rglob(f"samples_{TASK}_*.jsonl"))
    assert written, sorted(p.name for p in (tmp_path / "out").rglob("*"))
    samples = [json.loads(line) for line in written[-1].read_text().splitlines()]
    for sample in samples:  # the JSONL keeps arguments as {"gen_args_0": {"arg_0": ctx, "arg_1": cont}, ...}
        sample["arguments"] = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        sample["filtered_resps"] = [(float(r[0]), r[1]) for r in sample["filtered_resps"]]
    check_against_zoo(samples, zoo.from_pretrained(tmp_path / "m"))
