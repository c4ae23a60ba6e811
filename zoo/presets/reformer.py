"""Reformer presets (Kitaev et al. 2020, "Reformer: The Efficient Transformer", arXiv:2001.04451).

``reformer`` combines the paper's three savers: LSH attention (zoo/attention/lsh.py), the
reversible stack (zoo/stacks/reversible.py) and the chunked feed-forward. ``reformer_full`` is its
ablation with full shared-QK attention in the same reversible, chunked skeleton (the paper's
"full attention" baseline). Both use pre-norm residuals: the reversible coupling needs additive
ones. Deviation: sinusoidal positions instead of the paper's axial position embeddings.

:func:`duplication_model` builds the one-layer model of the paper's duplication task (Table 2), the
one the study reformer_duplication trains (through the app, and beside reformer-pytorch).
"""

from __future__ import annotations

from typing import Any

from zoo.models.base import ZooModel
from zoo.presets.factory import create_model, register_preset

LSH = {"name": "lsh", "n_hashes": 4, "chunk_size": 64, "n_buckets": 0}  # n_buckets 0: ~one chunk per bucket
COMMON = dict(
    kind="lm",
    n_layers=6,
    d_model=512,
    d_ff=2048,
    n_heads=8,
    dropout=0.1,
    ff_chunk_size=256,
    max_len=65536,
    residual={"name": "pre_norm"},
    stack={"name": "reversible"},
)
TINY = dict(attention={"chunk_size": 8}, ff_chunk_size=8)
KITAEV = "Kitaev et al. 2020, Reformer: The Efficient Transformer, arXiv:2001.04451"


@register_preset(
    "reformer",
    "Reformer LM: LSH attention (4 hashes, chunk 64) + reversible stack + chunked feed-forward (Kitaev et al. 2020)",
    tiny=TINY,
    example_length=24,
    paper=KITAEV,
)
def _reformer() -> dict[str, Any]:
    return dict(COMMON, attention=dict(LSH))


@register_preset(
    "reformer_full",
    "Reformer ablation: full shared-QK attention inside the reversible, chunked-feed-forward stack",
    tiny=dict(ff_chunk_size=8),
    example_length=24,
    paper=KITAEV,
)
def _reformer_full() -> dict[str, Any]:
    return dict(COMMON, attention={"name": "shared_qk"})


def duplication_model(
    mode: str,
    *,
    n_symbols: int,
    length: int,
    d_model: int,
    n_heads: int,
    chunk: int,
    tie_embeddings: bool = True,
    **lsh_options: Any,
) -> ZooModel:
    """The paper's duplication-task model (Section 2.1, Table 2) at a chosen size: one shared-QK layer,
    d_ff = d_model, learned positions, a plain (sequential) stack (one layer gains nothing from
    reversibility, and the recompute would cost time), no chunked feed-forward, no dropout.

    ``mode`` is a row or column of Table 2: ``full`` (shared-QK attention over every key) or ``lsh<N>``
    (LSH attention with N hashes, chunk ``chunk``, ``lsh_options`` on top, e.g. ``look_back="chunk"``).
    Both share their parameter names, so weights trained in one mode load into the other."""
    if mode == "full":
        attention: dict[str, Any] = {"name": "shared_qk"}
    elif mode.startswith("lsh") and mode[3:].isdigit():
        attention = {"name": "lsh", "n_hashes": int(mode[3:]), "chunk_size": chunk, **lsh_options}
    else:
        raise ValueError(f"duplication mode must be 'full' or 'lsh<hashes>' (e.g. lsh4), got {mode!r}")
    return create_model(
        "reformer",
        vocab_size=n_symbols + 1,
        d_model=d_model,
        d_ff=d_model,
        n_heads=n_heads,
        n_layers=1,
        dropout=0.0,
        position="learned",
        max_len=length,
        stack="sequential",
        ff_chunk_size=0,
        attention=attention,
        tie_embeddings=tie_embeddings,
    )
