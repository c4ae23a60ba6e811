"""The training application end to end: a tiny run per task, resume equivalence, refusals
(NaN loss, corrupt or mismatched checkpoints, missing data), a tiny multirun summary, DDP."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("hydra")

from support.app_cli import train_main  # noqa: E402
from support.app_overrides import TINY  # noqa: E402
from support.script_modules import load_script

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import load_run, run  # noqa: E402
from zoo.data import DataFileNotFound  # noqa: E402
from zoo.train.checkpoints.format import (  # noqa: E402
    CheckpointError,
    load_checkpoint,
    write_checksum,  # noqa: E402
)
from zoo.train.scoring import evaluate_model  # noqa: E402
from zoo.train.steps import TrainingDiverged  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def imdb_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "aclImdb.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for split in ("train", "test"):
            for polarity in ("pos", "neg"):
                for i in range(8):
                    data = (f"{polarity} " * 5).encode()
                    info = tarfile.TarInfo(f"aclImdb/{split}/{polarity}/{i}_5.txt")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return path


def train(tmp_path, *overrides, callbacks=()):
    return run(compose(TINY + list(overrides)), run_dir=tmp_path, callbacks=callbacks)


def result(run_dir):
    return json.loads((Path(run_dir) / "result.json").read_text())


@pytest.mark.parametrize(
    "task", ["duplication", "associative_recall", "listops", "char_lm", "enwik8", "imdb", "reverse"]
)
def test_tiny_run_per_task(tmp_path, task, text_file, imdb_file):
    extra = {
        "duplication": [],
        "associative_recall": ["data.n_pairs=4"],
        "listops": ["model=vanilla_classifier", "data.min_length=4", "data.max_length=16", "data.eval_size=4"],
        "char_lm": [f"data.path={text_file}"],
        "enwik8": [f"data.path={text_file}", "data.split=[18000,1000,1000]"],
        "imdb": ["model=vanilla_classifier", f"data.path={imdb_file}", "data.val_size=4"],
        "reverse": ["model=vanilla_seq2seq", "data.eval_size=4"],
    }[task]
    value = train(tmp_path, f"data={task}", *extra)
    res = result(tmp_path)
    assert res["status"] == "finished" and res["steps"] == 4 and res["final_metric"] == value and math.isfinite(value)
    assert res["metric"] == {"char_lm": "bpc", "enwik8": "bpc"}.get(task, "accuracy")
    assert res["tokens_per_s"] > 0 and res["params"] > 0 and res["act_mib"] > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows) and any(f"val/{res['metric']}" in r for r in rows)
    assert (tmp_path / "metrics.csv").read_text().startswith("step,")
    # the checkpoints hold the weights that scored what the run reported: reloaded as evaluate.py
    # does (a task rebuilt from the checkpoint), they score it again on the same validation batch,
    # loss included (continuous: an untrained model would not match it by chance)
    evaluations = {r["step"]: r for r in rows if f"val/{res['metric']}" in r}
    assert sorted(evaluations) == [2, 4]
    for name in ("last.pt", "best.pt"):
        _, task, model, ckpt = load_run(tmp_path / "checkpoints" / name)
        again = evaluate_model(model, task, "val", 1)
        assert again == {k: evaluations[ckpt["step"]][k] for k in again}, name
    assert (
        evaluations[4][f"val/{res['metric']}"] == res["final_metric"] and res["val/loss"] == evaluations[4]["val/loss"]
    )
    assert evaluations[ckpt["step"]][f"val/{res['metric']}"] == res["best_metric"]  # best.pt: the best step's


def _interrupt_at(step):
    """A real SIGINT (Ctrl-C) during step ``step``'s callbacks: the run stops after that step."""

    def callback(trainer, current):
        if current == step:
            os.kill(os.getpid(), signal.SIGINT)

    return callback


def test_resume_equals_straight_run(tmp_path, text_file):
    """2 steps, Ctrl-C (saves), resume for 2 more == 4 steps straight: same parameters, optimiser
    state, and data position (contiguous text, dropout on so RNG restore matters)."""
    common = ["data=char_lm", f"data.path={text_file}", "model.dropout=0.1", "trainer.eval_every=0"]
    train(tmp_path / "straight", *common)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "split", *common, callbacks=(_interrupt_at(2),))
    assert load_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")["step"] == 2
    train(tmp_path / "resumed", *common, f"trainer.resume={tmp_path / 'split' / 'checkpoints' / 'last.pt'}")
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 4
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
    assert result(tmp_path / "straight")["final_metric"] == result(tmp_path / "resumed")["final_metric"]


