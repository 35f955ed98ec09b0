"""`python -m mxfp8_inductor.check MODEL` (or `mxfp8-check MODEL`): the equivalence tables of one
model. Every argument is checked before a model is built; a mistake ends in one line naming the fix."""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import logging
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..options import RECIPES, MXFP8Config
from . import __doc__ as USAGE
from .harness import OpAtSites, compare, log
from .zoo import transformers_model


def _recipes(value: str) -> list[str]:
    recipes = value.split(",")
    wrong = [r for r in recipes if r not in RECIPES]
    if wrong:
        raise argparse.ArgumentTypeError(f"unknown recipe(s) {wrong}: choose from {', '.join(RECIPES)}")
    return recipes


def _spec_problem(spec: str) -> str | None:
    """Why `spec` names no model we can build, or None; without building anything."""
    if ":" in spec and not pathlib.Path(spec).exists():
        module = spec.split(":", 1)[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a missing parent package
            found = False
        return None if found else f"no module {module!r} to import (from {spec!r}): is it on PYTHONPATH?"
    if pathlib.Path(spec).exists() or "/" in spec:
        return None  # a config folder or a Hub id
    import transformers

    if spec in transformers.CONFIG_MAPPING:
        return None
    close = difflib.get_close_matches(spec, list(transformers.CONFIG_MAPPING), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else " (a transformers model type, Hub id or folder)"
    return f"unknown model type {spec!r}{hint}"


def _load(spec: str, tiny: bool) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    if ":" in spec and not pathlib.Path(spec).exists():
        module, fn = spec.split(":", 1)
        model, inputs = getattr(importlib.import_module(module), fn)()
        return model, tuple(inputs)
    return transformers_model(spec, tiny)


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
    problem = _spec_problem(args.model)
    if problem:
        p.error(problem)
    logging.basicConfig(format="%(message)s")
    log.setLevel(logging.INFO)
    log.info("building %s", args.model)
    torch.manual_seed(args.seed)
    try:
        model, inputs = _load(args.model, tiny=not args.full_size)
    except OSError as e:  # transformers' "can't load the config" (offline, private, misspelt Hub id)
        p.error(f"cannot load {args.model!r}: {str(e).splitlines()[0]}")
    model = model.to(args.device, torch.bfloat16)
    inputs = pytree.tree_map(lambda t: t.to(args.device) if isinstance(t, torch.Tensor) else t, inputs)
    config = MXFP8Config.from_options({"recipe": args.recipe[0], "exclude": args.exclude, "include": args.include})
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
