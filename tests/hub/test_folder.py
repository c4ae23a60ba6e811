"""A shared model folder: model.safetensors + config.json + README.md. Every preset round-trips
exactly, tied weights are stored once and come back tied, zoo.save/zoo.load are the same folder,
the first format still loads, and what cannot be loaded is refused naming the folder and the fix."""

from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file
from support.fast_cases import FAST_PRESETS, default_run_keeps

import zoo
from zoo.hub.folder import FORMAT_VERSION, V1_FORMAT, NotAZooModel
from zoo.presets.factory import get_preset
from zoo.registry import UnknownNameError

PLUGINS = Path(__file__).resolve().parents[1] / "contracts" / "plugins"


def tiny(name: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return zoo.create_model(name, **{**get_preset(name).tiny, **extra}).eval()


def inputs(model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    preset, cfg = get_preset(model.config.name), model.config
    pair = cfg.kind == "pair_classifier"  # two documents per row: [b, 2, t]
    shape = (2, 2, preset.example_length) if pair else (2, preset.example_length)
    tokens = torch.randint(0, cfg.vocab_size, shape, generator=torch.Generator().manual_seed(1))
    return (tokens, tokens) if cfg.kind == "seq2seq" else (tokens,)


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    by_storage: dict[int, list[str]] = {}
    for key, value in model.state_dict().items():
        by_storage.setdefault(value.untyped_storage().data_ptr(), []).append(key)
    return [names for names in by_storage.values() if len(names) > 1]


@pytest.mark.parametrize("preset", default_run_keeps(zoo.list_models(), FAST_PRESETS))
def test_every_preset_round_trips_exactly(tmp_path, preset):
    model = tiny(preset)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    info = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (info["model_type"], info["format_version"], info["zoo_version"]) == ("transformer-zoo", 2, zoo.__version__)
    assert info["preset"] == preset and info["params"] == sum(p.numel() for p in model.parameters())
    assert zoo.create_model(**info["config"]).config == model.config  # the config alone rebuilds it

    loaded = zoo.from_pretrained(tmp_path / "m")
    assert type(loaded) is type(model) and loaded.config == model.config and not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded(*inputs(model)).logits, model(*inputs(model)).logits)
    # tied weights: one tensor in the file, and tied again in the loaded model
    with safe_open(tmp_path / "m" / "model.safetensors", "pt") as f:
        stored = set(f.keys())
    for names in tied_groups(model):
        assert len(stored & set(names)) == 1, names
        assert names in tied_groups(loaded), names


def test_tied_adaptive_tables_are_stored_once_and_stay_tied(tmp_path):
    model = tiny("vanilla_lm", vocab_size=60, adaptive={"cutoffs": [10, 30], "div_val": 2})
    groups = tied_groups(model)
    assert len(groups) >= 2  # embeddings and the tail projections shared between input and output
    loaded = zoo.from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert tied_groups(loaded) == groups
    with torch.no_grad():  # tied means one parameter: a change to one name shows in the other
        for names in groups:
            loaded.state_dict()[names[0]].add_(1.0)
            assert torch.equal(loaded.state_dict()[names[0]], loaded.state_dict()[names[1]])


def test_model_card_names_preset_paper_and_size(tmp_path):
    model = tiny("transformer_xl")
    card = (model.save_pretrained(tmp_path / "m") / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "transformer-zoo"
    assert {"transformer_xl", "arxiv:1901.02860"} <= set(meta["tags"])
    assert "Dai et al. 2019" in body and "https://arxiv.org/abs/1901.02860" in body
    assert f"| parameters | {model.num_parameters:,} |" in body
    assert "Not exported from a training run" in body  # no data or metric is claimed for it
    hub = pytest.importorskip("huggingface_hub", reason="the Hub's own card parser")
    assert hub.ModelCard.load(tmp_path / "m" / "README.md").data.library_name == "transformer-zoo"


@pytest.mark.parametrize("preset", zoo.list_models())
def test_every_preset_cites_its_paper_for_the_card(preset):
    assert re.search(r"\d{4}, .+, arXiv:\d{4}\.\d{4,5}$", get_preset(preset).paper), get_preset(preset).paper


def test_zoo_save_and_load_are_the_same_folder(tmp_path):
    model = tiny("gtrxl")
    zoo.save(model, tmp_path / "a")
    model.save_pretrained(tmp_path / "b")
    assert (tmp_path / "a" / "config.json").read_bytes() == (tmp_path / "b" / "config.json").read_bytes()
    a, b = (load_file(tmp_path / side / "model.safetensors") for side in "ab")  # its header's order varies
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert zoo.load(tmp_path / "a").config == model.config
    with pytest.raises(FileNotFoundError, match="zoo.load reads a folder"):
        zoo.load(tmp_path / "nowhere")


def test_the_first_format_still_loads(tmp_path):
    """zoo.save before format versions wrote {"format": v1, "config", "params"} and no card."""
    model = tiny("vanilla_lm")
    folder = model.save_pretrained(tmp_path / "m")
    info = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"format": V1_FORMAT, "config": info["config"], "params": 1}))
    (folder / "README.md").unlink()
    with torch.no_grad():
        assert torch.equal(zoo.load(folder)(*inputs(model)).logits, model(*inputs(model)).logits)


