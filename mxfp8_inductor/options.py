"""Options of the pass: the only place their allowed values are defined. A leaf module: it
imports nothing from the package."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, get_args

Recipe = Literal["mxfp8", "fp8_rowwise", "fp8_blockwise", "auto"]
Rounding = Literal["rceil", "floor"]
Wgrad = Literal["quantized", "bf16"]
Targets = Literal["experts", "all"]
RECIPES: tuple[str, ...] = get_args(Recipe)
ROUNDINGS: tuple[str, ...] = get_args(Rounding)
WGRADS: tuple[str, ...] = get_args(Wgrad)
TARGETS: tuple[str, ...] = get_args(Targets)
# dense linears that stay bf16 unless an include pattern names them: the output projection and
# MoE routers (torchao's and TorchTitan's float8 practice: precision-sensitive, little compute)
DENSE_EXCLUDE = ("lm_head", "output", "*.gate", "*.router", "*.router.*")
# dense linears with K or N below this stay bf16 under every recipe, "auto" included (its cost model
# then decides the rest per layer): on the H200 a dense FP8 linear (its three GEMMs together) with
# K or N of 1024 or less loses to bf16 at every token count calibrated (lowering/auto_h200.json)
DENSE_MIN_DIM = 2048


def check_choice(name: str, value: Any) -> None:
    """Raise ValueError unless `value` is an allowed recipe, rounding or wgrad."""
    allowed = {"recipe": RECIPES, "rounding": ROUNDINGS, "wgrad": WGRADS, "targets": TARGETS}[name]
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}: expected one of {allowed}")


def check_flag(name: str, value: Any) -> None:
    """Raise ValueError unless `value` is True or False: a truthy stand-in ("False", 1) would turn
    the option on unseen."""
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False, got {value!r}")

# FQN globs: dotted names with *, ? and [...] classes
_PATTERN_OK = re.compile(r"^[A-Za-z0-9_.*?\[\]!\-]+$")


def _check_pattern(pattern: Any) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"include/exclude patterns must be non-empty strings, got {pattern!r}")
    if not _PATTERN_OK.match(pattern) or pattern.count("[") != pattern.count("]"):
        raise ValueError(
            f"malformed FQN pattern {pattern!r}: use dotted module or parameter names with glob "
            "wildcards, e.g. 'layers.*.moe.experts' or '*.w2'"
        )
    return pattern


def _patterns(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a glob string or a list of them, got {value!r}")
    return tuple(_check_pattern(p) for p in value)


@dataclasses.dataclass(frozen=True)
class MXFP8Config:
    """What to rewrite and how.

    include: glob patterns over global module or parameter FQNs; empty means every site.
    exclude: patterns whose sites stay in bf16 (wins over include). A pattern naming a module
      also covers the modules under it.
    recipe: "mxfp8", "fp8_rowwise", "fp8_blockwise" (scales per 128-element tile: 1 x 128 for
      activations, 128 x 128 for weights), or "auto" (per GEMM, the fastest of mxfp8,
      fp8_rowwise and bf16).
    autotune: with recipe "auto" on a CUDA GPU, time each GEMM's candidates there, once per shape
      and machine (kept in Inductor's cache directory); False, or off CUDA: a cost model
      calibrated on the H200. rounding: "rceil" (default) or "floor" (the scale exponent
      rule of both recipes). wgrad: "quantized" (the recipe's weight gradient) or "bf16".
    targets: "experts" (routed-expert grouped GEMMs) or "all" (dense linears on parameter weights
      too, except `DENSE_EXCLUDE` and layers with K or N below `dense_min_dim`).
    weight_cache: reuse each weight's FP8 form (fp8_rowwise, fp8_blockwise and native MXFP8) across GEMMs and
      microbatches until the parameter changes or an optimizer steps; fp8_rowwise then scales each
      expert's matrix as a whole, so that one form serves both GEMMs. Off by default: it holds the
      forms for the whole model until the step (docs/design.md, "Weight cache").
    mxfp8_fused: mxfp8's grouped GEMMs on CUDA GPUs in Triton kernels that round their bf16
      operands as they load them, instead of separate quantizers; opt-in, slower than the
      separate path on the H200 (docs/performance.md, "Fused grouped GEMMs").
    fsdp_fp8_all_gather: under FSDP2, all-gather the marked experts' weights in FP8 (about half
      of bf16's bytes). Each expert weight is then rounded once for both of its GEMMs (32x32
      tiles for mxfp8, the whole matrix for fp8_rowwise; docs/design.md, "Shared weight scales"),
      with or without FSDP2, so a sharded run computes as the unsharded one. Mark the model with
      `mxfp8()` before `fully_shard`; recipe "mxfp8" or "fp8_rowwise", rounding "rceil".
    filter_fn: `filter_fn(module, fqn) -> bool`, called on each expert module (one owning 3-D
      parameters) with its global FQN when a model is marked with `mxfp8()`; False keeps the
      module's sites in bf16. Marking only: the graph routes see no modules.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    recipe: Recipe = "mxfp8"
    rounding: Rounding = "rceil"
    wgrad: Wgrad = "quantized"
    targets: Targets = "experts"
    dense_min_dim: int = DENSE_MIN_DIM
    weight_cache: bool = False
    autotune: bool = True
    mxfp8_fused: bool = False
    fsdp_fp8_all_gather: bool = False
    filter_fn: Callable[[Any, str], bool] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "include", _patterns(self.include, "include"))
        object.__setattr__(self, "exclude", _patterns(self.exclude, "exclude"))
        for field in ("recipe", "rounding", "wgrad", "targets"):
            check_choice(field, getattr(self, field))
        # bool is an int subclass: dense_min_dim=True would read as 1
        if type(self.dense_min_dim) is not int or self.dense_min_dim < 0:
            raise ValueError(f"dense_min_dim must be a non-negative int, got {self.dense_min_dim!r}")
        for field in ("weight_cache", "autotune", "mxfp8_fused", "fsdp_fp8_all_gather"):
            check_flag(field, getattr(self, field))
        if self.fsdp_fp8_all_gather:
            self._check_shared_weights()
        if self.filter_fn is not None and not callable(self.filter_fn):
            raise ValueError(f"filter_fn must be a callable (module, fqn) -> bool, got {self.filter_fn!r}")

    def _check_shared_weights(self) -> None:
        if self.recipe not in ("mxfp8", "fp8_rowwise"):
            raise ValueError(f"fsdp_fp8_all_gather gathers one FP8 form of each weight, which recipe {self.recipe!r} "
                             "does not fix: use recipe='mxfp8' or 'fp8_rowwise'")
        if self.rounding != "rceil":
            raise ValueError("fsdp_fp8_all_gather needs rounding='rceil': under 'floor' a GEMM's own scaling would "
                             "round the shared-scale weight a second time")
        if self.weight_cache:
            raise ValueError("fsdp_fp8_all_gather and weight_cache=True do not combine: the GEMMs take the weight "
                             "rounded in the graph, which is never reused; drop weight_cache")

    def check_graph_route(self, route: str) -> None:
        """Raise ValueError if these options need module objects, which `route` (a compile or
        explain route that sees only the graph) does not have."""
        if self.fsdp_fp8_all_gather:
            raise ValueError(f"fsdp_fp8_all_gather changes how parameters are all-gathered, which {route} does not "
                             "see: mark the model with mxfp8_inductor.mxfp8(model, fsdp_fp8_all_gather=True) before "
                             "fully_shard and compile it with the default backend")
        if self.filter_fn is not None:
            raise ValueError(f"filter_fn is called on modules, which {route} does not see: mark the model "
                             "with mxfp8_inductor.mxfp8(model, filter_fn=...) and compile it with the default backend")

    @classmethod
    def from_options(cls, options: MXFP8Config | Mapping[str, Any] | None) -> MXFP8Config:
        """A config from keyword options (or the config itself); unknown keys raise ValueError."""
        if isinstance(options, MXFP8Config):
            return options
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"mxfp8 options must be an MXFP8Config or a dict, got {type(options).__name__}")
        options = dict(options or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(options) - names
        if unknown:
            raise ValueError(f"unknown mxfp8 option(s) {sorted(unknown)}: expected some of {sorted(names)}")
        return cls(**options)

    def key(self) -> str:
        """Stable text for cache keys (a filter_fn by its qualified name)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fn = fields.pop("filter_fn")
        if fn is not None:
            fields["filter_fn"] = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
        return json.dumps(fields, sort_keys=True)

    def matches(self, module_fqn: str | None, weight_fqn: str | None, dense: bool = False) -> tuple[bool, str]:
        """(rewrite?, reason) for a site from its FQNs by the include/exclude patterns and the dense
        defaults; `dense`: a linear, not a grouped GEMM. The pass's whole decision is
        `patterns.rewrite.decide`."""
        names = _candidates(module_fqn, weight_fqn)
        hit = _first_match(self.exclude, names)
        if hit:
            return False, f"excluded by {hit!r}"
        if self.include:
            hit = _first_match(self.include, names)
            if not hit:
                return False, f"matches no include pattern {list(self.include)}"
            return True, f"included by {hit!r}"
        if dense:
            hit = _first_match(DENSE_EXCLUDE, names)
            if hit:
                return False, f"kept bf16 by default ({hit!r}: output projection or router)"
            return True, "dense linear"
        return True, "routed-expert grouped GEMM"

    def unmatched(self, fqns: Iterable[tuple[str | None, str | None]]) -> list[str]:
        """Warnings for the include/exclude patterns that match none of these (module FQN, weight
        FQN) pairs, each naming the closest FQNs there are."""
        names = sorted({n for m, w in fqns for n in _candidates(m, w)})
        out = []
        for kind, patterns in (("include", self.include), ("exclude", self.exclude)):
            for pattern in patterns:
                if not _first_match((pattern,), names):
                    close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.0)
                    out.append(f"mxfp8 {kind} pattern {pattern!r} matches no grouped-matmul site; closest FQNs: "
                               f"{close or 'none'}")
        return out


def _candidates(module_fqn: str | None, weight_fqn: str | None) -> list[str]:
    """The weight FQN, the module FQN and every ancestor module FQN."""
    names = [weight_fqn] if weight_fqn else []
    if module_fqn:
        parts = module_fqn.split(".")
        names += [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    return names


def _first_match(patterns: tuple[str, ...], names: list[str]) -> str | None:
    for pattern in patterns:
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            return pattern
    return None
