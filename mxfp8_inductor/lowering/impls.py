"""What each `spec.Impl` that computes runs: `IMPLS`, one module per implementation, and the
`GemmImpl` interface they share.

Each method computes one GEMM of a grouped matmul (or of a dense linear) as its `GemmSpec` says,
and returns the result in bf16, or NotImplemented when `decomposing` (Inductor is decomposing the
op) and the path must stay an opaque op. Operands are scaled along the GEMM's contraction
(docs/design.md, "Numerics contract"). `param` is the parameter the weight operand views, under
which the weight's quantization is reused where `spec.reuse_weight` (lowering/weight_cache.py); None:
quantized for this GEMM alone. `offs` holds the token groups' cumulative ends.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..spec import GemmSpec, Impl, Role
from . import bf16, blockwise, mxfp8, rowwise


class GemmImpl(Protocol):
    def forward(self, a_MK: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor, spec: GemmSpec,
                param: torch.Tensor | None, decomposing: bool) -> torch.Tensor:
        """out[M, N] = a @ b per token group: a along K, b along K."""

    def input_grad(self, grad_MN: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor, spec: GemmSpec,
                   param: torch.Tensor | None, decomposing: bool) -> torch.Tensor:
        """d a[M, K] = grad @ b^T per token group: grad along N, b along N."""

    def weight_grad(self, grad_MN: torch.Tensor, a_MK: torch.Tensor, offs: torch.Tensor, spec: GemmSpec,
                    decomposing: bool) -> torch.Tensor:
        """d b[E, K, N] = a^T @ grad per token group: both along the group's tokens."""

    def dense_forward(self, x_MK: torch.Tensor, w_NK: torch.Tensor, spec: GemmSpec, param: torch.Tensor | None,
                      decomposing: bool) -> torch.Tensor:
        """out[M, N] = x @ w^T: x along K, w along K."""

    def dense_input_grad(self, grad_MN: torch.Tensor, w_NK: torch.Tensor, spec: GemmSpec,
                         param: torch.Tensor | None, decomposing: bool) -> torch.Tensor:
        """d x[M, K] = grad @ w: grad along N, w along N."""

    def dense_weight_grad(self, grad_MN: torch.Tensor, x_MK: torch.Tensor, spec: GemmSpec,
                          decomposing: bool) -> torch.Tensor:
        """d w[N, K] = grad^T @ x: both along the tokens."""


IMPLS: dict[Impl, GemmImpl] = {Impl.MXFP8: mxfp8, Impl.FP8_ROWWISE: rowwise, Impl.FP8_BLOCKWISE: blockwise,
                               Impl.BF16: bf16}

_METHODS = {Role.FORWARD: "forward", Role.INPUT_GRAD: "input_grad", Role.WEIGHT_GRAD: "weight_grad"}


def method(spec: GemmSpec):
    """The function computing `spec`'s GEMM: its implementation's method for its role and kind."""
    return getattr(IMPLS[spec.impl], ("dense_" if spec.dense else "") + _METHODS[spec.role])
