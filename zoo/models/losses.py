"""The token loss every LM-style head uses: mean cross-entropy over the scored target positions."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from zoo.models.inputs import (
    IGNORE_INDEX,
    check_targets,
    scored_loss,
)


def token_loss(
    logits: Tensor, targets: Tensor, pad_mask: Tensor | None, label_smoothing: float
) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy over real target positions, how many were scored). Targets == -100 or
    padded are skipped; none scored gives loss 0, never NaN (see :mod:`zoo.models.inputs`)."""
    check_targets(targets, tuple(logits.shape[:-1]), logits.shape[-1])
    targets = targets.long()
    if pad_mask is not None:
        targets = targets.masked_fill(~pad_mask, IGNORE_INDEX)
    flat_logits, flat_targets = logits.float().flatten(0, -2), targets.flatten()
    loss_sum = F.cross_entropy(
        flat_logits, flat_targets, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction="sum"
    )
    scored = (targets != IGNORE_INDEX).sum()
    return scored_loss(loss_sum, scored, logits), scored
