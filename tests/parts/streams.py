"""Feeding a layer a sequence in pieces through its state, for the mechanism tests."""

from __future__ import annotations

import torch


def fed_in_pieces(attn, x, ends) -> tuple[torch.Tensor, list]:
    """x [b, t, d] fed to ``attn`` in the pieces that end at ``ends`` (the last one t), from an empty state and
    without gradients -> (the pieces' outputs joined [b, t, d], the state after each piece)."""
    state, outs, states, start = attn.init_state(x.shape[0]), [], [], 0
    with torch.no_grad():
        for end in ends:
            result = attn(x[:, start:end], state=state)
            state, start = result.state, end
            outs.append(result.out)
            states.append(state)
    return torch.cat(outs, 1), states
