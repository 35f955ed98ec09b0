"""What a recipe module provides: the three GEMMs of a grouped matmul and of a dense linear.

Each returns the GEMM's result in bf16, or NotImplemented when `decomposing` (Inductor is
decomposing the op) and the path must stay an opaque op. Operands are scaled along the GEMM's
contraction (docs/design.md, "Numerics contract"). `param` is the parameter the weight operand
views, under whose version counter the weight's quantization may be reused (lowering/weights.py);
None: quantized for this GEMM alone. `offs` holds the token groups' cumulative ends.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Recipe(Protocol):
    def forward(self, a_MK: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor, rounding: str,
                param: torch.Tensor | None, decomposing: bool) -> torch.Tensor:
        """out[M, N] = a @ b per token group: a along K, b along K."""

    def dgrad(self, grad_MN: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor, rounding: str,
              param: torch.Tensor | None, decomposing: bool) -> torch.Tensor:
        """d a[M, K] = grad @ b^T per token group: grad along N, b along N."""

    def wgrad(self, grad_MN: torch.Tensor, a_MK: torch.Tensor, offs: torch.Tensor, rounding: str,
              decomposing: bool) -> torch.Tensor:
        """d b[E, K, N] = a^T @ grad per token group: both along the group's tokens."""

    def dense_forward(self, x_MK: torch.Tensor, w_NK: torch.Tensor, rounding: str, param: torch.Tensor | None,
                      decomposing: bool) -> torch.Tensor:
        """out[M, N] = x @ w^T: x along K, w along K."""

    def dense_dgrad(self, grad_MN: torch.Tensor, w_NK: torch.Tensor, rounding: str, param: torch.Tensor | None,
                    decomposing: bool) -> torch.Tensor:
        """d x[M, K] = grad @ w: grad along N, w along N."""

    def dense_wgrad(self, grad_MN: torch.Tensor, x_MK: torch.Tensor, rounding: str,
                    decomposing: bool) -> torch.Tensor:
        """d w[N, K] = grad^T @ x: both along the tokens."""
