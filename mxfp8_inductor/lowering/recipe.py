"""What a recipe module provides: the three GEMMs of a grouped matmul and of a dense linear; and
`RECIPES`, the implementation of each `registry.Gemm` that names one.

Each returns the GEMM's result in bf16, or NotImplemented when `decomposing` (Inductor is
decomposing the op) and the path must stay an opaque op. Operands are scaled along the GEMM's
contraction (docs/design.md, "Numerics contract"). `param` is the parameter the weight operand
views, under whose version counter the weight's quantization may be reused (lowering/weights.py);
None: quantized for this GEMM alone. `offs` holds the token groups' cumulative ends.
"""

from __future__ import annotations

import functools
import types
from typing import Protocol

import torch

from ..registry import Gemm
from . import bf16, blockwise, mxfp8, rowwise


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


_METHODS = ("forward", "dgrad", "wgrad", "dense_forward", "dense_dgrad", "dense_wgrad")
# mxfp8's grouped GEMMs in the fused kernels (the dense ones have no fused form: they take the
# separate path)
_MXFP8_FUSED = types.SimpleNamespace(
    **{m: functools.partial(getattr(mxfp8, m), fused=True) for m in _METHODS[:3]},
    **{m: getattr(mxfp8, m) for m in _METHODS[3:]})
RECIPES: dict[Gemm, Recipe] = {Gemm.MXFP8: mxfp8, Gemm.MXFP8_FUSED: _MXFP8_FUSED, Gemm.FP8_ROWWISE: rowwise,
                               Gemm.FP8_BLOCKWISE: blockwise, Gemm.BF16: bf16}
