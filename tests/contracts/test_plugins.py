"""Your own part, beside ours, with no edit to the zoo: one throwaway part per axis (attention,
residual, stack, position, task, head), each defined in a module outside ``zoo/``
(tests/contracts/plugins/zoo_plugin_parts/), registered by importing it through the public hooks,
built by name through the public API, trained for a few steps, and unregistered afterwards.

Also: the registries refuse a class outside their axis and a taken name; an installed package's
entry point registers its parts (``zoo.load_entry_points``); and the contract suite runs over a
user's own part from the command line, ``pytest tests/contracts --zoo-imports my_pkg.module``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import zoo
from zoo.app import lra
from zoo.app.paper import describe, format_report
from zoo.attention.base import ATTENTION
from zoo.data.base import TASK, create_task
from zoo.data.images import check_raster
from zoo.models import costs
from zoo.models.base import HEAD
from zoo.norm import NORM, Norm
from zoo.position.base import POSITION
from zoo.presets import build_model_for_task
from zoo.presets.factory import TINY
from zoo.registry import load_entry_points
from zoo.residual.base import RESIDUAL
from zoo.stacks.base import STACK
from zoo.train.steps import forward_backward, optimizer_step

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "plugins"
PACKAGE = "zoo_plugin_parts"
REGISTRIES = {
    "attention": ATTENTION,
    "residual": RESIDUAL,
    "stack": STACK,
    "position": POSITION,
    "task": TASK,
    "head": HEAD,
}


@pytest.fixture
def plugin(monkeypatch):
    """``plugin(axis)`` imports zoo_plugin_parts.<axis> (its part registers itself) and returns the
    part's name; afterwards the part is unregistered and the module forgotten."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    loaded = []

    def load(axis: str) -> str:
        module = f"{PACKAGE}.{axis}"
        sys.modules.pop(module, None)
        zoo.import_plugins([module])
        loaded.append(axis)
        return f"plugin_{axis}"

    yield load
    for axis in loaded:
        if f"plugin_{axis}" in REGISTRIES[axis]:
            REGISTRIES[axis].unregister(f"plugin_{axis}")
        sys.modules.pop(f"{PACKAGE}.{axis}", None)


def train_steps(model: nn.Module, batch: dict[str, torch.Tensor], steps: int = 6) -> list[float]:
    """Losses of ``steps`` optimiser steps on one fixed batch, through the library's own step."""
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        _, loss = forward_backward(model.train(), batch)
        optimizer_step(model, optimizer)
        losses.append(float(loss))
    return losses


def lm_batch(vocab: int = TINY["vocab_size"], b: int = 4, t: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (b, t + 1), generator=g)
    return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}


def learns(model: nn.Module, batch: dict[str, torch.Tensor]) -> None:
    losses = train_steps(model, batch)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


# -- one throwaway part per axis --------------------------------------------------------------------


def test_own_attention_builds_trains_and_is_reported_unknown(plugin):
    name = plugin("attention")
    assert name in zoo.list_attention()
    model = zoo.create_model("vanilla_lm", **TINY, attention=name)
    assert type(model.stack.blocks[0].attention).__module__ == f"{PACKAGE}.attention"
    learns(model, lm_batch())
    # it says nothing of its keys or FLOPs: describe and the benchmark report unknown, never dense
    assert costs.step_flops(model, 12) is None
    info = costs.describe_costs(model, 12)
    assert info["train_flops_per_token"] is None and info["keys_per_query"] is None
    assert "attention 'plugin_attention' does not say" in info["keys_rule"]
    assert "dense" not in info["keys_rule"]


