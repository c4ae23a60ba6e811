"""transformer-zoo: the efficient / long-context Transformer family on one block skeleton.

Public API::

    import zoo
    zoo.list_models()                      # presets
    model = zoo.create_model("vanilla_lm", vocab_size=256, d_model=64, n_layers=2, n_heads=4)
    zoo.list_attention()                   # mechanisms
    attn = zoo.create_attention("vanilla", d_model=64, n_heads=4, causal=True)
    model.save_pretrained("my-model/")     # model.safetensors + config.json + README.md (zoo.save: the same)
    zoo.from_pretrained("my-model/")       # or a Hugging Face Hub id; model.push_to_hub("user/my-model")
    zoo.load_checkpoint("run/checkpoints/last.pt")       # a training checkpoint, read as data only
"""

from zoo import data as _data  # noqa: F401  (registers every task)
from zoo.attention import ATTENTION, Attention, AttnOutput, create_attention
from zoo.config import ModelConfig
from zoo.feed_forward import FEED_FORWARD
from zoo.hub import from_pretrained, load, save
from zoo.hub import hf_auto as _hf_auto
from zoo.models.base import ModelOutput, ModelState
from zoo.norm import NORM, create_norm
from zoo.position import POSITION
from zoo.presets import create_model, list_models, preset_config
from zoo.registry import UnknownNameError, import_plugins, load_entry_points
from zoo.residual.base import RESIDUAL
from zoo.stacks.base import STACK
from zoo.train.checkpoints.format import CheckpointError, load_checkpoint

__version__ = "0.1.0"

load_entry_points()  # parts of installed packages (group transformer_zoo.parts), after the zoo's own
_hf_auto.install()  # transformers' Auto classes know the zoo, lazily (zoo/hub/hf_auto.py); a no-op without it


def list_attention(pattern: str = "*") -> list[str]:
    return ATTENTION.list(pattern)


def list_residuals(pattern: str = "*") -> list[str]:
    return RESIDUAL.list(pattern)


def list_stacks(pattern: str = "*") -> list[str]:
    return STACK.list(pattern)


def list_positions(pattern: str = "*") -> list[str]:
    return POSITION.list(pattern)


def list_norms(pattern: str = "*") -> list[str]:
    return NORM.list(pattern)


def list_feed_forwards(pattern: str = "*") -> list[str]:
    return FEED_FORWARD.list(pattern)


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
    "create_norm",
    "from_pretrained",
    "import_plugins",
    "list_attention",
    "list_feed_forwards",
    "list_models",
    "list_norms",
    "list_positions",
    "list_residuals",
    "list_stacks",
    "load",
    "load_checkpoint",
    "preset_config",
    "save",
]