def test_nan_weights_are_never_saved_and_the_sound_checkpoint_is_named(tmp_path):
    """Weights poisoned after step 2: the step-2 save is refused (last.pt keeps step 1, finite) and
    the error names that file. (Before: last.pt was overwritten with NaN and called "good".)"""

    def poison(trainer, step):
        if step == 2:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))

    with pytest.raises(TrainingDiverged) as info:
        train(tmp_path, "trainer.checkpoint_every=1", "trainer.eval_every=0", callbacks=(poison,))
    message, last = str(info.value), tmp_path / "checkpoints" / "last.pt"
    assert "step 2" in message and f"newest sound checkpoint: {last}" in message
    saved = load_checkpoint(last)
    assert saved["step"] == 1 and all(torch.isfinite(t).all() for t in saved["model"].values())


def test_nan_loss_stops_naming_step_and_checkpoint(tmp_path):
    def poison(trainer, step):
        if step == 1:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))

    with pytest.raises(TrainingDiverged) as info:
        train(tmp_path, "trainer.checkpoints=false", callbacks=(poison,))
    assert "loss is nan at step 2" in str(info.value)


def test_corrupt_and_mismatched_checkpoints_are_refused(tmp_path):
    train(tmp_path / "a")
    good = tmp_path / "a" / "checkpoints" / "last.pt"
    with pytest.raises(CheckpointError, match="different model.*d_model"):
        train(tmp_path / "b", "model.d_model=64", f"trainer.resume={good}")
    with pytest.raises(CheckpointError, match="different data"):
        train(tmp_path / "b", "data.eval_size=50", f"trainer.resume={good}")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(good.read_bytes()[:1000])
    write_checksum(good)
    Path(f"{corrupt}.sha256").write_text(Path(f"{good}.sha256").read_text())  # the sound file's digest
    with pytest.raises(CheckpointError, match="its SHA-256 is .* but corrupt.pt.sha256 records"):
        train(tmp_path / "c", f"trainer.resume={corrupt}")
    Path(f"{corrupt}.sha256").unlink()  # no sidecar: read (with a warning), and refused for what it holds
    with pytest.warns(UserWarning, match="no checksum file"), pytest.raises(CheckpointError, match="cannot read"):
        train(tmp_path / "c", f"trainer.resume={corrupt}")
    write_checksum(corrupt)  # a truncated file whose checksum was (wrongly) refreshed: the reader still refuses it
    with pytest.raises(CheckpointError, match="cannot read"):
        train(tmp_path / "c", f"trainer.resume={corrupt}")
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    write_checksum(tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a transformer-zoo checkpoint"):
        train(tmp_path / "c", f"trainer.resume={tmp_path / 'foreign.pt'}")


def test_missing_data_file_names_path_and_key(tmp_path):
    with pytest.raises(DataFileNotFound, match=r"no/such/file.txt.*data\.path"):
        train(tmp_path, "data=char_lm", "data.path=no/such/file.txt")


def test_kind_mismatch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="classifier model"):
        train(tmp_path, "model=vanilla_classifier")


def _subprocess_env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_SILENT="true", OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    return env


def test_tiny_multirun_writes_summary(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    code = train_main(
        [
            "-m",
            *TINY,
            "trainer.max_steps=2",
            "trainer.eval_every=0",
            "attention=vanilla,additive",
            f"hydra.sweep.dir={sweep}",
        ],
        monkeypatch,
    )
    assert code == 0
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["attention"] for r in rows} == {"vanilla", "additive"} and all(r["status"] == "finished" for r in rows)
    for row in rows:  # each row is its job's result.json, and the job ran the attention its row names
        job = sweep / row["run"].split(":")[0]
        result = json.loads((job / "result.json").read_text())
        for key in ("final_metric", "best_metric", "tokens_per_s", "act_mib", "wall_s"):
            assert float(row[key]) == result[key], key
        assert (int(row["steps"]), int(row["params"]), row["model"]) == (2, result["params"], result["model"])
        config = json.loads((job / "config.json").read_text())
        assert config["model_config"]["attention"]["name"] == row["attention"] == result["attention"]
        assert row["run"].endswith(f"attention={row['attention']}")
    assert rows[0]["params"] != rows[1]["params"]  # additive attention has its own score weights
    assert (sweep / "summary.png").stat().st_size > 1000
    md = (sweep / "summary.md").read_text()
    assert "val/accuracy" in md and "additive" in md and "summary.png" in capsys.readouterr().out


def test_multirun_survives_a_failing_variant(tmp_path, monkeypatch, capsys):
    """The other jobs run and the summary is written; the launch then exits 1 naming the failed job
    (before: exit 0, as if every job had finished)."""
    sweep = tmp_path / "sweep"
    argv = ["-m", *TINY, "trainer.max_steps=1", "trainer.eval_every=0", "model.n_heads=2,3", f"hydra.sweep.dir={sweep}"]
    assert train_main(argv, monkeypatch) == 1
    error = capsys.readouterr().err
    assert "1 job(s) of the sweep" in error and "job 1 (" in error and "model.n_heads=3): failed: ValueError" in error
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["status"][:6] for r in rows) == ["failed", "finis"] or {
        r["status"].split(":")[0] for r in rows
    } == {"finished", "failed"}
    failed = next(r for r in rows if r["status"].startswith("failed"))
    assert "divisible" in failed["status"]


