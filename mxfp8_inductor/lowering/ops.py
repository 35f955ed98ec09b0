"""The differentiable FP8 GEMM ops: `mxfp8::grouped_mm` and `mxfp8::linear` with their gradient
ops (schemas and fake impls), and their Inductor decompositions.

out[M, N] = grouped_mm(a[M, K], b[E, K, N], offs) with each GEMM as its own `GemmSpec` says (the
forward op takes all three, encoded; each gradient op its own), each operand scaled along the
GEMM's contraction (docs/design.md, "Numerics contract"):
  forward      a along K,        b along K
  input grad   dY along N,       b along N
  weight grad  dY and a along M, per token group
`lowering/dispatch.py` runs each GEMM, `lowering/autograd.py` links the ops.
"""
from __future__ import annotations

import functools

import torch

from ..spec import GemmSpec, Role
from . import autograd, dispatch
from .library import LIB, STATEFUL


def _forward(a, b, offs, forward, input_grad, weight_grad, param, *, decomposing=False):
    MKNE = (a.shape[0], b.shape[-2], b.shape[-1], b.shape[0])
    return dispatch.run(GemmSpec.decode(forward, Role.FORWARD, False), a, MKNE, a, b, offs, param=param,
                        decomposing=decomposing)


def _input_grad(grad, b, offs, spec, param, *, decomposing=False):
    MKNE = (grad.shape[0], b.shape[-2], b.shape[-1], b.shape[0])
    return dispatch.run(GemmSpec.decode(spec, Role.INPUT_GRAD, False), grad, MKNE, grad, b, offs, param=param,
                        decomposing=decomposing)


def _weight_grad(grad, a, offs, spec, *, decomposing=False):
    """db[E, K, N] from grad[M, N] and a[M, K], or db[E, N, K] with the two swapped."""
    MKNE = (grad.shape[0], a.shape[1], grad.shape[1], offs.shape[0])
    return dispatch.run(GemmSpec.decode(spec, Role.WEIGHT_GRAD, False), grad, MKNE, grad, a, offs,
                        decomposing=decomposing)


@torch.library.custom_op(f"{LIB}::grouped_mm", mutates_args=(), tags=STATEFUL)
def grouped_mm_op(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, forward: str, input_grad: str, weight_grad: str,
    param: torch.Tensor | None,
) -> torch.Tensor:
    return _forward(a, b, offs, forward, input_grad, weight_grad, param)


@grouped_mm_op.register_fake
def _(a, b, offs, forward, input_grad, weight_grad, param):
    # every trace that captures the op (Dynamo, AOTAutograd) runs this first, outside the traced
    # code: the place to make sure Inductor can decompose it (and its backward ops)
    register_decompositions()
    return a.new_empty(a.shape[0], b.shape[-1])


@torch.library.custom_op(f"{LIB}::grouped_mm_input_grad", mutates_args=(), tags=STATEFUL)
def grouped_mm_input_grad_op(
    grad: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, spec: str, param: torch.Tensor | None
) -> torch.Tensor:
    return _input_grad(grad, b, offs, spec, param)


@grouped_mm_input_grad_op.register_fake
def _(grad, b, offs, spec, param):
    return grad.new_empty(grad.shape[0], b.shape[-2])


@torch.library.custom_op(f"{LIB}::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad_op(grad: torch.Tensor, a: torch.Tensor, offs: torch.Tensor, spec: str) -> torch.Tensor:
    return _weight_grad(grad, a, offs, spec)


@grouped_mm_weight_grad_op.register_fake
def _(grad, a, offs, spec):
    return grad.new_empty(offs.shape[0], a.shape[1], grad.shape[1])


autograd.register_grouped(grouped_mm_op, grouped_mm_input_grad_op, grouped_mm_weight_grad_op)


# --------------------------------------------------------------------------------------------
# Dense linears


def _dense_forward(x, w, forward, input_grad, weight_grad, param, *, decomposing=False):
    MKNE = (x.shape[0], w.shape[1], w.shape[0], 1)
    return dispatch.run(GemmSpec.decode(forward, Role.FORWARD, True), x, MKNE, x, w, param=param,
                        decomposing=decomposing)


def _dense_input_grad(grad, w, spec, param, *, decomposing=False):
    MKNE = (grad.shape[0], w.shape[1], w.shape[0], 1)
    return dispatch.run(GemmSpec.decode(spec, Role.INPUT_GRAD, True), grad, MKNE, grad, w, param=param,
                        decomposing=decomposing)


def _dense_weight_grad(grad, x, spec, *, decomposing=False):
    MKNE = (grad.shape[0], x.shape[1], grad.shape[1], 1)
    return dispatch.run(GemmSpec.decode(spec, Role.WEIGHT_GRAD, True), grad, MKNE, grad, x, decomposing=decomposing)


@torch.library.custom_op(f"{LIB}::linear", mutates_args=(), tags=STATEFUL)
def linear_op(
    x: torch.Tensor, w: torch.Tensor, forward: str, input_grad: str, weight_grad: str, param: torch.Tensor | None,
) -> torch.Tensor:
    """x[M, K] @ w[N, K]^T as the specs say (the bias is added outside, in the input's dtype)."""
    return _dense_forward(x, w, forward, input_grad, weight_grad, param)


@linear_op.register_fake
def _(x, w, forward, input_grad, weight_grad, param):
    register_decompositions()  # as for grouped_mm
    return x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op(f"{LIB}::linear_input_grad", mutates_args=(), tags=STATEFUL)
def linear_input_grad_op(grad: torch.Tensor, w: torch.Tensor, spec: str, param: torch.Tensor | None) -> torch.Tensor:
    return _dense_input_grad(grad, w, spec, param)


@linear_input_grad_op.register_fake
def _(grad, w, spec, param):
    return grad.new_empty(grad.shape[0], w.shape[1])


@torch.library.custom_op(f"{LIB}::linear_weight_grad", mutates_args=())
def linear_weight_grad_op(grad: torch.Tensor, x: torch.Tensor, spec: str) -> torch.Tensor:
    return _dense_weight_grad(grad, x, spec)


@linear_weight_grad_op.register_fake
def _(grad, x, spec):
    return grad.new_empty(grad.shape[1], x.shape[1])


autograd.register_dense(linear_op, linear_input_grad_op, linear_weight_grad_op)


@functools.cache
def register_decompositions() -> None:
    """Let Inductor decompose the GEMM ops into their quantizers and GEMMs, so identical
    quantizations (the tokens feeding w1 and w3) are computed once. Called on first use of an
    entry point, and by the forward ops' fake impls (any trace of them), never on import."""
    from torch._inductor import decomposition, lowering
    from torch._library.utils import get_layout_constraint_tag

    for op, fn in ((grouped_mm_op, _forward), (grouped_mm_input_grad_op, _input_grad),
                   (grouped_mm_weight_grad_op, _weight_grad), (linear_op, _dense_forward),
                   (linear_input_grad_op, _dense_input_grad), (linear_weight_grad_op, _dense_weight_grad)):
        overload = op._opoverload
        decomposition.decompositions[overload] = functools.partial(fn, decomposing=True)
        # a decomposition returning NotImplemented (a choice made per call, the native path)
        # leaves the op in the graph, which Inductor refuses for an op it has a decomposition of
        # unless a fallback lowering says to call it as an extern kernel (with the layout
        # constraint Inductor gives any custom op)
        constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(overload, with_default=True))
        lowering.make_fallback(overload, layout_constraint=constraint, override_decomp=True)
    decomposition.fast_random_decomps.cache_clear()  # a cached copy of the table predates us
