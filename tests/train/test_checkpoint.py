"""Trustworthy runs (issue 10): checkpoints are data and checked, resume is exact for every preset,
state is carried for every memory mechanism, nothing is lost or written outside the run directory.

Each test here failed on the code before this change (see the docstrings for what it caught)."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import zoo

pytest.importorskip("hydra")

from support.app_overrides import TINY, script  # noqa: E402
from support.fast_cases import FAST_PRESETS, default_run_keeps  # noqa: E402

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import run  # noqa: E402
from zoo.train.checkpoints.format import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from zoo.train.steps import TrainingDiverged  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def train(run_dir, *overrides, callbacks=()):
    return run(compose(TINY + list(overrides)), run_dir=run_dir, callbacks=callbacks)


def stop_at(step):
    """A callback that interrupts the run after ``step`` (like Ctrl-C: the trainer saves first)."""

    def callback(trainer, current):
        if current == step:
            raise KeyboardInterrupt

    return callback


def sha256_sidecar(path):
    Path(f"{path}.sha256").write_text(f"{hashlib.sha256(Path(path).read_bytes()).hexdigest()}  {Path(path).name}\n")


# -- 6. checkpoints are data -----------------------------------------------------------------------------


class RunsCode:
    """Unpickling this runs ``exec``: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def plant(path, marker):
    """A checkpoint-shaped file whose unpickling writes ``marker`` (with a matching checksum)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": "transformer-zoo/checkpoint/v2", "step": 1, "model": RunsCode(marker), "model_config": {}}
    torch.save(payload, path)
    sha256_sidecar(path)
    return path


def test_crafted_checkpoint_runs_nothing_from_any_loader(tmp_path):
    """Before: every loader used torch.load(weights_only=False) and ran the file's code."""
    marker = tmp_path / "marker.txt"
    crafted = plant(tmp_path / "crafted.pt", marker)
    loaders = {
        "zoo.train.trainer.load_checkpoint": lambda: load_checkpoint(crafted),
        "zoo.load_checkpoint": lambda: zoo.load_checkpoint(crafted),
        "evaluate.py": lambda: script("evaluate").main([str(crafted), "--split", "val", "--batches", "1"]),
        "sample.py": lambda: script("sample").main([str(crafted), "--tokens", "2"]),
        "trainer.resume=PATH": lambda: train(tmp_path / "resume_path", f"trainer.resume={crafted}"),
    }
    plant(tmp_path / "auto" / "checkpoints" / "last.pt", marker)
    loaders["trainer.resume=auto"] = lambda: train(tmp_path / "auto", "trainer.resume=auto")
    for name, load in loaders.items():
        with pytest.raises(CheckpointError, match=r"crafted.pt|last.pt") as info:
            load()
        assert not marker.exists(), f"{name} ran code from the checkpoint"
        assert "other than tensors and plain data" in str(info.value), name


def test_checkpoint_holds_only_tensors_and_plain_types(tmp_path, text_file):
    """The whole payload (RNG states, carried memory, progress) loads with weights_only=True."""
    train(tmp_path, "model=transformer_xl", "data=char_lm", f"data.path={text_file}")
    payload = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert payload["state"]["__dataclass__"] == "zoo.models.base:ModelState" and payload["step"] == 4
    assert isinstance(payload["rng"]["numpy"]["key"], torch.Tensor)


@pytest.mark.parametrize(
    "tag",
    ["zoo.attention.xl_rel:XLMemory", "zoo.attention.adaptive_span:SpanCache", "zoo.attention.blocked:PatternCache"],
)
def test_state_classes_named_before_their_module_was_split_still_load(tag):
    """Issue 37 split XL's memory and the span cache into modules of their own: a checkpoint written before
    names the class by its old module (``module:QualName``), which must still rebuild it (the old module
    imports it), and a state written today round-trips."""
    from zoo.train.checkpoints.format import STATE_TAG, state_from_data, state_to_data

    old = {STATE_TAG: tag, "next": 3} if "xl_rel" not in tag else {STATE_TAG: tag, "states": torch.ones(1, 2, 4)}
    state = state_from_data(old)
    assert type(state).__name__ == tag.split(":")[1]
    again = state_from_data(state_to_data(state))
    assert type(again) is type(state) and again.length == state.length


