"""``transformers`` ``PreTrainedModel`` wrappers of the zoo's heads, registered with the Auto classes by
:mod:`zoo.hub.hf_auto`: ``ZooForCausalLM`` (``AutoModelForCausalLM``), ``ZooForSequenceClassification``
and ``ZooForSeq2SeqLM`` (:mod:`zoo.hub.hf_seq2seq`).

Each wraps the zoo model as ``self.model`` and calls it through its public contract
(``model(tokens, pad_mask=..., state=...) -> ModelOutput``), answering in HF's conventions: ``logits``,
``loss`` (HF's: labels are the inputs, shifted inside; -100 ignored; the zoo's weighted auxiliary losses
added, as the zoo's trainer adds them), ``cache`` (``past_key_values``: the zoo state in a
:class:`zoo.hub.hf_cache.ZooCache`) and ``hidden_states`` when asked.

The folder is the zoo's: ``from_pretrained`` reads it with :func:`zoo.from_pretrained` (its refusals:
no pickles, weights that do not fit, another library's config) and ``save_pretrained`` writes it with
:func:`zoo.hub.folder.write_folder`, so ``zoo.from_pretrained`` reads what transformers wrote and back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutput

from zoo.attention.base import Attention
from zoo.hub import from_pretrained as zoo_from_pretrained
from zoo.hub.folder import build_from, write_folder
from zoo.hub.hf_cache import ZooCache
from zoo.hub.hf_config import ZooConfig
from zoo.stacks.checkpointing import CheckpointPlan, set_activation_checkpointing, stacks_of

# from_pretrained keywords that change nothing for a zoo folder (Hub plumbing, what Auto classes and
# pipelines add); anything else a caller sets is refused rather than ignored
HARMLESS = {
    "trust_remote_code", "_from_auto", "_from_pipeline", "force_download", "proxies", "subfolder",
    "low_cpu_mem_usage", "use_safetensors", "attn_implementation", "output_loading_info", "gguf_file", "adapter_kwargs",
}  # fmt: skip
HUB = ("revision", "token", "cache_dir", "local_files_only")


def pad_mask_of(attention_mask: Tensor | None, t: int) -> Tensor | None:
    """HF's [b, t] 0/1 attention mask -> the zoo's boolean key padding (True = real), None when all real.
    Left padding is refused: the zoo counts positions from each row's first token, so a row padded on
    the left would not equal itself unpadded."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -t:].bool()
    if bool(mask.all()):
        return None
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError(
            "attention_mask pads a row on the left: zoo models count positions from a row's first token, so "
            "pad on the right (tokenizer.padding_side='right') or generate rows of different lengths one by one"
        )
    return mask


def dtype_of(value: Any) -> torch.dtype | None:
    if value is None or value == "auto":
        return None
    return getattr(torch, value) if isinstance(value, str) else value


