"""transformer-zoo: the efficient / long-context Transformer family on one block skeleton.

Public API::

    import zoo
    zoo.list_models()                      # presets
    model = zoo.create_model("vanilla_lm", vocab_size=256, d_model=64, n_layers=2, n_heads=4)
    zoo.list_attention()                   # mechanisms
    attn = zoo.create_attention("vanilla", d_model=64, n_heads=4, causal=True)
    zoo.save(model, "my-model/"); zoo.load("my-model/")   # model.safetensors + config.json
    zoo.load_checkpoint("run/checkpoints/last.pt")       # a training checkpoint, read as data only
"""

from zoo import attention as _attention  # noqa: F401  (registers mechanisms)
from zoo import gating as _gating  # noqa: F401  (gru_gate, identity_map residuals)
from zoo import positional as _positional  # noqa: F401
from zoo import presets as _presets  # noqa: F401
from zoo import residual as _residual  # noqa: F401
from zoo import reversible as _reversible  # noqa: F401  (registers the reversible stack)
from zoo import stacks as _stacks  # noqa: F401
from zoo import universal as _universal  # noqa: F401
from zoo.attention.base import Attention, AttnOutput
from zoo.build import create_attention
from zoo.checkpoint import CheckpointError, load_checkpoint
from zoo.config import ModelConfig
from zoo.export import load, save
from zoo.models import ModelOutput, ModelState, create_model, list_models, preset_config
from zoo.registry import ATTENTION, POSITION, RESIDUAL, STACK, UnknownNameError

__version__ = "0.1.0"


def list_attention(pattern: str = "*") -> list[str]:
    return ATTENTION.list(pattern)


def list_residuals(pattern: str = "*") -> list[str]:
    return RESIDUAL.list(pattern)


def list_stacks(pattern: str = "*") -> list[str]:
    return STACK.list(pattern)


def list_positions(pattern: str = "*") -> list[str]:
    return POSITION.list(pattern)


__all__ = [
    "Attention",
    "AttnOutput",
    "CheckpointError",
    "ModelConfig",
    "ModelOutput",
    "ModelState",
    "UnknownNameError",
    "create_attention",
    "create_model",
    "list_attention",
    "list_models",
    "list_positions",
    "list_residuals",
    "list_stacks",
    "load",
    "load_checkpoint",
    "preset_config",
    "save",
]