def _ddp_worker(rank, world_size, port, overrides, run_dir, errors):
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        torch.set_num_threads(1)
        run(compose(overrides), run_dir=run_dir)
    except BaseException as exc:  # report to the parent
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DDP_COMMON = ["data=char_lm", "trainer.max_steps=2", "trainer.eval_every=0", "trainer.threads=1"]


def _compare_ddp_with_single(tmp_path, text_file):
    train(tmp_path / "single", *DDP_COMMON, f"data.path={text_file}", "trainer.batch_size=4")
    a = load_checkpoint(tmp_path / "ddp" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "single" / "checkpoints" / "last.pt")
    assert a["world_size"] == 2 and a["step"] == 2
    for key in a["model"]:  # different data would differ by ~lr (3e-3) per step; reduction order by ~1e-5
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-3, atol=3e-4)
    assert len((tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()) == len(
        (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()
    )


def test_ddp_two_cpu_processes_match_one_process(tmp_path, text_file):
    """2 processes x 2 rows (gloo) == 1 process x 4 rows: the same lanes of the text and the same
    averaged gradient; only rank 0 writes. Forked workers (no re-import); the torchrun CLI path is
    the slow test below."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    errors, port = ctx.Queue(), _free_port()
    overrides = TINY + DDP_COMMON + [f"data.path={text_file}"]
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, overrides, tmp_path / "ddp", errors)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert errors.empty(), errors.get()
    assert all(p.exitcode == 0 for p in procs)
    _compare_ddp_with_single(tmp_path, text_file)


@pytest.mark.slow
def test_ddp_with_torchrun(tmp_path, text_file):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "experiments" / "train.py"),
        *TINY,
        *DDP_COMMON,
        f"data.path={text_file}",
        f"hydra.run.dir={tmp_path / 'ddp'}",
    ]
    proc = subprocess.run(cmd, env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _compare_ddp_with_single(tmp_path, text_file)


def test_wandb_offline_logging_writes_nothing_outside_the_run(tmp_path):
    """The default logger (wandb, offline) logs the run inside its directory, and writes nothing else:
    before, wandb-core left its debug logs under ~/.cache/wandb (here HOME is a fresh folder)."""
    pytest.importorskip("wandb")
    home, run_dir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    env = {k: v for k, v in _subprocess_env().items() if not k.startswith(("WANDB_", "XDG_"))}
    env.update(HOME=str(home), WANDB_SILENT="true")
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), *TINY, "logger=wandb", "trainer.max_steps=2"]
    proc = subprocess.run([*cmd, f"hydra.run.dir={run_dir}"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and result(run_dir)["status"] == "finished"
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []


@pytest.fixture
def memory_attention():
    """A toy memory mechanism (registered for this test only): vanilla attention that always keeps
    a bounded KV cache of the last 8 tokens and returns it, like segment-level recurrence."""
    from zoo.attention.base import ATTENTION
    from zoo.attention.vanilla import VanillaAttention

    class ToyMemory(VanillaAttention):
        def forward(self, x, *, context=None, pad_mask=None, state=None):
            return super().forward(
                x, context=context, pad_mask=pad_mask, state=state if state is not None else self.init_state(x.shape[0])
            )

    ToyMemory.registry_name = None
    ATTENTION.register("toy_memory_for_tests", ToyMemory)
    yield "toy_memory_for_tests"
    ATTENTION._entries.pop("toy_memory_for_tests")


def test_resume_restores_carried_memory(tmp_path, text_file, memory_attention):
    common = [
        "data=char_lm",
        f"data.path={text_file}",
        "trainer.eval_every=0",
        f"model.attention={{name: {memory_attention}, max_cache: 8}}",
    ]
    train(tmp_path / "straight", *common)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "split", *common, callbacks=(_interrupt_at(2),))
    saved = load_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert saved["state"] is not None and saved["state"]["offset"] == 32  # two 16-token segments carried
    train(tmp_path / "resumed", *common, f"trainer.resume={tmp_path / 'split' / 'checkpoints' / 'last.pt'}")
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    # without the memory the resumed run would differ: check the memory mattered
    train(tmp_path / "no_carry", *common, "trainer.carry_state=false")
    c = load_checkpoint(tmp_path / "no_carry" / "checkpoints" / "last.pt")
    assert any(not torch.equal(a["model"][k], c["model"][k]) for k in a["model"])


def test_evaluate_script_carries_memory(tmp_path, text_file, memory_attention, capsys):

    train(
        tmp_path,
        "data=char_lm",
        f"data.path={text_file}",
        f"model.attention={{name: {memory_attention}, max_cache: 8}}",
    )
    module = load_script(ROOT / "experiments" / "evaluate.py")
    out = module.main([str(tmp_path / "checkpoints" / "best.pt"), "--split", "val", "--batches", "3"])
    assert out["memory_carried"] and math.isfinite(out["val/bpc"]) and out["val/scored"] == 3 * 2 * 16
    module = load_script(ROOT / "experiments" / "sample.py")
    text = module.main([str(tmp_path / "checkpoints" / "best.pt"), "--prompt", "abc", "--tokens", "5"])
    assert text.startswith("abc") and len(text) == 8
    # the sampling options users reach for, streamed as they come: what is printed is what is returned
    capsys.readouterr()
    options = ["--top-p", "0.9", "--min-p", "0.05", "--repetition-penalty", "1.2", "--stream"]
    text = module.main([str(tmp_path / "checkpoints" / "best.pt"), "--prompt", "abc", "--tokens", "5", *options])
    assert capsys.readouterr().out == text + "\n" and len(text) == 8
    greedy_args = [str(tmp_path / "checkpoints" / "best.pt"), "--prompt", "abc", "--tokens", "5", "--greedy"]
    first = module.main(greedy_args)[3]  # the first greedy character, made the end token: generation stops there
    _, task, _, _ = load_run(tmp_path / "checkpoints" / "best.pt")
    assert module.main([*greedy_args, "--eos", str(task.encode(first)[0])]) == "abc" + first


def test_aux_losses_are_added_and_logged_by_name(tmp_path):
    """A toy mechanism with an aux loss (registered for this test only): the loss reaches the
    gradient (its weight moves) and is logged as train/aux/<name>."""
    from zoo.attention.base import ATTENTION, AttnOutput
    from zoo.attention.vanilla import VanillaAttention

    class ToyAux(VanillaAttention):
        def __init__(self, d_model, n_heads, **kwargs):
            super().__init__(d_model, n_heads, **kwargs)
            self.gate = torch.nn.Parameter(torch.ones(()))

        def forward(self, x, **kwargs):
            out = super().forward(x, **kwargs)
            return AttnOutput(out.out, out.state, {"toy_l1": 0.5 * self.gate.abs()}, {"gate": self.gate.detach()})

    ATTENTION.register("toy_aux_for_tests", ToyAux)
    try:
        train(tmp_path, "model.attention={name: toy_aux_for_tests}", "trainer.log_every=1")
    finally:
        ATTENTION._entries.pop("toy_aux_for_tests")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    aux = [r["train/aux/toy_l1"] for r in rows if "train/aux/toy_l1" in r]
    assert len(aux) == 4 and aux[0] == pytest.approx(2 * 0.5)  # two layers, 0.5 * |1| each, at step 1
    assert aux[-1] < aux[0]  # the aux loss was part of the objective: the gates shrank
    assert any("train/stats/layer0/attn/gate" in r for r in rows)


def test_compile_option_reaches_the_trainer(tmp_path, monkeypatch):
    """trainer.compile=true trains through torch.compile(model) (here a stand-in that counts calls, so
    nothing compiles: the real compilation is test_compile_option_trains_two_steps); default: eager."""
    calls = []

    class Compiled(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.inner = module

        def forward(self, *args, **kwargs):
            calls.append(1)
            return self.inner(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", Compiled)
    seen = {}

    def look(trainer, step):
        seen.setdefault(trainer.run_dir.name, type(trainer.net).__name__)

    train(tmp_path / "eager", "trainer.max_steps=2", "trainer.checkpoints=false", callbacks=[look])
    assert seen["eager"] != "Compiled" and not calls
    train(
        tmp_path / "compiled",
        "trainer.max_steps=2",
        "trainer.checkpoints=false",
        "trainer.compile=true",
        callbacks=[look],
    )
    assert seen["compiled"] == "Compiled" and len(calls) == 2  # one training forward per step
    assert result(tmp_path / "compiled")["steps"] == 2


@pytest.mark.slow  # torch.compile takes over a minute on the shared 2-core machine
def test_compile_option_trains_two_steps(tmp_path):
    seen = {}

    def look(trainer, step):
        seen[step] = (type(trainer.net).__name__, trainer.tokens_per_s[-1])

    train(tmp_path, "trainer.compile=true", "trainer.max_steps=2", "trainer.eval_every=0", callbacks=[look])
    res = result(tmp_path)
    assert res["status"] == "finished" and res["steps"] == 2 and math.isfinite(res["final_metric"])
    assert seen[1][0] == seen[2][0] == "OptimizedModule"
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert math.isfinite(first["train/loss"])
