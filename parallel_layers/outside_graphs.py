"""Functions that run outside torch.compile's graphs, marked without importing torch.compile's machinery.

``torch.compiler.disable`` imports torch._dynamo (0.5 s), and a module-level ``torch.compile(fn)`` torch._inductor
too (0.9 s more): 1.4 s of the 3.2 s every rank spent importing parallel_layers.train (2026-12-06, this 2-core
machine, ``python -X importtime``), in every run, compiled or not.  Here a function is marked with ``outside_graphs``
and left as it is; ``before_compiling()``, which every place that compiles parplan's modules calls first
(``compile_module``), replaces each marked function in its module by ``torch.compiler.disable(fn)``, the same
wrapper the decorator made before.  A marked function must be called through the name it was defined under (its
module's global, or its class's attribute): a copy bound elsewhere by ``from ... import`` would keep the unwrapped
function.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch

_MARKED: list[Callable] = []


def outside_graphs(fn: Callable) -> Callable:
    """Mark a function defined at a module's top level or in a class body there to run eagerly inside compiled code
    (a graph break), as ``torch.compiler.disable`` does, from the first ``before_compiling()`` on."""
    _MARKED.append(fn)
    return fn


def before_compiling() -> None:
    """Wrap every marked function in torch.compiler.disable where it is defined, its module or its class (once;
    idempotent)."""
    for fn in _MARKED:
        *path, name = fn.__qualname__.split(".")
        owner = sys.modules[fn.__module__]
        for part in path:
            owner = getattr(owner, part)
        if vars(owner).get(name) is fn:
            setattr(owner, name, torch.compiler.disable(fn))


def compile_module(module: torch.nn.Module) -> None:
    """``module.compile()`` (torch.compile in place, parameters kept the module's own) with the marked functions
    left out of its graphs."""
    before_compiling()
    module.compile()
