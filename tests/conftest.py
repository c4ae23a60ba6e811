import os

import pytest
import torch

# deterministic, CPU-sized tests: two threads (CI has 2 cores)
torch.set_num_threads(int(os.environ.get("ZOO_TEST_THREADS", "2")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
