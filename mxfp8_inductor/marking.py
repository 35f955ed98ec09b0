"""`mxfp8()`: mark a model (or every instance of a class) so that a plain `torch.compile`, of
the whole model or of each block, rewrites that model's grouped matmuls and nobody else's."""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import torch

from . import fsdp, marks
from ._warn import warn
from .backend import install_marked_model_pass
from .kernels.shared_weight import SHARED_TILE
from .lowering import weight_cache
from .options import MXFP8Config

M = TypeVar("M", bound=torch.nn.Module)

# (base class, options' key, parameter names kept bf16) -> guard subclass
_SUBCLASSES: dict[tuple[type, str, frozenset[str]], type] = {}


class _MarkedModule:
    """Mixed into the guard subclasses: copies (deepcopy, pickle) rebuild as the guard class by
    name of their base, not by the guard's own (which is made at run time), and stay marked."""

    def __reduce_ex__(self, protocol):
        _, _, *rest = super().__reduce_ex__(protocol)
        return (_new_guarded, (self._mxfp8_base, self._mxfp8_kept_bf16, self._mxfp8_config_key), *rest)

    def __setstate__(self, state):
        super().__setstate__(state)
        marks.adopt(self)


def _new_guarded(base: type, kept: frozenset[str], config_key: str) -> Any:
    cls = _guard_class(base, config_key, kept)
    return cls.__new__(cls)


def _guard_class(cls: type, config_key: str, kept: frozenset[str]) -> type:
    """A subclass of `cls` that Dynamo's type guards tell apart from `cls` and from other options
    and decisions: Dynamo otherwise reuses one compiled graph for every instance of a class (per
    model, and per block in a per-block compile), so one model's or block's options would apply to
    all (docs/design.md, "Caches"). Keyed on `MXFP8Config.key()`: a filter_fn may be unhashable,
    and what it decides is in `kept`."""
    key = (cls, config_key, kept)
    if key not in _SUBCLASSES:
        attrs = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "_mxfp8_base": cls, "_mxfp8_config_key": config_key, "_mxfp8_kept_bf16": kept}
        _SUBCLASSES[key] = type(cls.__name__, (_MarkedModule, cls), attrs)
    return _SUBCLASSES[key]


def _decide(module: torch.nn.Module, fqn: str, config: MXFP8Config) -> tuple[bool, frozenset[str]]:
    """(filtered, names of the 3-D parameters kept bf16) for an expert module."""
    filtered = False
    if config.filter_fn is not None:
        keep = config.filter_fn(module, fqn)
        if not isinstance(keep, bool):
            raise ValueError(f"filter_fn must return a bool (True: rewrite the module), got {keep!r} for "
                             f"{fqn or 'the model'} ({type(module).__name__})")
        filtered = not keep
    return filtered, frozenset(name for name, p in module.named_parameters(recurse=False) if p.dim() == 3 and (
        filtered or not config.matches(fqn, f"{fqn}.{name}" if fqn else name)[0]))


def _guarded_class(module: torch.nn.Module, fqn: str, config_key: str, kept: frozenset[str]) -> type:
    """The class `module` takes when marked; raises ValueError where it cannot take one."""
    base = getattr(type(module), "_mxfp8_base", None)
    if base is None:
        return _guard_class(type(module), config_key, kept)
    if type(module) in _SUBCLASSES.values():
        return _guard_class(base, config_key, kept)
    if (type(module)._mxfp8_config_key, type(module)._mxfp8_kept_bf16) != (config_key, kept):
        # a class made on top of ours (FSDP2's): its graphs cannot be told apart per options
        raise ValueError(f"{fqn} was marked, then wrapped ({type(module).__name__}), then marked with other "
                         "options: mark it once, before or after wrapping")
    return type(module)


def _mark(model: M, config: MXFP8Config) -> M:
    if config.targets != "experts":
        raise ValueError("mxfp8() marks routed experts only (targets='experts'); for dense linears too, compile "
                         "with backend='mxfp8' or inductor_options(targets='all')")
    experts = [(fqn, f"{fqn}.{name}" if fqn else name) for fqn, module in model.named_modules()
               for name, p in module.named_parameters(recurse=False) if p.dim() == 3]
    if not experts:
        warn(f"{type(model).__name__} has no expert weights (3-D parameters): mxfp8() marks nothing in it; dense "
             "linears are rewritten by compiling with backend='mxfp8' and targets='all'")
    for message in config.unmatched(experts):
        warn(f"{message} in {type(model).__name__}")
    # everything that may raise (filter_fn, the checks, the pass's install) before the first mark,
    # so that an error leaves the model as it was
    key = config.key()
    plans = []
    for fqn, module in model.named_modules():
        if any(p.dim() == 3 for p in module.parameters(recurse=False)):
            filtered, kept = _decide(module, fqn, config)
            plans.append((module, fqn, filtered, _guarded_class(module, fqn, key, kept)))
    install_marked_model_pass()
    before = {m.config.key() for module, *_ in plans if (m := module.__dict__.get(marks.ATTR)) is not None} - {key}
    if before:
        warn(f"{type(model).__name__} was marked before with other options ({', '.join(sorted(before))}); "
             f"the new ones now apply: {key}")
    for module, fqn, filtered, cls in plans:
        _set_all_gather(module, fqn, config, cls._mxfp8_kept_bf16)
        marks.mark(module, fqn, config, filtered)
        if config.weight_cache:
            # every state dict the module hands out from now on is watched, also one taken before
            # the first forward (a checkpoint loaded into it in place: docs/design.md, "Weight cache")
            weight_cache.watch_state_dicts(module)
        module.__class__ = cls
        if _warn_if_eager not in module._forward_pre_hooks.values():
            module.register_forward_pre_hook(_warn_if_eager)
    return model


