"""Sharing a model: a folder of ``model.safetensors`` + ``config.json`` + ``README.md`` (the layout of
Hugging Face's ``PyTorchModelHubMixin``), locally or on the Hugging Face Hub::

    model.save_pretrained("my-model/")                  # or zoo.save(model, "my-model/")
    model = zoo.from_pretrained("my-model/")            # or a Hub repository id: "user/my-model"
    model.push_to_hub("user/my-model")                  # needs huggingface_hub and a token

Every zoo model has ``save_pretrained`` / ``push_to_hub`` / ``from_pretrained`` (the mixin's names and
files), implemented here rather than by inheriting ``PyTorchModelHubMixin``: its loader reads the
weights with ``strict=False`` (weights that do not fit load partly, without a word), falls back to a
pickled ``pytorch_model.bin`` on the Hub, and builds the config dataclass dropping the keys it does
not know; its ``save_pretrained`` keeps an existing README.md (a stale card); and importing
``huggingface_hub`` with ``zoo`` would cost every user its import time (0.5 s here) for what only the
Hub needs. The folder format: :mod:`zoo.hub.folder`; the card: :mod:`zoo.hub.card`; the Hub:
:mod:`zoo.hub.remote`; a training checkpoint to a folder: :mod:`zoo.hub.export`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.hub.folder import CONFIG_FILE, WEIGHTS_FILE, NotAZooModel, load_files, write_folder
from zoo.hub.remote import download, push_folder
from zoo.models.base import SHARING


def save_pretrained(model: nn.Module, directory: str | Path, *, training: dict[str, Any] | None = None) -> Path:
    """Write ``model`` into ``directory``; ``training`` (what :func:`zoo.hub.export.training_record`
    reads from a checkpoint) goes into config.json and the card."""
    return write_folder(model, directory, training)


def from_pretrained(
    name_or_path: str | Path,
    *,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> nn.Module:
    """The model in a local folder, or in Hub repository ``name_or_path`` (``user/name``; ``revision``
    a branch, tag or commit), in eval mode on ``device``. Weights come from safetensors only."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_files(path / CONFIG_FILE, path / WEIGHTS_FILE, where=str(path), device=device)
    text = str(name_or_path)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise FileNotFoundError(f"{name_or_path}: no such model folder (a Hub repository id is 'user/name')")
    config, weights = download(
        text, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
    )
    return load_files(config, weights, where=f"Hub repository {text!r}", device=device)


def push_to_hub(model: nn.Module, repo_id: str, *, training: dict[str, Any] | None = None, **kwargs: Any) -> str:
    """Write ``model``'s folder to a temporary directory and upload it (:func:`zoo.hub.remote.push_folder`:
    ``private``, ``token``, ``commit_message``, ``branch``, ``create_pr``). Returns the commit's URL."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(model, Path(tmp) / "model", training)
        return push_folder(folder, repo_id, **kwargs)


def save(model: nn.Module, directory: str | Path) -> Path:
    """``zoo.save``: :func:`save_pretrained` (the same folder)."""
    return save_pretrained(model, directory)


def load(directory: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """``zoo.load``: :func:`from_pretrained` of a local folder (a repository id is refused here)."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"{directory}: no such model folder (zoo.load reads a folder; zoo.from_pretrained also a Hub id)"
        )
    return from_pretrained(path, device=device)


SHARING.update(save_pretrained=save_pretrained, push_to_hub=push_to_hub, from_pretrained=from_pretrained)

__all__ = ["NotAZooModel", "from_pretrained", "load", "push_folder", "push_to_hub", "save", "save_pretrained"]
