"""The differentiable FP8 GEMMs: the `mxfp8::grouped_mm` and `mxfp8::linear` custom ops, their
autograd, and the recipes they dispatch to.

out[M, N] = grouped_mm(a[M, K], b[E, K, N], offs) with each GEMM in its own recipe ("mxfp8",
"fp8_rowwise" or "bf16": the op takes one per role), each operand scaled along the GEMM's
contraction (docs/design.md, "Numerics contract"):
  forward      a along K,        b along K
  input grad   dY along N,       b along N
  weight grad  dY and a along M, per token group
Each GEMM runs an implementation of `lowering/recipe.py`'s `Recipe` (`recipe.RECIPES`).
"""
from __future__ import annotations

import functools
import math

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..eligibility import check_grouped_mm_args, check_linear_args
from ..kernels import shared_weight as shared_weight_rounding
from ..registry import DEFERRED, Gemm
from . import auto, measure
from .auto import plan_for
from .library import LIB
from .recipe import RECIPES


def _result(out, like: torch.Tensor):
    return out if out is NotImplemented else out.to(like.dtype)


# run-time choices per (M, K, N, E, dense, device, ...), with the calibration they were read from
# (a test may swap it): a plan costs tens of microseconds, a lookup well under one
_CHOICES: dict[tuple, tuple[dict, tuple[Gemm, Gemm, Gemm]]] = {}
_MAX_CHOICES = 4096  # token counts vary per step under expert parallelism: start over past this


def _timed_rows(M: int, E: int) -> int:
    """The token count a choice timed per call times for M rows in E groups: tokens per group rounded to a power
    of two, so that each bucket is timed once however the count varies from step to step."""
    per_group = max(M / max(E, 1), 1.0)
    return max(E, 1) << round(math.log2(per_group))


def _choice(deferred: Gemm, role: int, M: int, K: int, N: int, E: int, dense: bool, device: torch.device,
            rounding: str, cached: bool) -> Gemm:
    """A choice the pass left to run time, made per call from this call's shapes, as the eager op
    makes it: from the cost model (PER_CALL), or timed on the device (PER_CALL_TIMED)."""
    timed = deferred == Gemm.PER_CALL_TIMED and measure.measurable(device)
    if timed:
        M = _timed_rows(M, E)
    key, calibration = (M, K, N, E, dense, device, timed, rounding, cached), auto.table()
    hit = _CHOICES.get(key)
    if hit is None or hit[0] is not calibration:
        if len(_CHOICES) >= _MAX_CHOICES:
            _CHOICES.clear()
        plan = plan_for("auto", "quantized", M=M, K=K, N=N, E=E, dense=dense, device=device, autotune=timed,
                        rounding=rounding, cached=cached)
        hit = _CHOICES[key] = (calibration, plan.recipes)
    return hit[1][role]


_NO_WEIGHT = object()  # the weight gradient's calls: no weight operand, no `param`
# each method's result dims, of M, K, N and E (the fake impls' shapes): what an empty GEMM returns
_OUT_DIMS = {"forward": "MN", "dgrad": "MK", "wgrad": "EKN", "dense_forward": "MN", "dense_dgrad": "MK",
             "dense_wgrad": "NK"}


def _gemm(method: str, recipe: str, role: int, like: torch.Tensor, MKNE: tuple[int, int, int, int], *operands,
          rounding: str, param=_NO_WEIGHT, shared_weight: bool = False, decomposing: bool):
    """`RECIPES[recipe].<method>(*operands, rounding[, param], decomposing)` in `like`'s dtype
    (`recipe` a `Gemm` value); a choice deferred to run time is made for this call's M, K, N, E,
    and declines to decompose (Inductor keeps the op). `shared_weight`: the weight operand (the
    second) is rounded once for both its GEMMs (docs/design.md, "Shared weight scales"), in each
    GEMM anew rather than saved for the backward beside it."""
    gemm = Gemm(recipe)  # ValueError naming the value and the valid ones for anything else
    sizes = dict(zip("MKNE", MKNE))
    if sizes["K"] == 0 or sizes["N"] == 0:
        # nothing to multiply: the exact result is zeros (empty where N or K is the output's), as
        # torch._grouped_mm gives where it runs; the quantizers and torch's GEMMs refuse the
        # unaligned strides of an empty dimension, and "auto" has no cost for it
        return like.new_zeros([sizes[d] for d in _OUT_DIMS[method]])
    if shared_weight:
        x, b, *rest = operands
        operands = (x, shared_weight_rounding.quantize_dequantize(b, gemm.numerics, rounding), *rest)
    weight = () if param is _NO_WEIGHT else (param,)
    if gemm in DEFERRED:
        if decomposing:
            return NotImplemented
        cached = param is not _NO_WEIGHT and param is not None
        gemm = _choice(gemm, role, *MKNE, method.startswith("dense"), like.device, rounding, cached)
    return _result(getattr(RECIPES[gemm], method)(*operands, rounding, *weight, decomposing), like)


