"""A part of your own, beside ours, with no edit to the zoo: ``imports=[pkg.module]`` imports it before
Hydra composes, so ``attention=<its name>`` is a group option with no YAML file; it trains, sweeps,
describes, and its checkpoint imports the module again (or says what to do when it is gone).

The part is a throwaway module written to tmp_path, outside ``zoo/``, on the path only for the test."""

from __future__ import annotations

import csv
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("hydra")

from support.script_modules import load_script

from zoo.app.compose import compose, explain_overrides  # noqa: E402
from zoo.app.run import load_run, run  # noqa: E402
from zoo.attention.base import ATTENTION  # noqa: E402
from zoo.train.checkpoints.format import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "my_research_for_zoo_tests"
MODULE = f"{PACKAGE}.attention"
IMPORTS = f"imports=[{MODULE}]"
TINY = [
    "experiment=tiny",
    "logger=csv",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.batch_size=2",
    "trainer.seq_len=16",
    "trainer.progress=false",
    "trainer.device=cpu",
]
PART = textwrap.dedent('''
    """A researcher's own attention: vanilla attention with a temperature option (registered on import)."""
    from dataclasses import dataclass

    from zoo.attention.base import ATTENTION
    from zoo.attention.vanilla import VanillaAttention


    @ATTENTION.register("my_attention")
    class MyAttention(VanillaAttention):
        @dataclass
        class Options(VanillaAttention.Options):
            temperature: float = 1.0
''')


def forget_part() -> None:
    """As a fresh process would be: the module not imported, the part not registered."""
    if "my_attention" in ATTENTION:
        ATTENTION.unregister("my_attention")
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """The directory holding the throwaway package, put on sys.path (nothing imports it yet)."""
    root = tmp_path / "plugins"
    (root / PACKAGE).mkdir(parents=True)
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "attention.py").write_text(PART)
    monkeypatch.syspath_prepend(str(root))
    forget_part()
    yield root
    forget_part()


def script(name):
    return load_script(ROOT / "experiments" / f"{name}.py")


def test_your_part_trains_and_its_checkpoint_imports_it_again(tmp_path, plugin_dir, monkeypatch):
    assert "my_attention" not in ATTENTION
    assert "Could not find 'attention/my_attention'" in explain_overrides(["attention=my_attention"])  # not yet
    run_dir = tmp_path / "run"
    value = run(compose([*TINY, IMPORTS, "attention=my_attention", "attention.temperature=2.0"]), run_dir=run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["attention"] == "my_attention" and result["final_metric"] == value and result["steps"] == 2
    last = run_dir / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    assert ckpt["config"]["imports"] == [MODULE]
    assert ckpt["model_config"]["attention"] == {"name": "my_attention", "temperature": 2.0}

    forget_part()  # evaluate/sample in a new process: load_run imports the recorded module
    _, _, model, _ = load_run(last)
    attention = model.stack.blocks[0].attention
    assert type(attention).registry_name == "my_attention" and attention.options.temperature == 2.0
    for key, weights in ckpt["model"].items():
        assert torch.equal(model.state_dict()[key], weights), key

    forget_part()  # the module is gone: the error names the checkpoint, the module and what to do
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin_dir)])
    importlib.invalidate_caches()
    with pytest.raises(ImportError) as info:
        load_run(last)
    message = str(info.value)
    assert str(last) in message and f"imports=['{MODULE}']" in message and "PYTHONPATH" in message, message


def test_a_multirun_sweeps_your_part_beside_ours(tmp_path, plugin_dir, monkeypatch):
    from hydra.core.global_hydra import GlobalHydra

    sweep = tmp_path / "sweep"
    argv = ["-m", *TINY, IMPORTS, "attention=vanilla,my_attention", f"hydra.sweep.dir={sweep}"]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    GlobalHydra.instance().clear()
    try:
        script("train").main()
    finally:
        GlobalHydra.instance().clear()
    with open(sweep / "summary.csv") as f:
        rows = {row["attention"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"vanilla", "my_attention"}
    for row in rows.values():
        job = json.loads((sweep / row["run"].split(":")[0] / "result.json").read_text())
        assert row["status"] == "finished" and float(row["final_metric"]) == job["final_metric"]
        assert json.loads((sweep / row["run"].split(":")[0] / "config.json").read_text())["config"]["imports"] == [
            MODULE
        ]


def test_describe_shows_your_part(plugin_dir, capsys):
    describe = script("describe")
    ours = describe.main(["--json", "model=vanilla_lm", "attention=vanilla"])
    info = describe.main(["--json", IMPORTS, "model=vanilla_lm", "attention=my_attention", "attention.temperature=2.0"])
    assert info["axes"]["attention"] == {"name": "my_attention", "temperature": 2.0}
    assert info["params"] == ours["params"]  # the same projections as vanilla attention
    capsys.readouterr()
    assert "imports takes a list of modules" in explain_overrides([f"imports={MODULE}"])


def test_the_command_line_imports_before_hydra_composes(tmp_path, plugin_dir):
    """``python experiments/train.py imports=[...] attention=my_attention``: a fresh process whose
    only way to know the part is the imports= on its command line."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(plugin_dir)]), OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    run_dir = tmp_path / "run"
    argv = [*TINY, "trainer.max_steps=1", "trainer.threads=1", IMPORTS, "attention=my_attention"]
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), *argv, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["attention"] == "my_attention"


@pytest.mark.slow  # two job processes through submitit: ~10 s
def test_a_launchers_job_processes_import_your_part(tmp_path, plugin_dir):
    """hydra/launcher=local_jobs runs each job in a process of its own, which knows the part only
    through the ``imports`` of its config."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(plugin_dir)]), OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    sweep = tmp_path / "sweep"
    argv = ["-m", "hydra/launcher=local_jobs", "hydra.launcher.cpus_per_task=1", *TINY, "trainer.max_steps=1"]
    argv += [IMPORTS, "attention=vanilla,my_attention", f"hydra.sweep.dir={sweep}"]
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["attention"] for r in rows) == ["my_attention", "vanilla"]
    assert all(r["status"] == "finished" for r in rows)
