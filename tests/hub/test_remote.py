"""The Hugging Face Hub side, offline: huggingface_hub's download and upload calls are replaced by
fakes that serve or keep files locally (this machine has no network; the real calls are the
library's, not ours). What is checked is ours: which files are fetched or sent, in what order,
what is refused before any weight moves, and that what was sent loads back exactly."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

import zoo
from zoo.hub import push_folder
from zoo.hub.folder import NotAZooModel
from zoo.presets.factory import get_preset

hub = pytest.importorskip("huggingface_hub", reason="the Hub client (pip install 'transformer-zoo[hub]')")


def tiny_xl() -> torch.nn.Module:
    torch.manual_seed(0)
    return zoo.create_model("transformer_xl", **get_preset("transformer_xl").tiny).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(24).remainder(32)[None]).logits


@pytest.fixture
def served(monkeypatch, tmp_path):
    """``served[repo_id] = folder`` publishes a folder; requests are recorded in ``served.calls``."""

    class Served(dict):
        calls: list[tuple[str, str, str | None]] = []

    repos = Served()

    def hf_hub_download(repo_id, filename, *, revision=None, library_name=None, **kwargs):
        repos.calls.append((repo_id, filename, revision))
        assert library_name == "transformer-zoo"
        source = repos[repo_id] / filename
        if not source.is_file():
            raise hub.utils.EntryNotFoundError(f"{filename} not in {repo_id}")
        cached = tmp_path / "cache" / repo_id / filename
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, cached)
        return str(cached)

    monkeypatch.setattr(hub, "hf_hub_download", hf_hub_download)
    return repos


def test_a_hub_repository_loads_exactly(served, tmp_path):
    model = tiny_xl()
    served["user/tiny-xl"] = model.save_pretrained(tmp_path / "published")
    loaded = zoo.from_pretrained("user/tiny-xl", revision="v1")
    assert torch.equal(logits(loaded), logits(model))
    assert served.calls == [("user/tiny-xl", "config.json", "v1"), ("user/tiny-xl", "model.safetensors", "v1")]


def test_another_librarys_repository_is_refused_before_its_weights(served, tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert", "transformers_version": "4.40.0"}')
    (folder / "model.safetensors").write_bytes(b"large weights")
    served["google/bert"] = folder
    with pytest.raises(NotAZooModel, match="Hub repository 'google/bert' is not a transformer-zoo model"):
        zoo.from_pretrained("google/bert")
    assert [filename for _, filename, _ in served.calls] == ["config.json"]


def test_a_repository_without_safetensors_is_refused(served, tmp_path):
    folder = tiny_xl().save_pretrained(tmp_path / "m")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    served["user/pickled"] = folder
    with pytest.raises(NotAZooModel, match="has no model.safetensors.*never loads a pickle"):
        zoo.from_pretrained("user/pickled")


@pytest.fixture
def uploads(monkeypatch, tmp_path):
    """huggingface_hub.HfApi replaced: create_repo and upload_folder are recorded, and the files
    upload_folder would send (its allow_patterns) are copied to ``tmp_path / uploaded / <repo>``."""
    calls = []

    class FakeApi:
        def __init__(self, token=None):
            self.token = token

        def create_repo(self, repo_id, *, private=None, exist_ok=False, **kwargs):
            calls.append(("create", repo_id, private, exist_ok))
            return hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, allow_patterns, **kwargs):
            kept = tmp_path / "uploaded" / repo_id
            kept.mkdir(parents=True)
            for path in Path(folder_path).iterdir():
                if path.name in allow_patterns:
                    shutil.copy(path, kept / path.name)
            calls.append(("upload", repo_id, kwargs["commit_message"], kept))
            return hub.CommitInfo(
                commit_url=f"https://huggingface.co/{repo_id}/commit/abc",
                commit_message=kwargs["commit_message"],
                commit_description="",
                oid="abc",
            )

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    return calls


def test_push_to_hub_uploads_the_three_files_that_load_back(uploads):
    model = tiny_xl()
    url = model.push_to_hub("user/tiny-xl", private=True)
    assert url == "https://huggingface.co/user/tiny-xl/commit/abc"
    assert uploads[0] == ("create", "user/tiny-xl", True, True)
    kept = uploads[1][3]
    assert sorted(p.name for p in kept.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert torch.equal(logits(zoo.from_pretrained(kept)), logits(model))


def test_push_folder_sends_only_a_zoo_models_files(uploads, tmp_path):
    folder = tiny_xl().save_pretrained(tmp_path / "m")
    (folder / "notes.txt").write_text("private notes")
    push_folder(folder, "user/m")
    assert sorted(p.name for p in uploads[1][3].iterdir()) == ["README.md", "config.json", "model.safetensors"]
    (folder / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(NotAZooModel, match="not a transformer-zoo model"):
        push_folder(folder, "user/bert")
    assert len(uploads) == 2  # nothing more was sent


def test_without_huggingface_hub_a_repository_id_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as when not installed
    with pytest.raises(ImportError, match=r"pip install 'transformer-zoo\[hub\]'"):
        zoo.from_pretrained("user/tiny-xl")
    with pytest.raises(ImportError, match=r"pip install 'transformer-zoo\[hub\]'"):
        tiny_xl().push_to_hub("user/tiny-xl")
    folder = tiny_xl().save_pretrained(tmp_path / "m")  # a local folder needs nothing
    assert zoo.from_pretrained(folder).config.name == "transformer_xl"
