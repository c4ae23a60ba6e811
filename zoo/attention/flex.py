"""The FlexAttention backend: a mechanism's pattern run by ``torch.nn.attention.flex_attention``.

Not a mechanism (nothing registers here). A mechanism whose key sets are a rule over absolute
positions hands that rule, ``rule(h, i, j) -> bool`` (head, query position, key position), to
:func:`flex_attend`, which runs FlexAttention over the (query, key) blocks the rule touches. On CUDA its
kernels skip every block the rule leaves empty; on the CPU torch 2.13 runs the forward only
("FlexAttention does not support backward on CPU"), so a CPU caller asking for gradients is refused
with that reason and the mechanism's own path stays the training path there.

No t x t tensor: the :class:`BlockMask` is built one row of query blocks at a time (``BLOCK`` queries
against every key: O(BLOCK x s) booleans at once), reduced to the blocks each row must visit (partly
or fully allowed), and cached per call shape, positions and padding, so a training loop at one shape
builds it once. Inside partly allowed blocks the same rule runs as FlexAttention's ``mask_mod``.

Positions: queries at absolute ``query_positions`` [t] and keys at ``key_positions`` [s] (a cache's
keys need not be contiguous: attention sinks and a rolled window), key padding ``valid`` [b, s]. A
query row with no allowed key returns 0, as the mechanisms' own paths do.

A position part that adds a bias per query-key distance (ALiBi, T5 buckets: ``zoo/position``) enters as
FlexAttention's ``score_mod``: :class:`DistanceBias` holds the bias of every distance the call can meet,
a table [h, D] (D = the range of query minus key positions, at most t + s - 1: linear, never t x s), and
the score of (i, j) gets ``table[h, pos(i) - pos(j) - low]``. A learned table (T5) receives its gradient
through FlexAttention where its backward runs (CUDA).

Shapes: q [b, h, t, k]; k, v [b, h, s, k]; ``BLOCK`` = FlexAttention's block size.

On the CPU the keys and values are handed to the kernel padded to a multiple of ``CPU_KEY_MULTIPLE``
(the padding masked out), working around a defect of torch 2.13's compiled CPU kernel: its q k^T
micro-kernel (inductor's FP32 ``micro_gemm_transpose_b``, 16 keys per tile) treats a last tile of N keys
with N a multiple of the vector width (8 on AVX2) but under 16 as a whole tile, so it reads the 8
keys past the end and writes their scores past the row; for a block's last query row they land on the
kernel's running row maxima, and the softmax of the block's first 8 queries comes out wrong. Those keys
are whatever follows the view: a cache's unfilled preallocated capacity (append.py), or the memory after
a packed tensor. With s a multiple of 16 every tile is whole and the path is never taken.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128
CPU_KEY_MULTIPLE = 16  # the CPU micro-kernel's key tile (see the module docstring)
BACKENDS = ("auto", "native", "flex")
Rule = Callable[[Tensor, Tensor, Tensor], Tensor]  # (head, query position, key position) -> may attend


@dataclass
class DistanceBias:
    """b_h(d) for the distances d = low ... low + D - 1 of one call: ``table`` [h, D]; ``query_positions`` [t]
    and ``key_positions`` [s] number the pairs by the positions the bias counts (they may differ from the
    mask's numbering: vanilla's cache-order keys)."""

    table: Tensor
    low: int
    query_positions: Tensor
    key_positions: Tensor

    def score_mod(self) -> Callable[..., Tensor]:
        table, low, qpos, kpos = self.table, self.low, self.query_positions, self.key_positions

        def add_bias(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[h, qpos[q_idx] - kpos[kv_idx] - low].to(score.dtype)

        return add_bias


RECOMPILES = 64  # compiled variants of FlexAttention kept per process (one per shape and per mask rule)


@functools.cache
def compiled_flex() -> Callable[..., Tensor]:
    """FlexAttention compiled once per process: its eager form is a slow dense reference (0.29 s against
    0.005 s compiled for local_1d at 2,048 tokens, 4 heads of 32, measured here on one CPU thread).
    Every layer's rule and every shape is a variant of the one compiled function; past torch's default
    limit of 8 it would fall back to the eager reference silently (measured: 3.8 s instead of 0.05 s for a
    2-layer local_2d model at 4K once a benchmark had compiled 8 others), so the limit is raised here."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILES)
    return torch.compile(flex_attention, dynamic=False)


