"""Command-line overrides shared by the tests that run the Hydra app end to end: a CPU-sized run of
four steps that evaluates and checkpoints every two (tests/train, test_export, and app_cli's sweep
jobs); and ``script(name)``, the module of ``experiments/<name>.py`` (its ``main`` takes an argv list)."""

from pathlib import Path

from support.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "experiment=tiny",
    "logger=csv",
    "trainer.max_steps=4",
    "trainer.eval_every=2",
    "trainer.eval_batches=1",
    "trainer.batch_size=2",
    "trainer.seq_len=16",
    "trainer.progress=false",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_heads=2",
    "trainer.device=cpu",
]


def script(name):
    return load_script(ROOT / "experiments" / f"{name}.py")
