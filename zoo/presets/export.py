"""Sharing a trained model: ``model.safetensors`` + ``config.json`` in one directory.

safetensors holds named tensors and nothing executable; ``config.json`` holds the resolved model
config, so ``zoo.load(dir)`` rebuilds the exact architecture and loads the weights into it::

    zoo.save(model, "my-model/")
    model = zoo.load("my-model/")

Tied weights (the LM head and the token embedding) are stored once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.presets.factory import create_model

EXPORT_FORMAT = "transformer-zoo/model/v1"
WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "config.json"


def save(model: nn.Module, directory: str | Path) -> Path:
    """Write ``model`` (a zoo model: it has a resolved ``config``) to ``directory``."""
    from safetensors.torch import save_model

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise TypeError(f"zoo.save needs a zoo model (built by zoo.create_model); got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / WEIGHTS_FILE), metadata={"format": EXPORT_FORMAT})
    info = {"format": EXPORT_FORMAT, "config": config.to_dict(), "params": sum(p.numel() for p in model.parameters())}
    (directory / CONFIG_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return directory


def load(directory: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model saved by :func:`save` in ``directory`` (weights checked name by name)."""
    from safetensors.torch import load_model

    directory = Path(directory)
    config_file, weights = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for needed in (config_file, weights):
        if not needed.is_file():
            raise FileNotFoundError(
                f"{needed} not found: zoo.load reads a directory written by zoo.save ({WEIGHTS_FILE} + {CONFIG_FILE})"
            )
    try:
        info: dict[str, Any] = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(info, dict) or info.get("format") != EXPORT_FORMAT or not isinstance(info.get("config"), dict):
        found = info.get("format") if isinstance(info, dict) else type(info).__name__
        raise ValueError(
            f"{config_file} is not a transformer-zoo model config (format {found!r}, expected {EXPORT_FORMAT!r})"
        )
    model = create_model(**info["config"])
    missing, unexpected = load_model(model, str(weights), strict=False, device=str(device))
    if missing or unexpected:
        raise ValueError(
            f"{weights} does not fit the model in {config_file}: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
    return model.to(device)