def check_backend(backend: str, name: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"{name}: backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def use_flex(backend: str, device: torch.device, name: str, dropout: float = 0.0) -> bool:
    """Whether this call runs on FlexAttention: ``flex`` always (refused where it cannot run),
    ``auto`` on CUDA only (the mechanism's own path elsewhere; also for calls over a growing cache, where
    every decoding step would be a new shape to compile), ``native`` never. ``dropout``: the
    attention dropout this call would apply (FlexAttention has none: ``auto`` keeps the native path then)."""
    if backend == "native" or (backend == "auto" and (device.type != "cuda" or dropout > 0)):
        return False
    if dropout > 0:
        raise ValueError(
            f"{name}: backend='flex' has no dropout on the attention weights; set attention_dropout=0 or "
            "backend=native (auto picks native while dropout is on)"
        )
    if device.type == "cpu" and torch.is_grad_enabled():
        raise ValueError(
            f"{name}: backend='flex' needs gradients here, and FlexAttention does not support backward on CPU "
            "(torch 2.13); use backend=native (or auto) for training on the CPU, flex under torch.no_grad()"
        )
    return True


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rule: Rule,
    *,
    query_positions: Tensor,
    key_positions: Tensor,
    valid: Tensor | None,
    heads_differ: bool,
    cache_key: tuple,
    bias: DistanceBias | None = None,
    documents: Tensor | None = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias) v over the pairs ``rule`` allows (and ``valid`` keys), through
    FlexAttention. q [b, h, t, k]; k, v [b, h, s, k] -> [b, h, t, k]. ``documents`` long [b, s] (a packed row,
    queries and keys the same t = s positions): query i may see key j only inside its own document."""
    b, h, s = q.shape[0], q.shape[1], k.shape[2]
    run = kernel_keys(s, q.device)
    if run != s:  # padded keys: masked out by the block mask, given positions the bias table holds
        k, v = (torch.nn.functional.pad(x, (0, 0, 0, run - s)) for x in (k, v))
        if bias is not None:
            bias = replace(bias, key_positions=pad_positions(bias.key_positions, run))
    mask, has_key = block_mask(
        rule,
        query_positions,
        key_positions,
        valid,
        b if valid is not None or documents is not None else 1,
        h if heads_differ else 1,
        cache_key,
        kernel_length=run,
        documents=documents,
    )
    with warnings.catch_warnings():  # the compiled kernel warns once about its CPU path
        warnings.simplefilter("ignore")
        score_mod = None if bias is None else bias.score_mod()
        out = compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask)
    # a query that may see no key returns 0, as the mechanisms' own paths do (the kernel's value there
    # is not specified; the CPU's compiled path cannot return the log-sum-exp that would say so)
    return torch.where(has_key[..., None], out, torch.zeros((), dtype=out.dtype, device=out.device))


def kernel_keys(s: int, device: torch.device) -> int:
    """How many keys the kernel is handed for s real ones: s on CUDA, s rounded up to a multiple of
    ``CPU_KEY_MULTIPLE`` on the CPU (the padding is masked out; see the module docstring)."""
    return s if device.type != "cpu" else -(-s // CPU_KEY_MULTIPLE) * CPU_KEY_MULTIPLE


def pad_positions(positions: Tensor, n: int) -> Tensor:
    """Positions [s] extended to [n] by repeating the last (padded keys get a real key's position, so a
    rule or a bias table indexed by it stays in range; the mask drops them)."""
    return torch.cat([positions, positions[-1:].expand(n - positions.numel())])


_CACHE: dict[tuple, tuple[BlockMask, Tensor]] = {}


def block_mask(
    rule: Rule,
    query_positions: Tensor,
    key_positions: Tensor,
    valid: Tensor | None,
    batch: int,
    heads: int,
    cache_key: tuple,
    kernel_length: int | None = None,
    documents: Tensor | None = None,
) -> tuple[BlockMask, Tensor]:
    """The BlockMask of ``rule`` over these positions (and padding, and packed documents), built a row of
    query blocks at a time, and which queries may see any key at all (bool [batch, heads, t]).
    ``kernel_length``: the keys the kernel is handed (the s real ones, then padding the mask leaves out;
    None: s)."""
    s = key_positions.numel()
    kernel_length = s if kernel_length is None else kernel_length
    key = (
        cache_key,
        query_positions.device,
        int(query_positions[0]),
        query_positions.numel(),
        tuple(key_positions.tolist())
        if key_positions.numel() <= 4096
        else (key_positions.numel(), int(key_positions.sum())),
        None if valid is None else (valid.data_ptr(), valid._version, tuple(valid.shape)),
        None if documents is None else (documents.data_ptr(), documents._version, tuple(documents.shape)),
        batch,
        heads,
        kernel_length,
    )
    if key not in _CACHE:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = _build(rule, query_positions, key_positions, valid, batch, heads, kernel_length, documents)
    return _CACHE[key]


def _build(
    rule: Rule,
    qpos: Tensor,
    kpos: Tensor,
    valid: Tensor | None,
    batch: int,
    heads: int,
    run: int | None = None,
    documents: Tensor | None = None,
) -> tuple[BlockMask, Tensor]:
    t, s, device = qpos.numel(), kpos.numel(), qpos.device
    run = s if run is None else run  # keys the kernel sees: s real, then run - s padded ones (never allowed)
    n_q, n_kv = -(-t // BLOCK), -(-run // BLOCK)
    head_index = torch.arange(heads, device=device)[:, None, None]
    kv_pad, past_end = n_kv * BLOCK - s, n_kv * BLOCK - run
    any_rows, all_rows, has_key = [], [], []
    for row in range(n_q):  # [batch, heads, BLOCK, s] booleans at a time, never [t, s]
        queries = qpos[row * BLOCK : (row + 1) * BLOCK]
        allowed = rule(head_index, queries[None, :, None], kpos[None, None, :])  # [heads or 1, rows, s]
        allowed = allowed.expand(heads, queries.numel(), s)[None]
        if valid is not None:
            allowed = allowed & valid[:, None, None, :]
        if documents is not None:  # queries are positions row * BLOCK ... of the same row as the keys
            rows = documents[:, row * BLOCK : (row + 1) * BLOCK]
            allowed = allowed & (rows[:, None, :, None] == documents[:, None, None, :])
        has_key.append(allowed.any(-1))  # [batch, heads, rows]
        allowed = torch.nn.functional.pad(allowed, (0, kv_pad), value=False)
        blocks = allowed.reshape(*allowed.shape[:3], n_kv, BLOCK)  # [batch, heads, rows, n_kv, BLOCK]
        any_rows.append(blocks.any(-1).any(2))  # [batch, heads, n_kv]: a pair in the block is allowed
        # fully allowed: every pair (rows/columns past the kernel's ends count as allowed; padded keys
        # inside them do not, so their block stays partial and mask_mod drops them)
        full = (
            torch.nn.functional.pad(allowed, (0, 0, 0, BLOCK - queries.numel()), value=True)
            if queries.numel() < BLOCK
            else allowed
        )
        whole = full.reshape(*full.shape[:2], BLOCK, n_kv, BLOCK)
        if past_end:
            whole = whole.clone()
            whole[..., -1, BLOCK - past_end :] = True
        all_rows.append(whole.all(-1).all(2))
    partial = torch.stack(any_rows, dim=2)  # [batch, heads, n_q, n_kv]
    complete = torch.stack(all_rows, dim=2) & partial
    partial = partial & ~complete
    kv_num, kv_index = _indices(partial)
    full_num, full_index = _indices(complete)

    if run > s:  # padded keys: indexed in range (a real key's position, no padding flag), then dropped
        kpos = pad_positions(kpos, run)
        valid = None if valid is None else torch.nn.functional.pad(valid, (0, run - s), value=False)
        if documents is not None:  # padded keys belong to no document (mask_mod indexes them in range)
            documents = torch.nn.functional.pad(documents, (0, run - s), value=-1)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        allowed = rule(h if heads > 1 else torch.zeros_like(h), qpos[q_idx], kpos[kv_idx])
        if run > s:
            allowed = allowed & (kv_idx < s)
        if documents is not None:
            allowed = allowed & (documents[b, q_idx] == documents[b, kv_idx])
        return allowed & valid[b, kv_idx] if valid is not None else allowed

    mask = BlockMask.from_kv_blocks(
        kv_num, kv_index, full_num, full_index, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(t, run)
    )
    return mask, torch.cat(has_key, dim=2)


def _indices(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """[batch, heads, n_q, n_kv] bool -> (how many kv blocks each query block visits, their indices first)."""
    count = blocks.sum(-1).to(torch.int32)
    order = torch.argsort(~blocks, dim=-1, stable=True).to(torch.int32)  # visited blocks first, in order
    return count, order
