"""`python -m mxfp8_inductor.check MODEL`: the equivalence tables of one model."""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import __doc__ as USAGE
from .harness import compare
from .zoo import transformers_model


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
    p.add_argument("--recipe", default="mxfp8,fp8_rowwise", help="comma-separated recipes (default: both)")
    p.add_argument("--exclude", action="append", default=[], help="FQN glob to keep in bf16 (repeatable)")
    p.add_argument("--include", action="append", default=[], help="FQN glob to rewrite (repeatable)")
    p.add_argument("--full-size", action="store_true", help="keep a transformers config's own sizes")
    p.add_argument("--device", default="cpu", help="device to run on (cuda runs the GPU kernels)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    model, inputs = _load(args.model, tiny=not args.full_size)
    model = model.to(args.device, torch.bfloat16)
    inputs = pytree.tree_map(lambda t: t.to(args.device) if isinstance(t, torch.Tensor) else t, inputs)
    results = compare(model, inputs, args.recipe.split(","), exclude=args.exclude, include=args.include)
    for result in results:
        print(result, end="\n\n")
    return int(not all(r.passed for r in results))


if __name__ == "__main__":
    sys.exit(main())
