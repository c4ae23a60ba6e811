"""Shared by the transformers-integration tests (tests/hub/test_hf_*.py): offline, tiny byte-level models."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # every test here reads local folders only; never the Hub

import torch
from torch import nn

import zoo
from zoo.attention.base import ATTENTION

BYTES = 256


def byte_lm(name: str = "vanilla", seed: int = 0, **overrides):
    """A tiny byte-level causal LM on mechanism ``name`` (its contract options), its linear layers drawn
    large so greedy decoding does not just repeat the last byte (a random tied embedding would)."""
    cls = ATTENTION.get(name)
    torch.manual_seed(seed)
    model = zoo.create_model(
        "vanilla_lm",
        **{
            "vocab_size": BYTES,
            "d_model": 32,
            "n_heads": 4,
            "d_ff": 48,
            "n_layers": 2,
            "max_len": 128,
            "dropout": 0.0,
            "attention": {"name": name, **cls.contract_options()},
            **overrides,
        },
    )
    diversify(model, seed)
    return model.eval()


def diversify(model: nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module is not getattr(model, "head", None):  # the tied head: no
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * 0.4)


def prompt(b: int = 2, t: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randint(32, 127, (b, t), generator=torch.Generator().manual_seed(seed))


def decoding_lm(name: str, tokens: torch.Tensor, new: int):
    """``byte_lm(name)`` of the first seed whose greedy continuation of ``tokens`` is not one byte repeated
    in every row (a comparison of two decoders on a constant continuation would prove little)."""
    for seed in range(8):
        model = byte_lm(name, seed=seed)
        continuation = model.generate(tokens, new, greedy=True)[:, tokens.shape[1] :]
        if any(row.unique().numel() > 1 for row in continuation):
            return model
    raise AssertionError(f"{name}: greedy decoding repeats one byte for every seed tried")