def _forward(a, b, offs, forward, dgrad, wgrad, rounding, param, shared_weight=False, *, decomposing=False):
    MKNE = (a.shape[0], b.shape[-2], b.shape[-1], b.shape[0])
    return _gemm("forward", forward, 0, a, MKNE, a, b, offs, rounding=rounding, param=param,
                 shared_weight=shared_weight, decomposing=decomposing)


def _dgrad(grad, b, offs, recipe, rounding, param, shared_weight=False, *, decomposing=False):
    MKNE = (grad.shape[0], b.shape[-2], b.shape[-1], b.shape[0])
    return _gemm("dgrad", recipe, 1, grad, MKNE, grad, b, offs, rounding=rounding, param=param,
                 shared_weight=shared_weight, decomposing=decomposing)


def _wgrad(grad, a, offs, recipe, rounding, *, decomposing=False):
    """db[E, K, N] from grad[M, N] and a[M, K], or db[E, N, K] with the two swapped (never for a
    choice deferred to run time, which reads K and N from the operands)."""
    MKNE = (grad.shape[0], a.shape[1], grad.shape[1], offs.shape[0])
    return _gemm("wgrad", recipe, 2, grad, MKNE, grad, a, offs, rounding=rounding, decomposing=decomposing)


@torch.library.custom_op(f"{LIB}::grouped_mm", mutates_args=())
def grouped_mm_op(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, forward: str, dgrad: str, wgrad: str, rounding: str,
    param: torch.Tensor | None, shared_weight: bool = False,
) -> torch.Tensor:
    return _forward(a, b, offs, forward, dgrad, wgrad, rounding, param, shared_weight)


@grouped_mm_op.register_fake
def _(a, b, offs, forward, dgrad, wgrad, rounding, param, shared_weight=False):
    # every trace that captures the op (Dynamo, AOTAutograd) runs this first, outside the traced
    # code: the place to make sure Inductor can decompose it (and its backward ops)
    register_decompositions()
    return a.new_empty(a.shape[0], b.shape[-1])


@torch.library.custom_op(f"{LIB}::grouped_mm_dgrad", mutates_args=())
def grouped_mm_dgrad_op(
    grad: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str, param: torch.Tensor | None,
    shared_weight: bool = False,
) -> torch.Tensor:
    return _dgrad(grad, b, offs, recipe, rounding, param, shared_weight)


@grouped_mm_dgrad_op.register_fake
def _(grad, b, offs, recipe, rounding, param, shared_weight=False):
    return grad.new_empty(grad.shape[0], b.shape[-2])


@torch.library.custom_op(f"{LIB}::grouped_mm_wgrad", mutates_args=())
def grouped_mm_wgrad_op(
    grad: torch.Tensor, a: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str
) -> torch.Tensor:
    return _wgrad(grad, a, offs, recipe, rounding)


@grouped_mm_wgrad_op.register_fake
def _(grad, a, offs, recipe, rounding):
    return grad.new_empty(offs.shape[0], a.shape[1], grad.shape[1])


def _row_major(grad: torch.Tensor) -> torch.Tensor:
    """The incoming gradient in row-major layout: it may be expanded (zero strides), which an
    empty tensor keeps through `.contiguous()`."""
    if guard_or_false(grad.numel() == 0):
        return grad.new_empty(grad.shape)
    return grad.contiguous()


def _setup_context(ctx, inputs, output):
    a, b, offs, forward, dgrad, wgrad, rounding, param, shared_weight = inputs
    ctx.save_for_backward(a, b, offs, param)
    ctx.dgrad, ctx.wgrad, ctx.rounding, ctx.shared_weight = dgrad, wgrad, rounding, shared_weight


