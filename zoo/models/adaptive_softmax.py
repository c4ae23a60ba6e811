"""Adaptive input and adaptive softmax for large vocabularies, as the WikiText-103 rows use them.

Papers: Grave et al. 2017, "Efficient softmax approximation for GPUs" (arXiv:1609.04309): the
vocabulary, sorted by frequency, is cut into a head cluster (the frequent words plus one logit per
tail cluster) and tail clusters reached through their head logit, so most tokens never touch the
big tail matrices. Baevski & Auli 2019, "Adaptive Input Representations for Neural Language
Modeling" (arXiv:1809.10853): the input embedding uses the same clusters, narrower for rarer words
(width d_i = d_model // div_val**i) and projected up to d_model, with weights tied to the output.

Layout (the Transformer-XL WT103 configurations, Dai et al. 2019): ``cutoffs`` [20000, 40000,
200000] give clusters [0, 20000), [20000, 40000), [40000, 200000), [200000, V). With div_val = 1
every cluster is d_model wide and there are no projections (the 151M base model); with div_val > 1
every cluster, the head included, has a projection [d_model, d_i] (the 257M large model). Output
weights are the input embeddings when ``tie_embeddings`` is set; ``tie_projections`` shares the
tail clusters' projections between input and output and keeps the head cluster's separate
(the reference configs' ``proj_share_all_but_first``).

Why not ``torch.nn.AdaptiveLogSoftmaxWithLoss``: it always puts a projection in front of every tail
cluster (even at div_value 1) and keeps the head cluster's words and the cluster logits in one
Linear, so neither the input embedding nor the projections can be tied to it. It fits the untied
case only, where the tests use it as the reference (same weights -> same log-probabilities).

Shapes: ``tokens`` [b, t]; ``hidden`` [n, d] (flattened positions); log-probabilities [n, V].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import IGNORE_INDEX, require
from zoo.models.inputs import check_tokens


@dataclass
class AdaptiveOptions:
    """``ModelConfig.adaptive``: empty = the full softmax with one embedding table."""

    cutoffs: list[int] = field(default_factory=list)  # cluster boundaries, increasing, inside (0, vocab_size)
    div_val: int = 1  # cluster i is d_model // div_val**i wide
    tie_projections: bool = True  # tail clusters share input/output projections (the head's stays separate)

    def check(self, vocab_size: int, d_model: int) -> None:
        cutoffs = list(self.cutoffs)
        require(len(cutoffs) >= 1, f"model.adaptive.cutoffs must list at least one boundary, got {cutoffs}")
        require(all(isinstance(c, int) for c in cutoffs), f"model.adaptive.cutoffs must be ints, got {cutoffs}")
        require(
            all(a < b for a, b in zip(cutoffs, cutoffs[1:])), f"model.adaptive.cutoffs must increase, got {cutoffs}"
        )
        require(
            0 < cutoffs[0] and cutoffs[-1] < vocab_size,
            f"model.adaptive.cutoffs must lie inside (0, vocab_size={vocab_size}), got {cutoffs}",
        )
        require(
            isinstance(self.div_val, int) and self.div_val >= 1,
            f"model.adaptive.div_val must be an int >= 1, got {self.div_val!r}",
        )
        narrowest = d_model // self.div_val ** len(cutoffs)
        require(
            narrowest >= 1, f"model.adaptive.div_val={self.div_val} leaves the last cluster 0 wide at d_model={d_model}"
        )

    def bounds(self, vocab_size: int) -> list[tuple[int, int]]:
        edges = [0, *self.cutoffs, vocab_size]
        return list(zip(edges[:-1], edges[1:]))

    def widths(self, d_model: int) -> list[int]:
        return [d_model // self.div_val**i for i in range(len(self.cutoffs) + 1)]


def adaptive_options(config: dict, vocab_size: int, d_model: int) -> AdaptiveOptions:
    """Validate ``model.adaptive`` (unknown keys named) and return its options."""
    valid = {"cutoffs", "div_val", "tie_projections"}
    for key in config:
        require(key in valid, f"model.adaptive has no key {key!r}; valid: {', '.join(sorted(valid))}")
    options = AdaptiveOptions(**{k: (list(v) if k == "cutoffs" else v) for k, v in config.items()})
    options.check(vocab_size, d_model)
    return options


def needs_projection(options: AdaptiveOptions) -> bool:
    """The reference rule: projections everywhere when div_val > 1, nowhere when div_val = 1."""
    return options.div_val > 1


class AdaptiveInput(nn.Module):
    """Token ids [b, t] -> vectors [b, t, d_model] scaled by sqrt(d_model), one table per cluster."""

    def __init__(self, vocab_size: int, d_model: int, options: AdaptiveOptions):
        super().__init__()
        options.check(vocab_size, d_model)
        self.vocab_size, self.d_model, self.options = vocab_size, d_model, options
        self.bounds = options.bounds(vocab_size)
        widths = options.widths(d_model)
        # each cluster's output has unit variance per coordinate after the sqrt(d_model) scale
        self.embeddings = nn.ParameterList(
            nn.Parameter(torch.randn(hi - lo, w) * w**-0.5) for (lo, hi), w in zip(self.bounds, widths)
        )
        projections = (
            [nn.Parameter(torch.randn(d_model, w) * d_model**-0.5) for w in widths] if needs_projection(options) else []
        )
        self.projections = nn.ParameterList(projections)

    @property
    def weight(self) -> Tensor:
        """The head cluster's table: what callers read the embedding's dtype and device from."""
        return self.embeddings[0]

    def forward(self, tokens: Tensor) -> Tensor:
        check_tokens(tokens, "tokens", self.vocab_size)
        flat = tokens.reshape(-1).long()
        out = torch.zeros(flat.shape[0], self.d_model, dtype=self.embeddings[0].dtype, device=tokens.device)
        for i, (lo, hi) in enumerate(self.bounds):
            # an empty cluster still runs (on 0 rows) so every parameter is in the graph (DDP)
            rows = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            vectors = F.embedding(flat[rows] - lo, self.embeddings[i])  # [n_i, d_i]
            if len(self.projections):
                vectors = F.linear(vectors, self.projections[i])  # [n_i, d_model]
            out = out.index_copy(0, rows, vectors.to(out.dtype))
        return out.view(*tokens.shape, self.d_model) * math.sqrt(self.d_model)


class AdaptiveSoftmax(nn.Module):
    """Hidden states -> log-probabilities over the clustered vocabulary, or NLL of given targets.

    ``tied``: the :class:`AdaptiveInput` whose tables (and tail projections, with
    ``tie_projections``) this head shares; None = own weights."""

    flops_rule = "adaptive softmax: head cluster only (tail clusters add per their token share)"

    def __init__(self, vocab_size: int, d_model: int, options: AdaptiveOptions, tied: AdaptiveInput | None = None):
        super().__init__()
        options.check(vocab_size, d_model)
        self.vocab_size, self.d_model, self.options = vocab_size, d_model, options
        self.bounds = options.bounds(vocab_size)
        widths = options.widths(d_model)
        n_tail = len(self.bounds) - 1
        self.shortlist = self.bounds[0][1]
        self.cluster_weight = nn.Parameter(torch.zeros(n_tail, d_model))  # the head's logits of the tail clusters
        self.cluster_bias = nn.Parameter(torch.zeros(n_tail))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(hi - lo)) for lo, hi in self.bounds)
        if tied is not None:
            self.weights = tied.embeddings  # the same Parameter objects: one copy, counted once
        else:
            self.weights = nn.ParameterList(
                nn.Parameter(torch.randn(hi - lo, w) * w**-0.5) for (lo, hi), w in zip(self.bounds, widths)
            )
        projections = []
        if needs_projection(options):
            for i, w in enumerate(widths):
                share = tied is not None and options.tie_projections and i > 0
                projections.append(
                    tied.projections[i] if share else nn.Parameter(torch.randn(d_model, w) * d_model**-0.5)
                )
        self.projections = nn.ParameterList(projections)

    def forward_flops(self, t: int) -> float:
        """Matmul FLOPs over t tokens of the head cluster: the shortlist and one logit per tail cluster."""
        return 2.0 * t * self.d_model * (self.shortlist + len(self.bounds) - 1)

    def cluster_logits(self, hidden: Tensor, i: int) -> Tensor:
        """[n, d] -> [n, size of cluster i] (the head cluster without its tail logits)."""
        if len(self.projections):
            hidden = hidden @ self.projections[i]  # [n, d_i]
        return F.linear(hidden, self.weights[i].to(hidden.dtype), self.biases[i].to(hidden.dtype))

    def head_log_probs(self, hidden: Tensor) -> Tensor:
        """[n, d] -> [n, shortlist + n_tail]: the frequent words, then one entry per tail cluster."""
        tails = F.linear(hidden, self.cluster_weight.to(hidden.dtype), self.cluster_bias.to(hidden.dtype))
        return torch.log_softmax(torch.cat([self.cluster_logits(hidden, 0), tails], dim=-1).float(), dim=-1)

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Full log-probabilities [n, V] (scoring and generation; training uses :meth:`nll`)."""
        head = self.head_log_probs(hidden)
        parts = [head[:, : self.shortlist]]
        for i in range(1, len(self.bounds)):
            tail = torch.log_softmax(self.cluster_logits(hidden, i).float(), dim=-1)
            parts.append(head[:, self.shortlist + i - 1 : self.shortlist + i] + tail)
        return torch.cat(parts, dim=-1)

    def nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        """Negative log-likelihood [n] of ``targets`` [n] (0 where the target is -100). Each tail
        cluster's matrix is applied only to the rows whose target falls in it."""
        targets = targets.long()
        head = self.head_log_probs(hidden)  # [n, shortlist + n_tail]
        out = torch.zeros(targets.shape[0], dtype=head.dtype, device=hidden.device)
        in_head = (targets >= 0) & (targets < self.shortlist)
        rows = in_head.nonzero().squeeze(1)
        out = out.index_copy(0, rows, -head[rows, targets[rows]])
        for i, (lo, hi) in enumerate(self.bounds[1:], start=1):
            rows = ((targets >= lo) & (targets < hi)).nonzero().squeeze(1)  # may be empty: still in the graph
            tail = torch.log_softmax(self.cluster_logits(hidden[rows], i).float(), dim=-1)
            picked = tail.gather(1, (targets[rows] - lo)[:, None]).squeeze(1)
            out = out.index_copy(0, rows, -(head[rows, self.shortlist + i - 1] + picked))
        return out

    def forward(
        self, hidden: Tensor, targets: Tensor | None, *, pad_mask: Tensor | None = None, full: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """hidden [b, t, d] -> (log-probabilities [b, t, V], or [b, t, 0] when ``full`` is False;
        mean NLL over scored targets or None). Targets -100 or padded are not scored."""
        b, t, d = hidden.shape
        flat = hidden.reshape(b * t, d)
        logits = self.log_prob(flat).view(b, t, -1) if full else hidden.new_zeros(b, t, 0)
        loss = None
        if targets is not None:
            if targets.shape != (b, t):
                raise ValueError(f"targets must be shaped {(b, t)}; got {tuple(targets.shape)}")
            targets = targets.long()
            if pad_mask is not None:
                targets = targets.masked_fill(~pad_mask, IGNORE_INDEX)
            flat_targets = targets.reshape(-1)
            scored = flat_targets != IGNORE_INDEX
            bad = scored & ((flat_targets < 0) | (flat_targets >= self.vocab_size))
            if bool(bad.any()):
                raise ValueError(
                    f"targets must lie in [0, vocab_size={self.vocab_size}) or be -100; got {int(flat_targets[bad][0])}"
                )
            loss = self.nll(flat, flat_targets).sum() / scored.sum().clamp_min(1)
        return logits, loss


def adaptive_input_and_softmax(config) -> tuple[AdaptiveInput, AdaptiveSoftmax]:
    """The embedding and head of a causal LM whose ``config.adaptive`` is set (weights tied when
    ``config.tie_embeddings``)."""
    require(config.kind == "lm", f"model.adaptive is an LM head option; model kind is {config.kind!r}")
    require(
        config.head == "linear",
        "model.adaptive builds its own output (adaptive softmax); it cannot be combined with head='none'",
    )
    require(
        config.label_smoothing == 0.0, f"model.adaptive does not support label_smoothing (got {config.label_smoothing})"
    )
    options = adaptive_options(config.adaptive, config.vocab_size, config.d_model)
    embed = AdaptiveInput(config.vocab_size, config.d_model, options)
    return embed, AdaptiveSoftmax(
        config.vocab_size, config.d_model, options, tied=embed if config.tie_embeddings else None
    )
