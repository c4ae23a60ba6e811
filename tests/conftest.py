import os

import numpy as np
import pytest
import torch

from zoo.registry import import_plugins

# deterministic, CPU-sized tests on one thread: small ops gain little from a second thread,
# and on a loaded machine OpenMP barrier spinning makes 2 threads many times slower
torch.set_num_threads(int(os.environ.get("ZOO_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """A 20,000-character random lowercase text (the char_lm / enwik8 tasks read it by path)."""
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    rng = np.random.default_rng(0)
    path.write_bytes(bytes(rng.integers(97, 123, 20_000).astype(np.uint8)))
    return path


def pytest_addoption(parser):
    parser.addoption(
        "--zoo-imports",
        default="",
        help="comma-separated modules holding your own parts (my_research.attention,...): imported before "
        "collection, so the parametrised contract suites (tests/contracts) run over them too",
    )


def pytest_configure(config):
    modules = [m.strip() for m in config.getoption("--zoo-imports").split(",") if m.strip()]
    if modules:
        import_plugins(modules)