def _backward(ctx, grad):
    a, b, offs, param = ctx.saved_tensors
    grad = _row_major(grad)
    da = db = None
    if ctx.needs_input_grad[0]:
        da = grouped_mm_dgrad_op(grad, b, offs, ctx.dgrad, ctx.rounding, param, ctx.shared_weight)
    if ctx.needs_input_grad[1]:
        # the weight gradient is symmetric in its operands: compute it in the weight's own
        # layout (b is usually a transposed view of [E, N, K]), which saves a transposing copy
        swap = b.stride(-2) == 1 and Gemm(ctx.wgrad) not in DEFERRED
        x, y = (grad, a) if swap else (a, grad)
        db = grouped_mm_wgrad_op(y, x, offs, ctx.wgrad, ctx.rounding)
        db = (db.transpose(-2, -1) if swap else db).to(b.dtype)
    return da, db, None, None, None, None, None, None, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Dense linears


def _dense_forward(x, w, forward, dgrad, wgrad, rounding, param, *, decomposing=False):
    MKNE = (x.shape[0], w.shape[1], w.shape[0], 1)
    return _gemm("dense_forward", forward, 0, x, MKNE, x, w, rounding=rounding, param=param, decomposing=decomposing)


def _dense_dgrad(grad, w, recipe, rounding, param, *, decomposing=False):
    MKNE = (grad.shape[0], w.shape[1], w.shape[0], 1)
    return _gemm("dense_dgrad", recipe, 1, grad, MKNE, grad, w, rounding=rounding, param=param,
                 decomposing=decomposing)


def _dense_wgrad(grad, x, recipe, rounding, *, decomposing=False):
    MKNE = (grad.shape[0], x.shape[1], grad.shape[1], 1)
    return _gemm("dense_wgrad", recipe, 2, grad, MKNE, grad, x, rounding=rounding, decomposing=decomposing)


@torch.library.custom_op(f"{LIB}::linear", mutates_args=())
def linear_op(
    x: torch.Tensor, w: torch.Tensor, forward: str, dgrad: str, wgrad: str, rounding: str,
    param: torch.Tensor | None,
) -> torch.Tensor:
    """x[M, K] @ w[N, K]^T in the recipe (the bias is added outside, in the input's dtype)."""
    return _dense_forward(x, w, forward, dgrad, wgrad, rounding, param)


@linear_op.register_fake
def _(x, w, forward, dgrad, wgrad, rounding, param):
    register_decompositions()  # as for grouped_mm
    return x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op(f"{LIB}::linear_dgrad", mutates_args=())
def linear_dgrad_op(
    grad: torch.Tensor, w: torch.Tensor, recipe: str, rounding: str, param: torch.Tensor | None
) -> torch.Tensor:
    return _dense_dgrad(grad, w, recipe, rounding, param)


@linear_dgrad_op.register_fake
def _(grad, w, recipe, rounding, param):
    return grad.new_empty(grad.shape[0], w.shape[1])


@torch.library.custom_op(f"{LIB}::linear_wgrad", mutates_args=())
def linear_wgrad_op(grad: torch.Tensor, x: torch.Tensor, recipe: str, rounding: str) -> torch.Tensor:
    return _dense_wgrad(grad, x, recipe, rounding)


@linear_wgrad_op.register_fake
def _(grad, x, recipe, rounding):
    return grad.new_empty(grad.shape[1], x.shape[1])


def _setup_linear(ctx, inputs, output):
    x, w, forward, dgrad, wgrad, rounding, param = inputs
    ctx.save_for_backward(x, w, param)
    ctx.dgrad, ctx.wgrad, ctx.rounding = dgrad, wgrad, rounding


def _linear_backward(ctx, grad):
    x, w, param = ctx.saved_tensors
    grad = _row_major(grad)
    dx = dw = None
    if ctx.needs_input_grad[0]:
        dx = linear_dgrad_op(grad, w, ctx.dgrad, ctx.rounding, param)
    if ctx.needs_input_grad[1]:
        dw = linear_wgrad_op(grad, x, ctx.wgrad, ctx.rounding).to(w.dtype)
    return dx, dw, None, None, None, None, None


linear_op.register_autograd(_linear_backward, setup_context=_setup_linear)


