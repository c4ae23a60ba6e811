"""Other libraries' models, measured beside ours with the same shape of step.

Each entry of :data:`PEER` builds ``module(tokens) -> logits`` from ``(length, shape)`` (``shape``:
d_model, heads, layers, vocab, batch, d_ff); its docstring's first line describes it in tables and
``--help``. Install them with ``pip install transformer-zoo[peers]`` (x-transformers,
reformer-pytorch, local-attention); each is imported only when its peer is built.

:func:`import_checkout` imports a reference implementation from a checkout that is not installed
(the authors' code some experiment scripts train beside ours), without patching ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from zoo.registry import Registry

PEER: Registry[Any] = Registry("peer")


@PEER.register("x_transformers")
def _peer_x_transformers(length: int, shape: dict[str, int]) -> nn.Module:
    """x-transformers Decoder, attn_flash=True (SDPA), heads of d_model / heads; --generate: its cached decoding"""
    from x_transformers import Decoder, TransformerWrapper

    layers = Decoder(
        dim=shape["d_model"],
        depth=shape["layers"],
        heads=shape["heads"],
        attn_dim_head=shape["d_model"] // shape["heads"],  # its default is 64 whatever the width
        attn_flash=True,
    )
    return TransformerWrapper(num_tokens=shape["vocab"], max_seq_len=length, attn_layers=layers)


@PEER.register("hf_llama")
def _peer_hf_llama(length: int, shape: dict[str, int]) -> nn.Module:
    """HF transformers LlamaForCausalLM (SDPA); --generate decodes with its generate() and DynamicCache"""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["d_model"],
        intermediate_size=shape["d_ff"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["heads"],
        max_position_embeddings=length,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,  # decode exactly the tokens asked for
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


@PEER.register("hf_llama_static")
def _peer_hf_llama_static(length: int, shape: dict[str, int]) -> nn.Module:
    """HF transformers LlamaForCausalLM (SDPA); --generate decodes with its generate() and a StaticCache"""
    return _peer_hf_llama(length, shape)


@PEER.register("local_attention")
def _peer_local_attention(length: int, shape: dict[str, int]) -> nn.Module:
    """local-attention LocalTransformer, window 128"""
    from local_attention import LocalTransformer

    return LocalTransformer(
        num_tokens=shape["vocab"],
        max_seq_len=length,
        dim=shape["d_model"],
        depth=shape["layers"],
        heads=shape["heads"],
        causal=True,
        local_attn_window_size=128,
    )


@PEER.register("reformer_pytorch")
def _peer_reformer_pytorch(length: int, shape: dict[str, int]) -> nn.Module:
    """reformer-pytorch ReformerLM, 4 hashes, bucket 64, reversible"""
    from reformer_pytorch import ReformerLM

    return ReformerLM(
        num_tokens=shape["vocab"],
        dim=shape["d_model"],
        depth=shape["layers"],
        max_seq_len=length,
        heads=shape["heads"],
        bucket_size=64,
        n_hashes=4,
        causal=True,
    )


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds top-level modules and packages in one folder (a reference checkout), ahead of the rest."""

    def __init__(self, folder: Path):
        self.folder = str(folder)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if path is not None:  # a submodule: its package's own __path__ finds it
            return None
        return importlib.machinery.PathFinder.find_spec(name, [self.folder])


def module_from_file(path: str | Path, key: str) -> ModuleType:
    """The Python file at ``path`` (a reference we did not write, e.g. fla's ``naive.py``) as module ``key``,
    loaded once; nothing is added to ``sys.path``."""
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


def import_checkout(folder: str | Path, *modules: str) -> list[ModuleType]:
    """Import ``modules`` (dotted names) from ``folder``, a checkout of someone else's code that is
    not installed, e.g. ``import_checkout("../ref/adaptive-span", "data", "models", "trainer")``.

    The folder's top-level names are found first from now on (as if it led ``sys.path``), so its
    modules import each other by their own top-level names; nothing is copied or patched."""
    root = Path(folder).resolve()
    if not any(isinstance(f, _CheckoutFinder) and f.folder == str(root) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(root))
    return [importlib.import_module(name) for name in modules]
