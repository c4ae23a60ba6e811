"""Context parallelism of the matrix-state mechanisms (deltanet, gated_deltanet, mamba2) with padding, on real
processes (gloo, float64): the state before each rank's part is composed from the earlier ranks' affine maps
and the short convolution reads its halo from them, so logits, loss, every gradient equal one process's to
1e-10, over 2 and 4 ranks (tests/parallel/test_context_parallel.py's check). Without padding they are in
that file's sweep over every registered mechanism."""

from __future__ import annotations

import pytest

from tests.parallel.test_context_parallel import Case, check_cases
from zoo.attention.base import ATTENTION

NAMES = ("deltanet", "gated_deltanet", "mamba2")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4: three maps composed in order
def test_padded_split_over_ranks_equals_one_process(world):
    cases = [
        Case(
            f"{name}_padded",
            "vanilla_lm",
            {"attention": {"name": name, **ATTENTION.get(name).contract_options()}},
            pad=True,
        )
        for name in NAMES
    ]
    check_cases(world, cases)