class ZooPreTrainedModel(PreTrainedModel):
    """What the three wrappers share: the folder (from/save_pretrained), no HF re-initialisation, gradient
    checkpointing of every block, hidden states of every layer."""

    config_class = ZooConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Block"]
    kind: ClassVar[str] = ""  # the zoo head (ModelConfig.kind) this wrapper serves

    def __init__(self, config: ZooConfig, zoo_model: nn.Module | None = None):
        super().__init__(config)
        if config.kind != self.kind:
            raise ValueError(
                f"{type(self).__name__} wraps a zoo {self.kind!r} model, but this config holds a {config.kind!r} "
                f"({config.preset}); load it with the Auto class of its kind (zoo: zoo.from_pretrained)"
            )
        self.model = zoo_model if zoo_model is not None else build_from(config.zoo_info(), "this ZooConfig")
        self.post_init()

    def init_weights(self) -> None:
        """Nothing: the zoo initialised its parts (each part's own scheme); HF's would overwrite them."""

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing (see :meth:`init_weights`)."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the zoo keeps its own state; the first call returns it in a ZooCache

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | Path, *model_args: Any, config: ZooConfig | None = None, **kwargs: Any
    ) -> ZooPreTrainedModel:
        """The zoo model in a folder written by ``save_pretrained`` (either library's) or a Hub repository,
        wrapped. ``dtype`` / ``torch_dtype`` and ``device_map`` (one device) are honoured; a keyword that
        would change the model in a way this loader does not do is refused."""
        if model_args:
            raise TypeError(f"{cls.__name__}.from_pretrained takes no positional model arguments, got {model_args}")
        dtype = dtype_of(kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None))
        device = kwargs.pop("device_map", None) or "cpu"
        if isinstance(device, dict):
            devices = set(device.values())
            if len(devices) != 1:
                raise ValueError(f"a zoo model loads onto one device; device_map={device} spreads it")
            device = devices.pop()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        hub = {key: kwargs.pop(key) for key in HUB if key in kwargs}
        refused = sorted(k for k, v in kwargs.items() if k not in HARMLESS and v not in (None, False) and v != {})
        if refused:
            raise TypeError(f"{cls.__name__}.from_pretrained does not take {refused} (a zoo folder loads as saved)")
        model = zoo_from_pretrained(pretrained_model_name_or_path, device=device, **hub)
        folder_config = ZooConfig.from_dict(
            {"model_type": ZooConfig.model_type, "config": model.config.to_dict(), "kind": model.config.kind,
             "preset": model.config.name, "name_or_path": str(pretrained_model_name_or_path)}
        )  # fmt: skip
        if config is not None and config.config is not None and config.config != folder_config.config:
            raise ValueError("config= differs from the folder's config.json: a zoo folder loads as it was saved")
        wrapped = cls(config if config is not None else folder_config, zoo_model=model)
        if dtype is not None:
            wrapped = wrapped.to(dtype)
        return wrapped.eval()

    def save_pretrained(self, save_directory: str | Path, *, training: dict[str, Any] | None = None, **kwargs: Any):
        """The zoo's folder (:func:`zoo.hub.folder.write_folder`): ``model.safetensors`` + ``config.json`` +
        ``README.md``, read back by both libraries. HF's serialisation keywords do not apply and are refused."""
        kwargs.pop("safe_serialization", None)  # always safetensors
        kwargs.pop("is_main_process", None)
        refused = sorted(k for k, v in kwargs.items() if v not in (None, False))
        if refused:
            raise TypeError(f"save_pretrained of a zoo model does not take {refused}; it writes the zoo's folder")
        return write_folder(self.model, save_directory, training)

    # -- gradient checkpointing: the zoo's activation checkpointing (zoo.stacks.checkpointing) ---------------
    def stacks(self) -> list[nn.Module]:
        return [self.model.stack]

    def _set_gradient_checkpointing(
        self,
        enable: bool = True,
        gradient_checkpointing_func: Callable[..., Any] | None = None,
        every_n_layers: int = 1,
    ) -> None:
        """What ``activation_checkpointing_enable`` / ``gradient_checkpointing_enable`` (and ``_disable``)
        call: the zoo's activation checkpointing of every stack (what ``trainer.activation_checkpointing``
        applies: :func:`zoo.stacks.checkpointing.set_activation_checkpointing`), every ``every_n_layers``-th
        block's forward run again in backward through ``gradient_checkpointing_func`` (torch's non-reentrant
        checkpoint, HF's ``gradient_checkpointing_kwargs`` bound). A stack that cannot is refused (reversible)."""
        plan = CheckpointPlan()
        if enable:
            plan = CheckpointPlan("full") if every_n_layers == 1 else CheckpointPlan.selective(every_n_layers)
        func = gradient_checkpointing_func
        chosen = {id(block) for block in set_activation_checkpointing(self.model, plan, checkpoint_fn=func)}
        for stack in stacks_of(self.model):
            for block in stack.block_applications() or []:  # what PreTrainedModel.is_activation_checkpointing reads
                block.gradient_checkpointing = id(block) in chosen

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def refuse_unsupported(self, kwargs: dict[str, Any], output_attentions: bool | None) -> None:
        """Arguments a zoo model would otherwise drop without a word."""
        unknown = sorted(k for k, v in kwargs.items() if v is not None)
        if unknown:
            raise TypeError(f"a zoo {self.kind} model does not take {unknown} (it counts positions itself)")
        if output_attentions:
            raise ValueError("zoo mechanisms return no attention weights (many never form them: linear, LSH, ...)")

    def wants_hidden(self, output_hidden_states: bool | None) -> bool:
        return bool(self.config.output_hidden_states if output_hidden_states is None else output_hidden_states)

    @contextmanager
    def layer_outputs(self, enabled: bool) -> Iterator[list[Tensor]]:
        """Collect HF's hidden states while the model runs: the stack's input, then each block's output."""
        found: list[Tensor] = []
        if not enabled:
            yield found
            return
        stack = self.stacks()[-1]
        hooks = [stack.register_forward_pre_hook(lambda _m, args: found.append(args[0]))]
        hooks += [b.register_forward_hook(lambda _m, _a, out: found.append(out.x)) for b in stack_blocks(stack)]
        try:
            yield found
        finally:
            for hook in hooks:
                hook.remove()


def attention_projections(model: nn.Module) -> list[str]:
    """Names of the attention projections (the ``nn.Linear`` layers of every attention part named ``to_*``,
    to_q / to_k / to_v / to_out, to_qk, ..., or ``*_proj`` as the gated linear and state-space mixers name them
    after their papers' code: q_proj, in_proj, out_proj, ...) inside ``model``: PEFT's ``target_modules`` for
    LoRA on any mechanism, ``LoraConfig(target_modules=attention_projections(model))``."""
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, Attention):
            names += [
                f"{prefix}.{name}"
                for name, child in module.named_children()
                if (name.startswith("to_") or name.endswith("_proj")) and isinstance(child, nn.Linear)
            ]
    if not names:
        raise ValueError(f"{type(model).__name__} has no attention projections (to_*, *_proj Linear in an Attention)")
    return names


