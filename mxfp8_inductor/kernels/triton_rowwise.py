"""Triton twin of `rowwise.group_amax`: the one FP8-rowwise step Inductor cannot fuse well (a
segmented max over variable-size token groups; torch's scatter_reduce does it with atomics)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_mx import _bits, _load_f32


@triton.jit
def _group_amax_kernel(x_ptr, sx_m, offs_ptr, out_ptr, K, IN_BF16: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """Program (g, q): columns q*BK.. of group g, looping over the group's rows BM at a time."""
    g = tl.program_id(0)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    r0 = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    end = tl.load(offs_ptr + g)
    acc = tl.zeros([BK], dtype=tl.float32)
    while r0 < end:  # not range(): the interpreter cannot take loaded bounds
        r = r0 + tl.arange(0, BM)
        m = (r < end)[:, None] & (k < K)[None, :]
        ax = tl.abs(_load_f32(x_ptr + r.to(tl.int64)[:, None] * sx_m + k[None, :], m, IN_BF16))
        acc = tl.maximum(acc, tl.max(tl.where(ax != ax, float("inf"), ax), axis=0))
        r0 += BM
    tl.store(out_ptr + g * K + k, acc, mask=k < K)


def group_amax(x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """amax_GK float32, as `rowwise.group_amax`, in one read of x."""
    K, G = x_MK.shape[1], offs.numel()
    if x_MK.stride(1) != 1:
        x_MK = x_MK.contiguous()
    out = torch.empty(G, K, device=x_MK.device, dtype=torch.float32)
    BK = 128
    _group_amax_kernel[(G, triton.cdiv(K, BK))](
        _bits(x_MK), x_MK.stride(0), offs, out, K, IN_BF16=x_MK.dtype == torch.bfloat16, BM=32, BK=BK, num_warps=4
    )
    return out