def test_lra_tables_ask_the_mechanism_for_its_paper_row(plugin, monkeypatch):
    name = plugin("attention")
    rows = [{"experiment": "lra_text", "attention": m, "accuracy": 60.0} for m in (name, "local_1d", "gone")]
    body = [row[0] for row in lra.table1(rows)[1]]
    assert f"{name} (ours)" in body and "gone (ours)" in body  # no row of the paper beside either
    assert body[body.index("local_1d (ours)") + 1] == "Local Attention (LRA paper)"
    monkeypatch.setattr(ATTENTION.get(name), "lra_row", "Reformer", raising=False)  # it names one: it gets it
    body = [row[0] for row in lra.table1(rows)[1]]
    assert body[body.index(f"{name} (ours)") + 1] == "Reformer (LRA paper)"


def test_image_tasks_ask_the_mechanism_for_its_layout(plugin, monkeypatch):
    name = plugin("attention")
    seen = []
    monkeypatch.setattr(ATTENTION.get(name), "check_layout", classmethod(lambda cls, options, **at: seen.append(at)))
    check_raster(zoo.preset_config("vanilla_lm", attention=name), "cifar10", 32, 96)
    assert seen == [{"rows": 32, "width": 96, "data": "cifar10"}]
    # local_2d answers from its resolved options: its default width 32 reads a 32-wide raster, not a 96-wide one
    check_raster(zoo.preset_config("vanilla_lm", attention="local_2d"), "cifar10_gray", 32, 32)
    with pytest.raises(ValueError, match="local_2d has width=32 .* raster 96 wide"):
        check_raster(zoo.preset_config("vanilla_lm", attention="local_2d"), "cifar10", 32, 96)


def test_describe_of_a_model_with_an_own_attention_says_unknown(plugin):
    name = plugin("attention")
    info = describe([f"model.attention={{name: {name}}}", "trainer.seq_len=64"])
    report = format_report(info)
    assert f"attention: {name}" in report
    assert "FLOPs: unknown per training token" in report and "keys/query unknown" in report
    assert "dense" not in report
    reference = describe(["trainer.seq_len=64"])  # the preset's own attention answers
    assert reference["keys_rule"] == "dense causal" and reference["train_flops_per_token"] > 0


def test_own_residual(plugin):
    name = plugin("residual")
    assert name in zoo.list_residuals()
    model = zoo.create_model("vanilla_lm", **TINY, residual=name)
    assert type(model.stack.blocks[0].attention_residual).__module__ == f"{PACKAGE}.residual"
    assert isinstance(model.norm, Norm)  # its final_norm flag reached the model
    with_rmsnorm = zoo.create_model("vanilla_lm", **TINY, residual=name, norm="rmsnorm")
    assert isinstance(with_rmsnorm.stack.blocks[0].attention_residual.norm, NORM.get("rmsnorm"))  # make_norm
    learns(model, lm_batch())
    reversible = zoo.create_model("reformer", **TINY, residual=name)  # additive: the reversible stack takes it
    learns(reversible, lm_batch())


def test_own_stack(plugin):
    name = plugin("stack")
    assert name in zoo.list_stacks()
    model = zoo.create_model("vanilla_lm", **{**TINY, "n_layers": 4}, stack=name)
    assert len(model.stack.blocks) == 2  # shared in pairs
    learns(model, lm_batch())
    assert costs.step_flops(model, 12) is None  # it does not say what it applies
    assert "stack 'plugin_stack'" in costs.describe_costs(model, 12)["keys_rule"]
    with pytest.raises(ValueError, match="has no per-layer outputs"):  # Al-Rfou's losses ask it for layers
        zoo.create_model("vanilla_lm", **TINY, stack=name, aux_losses={"intermediate": True})


def test_own_position(plugin):
    name = plugin("position")
    assert name in zoo.list_positions()
    model = zoo.create_model("vanilla_lm", **TINY, position=name)
    assert type(model.position).__module__ == f"{PACKAGE}.position"
    learns(model, lm_batch())
    out = model.eval().generate(torch.zeros(1, 2, dtype=torch.long), 20)  # no length limit claimed
    assert out.shape == (1, 22)


