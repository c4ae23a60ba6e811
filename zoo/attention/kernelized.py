"""Kernelised attention: the shared machinery behind ``linear`` and ``performer`` (nothing registers here).

Both replace softmax(q k^T) with a feature map, sim(q, k) = phi(q) . phi(k) >= 0, and compute

    out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),   S = sum_j phi(k_j) v_j^T [f, e],   z = sum_j phi(k_j) [f]

over the keys j query i sees (Katharopoulos et al. 2020, arXiv:2006.16236, eqs. 4-6; the same form is
Performer's FAVOR+, Choromanski et al. 2020, arXiv:2009.14794, Section 2.2). Never a t x t tensor:

- bidirectional: S and z are summed once over every real key; cost O(t f e).
- causal: S_i and z_i are prefix sums. Summing a [t, f, e] tensor of outer products would keep
  t f e numbers; instead the sequence is cut into chunks of ``CHUNK`` positions: inside a chunk the
  C x C products phi(q) phi(k)^T are masked lower-triangular (the same numbers the recurrence
  produces, in another order), across chunks the running S, z carry on, so memory is
  O(t C + (t / C) f e) and the result is the recurrence's exactly.

Streaming (:class:`KernelState`): the running S and z are the whole state. A causal layer continues a
stream from them with a constant-size state (f x e + f per head): it remembers no token, so its
``length`` is 0 and its bound is 0 tokens, however long the stream.

Rotary positions (``position=rope``), RoFormer's form for kernelised attention (Su et al. 2021,
arXiv:2104.09864, Section 3.4.3, eq. 19): the feature-mapped queries and keys are rotated at their
absolute positions in the numerator only,

    out_i = sum_j (R_i phi(q_i))^T (R_j phi(k_j)) v_j / sum_j phi(q_i)^T phi(k_j),

so the numerator depends on i - j (R_i^T R_j = R_{j-i}) and the denominator stays positive. S sums the
rotated keys' features, z the plain ones; a stream carries both, each token rotated at its position.

Shape legend as in ``base.py``; here ``f`` = feature dimension, ``e`` = value head dim, ``n`` = chunks.
Padding: a padded key gets phi(k) = 0 (and v = 0), so it adds nothing to S or z.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.attention.base import NOT_PER_ROW, Attention, AttnOutput, KeysPerQuery, StateContract, dense_keys
from zoo.attention.documents import packed_segments

CHUNK = 64  # causal chunk length C: the intra-chunk products are C x C, the carried sums one per chunk


@dataclass
class KernelState:
    """The running sums of a causal kernelised attention, carried between calls (detached).

    kv [b, h, f, e] = sum phi(k_j) v_j^T and z [b, h, f] = sum phi(k_j) over every key seen so far;
    ``features``: what the feature map was built from when the stream started (Performer's random
    projection [f, k]), pinned so that a redraw between calls never changes a running stream's map;
    ``seen``: tokens streamed so far."""

    kv: Tensor | None = None
    z: Tensor | None = None
    features: Tensor | None = field(default=None, metadata=NOT_PER_ROW)  # [f, k], the same for every row
    seen: int = 0

    @property
    def length(self) -> int:
        return 0  # sums, not tokens: nothing grows with the stream


def mask_keys(phi_k: Tensor, v: Tensor, pad_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Zero the features and values of padded keys: phi_k [b, h, s, f], v [b, h, s, e], pad_mask [b, s]."""
    if pad_mask is None:
        return phi_k, v
    keep = pad_mask[:, None, :, None].to(phi_k.dtype)
    return phi_k * keep, v * keep


Rotated = tuple[Tensor, Tensor]  # the numerator's features (R_i phi(q_i), R_j phi(k_j)), shaped as phi_q, phi_k


def kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float, rotated: Rotated | None = None) -> Tensor:
    """Bidirectional: every query sees every key. phi_q [b, h, t, f], phi_k [b, h, s, f] (padding zeroed),
    v [b, h, s, e] -> [b, h, t, e]; ``rotated``: the numerator's features when rope rotates them."""
    num_q, num_k = rotated or (phi_q, phi_k)
    kv = torch.einsum("bhsf,bhse->bhfe", num_k, v)
    z = phi_k.sum(2)
    num = torch.einsum("bhtf,bhfe->bhte", num_q, kv)
    den = torch.einsum("bhtf,bhf->bht", phi_q, z)
    return num / denominator(den, eps)[..., None]


