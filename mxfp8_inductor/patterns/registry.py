"""Parameters of models marked with `mxfp8_inductor.mxfp8`: global FQN and options per parameter.

Keyed by the parameter object, so a site's global FQN is known whatever module was compiled
(per-block compile, resumed frames after a graph break).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from ..options import MXFP8Config


@dataclasses.dataclass(frozen=True)
class Marked:
    fqn: str
    config: MXFP8Config


_MARKED: dict[int, tuple[weakref.ref, Marked]] = {}


def register(param: torch.nn.Parameter, fqn: str, config: MXFP8Config) -> None:
    key = id(param)
    _MARKED[key] = (weakref.ref(param, lambda _: _MARKED.pop(key, None)), Marked(fqn, config))


def lookup(param: torch.nn.Parameter) -> Marked | None:
    entry = _MARKED.get(id(param))
    if entry is None or entry[0]() is not param:
        return None
    return entry[1]
