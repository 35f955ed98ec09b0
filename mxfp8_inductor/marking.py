"""`mxfp8()`: mark a model (or every instance of a class) so that a plain `torch.compile`, of
the whole model or of each block, rewrites that model's grouped matmuls and nobody else's."""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import torch

from .backend import install_marked_model_pass
from .options import MXFP8Config
from .patterns import registry

M = TypeVar("M", bound=torch.nn.Module)

_SUBCLASSES: dict[tuple[type, frozenset[str]], type] = {}


def _guard_class(cls: type, kept: frozenset[str]) -> type:
    """A subclass of `cls` that Dynamo's type guards tell apart from `cls` and from other
    decisions: per-block compile otherwise reuses one compiled graph for every instance of a
    class, so one block's decision would apply to all (docs/design.md, "Caches")."""
    key = (cls, kept)
    if key not in _SUBCLASSES:
        attrs = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "_mxfp8_base": cls, "_mxfp8_kept_bf16": kept}
        _SUBCLASSES[key] = type(cls.__name__, (cls,), attrs)
    return _SUBCLASSES[key]


def _mark(model: M, config: MXFP8Config) -> M:
    for module_fqn, module in model.named_modules():
        kept = []
        for name, param in module.named_parameters(recurse=False):
            fqn = f"{module_fqn}.{name}" if module_fqn else name
            registry.register(param, fqn, config)
            if param.dim() == 3 and not config.decide(module_fqn, fqn)[0]:
                kept.append(name)
        if any(p.dim() == 3 for p in module.parameters(recurse=False)):
            base = getattr(type(module), "_mxfp8_base", type(module))
            module.__class__ = _guard_class(base, frozenset(kept))
    install_marked_model_pass()
    return model


def mxfp8(target: Any = None, /, **options: Any) -> Any:
    """Mark a model for MXFP8 rewriting by `torch.compile`.

    `mxfp8(model, exclude=[...])` marks an instance; `@mxfp8(exclude=[...])` on an nn.Module
    class marks every instance when it is built. Options as for backend="mxfp8" (include,
    exclude, recipe, rounding, wgrad); FQNs are relative to the marked model, also when each
    block is compiled on its own. Expert modules (those owning 3-D parameters) get a subclass
    of their class so compiled graphs are not shared with unmarked models or other decisions.
    """
    config = MXFP8Config.from_options(options)
    if target is None:
        return lambda t: mxfp8(t, **options)
    if isinstance(target, torch.nn.Module):
        return _mark(target, config)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        init = target.__init__

        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if type(self).__init__ is __init__:  # the outermost __init__ of this class, not a subclass's
                _mark(self, config)

        target.__init__ = __init__
        return target
    raise TypeError(f"mxfp8() marks an nn.Module instance or class, got {type(target).__name__}")
