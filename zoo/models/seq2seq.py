"""The encoder-decoder (``kind="seq2seq"``): the original Transformer (Vaswani et al. 2017), with
cross-attention, optional three-way tying (source embedding = target embedding = output projection)
when the vocabularies are shared, and greedy / beam-search decoding through the KV cache.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from zoo.blocks import merge_into
from zoo.config import ModelConfig, check_type
from zoo.models.base import HEAD, ModelOutput, Seq2SeqState, TokenEmbedding, ZooModel, reorder_state
from zoo.models.inputs import (
    check_count,
    check_pad_mask,
    check_same_batch,
    check_tokens,
)
from zoo.models.losses import token_loss
from zoo.stacks.build import build_stack, create_position


@HEAD.register("seq2seq")
class EncoderDecoder(ZooModel):
    attention_directions = ("bidirectional", "causal")  # the encoder, then the decoder

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        d = config.d_model
        self.tgt_embed = TokenEmbedding(config.vocab_size, d, name="tgt", init_std=config.token_init_std)
        shared_vocab = config.src_vocab_size in (0, config.vocab_size)
        if shared_vocab and config.tie_embeddings:
            self.src_embed = self.tgt_embed  # three-way tying: source = target = output projection
        else:
            self.src_embed = TokenEmbedding(
                config.src_vocab_size or config.vocab_size, d, name="src", init_std=config.token_init_std
            )
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.encoder = build_stack(
            config,
            causal=False,
            cross=False,
            n_layers=config.n_encoder_layers or config.n_layers,
            position=self.position,
        )
        self.encoder_norm = self.final_norm()
        # a part acting inside attention gets one instance per stack (T5: the decoder has its own table);
        # a signal added at the input is the one self.position adds to both sides
        self.decoder_position = create_position(config) if self.position.kinds() else None
        self.decoder = build_stack(
            config, causal=True, cross=True, n_layers=config.n_layers, position=self.decoder_position or self.position
        )
        self.decoder_norm = self.final_norm()
        self.head = nn.Linear(d, config.vocab_size, bias=False) if config.head == "linear" else None
        if config.tie_embeddings and self.head is not None:
            self.head.weight = self.tgt_embed.weight

    def decoding_stack(self) -> nn.Module:
        return self.decoder

    def encode(
        self, src: Tensor | None = None, src_pad_mask: Tensor | None = None, *, src_embeds: Tensor | None = None
    ) -> Tensor:
        """Encoder output [b, s, d_model] for source ids ``src`` [b, s] or vectors ``src_embeds``."""
        return self._encode(src, src_pad_mask, src_embeds)[0]

    def _encode(
        self, src: Tensor | None, src_pad_mask: Tensor | None, src_embeds: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """Encoder output plus its aux losses and stats (an ACT encoder's ponder cost)."""
        x = self.input_vectors(self.src_embed, src, src_embeds, ("src", "src_embeds"))
        check_pad_mask(src_pad_mask, x[..., 0], "src_pad_mask")
        out = self.encoder(self.drop(self.position(x)), pad_mask=src_pad_mask)
        return self.encoder_norm(out.x), out.aux, out.stats

    def init_state(
        self, src: Tensor | None = None, src_pad_mask: Tensor | None = None, *, src_embeds: Tensor | None = None
    ) -> Seq2SeqState:
        """Encode the source (ids or vectors) once and start empty decoder caches (none when the
        decoder cannot continue a sequence: the state then only carries the encoded source)."""
        memory = self.encode(src, src_pad_mask, src_embeds=src_embeds)
        b = memory.shape[0]
        layers = self.decoder.init_state(b) if self.attentions_keep_state() else None
        return Seq2SeqState(memory, src_pad_mask, layers, 0, b, self.signature)

    def forward(
        self,
        src: Tensor | None = None,
        tgt: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        src_embeds: Tensor | None = None,
        tgt_embeds: Tensor | None = None,
        src_pad_mask: Tensor | None = None,
        tgt_pad_mask: Tensor | None = None,
        state: Seq2SeqState | None = None,
    ) -> ModelOutput:
        """Source as ids ``src`` or vectors ``src_embeds`` (not read when ``state`` holds the encoded
        source), target as ids ``tgt`` or vectors ``tgt_embeds``; each side chooses on its own."""
        self.refuse_without_head(targets)
        if state is None and src is not None:  # structure first: an empty source is named as such
            check_tokens(src, "src", None)
        y = self.input_vectors(self.tgt_embed, tgt, tgt_embeds, ("tgt", "tgt_embeds"))
        b, t = y.shape[:2]
        if state is None:
            check_same_batch(src=src if src is not None else src_embeds, tgt=y)
        self.check_state(state, b, Seq2SeqState, stack=self.decoder)
        encoder_aux: dict[str, Tensor] = {}
        encoder_stats: dict[str, Tensor] = {}
        if state is None:
            memory, encoder_aux, encoder_stats = self._encode(src, src_pad_mask, src_embeds)
            memory_pad_mask, layers, offset = src_pad_mask, None, 0
        else:
            memory, memory_pad_mask, layers, offset = state.memory, state.memory_pad_mask, state.layers, state.offset
        check_pad_mask(tgt_pad_mask, y[..., 0], "tgt_pad_mask")
        out = self.decoder(
            self.drop(self.position(y, offset)),
            pad_mask=tgt_pad_mask,
            state=layers,
            context=memory,
            context_pad_mask=memory_pad_mask,
        )
        hidden = self.decoder_norm(out.x)
        logits = self.output_head(hidden)
        loss, scored = None, None
        if targets is not None:
            loss, scored = token_loss(logits, targets, tgt_pad_mask, self.config.label_smoothing)
        new_state = None
        if state is not None:
            new_state = Seq2SeqState(memory, memory_pad_mask, out.state, offset + t, b, self.signature)
        aux = merge_into(dict(encoder_aux), out.aux)  # same-named losses (ponder) are summed
        stats = {**{f"encoder/{key}": value for key, value in encoder_stats.items()}, **out.stats}
        if scored is not None:
            stats["scored"] = scored
        return ModelOutput(logits, loss, aux, new_state, stats, hidden)

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        *,
        max_len: int,
        src_pad_mask: Tensor | None = None,
        beam_size: int = 1,
        length_penalty: float = 0.6,
    ) -> Tensor:
        """Decode [b, max_len'] target ids (starting after BOS, ending at EOS, padded with pad_id).

        beam_size 1 is greedy decoding; otherwise beam search with the GNMT length penalty
        ((5 + len) / 6) ** alpha (Wu et al. 2016), as used for the paper's translation results."""
        self.require_head("generate() decodes from the logits")
        check_tokens(src, "src", None)
        check_count(max_len, "max_len", 1)
        check_count(beam_size, "beam_size", 1)
        check_type(length_penalty, float, "length_penalty")
        self.check_decode_length(max_len, "max_len")
        was_training = self.training
        self.eval()
        try:
            return self._beam_search(src, src_pad_mask, max_len, beam_size, length_penalty)
        finally:
            self.train(was_training)

    def _decode_step(self, prefix: Tensor, state: Seq2SeqState, incremental: bool) -> tuple[Tensor, Seq2SeqState]:
        """Log-probabilities of the next token for each row of ``prefix`` [n, l]."""
        if incremental:
            out = self(None, prefix[:, -1:], state=state)
            return torch.log_softmax(out.logits[:, -1].float(), -1), out.state
        fresh = dataclasses.replace(state, layers=None, offset=0)
        out = self(None, prefix, state=fresh)
        return torch.log_softmax(out.logits[:, -1].float(), -1), state

    def _beam_search(self, src: Tensor, src_pad_mask: Tensor | None, max_len: int, beam: int, alpha: float) -> Tensor:
        cfg = self.config
        b, device = src.shape[0], src.device
        state = self.init_state(src, src_pad_mask)
        index = torch.arange(b, device=device).repeat_interleave(beam)  # [b*beam]: rows of each beam
        state = reorder_state(state, index)
        incremental = self.attentions_keep_state()
        prefix = torch.full((b * beam, 1), cfg.bos_id, dtype=torch.long, device=device)
        scores = torch.zeros(b, beam, device=device)
        scores[:, 1:] = float("-inf")  # all beams start identical: keep one alive at first
        finished = torch.zeros(b * beam, dtype=torch.bool, device=device)
        for _ in range(max_len):
            logp, state = self._decode_step(prefix, state, incremental)  # [b*beam, V]
            vocab = logp.shape[-1]
            # a finished hypothesis can only be extended by padding, at no cost
            logp = torch.where(finished[:, None], torch.full_like(logp, float("-inf")), logp)
            logp[finished, cfg.pad_id] = 0.0
            total = (scores.view(-1, 1) + logp).view(b, beam * vocab)
            scores, flat = total.topk(beam, dim=-1)  # [b, beam]
            source_beam, token = flat // vocab, flat % vocab
            rows = (torch.arange(b, device=device)[:, None] * beam + source_beam).view(-1)
            prefix = torch.cat([prefix[rows], token.view(-1, 1)], dim=1)
            finished = finished[rows] | (token.view(-1) == cfg.eos_id)
            state = reorder_state(state, rows)
            if bool(finished.all()):
                break
        lengths = (prefix[:, 1:] != cfg.pad_id).sum(1).clamp_min(1).float().view(b, beam)
        normalised = scores / (((5.0 + lengths) / 6.0) ** alpha) if beam > 1 else scores
        best = normalised.argmax(-1)
        chosen = prefix.view(b, beam, -1)[torch.arange(b, device=device), best, 1:]
        return chosen