def stack_blocks(stack: nn.Module) -> list[nn.Module]:
    """A stack's blocks, each called once per forward; refused with the stack's name when it does not call
    its blocks one by one (universal re-applies one block; reversible runs each as two branches)."""
    blocks = stack.layer_blocks()
    if blocks is None:
        raise ValueError(
            f"stack {stack.registry_name!r} does not call one block per layer (Stack.layer_blocks() is None): "
            "per-layer hidden states need the 'sequential' stack"
        )
    return blocks


def zoo_cache(cache: Any, past_key_values: Any) -> ZooCache | None:
    """The cache given under either name (transformers 5 says ``cache``; ``past_key_values`` before);
    only the ZooCache a zoo model returned continues it."""
    cache = cache if cache is not None else past_key_values
    if cache is not None and not isinstance(cache, ZooCache):
        raise TypeError(
            f"a zoo model continues from the ZooCache it returned, not a {type(cache).__name__}: its "
            "mechanisms keep their own state (KV cache, memory, recurrent state)"
        )
    return cache


def hidden_tuple(found: list[Tensor], final: Tensor | None) -> tuple[Tensor, ...] | None:
    """HF's hidden_states: the embeddings, each layer's output, the last one after the final norm."""
    if not found:
        return None
    return (*found[:-1], final)


class ZooForCausalLM(ZooPreTrainedModel, GenerationMixin):
    """A zoo causal LM (``kind="lm"``) for ``AutoModelForCausalLM``, ``generate`` and ``pipeline``."""

    kind = "lm"
    main_input_name = "input_ids"

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        cache: ZooCache | None = None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ZooCache | None = None,
        logits_to_keep: int = 0,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """input_ids [b, t] (or inputs_embeds [b, t, d_model]); ``cache`` the ZooCache a call returned;
        ``use_cache`` (default False) starts one. A cache is updated in place and returned."""
        self.refuse_unsupported(kwargs, output_attentions)
        cache = zoo_cache(cache, past_key_values)
        hidden_wanted = self.wants_hidden(output_hidden_states)
        t = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        state = cache.state if cache is not None else None
        if state is None and use_cache and self.model.attentions_keep_state():
            state = self.model.init_state((input_ids if input_ids is not None else inputs_embeds).shape[0])
        with self.layer_outputs(hidden_wanted) as found:
            out = self.model(input_ids, embeds=inputs_embeds, pad_mask=pad_mask_of(attention_mask, t), state=state)
        logits = out.logits
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].flatten(0, 1).float()
            loss = F.cross_entropy(
                shifted, labels[:, 1:].flatten(), ignore_index=-100, label_smoothing=self.model.config.label_smoothing
            )
            loss = loss + sum(out.aux_losses.values())
        if out.state is not None:
            cache = cache if cache is not None else ZooCache(out.state)
            cache.state = out.state
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=cache, hidden_states=hidden_tuple(found, out.hidden)
        )

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,
        next_sequence_length: int | None = None,
        cache: ZooCache | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        is_first_iteration: bool | None = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """With a cache, the tokens it has not seen; without one (a mechanism that cannot continue from a
        state, or use_cache=False), the last max_len tokens, as the zoo's own ``generate`` recomputes."""
        if inputs_embeds is not None:
            raise ValueError("generate from token ids: the zoo's decoding feeds its own embedding back")
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length() :]
        else:
            input_ids = input_ids[:, -self.model.config.max_len :]
        inputs = {"input_ids": input_ids, "cache": cache, "attention_mask": attention_mask}
        for key in ("use_cache", "output_hidden_states", "output_attentions", "logits_to_keep"):
            if key in kwargs:
                inputs[key] = kwargs[key]
        return inputs


class ZooForSequenceClassification(ZooPreTrainedModel):
    """A zoo sequence classifier (``kind="classifier"``) for ``AutoModelForSequenceClassification``."""

    kind = "classifier"
    main_input_name = "input_ids"

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        """input_ids [b, t] (or inputs_embeds); labels [b] classes: the zoo classifier's own loss."""
        self.refuse_unsupported(kwargs, output_attentions)
        hidden_wanted = self.wants_hidden(output_hidden_states)
        t = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        with self.layer_outputs(hidden_wanted) as found:
            out = self.model(input_ids, labels, embeds=inputs_embeds, pad_mask=pad_mask_of(attention_mask, t))
        loss = None if out.loss is None else out.loss + sum(out.aux_losses.values())
        return SequenceClassifierOutput(loss=loss, logits=out.logits, hidden_states=hidden_tuple(found, out.hidden))