def test_own_task(plugin):
    name = plugin("task")
    assert name in zoo.data.list_tasks()
    task = create_task(name, batch_size=4, seq_len=12, shift=3)
    batch = task.batch("train", 0)
    assert (batch["targets"][:, 3:] == batch["tokens"][:, :-3]).all()
    model = build_model_for_task("vanilla_lm", task, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)
    assert model.config.vocab_size == task.vocab_size
    learns(model, batch)
    assert TASK.get(name).nominal_vocab_size({}) == (16, "plugin_task's default vocabulary")


def test_own_head(plugin):
    name = plugin("head")
    model = zoo.create_model("vanilla_lm", **TINY, kind=name, n_classes=3)
    assert type(model).__module__ == f"{PACKAGE}.head"
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, TINY["vocab_size"], (4, 10), generator=g)
    learns(model, {"tokens": tokens, "targets": tokens % 3})
    assert costs.step_flops(model, 10) is None  # it does not say what its output layer costs


def test_unregistered_parts_are_gone(plugin):
    name = plugin("attention")
    ATTENTION.unregister(name)
    with pytest.raises(ValueError, match=f"unknown attention '{name}'"):
        zoo.create_model("vanilla_lm", **TINY, attention=name)


def test_unknown_head_kind_is_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match="unknown head 'lmm'.*Did you mean 'lm'"):
        zoo.preset_config("vanilla_lm", kind="lmm")


# -- registry refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize("axis", list(REGISTRIES))
def test_registry_refuses_a_class_outside_its_axis(axis):
    registry = REGISTRIES[axis]

    class NotAPart(nn.Module):
        pass

    with pytest.raises(TypeError, match=f"{registry.kind} 'not_a_part'.*must subclass"):
        registry.register("not_a_part", NotAPart)
    assert "not_a_part" not in registry


@pytest.mark.parametrize("axis", list(REGISTRIES))
def test_registry_refuses_a_taken_name(axis):
    registry = REGISTRIES[axis]
    taken = registry.list()[0]
    own = registry.get(taken)

    class Impostor(registry.base):
        pass

    with pytest.raises(ValueError, match=f"{registry.kind} '{taken}' is already registered"):
        registry.register(taken, Impostor)
    assert registry.get(taken) is own


# -- installed packages: the entry-point group --------------------------------------------------------


def fake_distribution(site: Path, entry: str) -> None:
    """An installed distribution as pip leaves it: ``<name>.dist-info`` with METADATA and entry_points.txt."""
    info = site / "zoo_fake_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zoo-fake-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[transformer_zoo.parts]\nmine = {entry}\n")


def test_an_installed_package_registers_its_parts_through_the_entry_point_group(tmp_path, monkeypatch):
    fake_distribution(tmp_path, f"{PACKAGE}.attention")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(PLUGINS))
    sys.modules.pop(f"{PACKAGE}.attention", None)
    assert "plugin_attention" not in ATTENTION
    try:
        assert f"{PACKAGE}.attention" in load_entry_points()
        assert "plugin_attention" in zoo.list_attention()
        zoo.create_model("vanilla_lm", **TINY, attention="plugin_attention")
    finally:
        ATTENTION.unregister("plugin_attention")
        sys.modules.pop(f"{PACKAGE}.attention", None)


def test_a_broken_entry_point_names_its_package(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "zoo_no_such_module.attention")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="entry point 'mine'.*zoo-fake-plugin"):
        load_entry_points()


# -- the contract suite on a user's own part, from the command line ------------------------------------


def test_contract_suite_runs_over_a_users_own_part():
    """The one command a researcher runs: the zoo's contract suites, with their part imported first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/contracts/test_attention.py",
        "tests/contracts/test_part_knowledge.py",
        f"--zoo-imports={PACKAGE}.attention",
        "-k",
        "plugin_attention",
        "-p",
        "no:cacheprovider",
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 10  # the whole attention contract ran on it (without the import, -k selects nothing)