@functools.cache
def register_decompositions() -> None:
    """Let Inductor decompose the GEMM ops into their quantizers and GEMMs, so identical
    quantizations (the tokens feeding w1 and w3) are computed once. Called on first use of an
    entry point, and by the forward ops' fake impls (any trace of them), never on import."""
    from torch._inductor import decomposition, lowering
    from torch._library.utils import get_layout_constraint_tag

    for op, fn in ((grouped_mm_op, _forward), (grouped_mm_dgrad_op, _dgrad), (grouped_mm_wgrad_op, _wgrad),
                   (linear_op, _dense_forward), (linear_dgrad_op, _dense_dgrad), (linear_wgrad_op, _dense_wgrad)):
        overload = op._opoverload
        decomposition.decompositions[overload] = functools.partial(fn, decomposing=True)
        # a decomposition returning NotImplemented (a recipe chosen per call, the native path)
        # leaves the op in the graph, which Inductor refuses for an op it has a decomposition of
        # unless a fallback lowering says to call it as an extern kernel (with the layout
        # constraint Inductor gives any custom op)
        constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(overload, with_default=True))
        lowering.make_fallback(overload, layout_constraint=constraint, override_decomp=True)
    decomposition.fast_random_decomps.cache_clear()  # a cached copy of the table predates us


def parameter_of(w: torch.Tensor) -> torch.Tensor | None:
    """The tensor whose version counter keys reuse of `w`'s quantization when `w` is passed to the
    eager op: `w` itself if it is a leaf (a parameter), the leaf it views, else None (a weight
    computed from others, or a DTensor's local shard, is quantized for each GEMM)."""
    if torch.compiler.is_compiling():
        return None  # a traced view's base is not a graph input here; the pass passes the parameter
    base = w._base if w._is_view() else w
    return base if base.is_leaf and not is_traceable_wrapper_subclass(base) else None


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    *,
    recipe: str = "mxfp8",
    rounding: str = "rceil",
    wgrad: str = "quantized",
    weight_cache: bool = False,
    autotune: bool = True,
) -> torch.Tensor:
    """FP8 drop-in for `torch._grouped_mm(a[M, K], b[E, K, N], offs)` -> [M, N] in a's dtype.

    Forward, input-gradient and weight-gradient GEMMs run in the recipe, "mxfp8", "fp8_rowwise"
    or "auto" (each GEMM the fastest of those and bf16 for its shape, timed on a CUDA GPU once
    per shape, or with `autotune=False` from the H200 cost model; lowering/auto.py);
    `wgrad="bf16"` keeps the weight gradient in bf16. `weight_cache=True` reuses b's FP8
    quantization while b is a parameter, or a view of one, that has not changed
    (lowering/weights.py). `b` may be a transposed view of [E, N, K] or a contiguous [E, K, N];
    token groups may have any size (0 and non-multiples of 32 included). As with
    `torch._grouped_mm`, output rows past offs[-1] are unspecified.
    """
    check_grouped_mm_args(a, b, offs, recipe, rounding, wgrad, weight_cache, autotune)
    plan = plan_for(recipe, wgrad, M=a.shape[0], K=b.shape[-2], N=b.shape[-1], E=b.shape[0], dense=False,
                    device=a.device, autotune=autotune, rounding=rounding, cached=weight_cache)
    return grouped_mm_op(a, b, offs, *plan.op_args(), rounding, parameter_of(b) if weight_cache else None)


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    recipe: str = "mxfp8",
    rounding: str = "rceil",
    wgrad: str = "quantized",
    weight_cache: bool = False,
    autotune: bool = True,
) -> torch.Tensor:
    """FP8 drop-in for `F.linear(x[..., K], w[N, K], bias)` -> [..., N] in x's dtype: forward,
    input-gradient and weight-gradient GEMMs in the recipe, each quantized along its own
    contraction (K, N, and the tokens); the other options as for `grouped_mm`."""
    check_linear_args(x, w, bias, recipe, rounding, wgrad, weight_cache, autotune)
    plan = plan_for(recipe, wgrad, M=math.prod(x.shape[:-1]), K=w.shape[1], N=w.shape[0], E=1, dense=True,
                    device=x.device, autotune=autotune, rounding=rounding, cached=weight_cache)
    return linear_body(x, w, bias, *plan.op_args(), rounding, parameter_of(w) if weight_cache else None)


def linear_body(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, forward: str, dgrad: str, wgrad: str,
                rounding: str, param: torch.Tensor | None) -> torch.Tensor:
    """`linear` without the argument checks, one recipe per GEMM: what the pass puts in a graph."""
    # rows counted, not inferred (-1): an empty K leaves no elements to infer them from
    out = linear_op(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), w, forward, dgrad, wgrad, rounding, param)
    out = out.reshape(*x.shape[:-1], w.shape[0])
    return out if bias is None else out + bias
