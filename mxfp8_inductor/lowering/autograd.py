"""The autograd of the GEMM ops: the forward op saves its operands and the specs of its two
gradient GEMMs; the backward runs each gradient op with its own spec."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ..spec import GemmSpec, Role


def _row_major(grad: torch.Tensor) -> torch.Tensor:
    """The incoming gradient in row-major layout: it may be expanded (zero strides), which an
    empty tensor keeps through `.contiguous()`."""
    if guard_or_false(grad.numel() == 0):
        return grad.new_empty(grad.shape)
    return grad.contiguous()


def register_grouped(op, input_grad_op: Callable, weight_grad_op: Callable) -> None:
    """Autograd of `grouped_mm(a, b, offs, forward, input_grad, weight_grad, param)`."""

    def setup_context(ctx, inputs, output):
        a, b, offs, forward, input_grad, weight_grad, param = inputs
        ctx.save_for_backward(a, b, offs, param)
        ctx.input_grad, ctx.weight_grad = input_grad, weight_grad

    def backward(ctx, grad):
        a, b, offs, param = ctx.saved_tensors
        grad = _row_major(grad)
        da = db = None
        if ctx.needs_input_grad[0]:
            da = input_grad_op(grad, b, offs, ctx.input_grad, param)
        if ctx.needs_input_grad[1]:
            # the weight gradient is symmetric in its operands: compute it in the weight's own
            # layout (b is usually a transposed view of [E, N, K]), which saves a transposing
            # copy; a choice left to each call reads K and N from the operands, so never there
            deferred = GemmSpec.decode(ctx.weight_grad, Role.WEIGHT_GRAD, dense=False).impl.deferred
            swap = b.stride(-2) == 1 and not deferred
            x, y = (grad, a) if swap else (a, grad)
            db = weight_grad_op(y, x, offs, ctx.weight_grad)
            db = (db.transpose(-2, -1) if swap else db).to(b.dtype)
        return da, db, None, None, None, None, None

    op.register_autograd(backward, setup_context=setup_context)


def register_dense(op, input_grad_op: Callable, weight_grad_op: Callable) -> None:
    """Autograd of `linear(x, w, forward, input_grad, weight_grad, param)`."""

    def setup_context(ctx, inputs, output):
        x, w, forward, input_grad, weight_grad, param = inputs
        ctx.save_for_backward(x, w, param)
        ctx.input_grad, ctx.weight_grad = input_grad, weight_grad

    def backward(ctx, grad):
        x, w, param = ctx.saved_tensors
        grad = _row_major(grad)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = input_grad_op(grad, w, ctx.input_grad, param)
        if ctx.needs_input_grad[1]:
            dw = weight_grad_op(grad, x, ctx.weight_grad).to(w.dtype)
        return dx, dw, None, None, None, None

    op.register_autograd(backward, setup_context=setup_context)
