"""`python -m mxfp8_inductor.check MODEL` (or `mxfp8-check MODEL`): the equivalence tables of one
model. Every argument is checked before a model is built (a builder's return value once it returns);
a mistake ends in one line naming the fix, with exit status 2, as argparse's own errors do."""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import logging
import os
import pathlib
import re
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..options import RECIPES, MXFP8Config
from . import __doc__ as USAGE
from .harness import OpAtSites, compare, log
from .zoo import model_from_config, text_config


def _recipes(value: str) -> list[str]:
    recipes = value.split(",")
    wrong = [r for r in recipes if r not in RECIPES]
    if wrong:
        raise argparse.ArgumentTypeError(f"unknown recipe(s) {wrong}: choose from {', '.join(RECIPES)}")
    return recipes


# a Hub id, namespace/name (huggingface_hub's rule, loosely): any other spec with a slash is a folder
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def _builder(spec: str) -> tuple[str, str] | None:
    """(module, function) of a `module:fn` spec, None for any other spec."""
    if ":" not in spec or pathlib.Path(spec).exists():
        return None
    module, fn = spec.split(":", 1)
    return module, fn


def _spec_problem(spec: str) -> str | None:
    """Why `spec` names no model we can build, or None; without building anything (a builder's
    module is imported, to find the function)."""
    builder = _builder(spec)
    if builder is not None:
        return _builder_problem(*builder)
    if pathlib.Path(spec).exists():
        return None  # a config folder: its config is checked as it loads
    if "/" in spec or os.sep in spec:
        return None if _HUB_ID.fullmatch(spec) else f"no folder {spec!r} (a Hub id is namespace/name)"
    import transformers

    if spec in transformers.CONFIG_MAPPING:
        return None
    close = difflib.get_close_matches(spec, list(transformers.CONFIG_MAPPING), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else " (a transformers model type, Hub id or folder)"
    return f"unknown model type {spec!r}{hint}"


def _builder_problem(module: str, fn: str) -> str | None:
    """Why `module:fn` names no function to call, or None (the module is imported to look)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        found = False
    if not found:
        return f"no module {module!r} to import (from '{module}:{fn}'): is it on PYTHONPATH?"
    mod = importlib.import_module(module)
    if callable(getattr(mod, fn, None)):
        return None
    names = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))]
    close = difflib.get_close_matches(fn, names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"module {module!r} has no function {fn!r} returning (model, inputs){hint}"


def _built_problem(spec: str, built: Any) -> str | None:
    """Why a builder's return value is not (model, inputs), or None."""
    if not (isinstance(built, (tuple, list)) and len(built) == 2):
        return f"{spec} must return a pair (model, inputs), got {type(built).__name__}"
    model, inputs = built
    if not isinstance(model, torch.nn.Module):
        return f"{spec} must return (model, inputs) with a torch.nn.Module model, got {type(model).__name__}"
    if not isinstance(inputs, (tuple, list)):
        # a tuple() of one tensor would split it along its first dimension
        return (f"{spec} must return (model, inputs) with inputs a tuple or list of the forward's arguments, got "
                f"{type(inputs).__name__} (one tensor x: return (model, (x,)))")
    return None


def _load(spec: str, tiny: bool, p: argparse.ArgumentParser) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The model and its inputs; a spec that loads no config, or a builder that returns no
    (model, inputs), is the user's mistake: `p.error`."""
    builder = _builder(spec)
    if builder is not None:
        built = getattr(importlib.import_module(builder[0]), builder[1])()
        problem = _built_problem(spec, built)
        if problem:
            p.error(problem)
        return built[0], tuple(built[1])
    try:
        config = text_config(spec)
    except (OSError, ValueError) as e:
        # transformers' "can't load the config" (offline, private, misspelt Hub id, a folder
        # without config.json) and "does not recognize this architecture" (unknown model_type)
        p.error(f"cannot load {spec!r}: {str(e).strip().splitlines()[0]}")
    return model_from_config(config, tiny)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxfp8_inductor.check", description=USAGE.split("\n\n")[0])
    p.add_argument("model", help="transformers model type, Hub id or config folder; "
                                 "or module:fn returning (model, inputs)")
    p.add_argument("--recipe", type=_recipes, default=["mxfp8", "fp8_rowwise"],
                   help=f"comma-separated, from {', '.join(RECIPES)} (default: mxfp8,fp8_rowwise)")
    p.add_argument("--exclude", action="append", default=[], help="FQN glob to keep in bf16 (repeatable)")
    p.add_argument("--include", action="append", default=[], help="FQN glob to rewrite (repeatable)")
    p.add_argument("--full-size", action="store_true", help="keep a transformers config's own sizes")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda runs the GPU kernels")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA GPU; run with --device cpu")
    try:  # the patterns, checked as the compile will check them, before anything is built
        config = MXFP8Config.from_options({"recipe": args.recipe[0], "exclude": args.exclude,
                                           "include": args.include})
    except ValueError as e:
        p.error(str(e))
    problem = _spec_problem(args.model)
    if problem:
        p.error(problem)
    logging.basicConfig(format="%(message)s")
    log.setLevel(logging.INFO)
    log.info("building %s", args.model)
    torch.manual_seed(args.seed)
    model, inputs = _load(args.model, not args.full_size, p)
    model = model.to(args.device, torch.bfloat16)
    inputs = pytree.tree_map(lambda t: t.to(args.device) if isinstance(t, torch.Tensor) else t, inputs)
    probe = OpAtSites(config, model)
    with probe, torch.no_grad():
        model(*inputs)
    if probe.calls == 0:
        print(f"{args.model}: no routed-expert grouped matmul the pass would rewrite (a dense model, or every "
              "expert excluded): nothing to compare", file=sys.stderr)
        return 2
    results = compare(model, inputs, args.recipe, exclude=args.exclude, include=args.include)
    for result in results:
        print(result, end="\n\n")
    return int(not all(r.passed for r in results))


if __name__ == "__main__":
    sys.exit(main())
