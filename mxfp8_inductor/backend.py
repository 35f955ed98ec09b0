"""The ways into the pass: the `mxfp8` torch.compile backend, Inductor options for the default
backend, and the process-wide pre-grad pass that serves models marked with `mxfp8()`.

Every way rewrites the Dynamo graph before AOTAutograd and Inductor see it, and registers a
custom pass whose `uuid()` hashes the package's sources and the options: the FX-graph and
AOTAutograd caches do not hash a custom op's Python backward or our kernels, so without it an
edited formula would be served stale (docs/design.md, "Caches").
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Mapping
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from .lowering import mxfp8 as mx_lowering
from .lowering import register_decompositions
from .options import MXFP8Config
from .patterns.rewrite import SiteReport, rewrite

INDUCTOR = "inductor"  # the backend option holding Inductor config patches


@functools.cache
def _sources() -> tuple[str, ...]:
    root = pathlib.Path(__file__).parent
    return tuple(sorted(str(p) for p in root.rglob("*.py")))


def _uuid(config_key: str) -> str:
    flags = f"slice={mx_lowering.WEIGHT_SLICE_BYTES}"  # settable at run time
    return get_hash_for_files(_sources(), f"{config_key};{flags}").hex()


class CacheKeyPass(CustomGraphPass):
    """A no-op post-grad pass that puts the package sources and options into the cache keys."""

    def __init__(self, config_key: str) -> None:
        self.config_key = config_key

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return _uuid(self.config_key)


class PreGradRewrite(CustomGraphPass):
    """The rewrite as an Inductor pre-grad pass. `config=None`: sites of marked models only."""

    def __init__(self, config: MXFP8Config | None) -> None:
        self.config = config
        self.last_rows: list[SiteReport] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.last_rows = rewrite(graph.owning_module, self.config)

    def uuid(self) -> str:
        return _uuid(self.config.key() if self.config else "marked-models")


def split_options(options: MXFP8Config | Mapping[str, Any] | None) -> tuple[MXFP8Config, dict[str, Any]]:
    """The backend's options as (the pass's config, the Inductor config patches under "inductor")."""
    if isinstance(options, MXFP8Config) or options is None:
        return MXFP8Config.from_options(options), {}
    options = dict(options)
    patches = options.pop(INDUCTOR, None) or {}
    if not isinstance(patches, Mapping):
        raise ValueError(f"options[{INDUCTOR!r}] must be a dict of Inductor config patches, got {patches!r}")
    return MXFP8Config.from_options(options), dict(patches)


def mxfp8_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    *,
    options: MXFP8Config | Mapping[str, Any] | None = None,
    mode: str | None = None,
    **_: Any,
):
    """`torch.compile(model, backend="mxfp8", options={...})`.

    Options: an `MXFP8Config`, or its keys (include, exclude, recipe, rounding, wgrad) plus
    "inductor", a dict of Inductor config patches; any other key raises ValueError. `mode`
    selects Inductor's mode options (torch.compile refuses `mode` together with `options`: put
    the mode's patches under "inductor" instead).
    """
    from torch._inductor import config as inductor_config
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    ensure_registered()
    config, patches = split_options(options)
    config.check_graph_route("backend='mxfp8'")
    patches = {**(list_mode_options(mode) if mode else {}), **patches}
    if patches.get("post_grad_custom_post_pass") is not None:
        raise ValueError("backend='mxfp8' uses post_grad_custom_post_pass for its cache key; drop that option")
    with inductor_config.patch(patches):  # the pass plans for the Inductor that compiles (CUDA graphs or not)
        rewrite(gm, config)
    patches["post_grad_custom_post_pass"] = CacheKeyPass(config.key())
    return compile_fx(gm, example_inputs, config_patches=patches)


def _early_timing() -> dict[str, Any]:
    # torch >= 2.13 may run a pre-grad pass after the cache lookup ("late"), keying the cache on
    # the unrewritten graph: per-model decisions would leak between identical graphs
    return {"pre_grad_pass_timing": "early"} if hasattr(torch._inductor.config, "pre_grad_pass_timing") else {}


def inductor_options(config: MXFP8Config | None = None, /, **options: Any) -> dict[str, Any]:
    """Options for the default backend: `torch.compile(model, options=inductor_options(exclude=[...]))`.

    Takes an `MXFP8Config` or its keys (include, exclude, recipe, rounding, wgrad).
    """
    ensure_registered()
    config = MXFP8Config.from_options(config if config is not None else options)
    config.check_graph_route("inductor_options()")
    return {"pre_grad_custom_pass": PreGradRewrite(config), **_early_timing()}


def install_marked_model_pass() -> None:
    """Make the default backend rewrite the sites of marked models (once per process)."""
    ensure_registered()
    cfg = torch._inductor.config
    current = cfg.pre_grad_custom_pass
    if isinstance(current, PreGradRewrite) and current.config is None:
        return
    if current is not None:
        raise RuntimeError(
            "mxfp8_inductor.mxfp8() needs torch._inductor.config.pre_grad_custom_pass, which is already "
            f"set to {current!r}; use backend='mxfp8' or inductor_options() instead of marking the model"
        )
    cfg.pre_grad_custom_pass = PreGradRewrite(None)
    for key, value in _early_timing().items():
        setattr(cfg, key, value)


BACKEND_NAME = "mxfp8"


def register_backend_name() -> None:
    """Make `torch.compile(model, backend="mxfp8")` work where the package is imported from a plain
    path (a checkout, a notebook, a vendored copy) with no `torch_dynamo_backends` entry point
    installed. Called on import; it adds only the name, as third-party backends do. Where the entry
    point is installed Dynamo loads it lazily, and registering the name here as well would make that
    load fail as a duplicate, so the name is left to it."""
    from importlib.metadata import entry_points

    from torch._dynamo.backends.registry import _COMPILER_FNS

    if BACKEND_NAME in _COMPILER_FNS or BACKEND_NAME in entry_points(group="torch_dynamo_backends").names:
        return
    torch._dynamo.register_backend(name=BACKEND_NAME)(mxfp8_backend)


@functools.cache
def ensure_registered() -> None:
    """What the package adds to Inductor, once, on first use of an entry point (importing it adds
    only the `torch.ops.mxfp8` op definitions and the backend name): the ops' decompositions."""
    register_decompositions()
