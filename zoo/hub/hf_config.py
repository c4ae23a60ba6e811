"""The ``transformers`` configuration of a zoo model: ``config.json`` as :mod:`zoo.hub.folder` writes it,
read by ``AutoConfig`` (``model_type`` ``transformer-zoo``), so one folder serves both libraries.

The zoo's own keys (``config``: the resolved model config; ``preset``, ``kind``, ``format_version``, ...)
are kept as they are; the names ``transformers`` and its consumers (generation, lm-evaluation-harness,
PEFT) ask for (``vocab_size``, ``hidden_size``, ``max_position_embeddings``, ...) are read from the
zoo config, never stored twice. Imported only through :mod:`zoo.hub.hf_auto`, after ``transformers``.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig

from zoo.hub.folder import FORMAT_VERSION, MODEL_TYPE


class ZooConfig(PretrainedConfig):
    model_type = MODEL_TYPE
    # no tokenizer file in the folder: AutoTokenizer asks the config (zoo/hub/hf_tokenizer.py)
    tokenizer_class: str | None = "ZooByteTokenizer"
    # the zoo ties the embedding and the head itself, inside create_model; transformers must not re-tie
    tie_word_embeddings: bool = False

    config: dict[str, Any] | None = None  # the resolved zoo model config: zoo.create_model(**config)
    format_version: int = FORMAT_VERSION
    zoo_version: str | None = None
    preset: str | None = None
    kind: str | None = None
    params: int | None = None
    imports: list[str] | None = None
    training: dict[str, Any] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        if self.config is not None:
            self.is_encoder_decoder = self.config.get("kind") == "seq2seq"
            if self.is_encoder_decoder:  # what HF generation starts the decoder with, and stops at
                self.decoder_start_token_id = self.config.get("bos_id")
                self.pad_token_id = self.config.get("pad_id")
                self.eos_token_id = self.config.get("eos_id")

    def zoo_info(self) -> dict[str, Any]:
        """The keys :func:`zoo.hub.folder.build_from` reads."""
        if not isinstance(self.config, dict):
            raise ValueError("this ZooConfig holds no zoo model config ('config'); build it from a zoo folder")
        return {"config": self.config, "imports": self.imports or []}

    def _zoo(self, key: str) -> Any:
        return (self.config or {}).get(key)

    # the names transformers (and lm-evaluation-harness's max_length) look up
    @property
    def vocab_size(self) -> int | None:
        return self._zoo("vocab_size")

    @property
    def hidden_size(self) -> int | None:
        return self._zoo("d_model")

    @property
    def num_hidden_layers(self) -> int | None:
        return self._zoo("n_layers")

    @property
    def num_attention_heads(self) -> int | None:
        return self._zoo("n_heads")

    @property
    def max_position_embeddings(self) -> int | None:
        return self._zoo("max_len")


def register() -> None:
    """``AutoConfig`` reads ``model_type: transformer-zoo`` as a ZooConfig (zoo/hub/hf_auto.py calls this)."""
    AutoConfig.register(ZooConfig.model_type, ZooConfig, exist_ok=True)
