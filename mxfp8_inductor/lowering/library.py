"""How the package's per-step ops are defined: the `mxfp8` op library and its output dtype."""

from __future__ import annotations

from collections.abc import Callable

import torch

LIB = "mxfp8"
OUT_DTYPE = torch.bfloat16


def define(name: str, schema: str, impl: Callable, fake: Callable) -> torch._ops.OpOverload:
    """An op without autograd that compiled graphs call once per GEMM operand per step.

    Defined with torch.library.define/impl rather than torch.library.custom_op: custom_op wraps
    every call in a Python autograd layer, several times the dispatch cost per call
    (benchmarks/bench_dispatch.py), and an MoE block calls a dozen such ops per step.
    """
    qualname = f"{LIB}::{name}"
    torch.library.define(qualname, schema)
    torch.library.impl(qualname, "default", impl)
    torch.library.register_fake(qualname, fake)
    return getattr(getattr(torch.ops, LIB), name).default


def like(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y laid out as torch.empty_like(x) (what the fake impls promise)."""
    if y.stride() == x.stride() and x.is_contiguous(memory_format=torch.contiguous_format):
        return y  # the common case, decided without allocating
    out = torch.empty_like(x, dtype=y.dtype)
    return y if out.stride() == y.stride() else out.copy_(y)
