"""``trainer.fsdp=true`` (FSDP2, zoo/train/fsdp.py) with real gloo processes on the CPU: the weights after
N steps equal one process's in float64; a run resumed from its sharded checkpoint (DCP,
zoo/train/checkpoints/sharded.py) equals the run without the break, also on another number of ranks; the
sharded checkpoint converts to the single-file format the other tools read; impossible settings are
refused at build time with the reason. Every FSDP run here is its own process (``run_ranks``, one included):
the test process never joins a process group, so the processes it forks later inherit none."""

from __future__ import annotations

import shutil
from dataclasses import asdict

import pytest
import torch

pytest.importorskip("hydra")

from support.app_overrides import TINY, script  # noqa: E402

import zoo  # noqa: E402
from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import build, optim_options, run, trainer_options  # noqa: E402
from zoo.data.base import create_task  # noqa: E402
from zoo.parallel.launch import run_ranks  # noqa: E402
from zoo.train.checkpoints.convert import to_single_file  # noqa: E402
from zoo.train.checkpoints.format import CheckpointError, load_checkpoint  # noqa: E402
from zoo.train.checkpoints.resume import check_continues, task_info  # noqa: E402
from zoo.train.checkpoints.sharded import MANIFEST  # noqa: E402
from zoo.train.fsdp import shard_groups, shard_units  # noqa: E402
from zoo.train.options import OptimOptions  # noqa: E402
from zoo.train.trainer import Trainer  # noqa: E402

COMMON = ["data=char_lm", "trainer.eval_every=2", "trainer.threads=1", "trainer.log_every=1"]


def float64_run(overrides: list[str], run_dir, *, steps: int, resume: str = "") -> dict[str, torch.Tensor]:
    """Train the app's configuration in float64 to ``steps`` through the Trainer (rank 0 of whatever group
    this process is in); the whole weights after it, gathered from the shards."""
    resolved, task, model = build(compose(overrides + [f"trainer.max_steps={steps}", f"trainer.resume={resume}"]))
    trainer = Trainer(
        model.double(),
        task,
        trainer=trainer_options(resolved),
        optim=optim_options(resolved),
        run_dir=run_dir,
        config=resolved,
    )
    trainer.fit()
    state = trainer.model.state_dict()
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def _fsdp_rank(rank: int, world: int, overrides: list[str], run_dir, steps: int, resume: str):
    return float64_run(overrides + ["trainer.fsdp=true"], run_dir, steps=steps, resume=resume)


def _app_rank(rank: int, world: int, overrides: list[str], run_dir) -> float:
    return run(compose(overrides), run_dir=run_dir)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:  # float64: only the order of the reductions differs
        torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12, msg=key)


def test_fsdp_on_two_ranks_trains_as_one_process_float64(tmp_path, text_file):
    """2 ranks x 2 rows, every weight sharded == 1 process x 4 rows, after 2 steps (the default run's case)."""
    overrides = TINY + COMMON + [f"data.path={text_file}", "model=vanilla_lm"]
    sharded = run_ranks(2, _fsdp_rank, overrides, tmp_path / "fsdp", 2, "")
    one = float64_run(overrides + ["trainer.batch_size=4"], tmp_path / "single", steps=2)
    assert_same_weights(sharded[0], one)
    assert_same_weights(sharded[1], one)
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "last.dcp"
    assert (checkpoint / MANIFEST).is_file() and not (tmp_path / "fsdp" / "checkpoints" / "last.pt").exists()


@pytest.mark.slow
def test_fsdp_resumes_from_its_sharded_checkpoint_on_two_ranks_and_on_one(tmp_path, text_file):
    """2 steps on 2 ranks, the sharded checkpoint resumed to 4 steps on the 2 ranks and (resharded by DCP)
    on one process reading the 4 rows: both equal 4 uninterrupted steps of one process."""
    overrides = TINY + COMMON + [f"data.path={text_file}", "model=vanilla_lm"]
    single = overrides + ["trainer.batch_size=4"]
    four = float64_run(single, tmp_path / "single", steps=4)
    run_ranks(2, _fsdp_rank, overrides, tmp_path / "fsdp", 2, "")
    shutil.copytree(tmp_path / "fsdp", tmp_path / "one")  # the same checkpoint, resumed by one process
    resumed = run_ranks(2, _fsdp_rank, overrides, tmp_path / "fsdp", 4, "auto")
    assert_same_weights(resumed[0], four)
    assert_same_weights(resumed[1], four)
    one = run_ranks(1, _fsdp_rank, single, tmp_path / "one", 4, "auto")[0]
    assert_same_weights(one, four)


@pytest.mark.slow
def test_a_sharded_checkpoint_converts_to_the_single_file_format(tmp_path, text_file):
    """The converted file holds what a run without FSDP writes: the same keys, the weights the sharded
    run reached, an optimiser state that loads; a sharded checkpoint with a changed file is refused."""
    overrides = TINY + COMMON + [f"data.path={text_file}", "trainer.max_steps=2", "trainer.fsdp=true"]
    run_ranks(1, _app_rank, overrides, tmp_path / "run")  # one process, sharded over a group of one
    sharded = tmp_path / "run" / "checkpoints" / "last.dcp"
    script("export").main([str(sharded), "--single-file", str(tmp_path / "last.pt")])  # the CLI
    converted = load_checkpoint(tmp_path / "last.pt")
    resolved, _, model = build(compose(overrides))
    assert converted["model"].keys() == model.state_dict().keys() and converted["step"] == 2
    model.load_state_dict(converted["model"])
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.load_state_dict(converted["optimizer"])
    assert len(optimizer.state) == len(list(model.parameters()))
    shard = next(sharded.glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1  # one bit of a tensor
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"SHA-256 of {shard.name} .* but {MANIFEST} records"):
        to_single_file(sharded, tmp_path / "again.pt")


