"""``python -m zoo.bench --imports my_research.attention --attention vanilla,my_attention``: a researcher's
own attention, in a package outside zoo/, measured beside ours (also in the fresh RSS process)."""

from __future__ import annotations

import csv
import os
import sys
import textwrap

import pytest

from zoo import bench
from zoo.attention import ATTENTION

PLUGIN = "_bench_plugin_research"
NAME = "_bench_gated_vanilla"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A package outside zoo/ whose module registers ``NAME``: vanilla attention with one extra
    learned gate per layer (so its parameter count tells the built model has it)."""
    package = tmp_path / PLUGIN
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "attention.py").write_text(
        textwrap.dedent(
            f"""
            import torch
            from zoo.attention import ATTENTION
            from zoo.attention.vanilla import VanillaAttention


            @ATTENTION.register({NAME!r})
            class GatedVanilla(VanillaAttention):
                def __init__(self, d_model, n_heads, **kwargs):
                    super().__init__(d_model, n_heads, **kwargs)
                    self.gate = torch.nn.Parameter(torch.ones(()))

                def forward(self, x, **kwargs):
                    out = super().forward(x, **kwargs)
                    out.out = self.gate * out.out
                    return out
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    yield f"{PLUGIN}.attention"
    if NAME in ATTENTION:
        ATTENTION.unregister(NAME)
    for module in [m for m in sys.modules if m.startswith(PLUGIN)]:
        del sys.modules[module]


def test_imports_make_a_plugin_attention_measurable(plugin, tmp_path):
    assert NAME not in ATTENTION  # not registered until --imports imports it
    out = tmp_path / "out"
    common = ["--attention", f"vanilla,{NAME}", "--lengths", "16", "--layers", "2", "--d-model", "16"]
    common += ["--heads", "2", "--vocab", "32", "--repeats", "1", "--threads", "1", "--no-rss", "--out", str(out)]
    assert bench.main(["--imports", plugin, *common]) == 0
    rows = {r["variant"]: r for r in csv.DictReader((out / "bench.csv").open())}
    assert rows[NAME]["status"] == "ok" and float(rows[NAME]["time_ms"]) > 0
    assert int(rows[NAME]["params"]) == int(rows["vanilla"]["params"]) + 2  # one gate in each of 2 layers
    # the fresh process that measures peak RSS imports the plugin too
    variant = bench.Variant(NAME, "zoo", "vanilla_lm", {"attention": NAME})
    shape = dict(d_model=16, heads=2, layers=2, vocab=32, batch=1, d_ff=64)
    peak, _ = bench.measure_rss(variant, 16, shape, {}, 1, imports=[plugin])
    assert peak > 0


def test_an_unimportable_module_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--imports", "no_such_research.attention", "--attention", "vanilla", "--out", str(tmp_path)])
    assert "no_such_research.attention" in capsys.readouterr().err


def test_import_checkout_reads_a_reference_checkout_without_touching_sys_path(tmp_path):
    """A checkout of someone else's code (flat modules importing each other by top-level name, and a
    package) is imported from its folder; sys.path is left as it was."""
    folder = tmp_path / "ref_checkout"
    (folder / "_zoo_ref_pkg" / "sub").mkdir(parents=True)
    (folder / "_zoo_ref_helpers.py").write_text("SCALE = 3\n")
    models_source = "from _zoo_ref_helpers import SCALE\n\n\ndef f(x):\n    return SCALE * x\n"
    (folder / "_zoo_ref_models.py").write_text(models_source)
    (folder / "_zoo_ref_pkg" / "__init__.py").write_text("")
    (folder / "_zoo_ref_pkg" / "sub" / "__init__.py").write_text("")
    (folder / "_zoo_ref_pkg" / "sub" / "mod.py").write_text("from _zoo_ref_pkg import sub\nVALUE = 7\n")
    before = list(sys.path)
    try:
        models, mod = bench.import_checkout(folder, "_zoo_ref_models", "_zoo_ref_pkg.sub.mod")
        assert models.f(2) == 6 and mod.VALUE == 7
        assert sys.path == before
        assert bench.import_checkout(folder, "_zoo_ref_models")[0] is models  # a second call reuses the modules
    finally:
        for name in [m for m in sys.modules if m.startswith("_zoo_ref_")]:
            del sys.modules[name]
        for finder in [f for f in sys.meta_path if getattr(f, "folder", None) == str(folder.resolve())]:
            sys.meta_path.remove(finder)
