"""Which parameters belong to models marked with `mxfp8_inductor.mxfp8`, with their global FQN and
the model's options.

A mark lives on each marked expert module (a module owning 3-D parameters), as its global FQN and
options, never on the parameter objects: deepcopy, pickling, `load_state_dict(assign=True)`, swapped
tensors and FSDP2 replace parameters but keep (or copy) modules. Marked modules are held weakly; a
parameter is looked up among the parameters they hold at that moment, so a site's global FQN is
known whatever module was compiled (per-block compile, resumed frames after a graph break).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from .options import MXFP8Config

ATTR = "_mxfp8_mark"


@dataclasses.dataclass(frozen=True)
class Marked:
    fqn: str
    config: MXFP8Config
    filtered: bool = False  # the config's filter_fn returned False for the module


_MODULES: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def mark(module: torch.nn.Module, fqn: str, config: MXFP8Config, filtered: bool = False) -> None:
    """Mark `module` (global FQN `fqn`) and every parameter it holds, now or later."""
    module.__dict__[ATTR] = Marked(fqn, config, filtered)
    _MODULES.add(module)


def adopt(module: torch.nn.Module) -> None:
    """Track a module that arrived carrying a mark (a deepcopy or an unpickled copy)."""
    if ATTR in module.__dict__:
        _MODULES.add(module)


def marked_params() -> dict[int, tuple[torch.nn.Parameter, Marked]]:
    """Every parameter of a live marked module: id -> (parameter, its global FQN and options)."""
    out = {}
    for module in list(_MODULES):
        mark_ = module.__dict__.get(ATTR)
        for name, param in module._parameters.items():
            if mark_ is not None and param is not None:
                fqn = f"{mark_.fqn}.{name}" if mark_.fqn else name
                out[id(param)] = (param, Marked(fqn, mark_.config, mark_.filtered))
    return out


def lookup(param: torch.nn.Parameter, table: dict | None = None) -> Marked | None:
    """The mark of `param`, from `table` (a `marked_params()` snapshot) or a fresh one."""
    entry = (marked_params() if table is None else table).get(id(param))
    return entry[1] if entry is not None and entry[0] is param else None
