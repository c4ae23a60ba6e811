"""One training loop for models we wrote and models we did not: the ground a comparison between them
stands on (``zoo/studies/llama_gap.py``; the Llama runs of ``results/streaming/rope``).

Our trainer cannot train Hugging Face's ``LlamaForCausalLM`` or x-transformers' decoder, and our trainer
against another loop moves the same model's bits per character by 0.02-0.06 (data order, Adam's beta2;
``results/streaming/rope``). So every model of a comparison is trained here, in one loop: windows of
``length + 1`` tokens drawn at random positions of the training split by a generator seeded with the run's
seed (the same batches for every model of a seed), Adam at ``lr`` with ``warmup`` linear warm-up steps then
a cosine decay to zero, gradients clipped to norm 1; then scored on non-overlapping test segments.

The models differ only in how they are called (:func:`next_token_loss`): ours take tokens and targets,
HF's take labels equal to the inputs (shifted inside), x-transformers' return logits. :class:`TorchSeq2Seq`
is ``torch.nn.Transformer`` wrapped to be called as our encoder-decoders are (``ut_length``'s reference).

:func:`stepped` is the other loop every study shares: the app's own ``train_step`` one batch at a time, for
the comparisons the app's run cannot express: ours beside a reference model trained on the very same batches
(reformer-pytorch, ``torch.nn.Transformer``, the LRA code's ``ModelForSC``, each wrapped to be called as ours
are) and step-for-step parity with another program's log (``xl_parity``, ``lra_parity``).

The adaptive-span authors' ``TransformerSeq`` (``zoo/studies/adaptive_span_range.py``) is trained by their own
loop, driven here once (:func:`train_authors_adaptive_span`): the comparison there is each code as its
authors train it, on the same files, sizes and optimiser.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.bench import import_checkout
from zoo.config import IGNORE_INDEX
from zoo.models.base import ModelOutput
from zoo.position.base import sinusoid_table
from zoo.train.steps import schedule, train_step

OURS, LLAMA, X_TRANSFORMERS = "ours", "llama", "x_transformers"


class TorchSeq2Seq(nn.Module):
    """``torch.nn.Transformer`` (PyTorch's encoder-decoder, code we did not write) called as our encoder-decoders
    are, so the step loop trains both: three-way tied embeddings (scaled by sqrt(d)) and the sinusoid added
    outside it; in training each sequence (source and target drawn apart, as ours do) starts at a random
    position 0..offset_max (Universal Transformers' randomised offsets, arXiv:1807.03819)."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, d_ff: int, layers: int, offset_max: int):
        super().__init__()
        self.d_model, self.offset_max = d_model, offset_max
        self.embed = nn.Parameter(torch.randn(vocab, d_model) * d_model**-0.5)
        self.transformer = nn.Transformer(d_model, n_heads, layers, layers, d_ff, dropout=0.0, batch_first=True)

    def vectors(self, tokens: Tensor) -> Tensor:
        b, t = tokens.shape
        positions = torch.arange(t)[None]
        if self.training and self.offset_max:
            positions = positions + torch.randint(0, self.offset_max + 1, (b, 1))
        signal = sinusoid_table(positions.flatten(), self.d_model).view(-1, t, self.d_model)
        return nn.functional.embedding(tokens, self.embed) * math.sqrt(self.d_model) + signal

    def forward(self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, *, src_pad_mask: Tensor,
                tgt_pad_mask: Tensor) -> ModelOutput:
        """Logits [b, t, vocab]; with ``targets`` the cross-entropy over those not -100 (our models' loss)."""
        logits = self.logits(src, tgt, src_pad_mask, tgt_pad_mask)
        if targets is None:
            return ModelOutput(logits)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return ModelOutput(logits, loss)

    def logits(self, src: Tensor, tgt: Tensor, src_pad_mask: Tensor, tgt_pad_mask: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.bool)
        h = self.transformer(self.vectors(src), self.vectors(tgt), tgt_mask=causal, src_key_padding_mask=~src_pad_mask,
                             tgt_key_padding_mask=~tgt_pad_mask, memory_key_padding_mask=~src_pad_mask,
                             tgt_is_causal=True)
        return h @ self.embed.t()

    @torch.no_grad()
    def generate(self, src: Tensor, max_len: int, src_pad_mask: Tensor, bos: int, eos: int, pad: int) -> Tensor:
        """Greedy decoding, recomputing the prefix (nn.Transformer keeps no cache)."""
        prefix = torch.full((src.shape[0], 1), bos, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            logits = self.logits(src, prefix, src_pad_mask, torch.ones_like(prefix, dtype=torch.bool))
            token = logits[:, -1].argmax(-1).masked_fill(done, pad)
            prefix = torch.cat([prefix, token[:, None]], 1)
            done |= token == eos
            if bool(done.all()):
                break
        return prefix[:, 1:]


def build_llama(vocab: int, length: int, *, d_model: int = 128, n_layers: int = 4, n_heads: int = 4,
                intermediate: int = 512, tie: bool = False, attention_dropout: float = 0.0,
                eager: bool = False) -> nn.Module:
    """``transformers.LlamaForCausalLM`` (rotary, pre-RMSNorm, SwiGLU of width ``intermediate``, no biases,
    N(0, 0.02) initialisation); ``eager`` attention returns its weights (``output_attentions``)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:  # an optional reference: say how to get it
        raise RuntimeError(f"the Llama reference needs Hugging Face transformers (make peers): {error}") from error
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=d_model, intermediate_size=intermediate, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=length,
        attention_dropout=attention_dropout, tie_word_embeddings=tie,
        attn_implementation="eager" if eager else "sdpa",
    )
    return LlamaForCausalLM(config)


def build_xtransformers(vocab: int, length: int, *, d_model: int = 128, n_layers: int = 4,
                        n_heads: int = 4) -> nn.Module:
    """x-transformers' decoder in our ``vanilla_lm`` pre-norm shape: LayerNorm before each sub-layer, GELU
    feed-forward of 4 d_model with biases, rotary over the whole head, tied embeddings, attention dropout 0.1."""
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError as error:
        raise RuntimeError(f"the x-transformers reference needs x-transformers (make peers): {error}") from error
    layers = Decoder(dim=d_model, depth=n_layers, heads=n_heads, attn_dim_head=d_model // n_heads,
                     rotary_pos_emb=True, ff_mult=4, attn_dropout=0.1)
    return TransformerWrapper(num_tokens=vocab, max_seq_len=length, use_abs_pos_emb=False, tie_embedding=True,
                              attn_layers=layers)


def next_token_loss(model: nn.Module, batch: Tensor, kind: str) -> Tensor:
    """Mean cross-entropy of each next token inside ``batch`` [b, t] (t - 1 predictions, for every kind)."""
    if kind == OURS:
        return model(batch[:, :-1], batch[:, 1:]).loss
    if kind == X_TRANSFORMERS:
        logits = model(batch[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    return model(batch, labels=batch).loss


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine decay to zero (our trainer's shape)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@dataclass
class LoopSettings:
    steps: int = 2000
    batch_size: int = 16
    length: int = 256  # tokens per window: length - 1 predictions each
    lr: float = 1e-3
    warmup: int = 100
    seed: int = 0


def random_windows(stream: Tensor, settings: LoopSettings, generator: torch.Generator) -> Tensor:
    """[batch_size, length] windows at random start positions of ``stream`` (1-D token ids)."""
    starts = torch.randint(0, len(stream) - settings.length, (settings.batch_size,), generator=generator)
    return torch.stack([stream[s : s + settings.length] for s in starts.tolist()])


def train_in_loop(model: nn.Module, kind: str, train: Tensor, settings: LoopSettings) -> float:
    """Train ``model`` in place on the 1-D ``train`` stream; returns the seconds it took. The batches depend
    on ``settings.seed`` alone, so every model of a seed sees the same ones."""
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    generator = torch.Generator().manual_seed(settings.seed)
    begin = time.perf_counter()
    model.train()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings.steps, settings.lr, settings.warmup)
        loss = next_token_loss(model, random_windows(train, settings, generator), kind)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return time.perf_counter() - begin


def stepped(model: nn.Module, batch_at: Callable[[int], dict[str, Tensor]], optimizer: torch.optim.Optimizer, *,
            steps: int, start: int = 0, scheduler: Any = None, clip: float = 1.0,
            state: Any = None) -> Iterator[tuple[int, Any, float]]:
    """Train ``model`` by the app's ``train_step`` on ``batch_at(step)`` for steps ``start``..``steps - 1``,
    yielding ``(steps done, output, loss)`` after each; ``state`` (a model carrying memory) is carried from
    step to step. The caller decides what to log, when to stop (a generator left early trains no more) and,
    by zipping two of them, runs two models in lockstep on the same batches."""
    for step in range(start, steps):
        out, loss = train_step(model, batch_at(step), optimizer, scheduler=scheduler, clip=clip, state=state)
        if state is not None:
            state = out.state
        yield step + 1, out, float(loss)


def segments_of(stream: Tensor, length: int, limit: int = 0) -> Tensor:
    """[n, length] non-overlapping segments from the start of ``stream`` (the first ``limit`` when > 0)."""
    n = len(stream) // length if limit <= 0 else min(limit, len(stream) // length)
    return stream[: n * length].view(n, length)


@torch.no_grad()
def segment_bpc(model: nn.Module, kind: str, segments: Tensor, batch_size: int = 32) -> float:
    """Bits per token over ``segments`` [n, t], each scored on its own (t - 1 predictions each)."""
    model.eval()
    total, count = 0.0, 0
    for chunk in segments.split(batch_size):
        predictions = chunk.shape[0] * (chunk.shape[1] - 1)
        total += float(next_token_loss(model, chunk, kind)) * predictions
        count += predictions
    return total / count / math.log(2)


@torch.no_grad()
def llama_sink_rows(model: nn.Module, segments: Tensor, first: int, sinks: int) -> list[dict]:
    """The mean attention weight HF Llama's queries at positions ``first``.. give to the first ``sinks`` keys,
    per layer and head, from its own ``output_attentions`` (build it with ``eager=True``), with the share a
    uniform distribution would give (StreamingLLM's attention sinks, arXiv:2309.17453)."""
    attentions = model(segments, output_attentions=True).attentions  # per layer [n, h, t, t]
    t = segments.shape[1]
    uniform = float((sinks / torch.arange(first + 1, t + 1, dtype=torch.float64)).mean())
    rows = []
    for layer, weights in enumerate(attentions):
        for head, mass in enumerate(weights[:, :, first:, :sinks].sum(-1).mean((0, 2)).tolist()):
            rows.append(dict(layer=layer, head=head, mass=mass, uniform=uniform, ratio=mass / uniform))
    return rows


# -- the adaptive-span authors' code, trained by their own loop ------------------------------------------------
class _DataParallelLike(nn.Module):
    """Their trainer reads ``model.module`` (they wrap in DataParallel, which needs CUDA)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def train_authors_adaptive_span(path: str, data_dir: str, o: Any, *, adaptive: bool,
                                log: Callable[[int, float, list[list[float]]], None]) -> dict[str, Any]:
    """The authors' ``TransformerSeq`` (facebookresearch/adaptive-span, a checkout at ``path``, unpatched) trained
    by their ``trainer.train_iteration`` on the splits in ``data_dir`` read by their ``data.Corpus``, then scored
    by their ``full_eval``. ``o`` holds the sizes (``d_model``, ``heads``, ``layers``, ``max_span``, ``segment``,
    ``batch``), the span's (``ramp``, ``l1``, ``span_init`` as a fraction of S) and the schedule (``lr``,
    ``warmup``, ``steps``, ``clip``, ``log_every``, ``seed``): Adam with our cosine schedule, so the optimiser
    is not a difference. Their ``main.py`` is not run: it asserts CUDA and caches a pickle today's
    ``torch.load`` refuses. ``log(step, train bpc, spans per layer)`` every ``log_every`` steps; returns the
    validation bpc, the spans (tokens: ``AdaptiveMask.current_val`` x S) and the CPU seconds."""
    if not path or not (Path(path) / "adaptive_span.py").is_file():
        raise RuntimeError(f"{path!r} is not a checkout of facebookresearch/adaptive-span (no adaptive_span.py)")
    ref_data, ref_models, ref_trainer = import_checkout(path, "data", "models", "trainer")  # their top-level names
    corpus = ref_data.Corpus(data_dir, False)  # their reader (get_train_val_test_data caches a pickle)
    train, val, _ = ref_data._get_train_val_test_data(corpus, o.batch)
    torch.manual_seed(o.seed)
    model = _DataParallelLike(ref_models.TransformerSeq(
        vocab_size=corpus.vocab_size, hidden_size=o.d_model, nb_heads=o.heads, nb_layers=o.layers,
        attn_span=o.max_span, emb_dropout=0.0, inner_hidden_size=4 * o.d_model, dropout=0.0, block_size=o.segment,
        adapt_io_params={"adapt_io_enabled": False},
        adapt_span_params={"adapt_span_enabled": adaptive, "adapt_span_loss": o.l1, "adapt_span_ramp": o.ramp,
                           "adapt_span_init": o.span_init, "adapt_span_cache": False},
        pers_mem_params={"pers_mem_size": 0}))
    optimizer = torch.optim.Adam(model.parameters(), lr=o.lr, betas=(0.9, 0.98), eps=1e-9)
    scheduler = schedule(optimizer, "cosine", warmup=o.warmup, total=o.steps)
    optimizer.grad_clip = o.clip  # their trainer clips the global norm when optimizer.grad_clip > 0

    def spans() -> list[list[float]]:
        if not adaptive:
            return [[float(o.max_span)] * o.heads for _ in range(o.layers)]
        return [[float(z) * o.max_span for z in layer.attn.attn.adaptive_span._mask.current_val.detach().flatten()]
                for layer in model.module.layers]

    cache = [torch.zeros(o.batch, o.max_span, o.d_model) for _ in range(o.layers)]
    position, step, begin = 0, 0, time.process_time()
    while step < o.steps:
        n = min(o.log_every, o.steps - step)
        loss, position, cache = ref_trainer.train_iteration(model, optimizer, scheduler, train, n, o.segment, False,
                                                            position, cache, 1)
        step += n
        log(step, loss / math.log(2), spans())
    with torch.no_grad():
        bpc = ref_trainer.full_eval(model, optimizer, scheduler, val, o.segment, o.d_model) / math.log(2)
    return dict(bpc=bpc, spans=spans(), cpu=time.process_time() - begin)