def denominator(den: Tensor, eps: float) -> Tensor:
    """phi(q)^T z + eps; with eps = 0 (Performer's form) a row with no real key (den = 0, num = 0)
    divides by the smallest normal number instead, so it outputs 0, not NaN."""
    return den + eps if eps else den.clamp_min(torch.finfo(den.dtype).tiny)


def causal_kernel_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    eps: float,
    state: KernelState | None = None,
    rotated: Rotated | None = None,
    chunk_size: int = CHUNK,
    segments: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal: query i sees keys j <= i (and everything summed into ``state``). phi_q, phi_k [b, h, t, f],
    v [b, h, t, e] -> (out [b, h, t, e], kv [b, h, f, e], z [b, h, f]): the output and the sums after
    the last position, for the next call; ``rotated``: the numerator's features when rope rotates them;
    ``chunk_size``: C; ``segments`` long [b, t] (packed documents, ``documents.segment_ids``): query i sees
    keys j <= i of its own segment only (:func:`segment_sums`)."""
    b, h, t, f = phi_q.shape
    e = v.shape[-1]
    chunk = min(chunk_size, t)  # one token at a time (decoding) costs one product, not a C x C block
    length = -(-t // chunk) * chunk
    pad = (0, 0, 0, length - t)  # zero features past the end: they add nothing
    qc, kc, vc = (rearrange(F.pad(x, pad), "b h (n c) f -> b h n c f", c=chunk) for x in (phi_q, phi_k, v))
    nqc, nkc = (rearrange(F.pad(x, pad), "b h (n c) f -> b h n c f", c=chunk) for x in rotated) if rotated else (qc, kc)
    kv0 = phi_q.new_zeros(b, h, f, e) if state is None or state.kv is None else state.kv
    z0 = phi_q.new_zeros(b, h, f) if state is None or state.z is None else state.z
    # inside a chunk: the C x C similarities, lower-triangular (a query sees itself and earlier keys)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=qc.device).tril()
    if segments is not None:
        seg = rearrange(torch.cat([segments, segments[:, -1:].expand(b, length - t)], 1), "b (n c) -> b n c", c=chunk)
        lower = lower & (seg[:, None, :, :, None] == seg[:, None, :, None, :])  # [b, 1, n, c, c]
        (kv_before, z_before), (kv_last, z_last), read = segment_sums(nkc, kc, vc, kv0, z0, seg)
        qc_read, nqc_read = qc * read, nqc * read
    else:
        # per-chunk sums and their exclusive prefix: what every chunk inherits from the chunks before it
        chunk_kv = torch.einsum("bhncf,bhnce->bhnfe", nkc, vc)
        chunk_z = kc.sum(3)
        kv_before = kv0[:, :, None] + torch.cumsum(chunk_kv, dim=2) - chunk_kv  # [b, h, n, f, e]
        z_before = z0[:, :, None] + torch.cumsum(chunk_z, dim=2) - chunk_z  # [b, h, n, f]
        kv_last, z_last, qc_read, nqc_read = kv0 + chunk_kv.sum(2), z0 + chunk_z.sum(2), qc, nqc
    sim = torch.einsum("bhncf,bhndf->bhncd", qc, kc) * lower
    num_sim = torch.einsum("bhncf,bhndf->bhncd", nqc, nkc) * lower if rotated else sim
    num = torch.einsum("bhncd,bhnde->bhnce", num_sim, vc) + torch.einsum("bhncf,bhnfe->bhnce", nqc_read, kv_before)
    den = sim.sum(-1) + torch.einsum("bhncf,bhnf->bhnc", qc_read, z_before)
    out = rearrange(num / denominator(den, eps)[..., None], "b h n c e -> b h (n c) e")[:, :, :t]
    return out, kv_last, z_last


def segment_sums(nkc: Tensor, kc: Tensor, vc: Tensor, kv0: Tensor, z0: Tensor, seg: Tensor):
    """The running sums over packed segments, emptied where a segment starts (``seg`` [b, n, c] per chunk): a key
    enters its chunk's sums only if no segment starts after it in the chunk, the sums pass a chunk only if none
    starts inside it, and a query reads the sums from before its chunk only if no segment started in between.
    -> ((S, z) before each chunk [b, h, n, f, e] / [b, h, n, f], (S, z) after the last, the read mask
    [b, 1, n, c, 1] for the queries' state terms). Only the n = t / C chunk sums are stepped in order."""
    entering = torch.cat([seg[:, :1, :1], seg[:, :-1, -1:]], dim=1)  # [b, n, 1]: the segment entering each chunk
    write = (seg == seg[..., -1:])[:, None, :, :, None].to(kc.dtype)
    chunk_kv = torch.einsum("bhncf,bhnce->bhnfe", nkc * write, vc)
    chunk_z = (kc * write).sum(3)
    passes = (seg[..., -1] == entering[..., 0])[:, None].to(kc.dtype)  # [b, 1, n]
    kv_run, z_run, kv_before, z_before = kv0, z0, [], []
    for m in range(seg.shape[1]):
        kv_before.append(kv_run)
        z_before.append(z_run)
        kv_run = passes[..., m, None, None] * kv_run + chunk_kv[:, :, m]
        z_run = passes[..., m, None] * z_run + chunk_z[:, :, m]
    read = (seg == entering)[:, None, :, :, None].to(kc.dtype)
    return (torch.stack(kv_before, 2), torch.stack(z_before, 2)), (kv_run, z_run), read


def kernel_keys(t: int, causal: bool) -> KeysPerQuery:
    """Every key reaches every query (through S and z): the dense receptive field, at linear cost."""
    keys = dense_keys(t, causal)
    return KeysPerQuery(keys.keys, f"{keys.rule}, through the summed features (no score per key)")


def kernel_flops(t: int, f: int, e: int, heads: int, causal: bool) -> dict[str, float]:
    """Matmul FLOPs of the kernelised product over t tokens (per call, batch 1): S and z (2 t f e + 2 t f),
    the read-out (2 t f e + 2 t f), and, when causal, the intra-chunk C x C products (2 x 2 t C f / 2)."""
    sums = 2.0 * t * f * (e + 1)
    readout = 2.0 * t * f * (e + 1)
    intra = 2.0 * t * CHUNK * (f + e) if causal else 0.0
    return {"feature sums": heads * sums, "read-out": heads * (readout + intra)}


class KernelizedAttention(Attention):
    """Base of ``linear`` and ``performer``: q/k/v/output projections around the kernelised product. A
    subclass gives its feature map (``feature_maps``) and an ``eps`` option (added to the denominator);
    this class sums (bidirectional) or prefix-sums (causal) and carries the constant-size stream state."""

    packs_documents = True  # causal: the running sums restart at each document (segment_sums); bidirectional refuses

    takes_left_padding = True  # padding never enters the running sums (tests/contracts/test_generate.py)
    projection_features = ("qk_norm",)
    no_projection_reason = (
        "it computes no scores (a feature map product, summed), and its running sums are kept per query head"
    )

    position_kinds = ("rotary",)  # RoFormer Section 3.4.3: the feature-mapped q and k rotated in the numerator
    no_position_reason = (
        "it forms no score per query-key pair: every query reads the same sums S = sum_j phi(k_j) v_j^T and "
        "z = sum_j phi(k_j), while a bias b(i - j) weights each key differently for each query, so exp(b(i - j)) "
        "would have to factor as f(i) g(j) to enter the sums: T5's buckets and a symmetric |i - j| never do (causal "
        "ALiBi's exp(-m (i - j)) does, as a per-head decay of the sums, which is not offered here)"
    )

    supports_memory = True  # causal: the running sums, constant size

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=0)  # sums only: no token kept, exact at any length

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)

    def feature_maps(
        self, q: Tensor, k: Tensor, pad_mask: Tensor | None, state: KernelState | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(phi(q), phi(k) [b, h, t, f], what a stream must pin to keep this map, or None)."""
        raise NotImplementedError

    def position_refusal(self, position) -> str | None:
        features = self.feature_dim()
        if position.rotary and features < getattr(position, "rotated", 0):
            return (
                f"rope turns {position.rotated} dimensions but the feature map gives {features} per head: the "
                "rotation acts on the feature-mapped queries and keys (RoFormer Section 3.4.3), so it needs as many"
            )
        return super().position_refusal(position)

    def feature_dim(self) -> int:
        """f, the features per head the map gives (what rope rotates)."""
        return self.head_dim

    def rotated_features(self, phi_q: Tensor, phi_k: Tensor, positions: Tensor) -> Rotated | None:
        """(R_i phi(q_i), R_j phi(k_j)) at absolute ``positions`` [t] when the layer's position part
        rotates (RoFormer's eq. 19: the numerator's features), else None."""
        if self.position is None or not self.position.rotary:
            return None
        return self.rotate(phi_q, positions), self.rotate(phi_k, positions)

    def init_state(self, batch_size: int) -> KernelState:
        super().init_state(batch_size)  # a bidirectional layer refuses, saying why
        return KernelState()

    def state_bound(self) -> int:
        return 0

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return kernel_keys(t, self.causal)

    # -- context parallelism (zoo/parallel): the earlier chunks' running sums -----------------------------
    def context_refusal(self) -> str | None:
        if not self.causal:
            return f"attention {self.registry_name!r} is bidirectional here: every query reads every chunk's sums"
        return None

    def attend_chunk(self, x: Tensor, chunk, *, pad_mask: Tensor | None = None, state=None, **kwargs) -> AttnOutput:
        """Of the earlier chunks a causal kernelised layer reads only their running sums S = sum phi(k) v^T
        and z = sum phi(k) ([f, e] + [f] per head, whatever the length): every rank sends its chunk's sums to
        the later ranks (an exclusive prefix sum over the ranks, as flash-linear-attention splits linear
        attention) and continues from them as a stream continues from its state."""
        self.check_inputs(x, None, pad_mask, None)
        self.refuse_chunk_state(state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        phi_q, phi_k, _ = self.feature_maps(q, k, pad_mask, None)
        phi_k, v = mask_keys(phi_k, v, pad_mask)
        rotated = self.rotated_features(phi_q, phi_k, chunk.positions(x.device))
        f, e = phi_k.shape[-1], v.shape[-1]
        num_k = rotated[1] if rotated else phi_k
        sums = torch.cat([torch.einsum("bhtf,bhte->bhfe", num_k, v).flatten(2), phi_k.sum(2)], dim=-1)
        before = chunk.sum_before(sums)  # [b, h, f e + f]
        carried = KernelState(before[..., : f * e].unflatten(-1, (f, e)), before[..., f * e :])
        out, _, _ = causal_kernel_attention(phi_q, phi_k, v, self.options.eps, carried, rotated)
        return AttnOutput(self.to_out(self.merge_heads(out)))

    def packing_refusal(self) -> str | None:
        if not self.causal:
            return (
                f"attention {self.registry_name!r} cannot keep packed documents apart: bidirectional, every query "
                "reads one sum over the whole row"
            )
        return super().packing_refusal()

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state=None,
        documents: Tensor | None = None,
    ) -> AttnOutput:
        """``documents`` [b, t] (packed rows, causal): the running sums restart at every document."""
        self.check_inputs(x, context, pad_mask, state)
        segments = packed_segments(self, documents, x, state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        phi_q, phi_k, pinned = self.feature_maps(q, k, pad_mask, state)
        phi_k, v = mask_keys(phi_k, v, pad_mask)
        seen = state.seen if state is not None else 0
        rotated = self.rotated_features(phi_q, phi_k, torch.arange(seen, seen + x.shape[1], device=x.device))
        new_state = None
        if not self.causal:
            out = kernel_attention(phi_q, phi_k, v, self.options.eps, rotated)
        else:
            if state is not None and state.kv is not None and state.kv.shape[0] != x.shape[0]:
                raise ValueError(
                    f"{self.registry_name}: the state holds batch size {state.kv.shape[0]}, the input has {x.shape[0]}"
                )
            out, kv, z = causal_kernel_attention(phi_q, phi_k, v, self.options.eps, state, rotated, segments=segments)
            if state is not None:
                new_state = KernelState(kv.detach(), z.detach(), pinned, state.seen + x.shape[1])
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)
