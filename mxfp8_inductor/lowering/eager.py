"""The eager FP8 GEMMs: `grouped_mm` and `linear`, drop-ins for `torch._grouped_mm` and
`F.linear` that check their arguments, plan each GEMM and call the ops; and `linear_body`, what
the pass puts in a graph for a linear."""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..eligibility import check_grouped_mm_args, check_linear_args
from ..spec import op_args, site_specs
from .auto import plan_for
from .ops import grouped_mm_op, linear_op


def parameter_of(w: torch.Tensor) -> torch.Tensor | None:
    """The tensor whose writes key reuse of `w`'s quantization when `w` is passed to the eager op:
    `w` itself if it is a leaf (a parameter), the leaf it views, else None (a weight computed from
    others, or a DTensor's local shard, is quantized for each GEMM)."""
    if torch.compiler.is_compiling():
        return None  # a traced view's base is not a graph input here; the pass passes the parameter
    base = w._base if w._is_view() else w
    return base if base.is_leaf and not is_traceable_wrapper_subclass(base) else None


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, recipe: str = "mxfp8", rounding: str = "rceil",
               wgrad: str = "quantized", weight_cache: bool = False, autotune: bool = True) -> torch.Tensor:
    """FP8 drop-in for `torch._grouped_mm(a[M, K], b[E, K, N], offs)` -> [M, N] in a's dtype.

    Forward, input-gradient and weight-gradient GEMMs run in the recipe, "mxfp8", "fp8_rowwise",
    "fp8_blockwise" or "auto" (each GEMM the fastest of those and bf16 for its shape, timed on a
    CUDA GPU once per shape, or with `autotune=False` from the H200 cost model; lowering/auto.py);
    `wgrad="bf16"` keeps the weight gradient in bf16. `weight_cache=True` reuses b's FP8
    quantization while b is a parameter, or a view of one, that has not changed
    (lowering/weight_cache.py). `b` may be a transposed view of [E, N, K] or a contiguous [E, K, N];
    token groups may have any size (0 and non-multiples of 32 included). As with
    `torch._grouped_mm`, output rows past offs[-1] are unspecified.
    """
    check_grouped_mm_args(a, b, offs, recipe, rounding, wgrad, weight_cache, autotune)
    param = parameter_of(b) if weight_cache else None
    plan = plan_for(recipe, wgrad, M=a.shape[0], K=b.shape[-2], N=b.shape[-1], E=b.shape[0], dense=False,
                    device=a.device, autotune=autotune, rounding=rounding, cached=weight_cache)
    specs = site_specs(plan.impls, rounding=rounding, reuse_weight=param is not None)
    return grouped_mm_op(a, b, offs, *op_args(specs), param)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, recipe: str = "mxfp8",
           rounding: str = "rceil", wgrad: str = "quantized", weight_cache: bool = False,
           autotune: bool = True) -> torch.Tensor:
    """FP8 drop-in for `F.linear(x[..., K], w[N, K], bias)` -> [..., N] in x's dtype: forward,
    input-gradient and weight-gradient GEMMs in the recipe, each quantized along its own
    contraction (K, N, and the tokens); the other options as for `grouped_mm`."""
    check_linear_args(x, w, bias, recipe, rounding, wgrad, weight_cache, autotune)
    param = parameter_of(w) if weight_cache else None
    plan = plan_for(recipe, wgrad, M=math.prod(x.shape[:-1]), K=w.shape[1], N=w.shape[0], E=1, dense=True,
                    device=x.device, autotune=autotune, rounding=rounding, cached=weight_cache)
    specs = site_specs(plan.impls, rounding=rounding, reuse_weight=param is not None, dense=True)
    return linear_body(x, w, bias, *op_args(specs), param)


def linear_body(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, forward: str, input_grad: str,
                weight_grad: str, param: torch.Tensor | None) -> torch.Tensor:
    """`linear` without the argument checks, one encoded spec per GEMM: what the pass puts in a graph."""
    # rows counted, not inferred (-1): an empty K leaves no elements to infer them from
    out = linear_op(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), w, forward, input_grad, weight_grad, param)
    out = out.reshape(*x.shape[:-1], w.shape[0])
    return out if bias is None else out + bias