# -- 7. corruption is refused -------------------------------------------------------------------------


def test_flipped_bytes_are_refused_naming_the_file_and_the_sound_one(tmp_path):
    """Before: 64 flipped bytes in the middle loaded with rc 0 and corrupted tensors silently."""
    train(tmp_path, "trainer.eval_every=0")
    last, best = tmp_path / "checkpoints" / "last.pt", tmp_path / "checkpoints" / "best.pt"
    data = bytearray(last.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    last.write_bytes(bytes(data))
    os.utime(best, (1, 1))  # older than anything: still named, as the only sound one
    expected = rf"refusing checkpoint {last}: its SHA-256.*sound checkpoint beside it is {best}"
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(last)
    with pytest.raises(CheckpointError, match="SHA-256"):
        train(tmp_path / "again", f"trainer.resume={last}")
    with pytest.raises(CheckpointError, match="SHA-256"):
        script("evaluate").main([str(last), "--batches", "1"])
    assert load_checkpoint(best)["step"] == 4


# -- 8. divergence never overwrites a sound checkpoint ------------------------------------------------


def test_divergence_names_a_checkpoint_that_evaluates_finite(tmp_path):
    """Before: "loss is nan ... last good checkpoint: .../last.pt", and that file evaluated to NaN."""
    with pytest.raises(TrainingDiverged) as info:
        train(
            tmp_path,
            "optim.lr=1e3",
            "optim.schedule=constant",
            "optim.warmup=0",
            "trainer.clip=0",
            "trainer.eval_every=1",
            "trainer.max_steps=20",
        )
    message = str(info.value)
    last = tmp_path / "checkpoints" / "last.pt"
    assert str(last) in message, message
    result = script("evaluate").main([str(last), "--split", "val", "--batches", "1"])
    assert math.isfinite(result["val/loss"]) and math.isfinite(result["val/accuracy"])
    assert all(torch.isfinite(t).all() for t in load_checkpoint(last)["model"].values())
    assert f"newest sound checkpoint: {last}" in message, message


# -- 3. resume is exact for every preset ----------------------------------------------------------------


def preset_overrides(preset, text_file):
    from zoo.data.layouts import write_aan

    kind = zoo.preset_config(preset).kind
    if kind == "pair_classifier":  # AAN-style document pairs, written in the released TSV layout
        aan = text_file.parent / "aan"
        if not aan.exists():
            write_aan(aan)
    data = {
        "lm": ["data=char_lm", f"data.path={text_file}"],
        "classifier": ["data=listops", "data.min_length=4", "data.max_length=16", "data.eval_size=4"],
        "pair_classifier": ["data=aan", f"data.path={text_file.parent / 'aan'}"],
        "seq2seq": ["data=reverse", "data.eval_size=4"],
    }[kind]
    return [f"model={preset}", *data, "model.dropout=0.1", "trainer.eval_every=0", "trainer.log_every=1"]


@pytest.mark.parametrize("preset", default_run_keeps(zoo.list_models(), FAST_PRESETS))
def test_resume_is_exact_for_every_preset(tmp_path, preset, text_file):
    """4 steps straight == 2 + resume + 2, bit for bit: weights, every buffer (LSH's hash_step),
    optimiser state, the carried memory and the final metric. Before: the Reformer's rotations
    restarted on resume (hash_step was not saved) and its weights drifted."""
    common = preset_overrides(preset, text_file)
    train(tmp_path / "straight", *common)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "split", *common, callbacks=(stop_at(2),))
    train(tmp_path / "split", *common, "trainer.resume=auto")
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 4
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert json.dumps(a["state"], default=lambda t: t.tolist()) == json.dumps(b["state"], default=lambda t: t.tolist())
    ra = json.loads((tmp_path / "straight" / "result.json").read_text())
    rb = json.loads((tmp_path / "split" / "result.json").read_text())
    assert ra["final_metric"] == rb["final_metric"]
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]


def test_lsh_rotation_step_is_saved():
    model = zoo.create_model("reformer", **zoo.presets.get_preset("reformer").tiny)
    assert any(key.endswith("hash_step") for key in model.state_dict())


