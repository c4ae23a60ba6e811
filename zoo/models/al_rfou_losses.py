"""Auxiliary losses of Al-Rfou et al. 2018, "Character-Level Language Modeling with Deeper Self-Attention"
(arXiv:1808.04444, section "Auxiliary Losses"), which the paper needs to train its 64-layer character
model (T64).

The paper's three losses, as a language model here computes them:

1. Multiple positions: every position predicts its next character. That is already our LM loss
   (``ModelOutput.loss``, the mean over all positions), so nothing is added for it.
2. Intermediate layers: the output of each layer l < L (L = n_layers, l counted from 1) also
   predicts the next character, through the model's final norm and then that layer's own classifier
   (``layer_heads``, the preset's choice) or the model's output projection (``layer_heads`` false).
   Layer l's loss counts only while training progress (fraction of the planned steps) is below
   l / (2L), the paper's schedule: the lowest layers drop out first and all are gone by half of
   training. Entry ``intermediate_l{l}`` = ``intermediate_weight`` x that layer's loss.
3. Multiple targets: each position also predicts the character after next (targets shifted by one
   more; the last position has none), through a separate classifier, weighted by ``multi_target``
   (the paper's multiplier: 0.5) and added to the loss of the layer it belongs to: entry
   ``multi_target`` for the final layer, and inside ``intermediate_l{l}`` for an intermediate layer.

What was checked against the paper, and from where (the arXiv text itself was not readable in full here;
its sentences were read as quoted by two third-party reading notes, and the totals as listed by
Papers with Code and Dai et al. 2019):

- "Intermediate Layer Losses": layer l of n stops contributing after l/2n of training, so all are gone
  after half of it; predictions at every position at every layer. Matches.
- "Multiple Targets": a separate classifier per extra target; the extra target's loss weighted 0.5
  and added to its layer's loss, so intermediate layers predict the character after next too. Matches.
- "Multiple Positions": every position predicts (the standard LM loss). Matches.
- Weighting of intermediate losses: the paper speaks of lower layers contributing less and less as
  training goes on, realised by the drop-out schedule above; no per-layer multiplier is stated, so
  each active layer counts with weight ``intermediate_weight`` (1) and everything is summed with the
  final loss (zoo.train.steps.total_loss). Whether the paper sums or averages over layers is not stated
  in what we could read.
- Classifiers per layer: the paper's parameter totals (T12 44M, T64 235M, results tables) add up only
  with a learned position table per layer plus two classifiers (next character, character after next)
  per layer: 12 x 3.15M blocks + 12 x 0.26M positions + 24 x 0.13M classifiers = 44.2M; the same sum
  for 64 layers = 235.3M (shared heads would give 41M / 218M). One reading note also says those
  classifiers are counted as training-only parameters. Hence ``layer_heads`` (on in ``al_rfou_lm``),
  an inference from the counts rather than a sentence of the paper.

Progress reaches the model through ``set_progress(fraction)``; :func:`zoo.train.steps.set_training_progress`
calls it, and the trainer does so before every step (``step / max_steps``). A model never told
stays at progress 0: every intermediate loss on. The losses are training devices: computed only in
training mode with targets, so evaluation reports the plain LM loss.

Intermediate outputs are read with forward hooks on the stack's blocks, so the block skeleton is
untouched; a stack without one block per layer (``Stack.layer_blocks()`` is None: universal,
reversible) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from zoo.config import build_options, require
from zoo.models.losses import token_loss

PAPER_MULTI_TARGET_WEIGHT = 0.5  # Section 2.2: extra targets weighted by 0.5


@dataclass
class AuxLossOptions:
    """``ModelConfig.aux_losses``: {} = off (every preset but ``al_rfou_lm``)."""

    intermediate: bool = False  # each layer below the last also predicts the next character
    intermediate_weight: float = 1.0  # multiplier of each intermediate layer's loss
    multi_target: float = 0.0  # weight of the character-after-next loss; 0 = off, the paper: 0.5
    # own classifiers per layer (the paper's parameter counts); false: intermediate layers share the model's
    # output head and every layer shares one character-after-next classifier
    layer_heads: bool = False

    def __post_init__(self) -> None:
        require(
            isinstance(self.intermediate, bool),
            f"aux_losses.intermediate must be true or false, got {self.intermediate!r}",
        )
        require(
            self.intermediate_weight > 0, f"aux_losses.intermediate_weight must be > 0, got {self.intermediate_weight}"
        )
        require(self.multi_target >= 0, f"aux_losses.multi_target must be >= 0 (0 = off), got {self.multi_target}")
        require(
            isinstance(self.layer_heads, bool),
            f"aux_losses.layer_heads must be true or false, got {self.layer_heads!r}",
        )


def intermediate_layer_active(layer: int, n_layers: int, progress: float) -> bool:
    """Layer ``layer`` (1..n_layers-1) still contributes at training ``progress`` in [0, 1]:
    progress < layer / (2 n_layers)."""
    return progress < layer / (2 * n_layers)


class AlRfouLosses(nn.Module):
    """The intermediate-layer and multiple-target losses of one causal LM.

    ``blocks``: the stack's per-layer blocks (read through forward hooks); ``norm`` and ``head``:
    the model's final norm and output projection, shared by the intermediate predictions."""

    def __init__(
        self, options: dict, *, blocks: list[nn.Module], norm: nn.Module, head: nn.Module, d_model: int, vocab_size: int
    ):
        super().__init__()
        self.options = build_options(AuxLossOptions, options, "aux_losses")
        self.n_layers = len(blocks)
        self.progress = 0.0
        self._norm, self._head = [norm], [head]  # held in lists: owned (and saved) by the model, not here
        options = self.options

        def linear_heads(count: int) -> nn.ModuleList:  # no bias, like the tied next-character head
            return nn.ModuleList(nn.Linear(d_model, vocab_size, bias=False) for _ in range(count))

        # the character after next: one classifier shared by all layers, or one per layer (index l - 1)
        self.multi_target_head = (
            nn.Linear(d_model, vocab_size, bias=False) if options.multi_target and not options.layer_heads else None
        )
        self.after_next_heads = linear_heads(self.n_layers) if options.multi_target and options.layer_heads else None
        # the next character from intermediate layer l (index l - 1); None: the model's own output head
        self.next_char_heads = linear_heads(self.n_layers - 1) if options.intermediate and options.layer_heads else None
        self._hidden: list[Tensor] | None = None
        if self.options.intermediate:
            for block in list(blocks)[:-1]:
                block.register_forward_hook(self._keep_output)

    def set_progress(self, fraction: float) -> None:
        """Training progress in [0, 1] (steps done / steps planned): drives the layer schedule."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"training progress must be in [0, 1], got {fraction}")
        self.progress = float(fraction)

    def classifiers(self, layer: int) -> tuple[nn.Module, nn.Module | None]:
        """(next-character, character-after-next) classifiers of ``layer`` (1..n_layers); the second is
        None when multiple targets are off. Layer n_layers's next-character classifier is the model's head."""
        next_char = self._head[0]
        if self.next_char_heads is not None and layer < self.n_layers:
            next_char = self.next_char_heads[layer - 1]
        after_next = self.after_next_heads[layer - 1] if self.after_next_heads is not None else self.multi_target_head
        return next_char, after_next

    def _keep_output(self, module: nn.Module, args: tuple, output) -> None:
        if self._hidden is not None:
            self._hidden.append(output.x)

    def start(self, active: bool) -> None:
        """Call before the stack: collect the intermediate layers' outputs [b, t, d] when ``active``
        (training with targets), else record nothing (evaluation, decoding)."""
        self._hidden = [] if active and self.options.intermediate else None

    def losses(
        self, hidden: Tensor, targets: Tensor, pad_mask: Tensor | None, label_smoothing: float
    ) -> dict[str, Tensor]:
        """Weighted auxiliary losses from the final ``hidden`` [b, t, d] (after the final norm) and
        the intermediate outputs recorded; ``targets`` [b, t] are the next characters."""

        captured, self._hidden = self._hidden or [], None
        if self.options.intermediate and len(captured) != self.n_layers - 1:
            raise RuntimeError(
                f"aux_losses: recorded {len(captured)} intermediate outputs for {self.n_layers} layers; "
                "the stack must call each block once (stack 'sequential')"
            )
        weight = self.options.multi_target if targets.shape[1] > 1 else 0.0  # a single position has no after-next
        norm = self._norm[0]

        def after_next(classifier: nn.Module, h: Tensor) -> Tensor:  # position i predicts targets[i + 1]
            mask = pad_mask[:, 1:] if pad_mask is not None else None
            return token_loss(classifier(h[:, :-1]), targets[:, 1:], mask, label_smoothing)[0]

        out: dict[str, Tensor] = {}
        if weight:
            out["multi_target"] = weight * after_next(self.classifiers(self.n_layers)[1], hidden)
        for layer, h in enumerate(captured, start=1):
            if not intermediate_layer_active(layer, self.n_layers, self.progress):
                continue
            h = norm(h)
            next_char, char_after = self.classifiers(layer)
            loss = token_loss(next_char(h), targets, pad_mask, label_smoothing)[0]  # (mean, count scored)
            if weight:
                loss = loss + weight * after_next(char_after, h)
            out[f"intermediate_l{layer}"] = self.options.intermediate_weight * loss
        return out
