"""The Hugging Face Hub side, through ``huggingface_hub`` (the optional extra ``transformer-zoo[hub]``,
imported only here and only when a repository is named): download a model's two files, upload a
model folder. Saving and loading a local folder never need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.hub.folder import CARD_FILE, CONFIG_FILE, FILES, WEIGHTS_FILE, NotAZooModel, read_config, zoo_version


def hub() -> Any:
    """The ``huggingface_hub`` module, or an ImportError saying how to install it."""
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError(
            "a model on the Hugging Face Hub needs the huggingface_hub package: pip install 'transformer-zoo[hub]' "
            "(or pip install huggingface_hub); local folders load without it"
        ) from None
    return huggingface_hub


def download(
    repo_id: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> tuple[Path, Path]:
    """(config.json, model.safetensors) of Hub repository ``repo_id``, in the local cache. The config
    is read and checked first, so another library's repository costs no weight download; only the
    safetensors file is fetched (never a pickle)."""
    api = hub()
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError

    where = f"Hub repository {repo_id!r}" + (f" at {revision!r}" if revision else "")
    kwargs = dict(repo_id=repo_id, revision=revision, token=token, cache_dir=cache_dir)
    kwargs.update(local_files_only=local_files_only, library_name="transformer-zoo", library_version=zoo_version())

    def fetch(filename: str) -> Path:
        try:
            return Path(api.hf_hub_download(filename=filename, **kwargs))
        except LocalEntryNotFoundError:
            raise  # offline and not cached: huggingface_hub says so
        except EntryNotFoundError:
            held = (
                " (its weights are not safetensors: transformer-zoo never loads a pickle)"
                if filename == WEIGHTS_FILE
                else ""
            )
            raise NotAZooModel(f"{where} has no {filename}{held}") from None

    config = fetch(CONFIG_FILE)
    read_config(config, where)
    return config, fetch(WEIGHTS_FILE)


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload a transformer-zoo model",
    branch: str | None = None,
    create_pr: bool = False,
) -> str:
    """Upload a model folder (written by ``save_pretrained`` or ``experiments/export.py``) to Hub
    repository ``repo_id``, created when missing: its three files only, nothing else in the folder.
    Returns the commit's URL."""
    folder = Path(folder)
    read_config(folder / CONFIG_FILE, str(folder))  # ours, a version this reads
    missing = [name for name in (WEIGHTS_FILE, CARD_FILE) if not (folder / name).is_file()]
    if missing:
        raise NotAZooModel(f"{folder} lacks {', '.join(missing)}: write it with save_pretrained first")
    api = hub().HfApi(token=token)
    repo = api.create_repo(repo_id=repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(
        repo_id=getattr(repo, "repo_id", repo_id),
        repo_type="model",
        folder_path=str(folder),
        commit_message=commit_message,
        revision=branch,
        create_pr=create_pr,
        allow_patterns=list(FILES),
    )
    return str(getattr(commit, "commit_url", commit))
