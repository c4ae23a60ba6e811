"""Which cases of a parametrised suite the default test run keeps; the rest are marked ``slow``.

The default run (``make test``) must stay within 5 minutes on 2 cores while presets, paper configs and
mechanisms multiply. A suite that repeats one contract over every preset or mechanism keeps in the
default run a covering few (one per stack, task kind and state family, below) and runs every case with
``-m slow``; each part keeps fast cases in the suites that check it alone (tests/contracts/test_attention.py
and test_bad_input.py run every mechanism by default)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

# one per stack (sequential, reversible, universal with ACT), task kind (lm, seq2seq, pair classifier),
# and kind of carried state (KV cache, XL memory, span cache, LSH buckets, a recurrent state)
FAST_PRESETS = (
    "vanilla_lm",
    "transformer_xl",
    "adaptive_span_lm",
    "reformer",
    "universal_transformer_act",
    "vanilla_seq2seq",
    "two_tower_classifier",
    "gated_deltanet_lm",
)
# one per kind of attention state: dense KV cache, pattern cache, XL memory, span cache, LSH buckets,
# a running sum (linear), a decaying and a delta-rule recurrent state
FAST_MECHANISMS = ("vanilla", "local_1d", "xl_rel", "adaptive_span", "lsh", "linear", "gla", "gated_deltanet")
# one paper configuration per stack family
FAST_PAPERS = ("xl_text8", "adaptive_span_text8_small", "reformer_enwik8", "image_transformer_cifar10_2d")


def default_run_keeps(values: Iterable[Any], keep: Iterable[str], key: Callable[[Any], str] = str) -> list[Any]:
    """``values`` as pytest parameters: those whose ``key`` is in ``keep`` run by default, the rest only
    with ``-m slow``. Keeping none of ``values`` is an error, so a renamed part cannot silently empty a
    suite's default run."""
    values, keep = list(values), set(keep)
    present = {key(v) for v in values}
    chosen = keep & present
    if not chosen and values:
        raise ValueError(f"none of {sorted(keep)} among this suite's cases {sorted(present)}")
    return [v if key(v) in chosen else pytest.param(v, marks=pytest.mark.slow) for v in values]