def test_fsdp_refuses_the_reversible_stack_at_build_time_with_the_reason(tmp_path, text_file):
    overrides = TINY + COMMON + [f"data.path={text_file}", "trainer.max_steps=1", "trainer.fsdp=true"]
    with pytest.raises(RuntimeError, match="stack 'reversible' runs each layer as its two branches"):
        run_ranks(1, _app_rank, overrides + ["model=reformer"], tmp_path / "rev")


@pytest.mark.slow
def test_a_single_file_checkpoint_under_fsdp_is_refused_saying_what_to_do(tmp_path, text_file):
    overrides = TINY + COMMON + [f"data.path={text_file}", "trainer.max_steps=1", "trainer.fsdp=true"]
    single_file = tmp_path / "last.pt"
    single_file.write_bytes(b"")  # refused for its kind before it is read
    with pytest.raises(RuntimeError, match="is single-file, this run is with FSDP .*trainer.fsdp=false"):
        run_ranks(1, _app_rank, overrides + [f"trainer.resume={single_file}"], tmp_path / "plain")


@pytest.mark.slow
def test_fsdp_with_context_parallelism_on_four_ranks_trains_as_one_process_float64(tmp_path, text_file):
    """world 4 = 2 data replicas x 2 context ranks, every weight sharded over all 4: each replica reads 2 of
    the 4 rows, each context rank half of every sequence; the weights after 2 steps equal one process's."""
    overrides = TINY + COMMON + [f"data.path={text_file}", "model=vanilla_lm"]
    sharded = run_ranks(
        4, _fsdp_rank, overrides + ["trainer.context_parallel=2"], tmp_path / "fsdp_cp", 2, "", timeout=900
    )
    one = float64_run(overrides + ["trainer.batch_size=4"], tmp_path / "single", steps=2)
    for weights in sharded:
        assert_same_weights(weights, one)


def test_blocks_sharing_a_parameter_form_one_unit():
    """Adaptive span's layers share one relative-key table: one FSDP unit for them all (one would otherwise
    own it while the others read it); blocks sharing nothing are a unit each."""

    sizes = dict(vocab_size=32, d_model=16, n_heads=2, d_ff=32, n_layers=3)
    shared = zoo.create_model("adaptive_span_lm", **sizes)
    assert [len(g) for g in shard_groups(shard_units(shared))] == [3]
    plain = zoo.create_model("vanilla_lm", **sizes)
    assert [len(g) for g in shard_groups(shard_units(plain))] == [1, 1, 1]


def test_a_sharded_checkpoint_resumes_on_other_ranks_only_where_a_step_reads_the_same_rows(text_file):
    """2 ranks x 2 rows -> 1 process x 4 rows: the same rows of a text's lanes; a synthetic task draws each
    rank's rows by its rank and the number of ranks, and a different number of rows per step is refused."""
    model, optim = zoo.create_model("vanilla_lm", vocab_size=256, d_model=16, n_heads=2, d_ff=32), OptimOptions()

    def resume_on_one(task_name: str, saved_rows: int, **options) -> None:
        """A checkpoint of 2 ranks x ``saved_rows`` rows resumed by one process reading 4 rows."""
        task = create_task(task_name, batch_size=4, seq_len=16, **options)
        saved = {"task": {**task_info(task), "batch_size": saved_rows}, "world_size": 2, "optim": asdict(optim)}
        ckpt = {**saved, "model_config": model.config.to_dict()}
        check_continues(ckpt, "ckpt", model=model, task=task, world_size=1, optim=optim, reshard=True)

    resume_on_one("char_lm", 2, path=str(text_file))
    with pytest.raises(CheckpointError, match="the rows of a step .* must stay the same"):
        resume_on_one("char_lm", 1, path=str(text_file))
    with pytest.raises(CheckpointError, match="'duplication' draws each rank's rows by its rank"):
        resume_on_one("duplication", 2)


@pytest.mark.slow
def test_bf16_under_fsdp_evaluates_as_one_process(tmp_path, text_file):
    """trainer.precision=bf16: the same autocast as one process (weights gathered in float32, gradients
    reduced in float32); the validation bpc after 2 steps agrees to bf16 rounding."""
    overrides = TINY + COMMON + [f"data.path={text_file}", "trainer.max_steps=2", "trainer.precision=bf16"]
    sharded = run_ranks(2, _app_rank, overrides + ["trainer.fsdp=true"], tmp_path / "fsdp")
    one = run(compose(overrides + ["trainer.batch_size=4"]), run_dir=tmp_path / "single")
    assert sharded[0] == pytest.approx(one, rel=1e-3)


@pytest.mark.slow
def test_fsdp_with_activation_checkpointing_trains_as_one_process_float64(tmp_path, text_file):
    """trainer.activation_checkpointing=full under FSDP: each block's forward runs again in backward, after
    FSDP's pre-backward hook has gathered its weights; the weights after 2 steps equal one process's."""
    overrides = TINY + COMMON + [f"data.path={text_file}", "model=vanilla_lm", "trainer.activation_checkpointing=full"]
    sharded = run_ranks(2, _fsdp_rank, overrides, tmp_path / "fsdp", 2, "")
    one = float64_run(overrides + ["trainer.batch_size=4"], tmp_path / "single", steps=2)
    assert_same_weights(sharded[0], one)