def _sharded(p: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)


def _set_all_gather(module: torch.nn.Module, fqn: str, config: MXFP8Config, kept: frozenset[str]) -> None:
    """Make the module's rewritten expert weights FP8AllGatherWeight parameters where the options
    ask for FP8 all-gathers, plain ones otherwise."""
    for name, p in list(module.named_parameters(recurse=False)):
        if p.dim() != 3:
            continue
        # an mxfp8 weight of no whole tiles is skipped by the pass, and so gathered as it is
        wanted = config.fsdp_fp8_all_gather and name not in kept and (
            config.recipe != "mxfp8" or not (p.shape[-1] % SHARED_TILE or p.shape[-2] % SHARED_TILE))
        if wanted and _sharded(p):
            raise ValueError(f"{fqn}.{name} is already sharded: mark the model with mxfp8(..., "
                             "fsdp_fp8_all_gather=True) before fully_shard, which shards what it finds")
        if wanted:
            setattr(module, name, fsdp.wrap(p, config.recipe, config.rounding))
            if not module.__dict__.get("_mxfp8_plain_state_dict"):
                module.register_state_dict_post_hook(fsdp.plain_state_dict)
                module.__dict__["_mxfp8_plain_state_dict"] = True
        elif isinstance(p.data, fsdp.FP8AllGatherWeight):
            setattr(module, name, fsdp.plain(p))


def _warn_if_eager(module: torch.nn.Module, args: Any) -> None:
    """A marked expert module running outside torch.compile stays bf16: say so (once per process,
    as Python shows a warning from one line). Under compile Dynamo folds this to nothing."""
    if not torch.compiler.is_compiling():
        warn("a model marked with mxfp8() ran its experts outside torch.compile, in bf16: the pass rewrites "
             "only compiled graphs; compile the model or its blocks (torch.compile, or --compile.enable "
             "with 'model' in --compile.components in TorchTitan)")


def mxfp8(target: Any = None, /, config: MXFP8Config | None = None, **options: Any) -> Any:
    """Mark a model for MXFP8 rewriting by `torch.compile`.

    `mxfp8(model, exclude=[...])` marks an instance; `@mxfp8(exclude=[...])` on an nn.Module
    class marks every instance of it and of its subclasses when built. Options: an
    `MXFP8Config`, or its keys (include, exclude, recipe, rounding, wgrad, weight_cache,
    fsdp_fp8_all_gather, filter_fn); FQNs are relative to the marked model, also when each block
    is compiled on its own. With fsdp_fp8_all_gather, mark before `fully_shard`. The mark
    survives deepcopy, pickling, `load_state_dict(assign=True)`, swapped tensors and FSDP2. Expert
    modules (those owning 3-D parameters) get a subclass of their class so compiled graphs are
    not shared with unmarked models or models marked with other options or decisions.
    """
    if config is not None and options:
        raise ValueError("pass either an MXFP8Config or keyword options to mxfp8(), not both")
    config = MXFP8Config.from_options(config if config is not None else options)
    if target is None:
        return lambda t: mxfp8(t, config)
    if isinstance(target, torch.nn.Module):
        return _mark(target, config)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        _mark_on_init(target, config)
        return target
    raise TypeError(f"mxfp8() marks an nn.Module instance or class, got {type(target).__name__}")


def _mark_on_init(cls: type, config: MXFP8Config) -> None:
    """Wrap `cls.__init__`, and the `__init__` of every subclass defined later, so that the
    outermost `__init__` of an instance marks it when it returns."""

    def wrap(init):
        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            depth = self.__dict__.get("_mxfp8_init_depth", 0)
            self.__dict__["_mxfp8_init_depth"] = depth + 1
            try:
                init(self, *args, **kwargs)
            finally:
                self.__dict__["_mxfp8_init_depth"] = depth
            if depth == 0:
                del self.__dict__["_mxfp8_init_depth"]
                _mark(self, config)

        return __init__

    cls.__init__ = wrap(cls.__init__)
    parent_hook = cls.__init_subclass__

    def __init_subclass__(sub, **kwargs: Any) -> None:
        parent_hook.__func__(sub, **kwargs) if hasattr(parent_hook, "__func__") else parent_hook(**kwargs)
        if "__init__" in sub.__dict__:
            sub.__init__ = wrap(sub.__dict__["__init__"])

    cls.__init_subclass__ = classmethod(__init_subclass__)
