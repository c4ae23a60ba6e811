"""A shared model is one folder, the layout of Hugging Face's ``PyTorchModelHubMixin``:

- ``model.safetensors``: the weights, named tensors and nothing executable; tied weights (the LM
  head and the embedding, the encoder-decoder's three-way tie) are stored once and come back tied,
  because the model is rebuilt with its ties and the file loaded into it;
- ``config.json``: ``model_type`` (``transformer-zoo``), ``format_version``, the ``zoo_version`` and
  ``preset`` that wrote it, the parameter count, the resolved model config that rebuilds the
  model (``zoo.create_model(**config["config"])``), the modules of your own its parts come from
  (``imports``) and, from a training run, what it was trained on (``training``);
- ``README.md``: the model card (:mod:`zoo.hub.card`).

Reading refuses, naming the folder and the fix: a folder with no ``config.json``, another
library's (``model_type`` other than ours), a newer ``format_version`` than this version reads,
weights that are not safetensors (a pickle is never loaded) or that do not fit the config. The
first format (``zoo.save`` before format versions: ``{"format": "transformer-zoo/model/v1", ...}``)
still loads.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from zoo.attention.base import ATTENTION
from zoo.config import PART_AXES
from zoo.feed_forward.base import FEED_FORWARD
from zoo.hub.card import model_card
from zoo.init.base import INIT
from zoo.models.base import HEAD
from zoo.norm.base import NORM
from zoo.position.base import POSITION
from zoo.presets.factory import MODEL, create_model
from zoo.registry import UnknownNameError
from zoo.residual.base import RESIDUAL
from zoo.stacks.base import STACK

MODEL_TYPE = "transformer-zoo"
FORMAT_VERSION = 2  # bump when config.json changes in a way an older reader would misread
V1_FORMAT = "transformer-zoo/model/v1"  # zoo.save's first format: {"format", "config", "params"}
WEIGHTS_FILE, CONFIG_FILE, CARD_FILE = "model.safetensors", "config.json", "README.md"
FILES = (WEIGHTS_FILE, CONFIG_FILE, CARD_FILE)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# the registry each part axis names its part in
REGISTRIES = {
    "attention": ATTENTION,
    "cross_attention": ATTENTION,
    "residual": RESIDUAL,
    "stack": STACK,
    "position": POSITION,
    "norm": NORM,
    "feed_forward": FEED_FORWARD,
    "init": INIT,
}


class NotAZooModel(ValueError):
    """A folder or repository that holds no transformer-zoo model this version can load."""


def zoo_version() -> str:
    """The installed transformer-zoo's version (pyproject.toml's), recorded in every config.json."""
    try:
        return importlib.metadata.version("transformer-zoo")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def own_modules(config: Any) -> list[str]:
    """Modules outside transformer-zoo that registered the preset, the head or a part ``config``
    names (``imports=[...]`` in a run): a loader must import them itself, nothing imports them for it."""
    found = [MODEL.get(config.name).build_config, HEAD.get(config.kind)]
    for axis in PART_AXES:  # an axis may hold a per-layer list of parts (a hybrid's attention)
        value = getattr(config, axis)
        found += [REGISTRIES[axis].get(part["name"]) for part in (value if isinstance(value, list) else [value])]
    modules = (getattr(obj, "__module__", "zoo") for obj in found)
    return sorted({m for m in modules if m != "zoo" and not m.startswith("zoo.")})


def folder_config(model: nn.Module, training: dict[str, Any] | None = None) -> dict[str, Any]:
    """``config.json`` of ``model`` (see the module doc)."""
    config = model.config
    info = {
        "model_type": MODEL_TYPE,
        "format_version": FORMAT_VERSION,
        "zoo_version": zoo_version(),
        "preset": config.name,
        "kind": config.kind,
        "params": sum(p.numel() for p in model.parameters()),
        "imports": own_modules(config),
        "config": config.to_dict(),
    }
    if training:
        info["training"] = training
    return info


def write_folder(model: nn.Module, directory: str | Path, training: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (a zoo model) into ``directory``: weights, config.json, model card. A folder
    holding another library's model is refused rather than overwritten."""
    if not hasattr(getattr(model, "config", None), "to_dict"):
        raise TypeError(f"save_pretrained needs a zoo model (built by zoo.create_model); got {type(model).__name__}")
    directory = Path(directory)
    if (directory / CONFIG_FILE).is_file():
        try:  # ours, of a version we read: replaced; anything else: refused, never overwritten
            read_config(directory / CONFIG_FILE, str(directory))
        except NotAZooModel as exc:
            raise NotAZooModel(
                f"save_pretrained will not overwrite {directory / CONFIG_FILE}: {directory} already holds a "
                f"config.json that is not a transformer-zoo model folder's this version can replace ({exc}). "
                "Save into a new or empty folder (a run directory's own config.json is kept too)"
            ) from None
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})  # one copy of each tied tensor
    info = folder_config(model, training)
    (directory / CONFIG_FILE).write_text(json.dumps(info, indent=2) + "\n")
    (directory / CARD_FILE).write_text(model_card(info))
    return directory