def write_config(folder: Path, **changes) -> Path:
    info = json.loads((folder / "config.json").read_text())
    info.update(changes)
    (folder / "config.json").write_text(json.dumps(info))
    return folder


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"model_type": "transfo-xl", "architectures": ["TransfoXLLMHeadModel"], "transformers_version": "4.35.0"},
            r"not a transformer-zoo model: its config.json has model_type 'transfo-xl'.*Hugging Face transformers",
        ),
        ({"hidden_size": 4}, r"not a transformer-zoo model: its config.json has no model_type.*library that wrote it"),
    ],
)
def test_a_folder_of_another_library_is_refused(tmp_path, config, message):
    model = tiny("vanilla_lm")
    folder = model.save_pretrained(tmp_path / "m")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotAZooModel, match=message):
        zoo.from_pretrained(folder)
    written = (folder / "config.json").read_text()
    overwrite = rf"save_pretrained will not overwrite {re.escape(str(folder / 'config.json'))}: .*not a transformer-zoo"
    with pytest.raises(NotAZooModel, match=overwrite):  # and not overwritten by a save, which says so
        model.save_pretrained(folder)
    assert (folder / "config.json").read_text() == written


def test_save_pretrained_into_a_run_directory_names_the_config_it_will_not_overwrite(tmp_path):
    """A run directory holds the run's own config.json: the refusal is about overwriting it (which
    file), not about loading."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"model": {"preset": "vanilla_lm"}, "trainer": {}}))
    with pytest.raises(NotAZooModel, match=r"will not overwrite .*run/config\.json") as refused:
        tiny("vanilla_lm").save_pretrained(run_dir)
    assert "load it" not in str(refused.value).split("(")[0]


def test_a_newer_config_version_is_refused_with_the_upgrade(tmp_path):
    folder = write_config(tiny("vanilla_lm").save_pretrained(tmp_path / "m"), format_version=FORMAT_VERSION + 1)
    write_config(folder, zoo_version="9.0.0")
    expected = rf"written by transformer-zoo 9.0.0 in config format {FORMAT_VERSION + 1}.*reads formats up to "
    with pytest.raises(
        NotAZooModel, match=expected + rf"{FORMAT_VERSION}: upgrade it \(pip install -U transformer-zoo\)"
    ):
        zoo.from_pretrained(folder)


class _RunsCode:
    def __reduce__(self):
        return (exec, ("open('UNPICKLED', 'w').close()",))


def test_a_pickle_is_never_loaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tiny("vanilla_lm").save_pretrained(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(NotAZooModel, match=r"no model.safetensors; it holds pytorch_model.bin.*never loaded"):
        zoo.from_pretrained(folder)
    assert not (tmp_path / "UNPICKLED").exists()


def test_weights_that_do_not_fit_and_missing_folders_are_refused(tmp_path):
    folder = tiny("vanilla_lm").save_pretrained(tmp_path / "m")
    info = json.loads((folder / "config.json").read_text())
    write_config(folder, config={**info["config"], "d_model": 64})
    with pytest.raises(NotAZooModel, match="model.safetensors does not fit the model in"):
        zoo.from_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(NotAZooModel, match="has no config.json: not a model folder"):
        zoo.from_pretrained(folder)
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        zoo.from_pretrained(tmp_path / "nowhere")


def test_from_pretrained_on_a_head_class_refuses_another_head(tmp_path):
    folder = tiny("vanilla_classifier").save_pretrained(tmp_path / "m")
    lm_class = type(tiny("vanilla_lm"))
    with pytest.raises(TypeError, match="not a .*load it with zoo.from_pretrained"):
        lm_class.from_pretrained(folder)
    assert type(type(tiny("vanilla_classifier")).from_pretrained(folder)).__name__ != lm_class.__name__


def test_a_part_of_your_own_is_named_not_imported(tmp_path, monkeypatch):
    """config.json records the module a part came from; loading never imports it, it says which."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    module = "zoo_plugin_parts.attention"
    zoo.import_plugins([module])
    try:
        folder = tiny("vanilla_lm", attention="plugin_attention").save_pretrained(tmp_path / "m")
        assert json.loads((folder / "config.json").read_text())["imports"] == [module]
    finally:
        zoo.attention.ATTENTION.unregister("plugin_attention")
        sys.modules.pop(module, None)
    with pytest.raises(UnknownNameError, match=rf"import them first \(zoo.import_plugins\(\['{module}'\]\)\)"):
        zoo.from_pretrained(folder)
    assert module not in sys.modules
