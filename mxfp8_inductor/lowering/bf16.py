"""The bf16 GEMMs, in the `GemmImpl` interface (lowering/impls.py): what `wgrad="bf16"` keeps, and
what `recipe="auto"` picks for a GEMM that FP8 would make slower."""

from __future__ import annotations

import torch

from .library import OUT_DTYPE


def _bf16(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(OUT_DTYPE) for t in tensors]


def forward(a_MK, b_EKN, offs, spec, param, decomposing):
    a_MK, b_EKN = _bf16(a_MK, b_EKN)
    return torch._grouped_mm(a_MK, b_EKN, offs)


def input_grad(grad_MN, b_EKN, offs, spec, param, decomposing):
    grad_MN, b_EKN = _bf16(grad_MN, b_EKN)
    return torch._grouped_mm(grad_MN, b_EKN.transpose(-2, -1), offs)


def weight_grad(grad_MN, a_MK, offs, spec, decomposing):
    grad_MN, a_MK = _bf16(grad_MN, a_MK)
    return torch._grouped_mm(a_MK.t(), grad_MN, offs)


def dense_forward(x_MK, w_NK, spec, param, decomposing):
    x_MK, w_NK = _bf16(x_MK, w_NK)
    return torch.mm(x_MK, w_NK.t())


def dense_input_grad(grad_MN, w_NK, spec, param, decomposing):
    grad_MN, w_NK = _bf16(grad_MN, w_NK)
    return torch.mm(grad_MN, w_NK)


def dense_weight_grad(grad_MN, x_MK, spec, decomposing):
    grad_MN, x_MK = _bf16(grad_MN, x_MK)
    return torch.mm(grad_MN.t(), x_MK)
