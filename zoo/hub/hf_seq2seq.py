"""``ZooForSeq2SeqLM``: the zoo's encoder-decoder (``kind="seq2seq"``) for ``AutoModelForSeq2SeqLM`` and
HF's encoder-decoder ``generate``: ``get_encoder()`` encodes the source once (the zoo's ``encode``), each
decoder step continues the zoo's ``Seq2SeqState`` (encoded source + decoder caches) in a ZooCache. The
decoder starts at the zoo's ``bos_id`` and stops at its ``eos_id`` (ZooConfig sets HF's names to them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from zoo.hub.hf_cache import ZooCache
from zoo.hub.hf_models import ZooPreTrainedModel, hidden_tuple, pad_mask_of, zoo_cache
from zoo.models.base import Seq2SeqState


class ZooEncoder(nn.Module):
    """The encoder half, as HF's ``generate`` calls it: source ids -> ``last_hidden_state`` [b, s, d]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        object.__setattr__(self, "zoo", model)  # not a submodule: the parameters stay the wrapper's own

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any) -> BaseModelOutput:
        pad_mask = pad_mask_of(attention_mask, input_ids.shape[1])
        return BaseModelOutput(last_hidden_state=self.zoo.encode(input_ids, pad_mask))


class ZooForSeq2SeqLM(ZooPreTrainedModel, GenerationMixin):
    """A zoo encoder-decoder for ``AutoModelForSeq2SeqLM``; ``labels`` are the decoder's targets (HF's
    convention: the decoder input is them shifted right behind ``bos_id`` when not given)."""

    kind = "seq2seq"
    main_input_name = "input_ids"

    def stacks(self) -> list[nn.Module]:
        return [self.model.encoder, self.model.decoder]

    def get_encoder(self, modality: str | None = None) -> ZooEncoder:
        return ZooEncoder(self.model)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.src_embed

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: ZooCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ZooCache | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput:
        self.refuse_unsupported(kwargs, output_attentions)
        config = self.model.config
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("give decoder_input_ids, or labels to shift right behind bos_id")
            shifted = labels[:, :-1].masked_fill(labels[:, :-1] == -100, config.pad_id)
            decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], config.bos_id), shifted], dim=1)
        cache = zoo_cache(cache, past_key_values)
        t = decoder_input_ids.shape[1]
        if cache is not None:
            state = cache.state
        else:
            if encoder_outputs is None:
                encoder_outputs = self.get_encoder()(input_ids, attention_mask)
            memory = encoder_outputs[0]
            pad_mask = pad_mask_of(attention_mask, memory.shape[1])
            b = memory.shape[0]
            layers = self.model.decoder.init_state(b) if use_cache and self.model.attentions_keep_state() else None
            state = Seq2SeqState(memory, pad_mask, layers, 0, b, self.model.signature)
            if layers is None:  # recomputing: the whole target prefix against the encoded source
                cache = None
        hidden_wanted = self.wants_hidden(output_hidden_states)
        with self.layer_outputs(hidden_wanted) as found:
            out = self.model(None, decoder_input_ids, tgt_pad_mask=pad_mask_of(decoder_attention_mask, t), state=state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                label_smoothing=config.label_smoothing,
            ) + sum(out.aux_losses.values())  # fmt: skip
        if state.layers is not None:
            cache = cache if cache is not None else ZooCache(out.state)
            cache.state = out.state
        return Seq2SeqLMOutput(
            loss=loss,
            logits=out.logits,
            cache=cache,
            decoder_hidden_states=hidden_tuple(found, out.hidden),
            encoder_last_hidden_state=state.memory,
        )

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,
        next_sequence_length: int | None = None,
        cache: ZooCache | None = None,
        attention_mask: Tensor | None = None,
        encoder_outputs: BaseModelOutput | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The decoder tokens the cache has not seen (all of them when the decoder recomputes)."""
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length() :]
        inputs = {
            "decoder_input_ids": input_ids,
            "cache": cache,
            "attention_mask": attention_mask,
            "encoder_outputs": encoder_outputs,
        }
        for key in ("use_cache", "output_hidden_states", "output_attentions"):
            if key in kwargs:
                inputs[key] = kwargs[key]
        return inputs