def read_config(config_file: Path, where: str) -> dict[str, Any]:
    """The validated contents of a ``config.json``; refuses anything this version cannot load."""
    if not config_file.is_file():
        raise NotAZooModel(
            f"{where} has no {CONFIG_FILE}: not a model folder written by save_pretrained / zoo.save "
            f"({WEIGHTS_FILE} + {CONFIG_FILE} + {CARD_FILE})"
        )
    try:
        info = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NotAZooModel(f"{config_file} is not valid JSON ({exc}); not a transformer-zoo model") from None
    if isinstance(info, dict) and info.get("format") == V1_FORMAT and isinstance(info.get("config"), dict):
        return {"format_version": 1, "preset": info["config"].get("name"), "imports": [], **info}
    model_type = info.get("model_type") if isinstance(info, dict) else None
    if model_type != MODEL_TYPE:
        if not isinstance(info, dict):
            found = f"a JSON {type(info).__name__}"
        elif model_type is None:
            found = "no model_type"
        else:
            found = f"model_type {model_type!r}"
        library = "Hugging Face transformers" if isinstance(info, dict) and "transformers_version" in info else ""
        raise NotAZooModel(
            f"{where} is not a transformer-zoo model: its {CONFIG_FILE} has {found} (expected {MODEL_TYPE!r})"
            + (
                f", written by {library}: load it with that library"
                if library
                else "; load it with the library that wrote it"
            )
        )
    version = info.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise NotAZooModel(f"{config_file}: format_version must be a positive int, got {version!r}")
    if version > FORMAT_VERSION:
        raise NotAZooModel(
            f"{where} was written by transformer-zoo {info.get('zoo_version', '?')} in config format {version}; "
            f"this transformer-zoo {zoo_version()} reads formats up to {FORMAT_VERSION}: upgrade it "
            "(pip install -U transformer-zoo)"
        )
    if not isinstance(info.get("config"), dict):
        raise NotAZooModel(f"{config_file} holds no model config ('config' missing or not a mapping)")
    return info


def build_from(info: dict[str, Any], where: str) -> nn.Module:
    """The model ``info`` describes, freshly initialised; a part of an unimported module names it."""
    config = dict(info["config"])
    try:
        return create_model(**config)
    except UnknownNameError as exc:
        imports = info.get("imports") or []
        if not imports:
            raise
        raise UnknownNameError(
            f"{exc}. {where} was saved with parts of {imports}: import them first "
            f"(zoo.import_plugins({imports!r})); transformer-zoo never imports code a config names"
        ) from None


def load_files(config_file: Path, weights_file: Path, *, where: str, device: str | torch.device = "cpu") -> nn.Module:
    """The model of a ``config.json`` + ``model.safetensors`` pair, in eval mode, on ``device``."""
    info = read_config(config_file, where)
    if not weights_file.is_file():
        pickles = sorted(p.name for p in weights_file.parent.iterdir() if p.suffix in PICKLE_SUFFIXES)
        held = (
            f"; it holds {', '.join(pickles)}, which would be unpickled (able to run code): never loaded"
            if pickles
            else ""
        )
        raise NotAZooModel(f"{where} has no {WEIGHTS_FILE}{held}. transformer-zoo loads weights from safetensors only")
    model = build_from(info, where)
    try:
        missing, unexpected = load_model(model, str(weights_file), strict=False, device=str(device))
    except (RuntimeError, SafetensorError) as exc:  # a shape that does not fit, a truncated file
        raise NotAZooModel(
            f"{weights_file} does not fit the model in {config_file}: {str(exc).splitlines()[0]}"
        ) from None
    if missing or unexpected:
        raise NotAZooModel(
            f"{weights_file} does not fit the model in {config_file}: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    return model.to(device).eval()
