"""Registers the zoo with ``transformers``' Auto classes (``AutoConfig``, ``AutoModelForCausalLM``,
``AutoModelForSequenceClassification``, ``AutoModelForSeq2SeqLM``, ``AutoTokenizer``), so after
``import zoo`` a folder written by ``save_pretrained`` loads with no ``trust_remote_code``::

    import zoo
    from transformers import AutoModelForCausalLM, pipeline
    model = AutoModelForCausalLM.from_pretrained("my-model/")
    pipeline("text-generation", model="my-model/")

Lazily: importing ``transformers``' Auto modules costs seconds, so ``import zoo`` imports none of it.
:func:`install` (called by ``zoo/__init__``) puts a finder on ``sys.meta_path`` that registers the zoo's
classes right after ``transformers`` executes each Auto module (configuration, modeling, tokenization),
and registers at once with those already imported. Without ``transformers`` installed nothing happens.
The classes: :mod:`zoo.hub.hf_config`, :mod:`zoo.hub.hf_models`, :mod:`zoo.hub.hf_seq2seq`,
:mod:`zoo.hub.hf_tokenizer` (each with its ``register()``; :mod:`zoo.hub.hf_heads` for
the models); the cache adapter: :mod:`zoo.hub.hf_cache`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from typing import Any

AUTO = "transformers.models.auto."


# each Auto module of transformers, and the zoo module whose register() tells it about the zoo. Named, not
# imported: importing them imports transformers, which is what waiting for it avoids
REGISTER: dict[str, str] = {
    AUTO + "configuration_auto": "zoo.hub.hf_config",
    AUTO + "modeling_auto": "zoo.hub.hf_heads",
    AUTO + "tokenization_auto": "zoo.hub.hf_tokenizer",
}


MIN_TRANSFORMERS = (5, 24)  # the cache interface and output names (``cache``) the wrappers speak


def register(auto_module: str) -> None:
    """Tell one Auto module about the zoo; an older transformers is left as it is, with a warning (the
    wrappers would not fit its generation loop), so ``import zoo`` never breaks someone's transformers."""
    import transformers

    found = tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())
    if found < MIN_TRANSFORMERS:
        warnings.warn(
            f"transformers {transformers.__version__} is older than the zoo's Auto classes need "
            f"({'.'.join(map(str, MIN_TRANSFORMERS))}): not registered (pip install 'transformer-zoo[hf]')",
            stacklevel=2,
        )
        return
    importlib.import_module(REGISTER[auto_module]).register()


class RegisterAfterImport:
    """Finds nothing itself: for a module in REGISTER it wraps the real loader so that the zoo registers
    right after the module's code has run. (Not an ``importlib.abc`` subclass: importing that module
    would cost ``import zoo`` more than this finder does.)"""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in REGISTER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = RegisteringLoader(spec.loader, fullname)
                return spec
        return None


class RegisteringLoader:
    def __init__(self, loader: Any, auto_module: str):
        self.loader, self.auto_module = loader, auto_module

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        sys.modules[module.__name__] = module  # registering imports the module's siblings, which import it
        register(self.auto_module)


def install() -> None:
    """Register with the Auto modules already imported, and with the others when they are (a no-op
    without transformers; installing twice adds one finder)."""
    if importlib.util.find_spec("transformers") is None:
        return
    if not any(isinstance(finder, RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterImport())
    for auto_module in REGISTER:
        if auto_module in sys.modules:
            register(auto_module)
