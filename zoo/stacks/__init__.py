"""The stack axis: how blocks compose in depth (``base.py`` holds the contract and the ``STACK``
registry, ``build.py`` turns a model config into a stack; every other module registers its stack
when this package is imported)."""

from zoo.registry import import_submodules
from zoo.stacks.base import STACK, Stack, StackOutput

import_submodules(__name__)

__all__ = ["STACK", "Stack", "StackOutput"]
