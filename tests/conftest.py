import os

import pytest
import torch

# deterministic, CPU-sized tests on one thread: small ops gain little from a second thread,
# and on a loaded machine OpenMP barrier spinning makes 2 threads many times slower
torch.set_num_threads(int(os.environ.get("ZOO_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