# -- 2. state is carried for every memory mechanism -------------------------------------------------------


def library_metric(model, task, batches):
    """The library's own loop: init_state, then feed out.state back segment after segment."""
    model.eval()
    state, nll, count = model.init_state(task.batch_size), 0.0, 0
    with torch.no_grad():
        for index in range(batches):
            batch = task.batch("val", index)
            out = model(batch["tokens"], state=state)
            state = out.state
            targets = batch["targets"].flatten()
            nll += float(torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets, reduction="sum"))
            count += batch["targets"].numel()
    return nll / count / math.log(2)


@pytest.mark.parametrize("preset", ["adaptive_span_lm", "transformer_xl"])
def test_state_is_carried_through_train_evaluate_and_sample(tmp_path, text_file, preset):
    """Before: the trainer and evaluate.py never called init_state, so adaptive_span_lm trained and
    evaluated without its span cache."""
    seen = []

    def carried(trainer, step):
        seen.append(trainer.state)

    data = ["data=char_lm", f"data.path={text_file}"]
    train(tmp_path, f"model={preset}", *data, "trainer.eval_every=0", callbacks=(carried,))
    assert all(s is not None and s.offset == 16 * (i + 1) for i, s in enumerate(seen))
    ckpt = tmp_path / "checkpoints" / "last.pt"
    from zoo.app.run import load_run

    _, task, model, _ = load_run(ckpt)
    expected = library_metric(model, task, 3)
    result = script("evaluate").main([str(ckpt), "--split", "val", "--batches", "3"])
    assert result["val/bpc"] == pytest.approx(expected, rel=1e-6)
    text = script("sample").main([str(ckpt), "--prompt", "abc", "--tokens", "4", "--greedy"])
    prompt = torch.tensor([task.encode("abc")])
    assert text == task.decode(model.generate(prompt, 4, greedy=True)[0].tolist())


# -- 4. changed optimiser settings on resume -----------------------------------------------------------


def test_resume_applies_rate_and_decay_and_refuses_what_breaks_the_state(tmp_path, caplog):
    """Before: optim.lr / weight_decay given on resume were silently replaced by the checkpoint's."""
    common = ["optim.schedule=constant", "optim.warmup=0", "trainer.eval_every=0"]
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, *common, callbacks=(stop_at(2),))
    seen = {}

    def record(trainer, step):
        group = trainer.optimizer.param_groups[0]
        seen[step] = (group["lr"], group["weight_decay"])

    with caplog.at_level("WARNING", logger="zoo.train.trainer"):
        train(tmp_path, *common, "trainer.resume=auto", "optim.lr=5e-2", "optim.weight_decay=0.1", callbacks=(record,))
    assert seen[3] == (5e-2, 0.1) and seen[4] == (5e-2, 0.1)
    assert "optim.lr=0.05 applied" in caplog.text and "optim.weight_decay=0.1 applied" in caplog.text
    for change in ("optim.name=adamw", "optim.betas=[0.9,0.999]"):
        with pytest.raises(CheckpointError, match=rf"{change.split('=')[0]}: checkpoint"):
            train(tmp_path, *common, "trainer.resume=auto", change)


def test_adam_with_weight_decay_is_adam(tmp_path):
    """Before: optim.name=adam with weight decay silently built AdamW."""
    seen = []

    def record(trainer, step):
        seen.append(type(trainer.optimizer))

    train(tmp_path / "adam", "optim.weight_decay=0.1", "trainer.max_steps=1", callbacks=(record,))
    train(tmp_path / "adamw", "optim.name=adamw", "optim.weight_decay=0.1", "trainer.max_steps=1", callbacks=(record,))
    assert seen == [torch.optim.Adam, torch.optim.AdamW]
    assert json.loads((tmp_path / "adam" / "result.json").read_text())["optimizer"] == "Adam (L2 weight decay 0.1)"


# -- 9. work is not lost ----------------------------------------------------------------------------------


