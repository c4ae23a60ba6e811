"""The tokenizer of the zoo's character models, for ``transformers``: UTF-8 bytes, id = byte value (the
zoo's ``data.vocab=bytes``, 256 ids, :mod:`zoo.data.text`), with no ids of its own: a pipeline and
lm-evaluation-harness tokenize exactly as the zoo's text tasks do.

It needs no vocabulary file, so a folder written by ``save_pretrained`` is a complete pipeline folder:
``AutoTokenizer`` finds it through ``ZooConfig.tokenizer_class``. Byte 0 (NUL, absent from text) is the padding
and the end-of-text id (lm-evaluation-harness starts an empty context with it); pad on the right (zoo
models count positions from a row's first token).
"""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizer

from zoo.hub.hf_config import ZooConfig

BYTES = 256


class ZooByteTokenizer(PreTrainedTokenizer):
    model_input_names = ["input_ids", "attention_mask"]
    vocab_files_names: dict[str, str] = {}

    def __init__(self, pad_token: str = "\x00", eos_token: str = "\x00", padding_side: str = "right", **kwargs):
        super().__init__(pad_token=pad_token, eos_token=eos_token, padding_side=padding_side, **kwargs)

    @property
    def vocab_size(self) -> int:
        return BYTES

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(BYTES)}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [chr(b) for b in text.encode("utf-8")]  # one token per byte, spelt as its latin-1 character

    def _convert_token_to_id(self, token: str) -> int:
        return ord(token) if len(token) == 1 and ord(token) < BYTES else self.unk_token_id

    def _convert_id_to_token(self, index: int) -> str:
        return chr(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(ord(t) for t in tokens if len(t) == 1 and ord(t) < BYTES).decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        return ()  # bytes need no vocabulary file


def register() -> None:
    """``AutoTokenizer`` of a zoo folder: the byte tokenizer (zoo/hub/hf_auto.py calls this)."""
    AutoTokenizer.register(ZooConfig, slow_tokenizer_class=ZooByteTokenizer, exist_ok=True)
