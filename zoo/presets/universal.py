"""Presets of the Universal Transformer (Dehghani et al. 2019, arXiv:1807.03819), fixed depth and
with Adaptive Computation Time (Graves 2016, arXiv:1603.08983). See zoo/stacks/universal.py.

``n_layers`` is the number of recurrent steps T (the step limit under ACT). The stack adds the
position + timestep signal before every step, so the model's own ``position`` is ``none``.
Size: the base Transformer's block (d 512, 8 heads, d_ff 2048); one block's parameters, shared.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset
from zoo.presets.vanilla import BASE

DEHGHANI = "Dehghani et al. 2019, Universal Transformers, arXiv:1807.03819"

UNIVERSAL = dict(BASE, position={"name": "none"})


@register_preset(
    "universal_transformer",
    "Universal Transformer LM: one shared block applied T=6 times with position+timestep signals "
    "(Dehghani et al. 2019)",
    paper=DEHGHANI,
)
def _universal_transformer() -> dict[str, Any]:
    return dict(UNIVERSAL, kind="lm", n_layers=6, stack={"name": "universal"})


@register_preset(
    "universal_transformer_act",
    "Universal Transformer LM with per-position ACT halting, at most 8 steps, ponder cost 0.01 "
    "(Dehghani et al. 2019; Graves 2016)",
    paper=DEHGHANI,
)
def _universal_transformer_act() -> dict[str, Any]:
    return dict(UNIVERSAL, kind="lm", n_layers=8, stack={"name": "universal", "act": True})


@register_preset(
    "universal_seq2seq_act",
    "Universal Transformer encoder-decoder with ACT in both halves, at most 8 steps (algorithmic tasks)",
    paper=DEHGHANI,
)
def _universal_seq2seq_act() -> dict[str, Any]:
    return dict(UNIVERSAL, kind="seq2seq", n_layers=8, stack={"name": "universal", "act": True})