def test_sigterm_saves_and_prints_the_resume_command(tmp_path):
    """Before: SIGTERM (what Slurm and containers send) killed the run with nothing saved."""
    code = textwrap.dedent(f"""
        import os, signal, sys, torch
        torch.set_num_threads(1)
        from zoo.app.compose import compose
        from zoo.app.run import run
        def term(trainer, step):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
        try:
            run(compose({TINY + ["trainer.eval_every=0"]!r}), run_dir={str(tmp_path)!r}, callbacks=(term,))
        except KeyboardInterrupt:
            sys.exit(143)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    last = tmp_path / "checkpoints" / "last.pt"
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert (
        f"terminated (SIGTERM) at step 2; checkpoint saved to {last}; resume with trainer.resume={last}" in proc.stdout
    )
    assert load_checkpoint(last)["step"] == 2


def test_failed_save_removes_its_temp_file_and_says_no_space(tmp_path, monkeypatch):
    """Before: a failed save left .last.pt.tmp<pid> behind, and a full disk said "enforce fail"."""
    import zoo.train.checkpoints.format

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial checkpoint bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zoo.train.checkpoints.format.torch, "save", full_disk)
    with pytest.raises(CheckpointError, match=rf"no space left on device: {tmp_path / 'checkpoints'}/(best|last).pt"):
        train(tmp_path, "trainer.max_steps=2", "trainer.eval_every=0")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []


def test_stale_temp_files_are_swept_at_start(tmp_path):
    """Before: temp files of killed saves (354 MB after 30 kills) were never cleaned."""
    train(tmp_path, "trainer.max_steps=2", "trainer.eval_every=0")
    stale = [tmp_path / "checkpoints" / f".last.pt.tmp{pid}" for pid in (101, 202)]
    for path in stale:
        path.write_bytes(b"x" * 1000)
    train(tmp_path, "trainer.max_steps=3", "trainer.eval_every=0", "trainer.resume=auto")
    assert not any(p.exists() for p in stale)


def test_metrics_are_cut_to_the_checkpoint_step_on_resume(tmp_path):
    """A crash after step 3 (checkpoint at 2), then resume: every step is logged once.
    Before: steps 3 appeared twice in metrics.jsonl."""

    def crash(trainer, step):
        if step == 3:
            raise RuntimeError("power cut")

    common = ["trainer.eval_every=0", "trainer.checkpoint_every=2", "trainer.log_every=1"]
    with pytest.raises(RuntimeError, match="power cut"):
        train(tmp_path, *common, callbacks=(crash,))
    train(tmp_path, *common, "trainer.resume=auto")
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if "train/loss" in json.loads(line)
    ]
    assert steps == [1, 2, 3, 4]


def test_a_split_too_short_is_refused_before_training(tmp_path, text_file):
    """Before: found only at the final evaluation, after training, with no checkpoint written."""
    steps = []
    with pytest.raises(ValueError, match=r"val split.*too small.*trainer.seq_len=16"):
        train(
            tmp_path,
            "data=char_lm",
            f"data.path={text_file}",
            "data.split=[18990,10,1000]",
            callbacks=(lambda t, s: steps.append(s),),
        )
    assert steps == []


def test_bad_device_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.device='cpux' is not a device; use auto, cpu, cuda or cuda:N"):
        train(tmp_path, "trainer.device=cpux")


# -- 10. nothing is written outside the run directory --------------------------------------------------


@pytest.mark.parametrize(
    "artefact", default_run_keeps(["metrics.jsonl", "result.json", "config.json", "checkpoints"], ["checkpoints"])
)
def test_planted_links_are_refused(tmp_path, artefact):
    """Before: the app wrote through links planted in the run directory, to files outside it."""
    from zoo.train.rundir import RunDirError

    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / artefact
    if artefact == "checkpoints":
        target.mkdir()
    else:
        target.write_text("precious\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / artefact).symlink_to(target)
    with pytest.raises(RunDirError, match=rf"{run_dir / artefact} is a symbolic link"):
        train(run_dir, "trainer.max_steps=2", "trainer.resume=auto")
    if artefact == "checkpoints":
        assert list(target.iterdir()) == []
    else:
        assert target.read_text() == "precious\n"


# -- 5. one run per directory -------------------------------------------------------------------------------


def test_a_run_directory_holding_a_run_is_refused_unless_resuming(tmp_path):
    """Before: a second run in the same directory shared its checkpoints and interleaved metrics."""
    from zoo.train.rundir import RunDirError

    train(tmp_path, "trainer.max_steps=1")
    with pytest.raises(RunDirError, match=rf"run directory {tmp_path} already holds a run.*trainer.resume=auto"):
        train(tmp_path, "trainer.max_steps=1")
    train(tmp_path, "trainer.max_steps=2", "trainer.resume=auto")


def test_runs_started_in_the_same_second_get_their_own_directories(monkeypatch):
    """Before: outputs/<date>/<H-M-S> only, so two runs started in one second shared it."""
    from omegaconf import OmegaConf

    import zoo.app.run  # noqa: F401  (registers the resolver, as experiments/train.py does)

    dirs = []
    for token in ("aaa111", "bbb222"):
        monkeypatch.setenv("ZOO_RUN_ID", token)
        cfg = compose([], return_hydra_config=True)
        OmegaConf.register_new_resolver("now", lambda pattern: "2026-01-01/12-00-00", replace=True)
        dirs.append((OmegaConf.select(cfg, "hydra.run.dir"), OmegaConf.select(cfg, "hydra.sweep.dir")))
    (run_a, sweep_a), (run_b, sweep_b) = dirs
    assert run_a != run_b and sweep_a != sweep_b
    assert run_a.endswith("aaa111") and sweep_b.endswith("bbb222")


# -- 12. the trainer reuses the library's step -----------------------------------------------------------


def test_trainer_step_is_the_library_step(tmp_path):
    """One trainer step == zoo.train.steps.train_step on the same batch (same weights after), and the
    trainer and the benchmark measure activations with one meter."""
    from zoo import bench
    from zoo.app.run import build
    from zoo.train import activation_meter as meter
    from zoo.train import steps as training

    cfg = compose(TINY + ["trainer.max_steps=1", "trainer.eval_every=0", "optim.schedule=constant", "optim.warmup=0"])
    _, task, model = build(cfg)
    reference = copy.deepcopy(model)
    train(tmp_path, "trainer.max_steps=1", "trainer.eval_every=0", "optim.schedule=constant", "optim.warmup=0")
    optimizer = training.adam(reference, lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    training.train_step(reference, task.batch("train", 0), optimizer, clip=1.0)
    trained = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["model"]
    for key, value in reference.state_dict().items():
        assert torch.equal(value, trained[key]), key
    assert bench.ActivationMeter is meter.ActivationMeter
    assert not hasattr(bench, "SavedTensorMeter")


def test_a_data_option_added_since_the_checkpoint_counts_as_its_default():
    """A checkpoint written before a task option existed ran with what is now its default, so it resumes;
    a saved value other than the default still refuses."""
    from zoo.data import TASK
    from zoo.train.checkpoints.resume import config_diff, task_info, with_new_defaults

    task = TASK.get("listops")(seq_len=64, batch_size=2, max_length=60, min_length=10)
    saved = task_info(task)
    older = {**saved, "options": {k: v for k, v in saved["options"].items() if k != "path"}}
    assert config_diff(older, saved) and not config_diff(with_new_defaults(older, task), saved)
    other = {**saved, "options": {**saved["options"], "path": "elsewhere"}}
    assert config_diff(with_new_defaults(other, task), saved)


def test_a_model_field_added_since_the_checkpoint_counts_as_its_default(tmp_path):
    """A checkpoint written before a ModelConfig field existed (here pool_length and token_init_std) was made
    by the model that field's default gives, so the run resumes from it; setting the field to another value
    is another model, and is still refused."""
    train(tmp_path, "trainer.max_steps=2", "trainer.checkpoint_every=2", "trainer.eval_every=0")
    path = tmp_path / "checkpoints" / "last.pt"
    payload = load_checkpoint(path)
    for field in ("pool_length", "token_init_std"):
        del payload["model_config"][field]
    save_checkpoint(path, payload)  # as an older version wrote it (with its checksum)
    train(tmp_path, "trainer.max_steps=3", "trainer.eval_every=0", "trainer.resume=auto")
    assert load_checkpoint(path)["step"] == 3
    with pytest.raises(CheckpointError, match="token_init_std: checkpoint 0.0 vs now 0.02"):
        train(tmp_path, "trainer.max_steps=4", "trainer.resume=auto", "model.token_init_std=0.02")
