"""The byte transpose of an FP8 weight: its other orientation (the input gradient contracts the
weight along the other dim than the forward, and both GEMMs read their operands K-major), from
the one quantized form the weight cache holds (docs/design.md, "Weight cache"). torch's strided
copy of a transposed view moves 1-byte elements one at a time; this moves tiles, each read along
one dim and written along the other."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch_tuned

# (tile rows, tile columns, warps): the autotuner's candidates on a GPU
CONFIGS = [triton.Config({"BR": br, "BC": bc}, num_warps=w)
           for br, bc, w in ((64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8))]
INTERPRETER_CONFIG = {"BR": 16, "BC": 32}


@triton.jit
def _transpose_kernel(x_ptr, y_ptr, R, C, BR: tl.constexpr, BC: tl.constexpr):
    """Program (i, j, e): y[e, r, c] = x[e, c, r] over the tile r in i*BR.., c in j*BC..; x
    [E, C, R] and y [E, R, C] contiguous."""
    e = tl.program_id(2).to(tl.int64) * R * C
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    m = (r < R)[:, None] & (c < C)[None, :]
    tile = tl.load(x_ptr + e + c[None, :].to(tl.int64) * R + r[:, None], mask=m)
    tl.store(y_ptr + e + r[:, None].to(tl.int64) * C + c[None, :], tile, mask=m)


_tuned = triton.autotune(CONFIGS, key=["R", "C"])(_transpose_kernel)


def contiguous(x_ERC: torch.Tensor) -> torch.Tensor:
    """`x_ERC.contiguous()`, bit for bit, for a 1-byte tensor of 2 or 3 dims: by the tiled kernel
    where x is the transposed view of a contiguous [E, C, R] (or [C, R]), by torch otherwise."""
    if x_ERC.element_size() != 1 or x_ERC.dim() not in (2, 3) or x_ERC.is_contiguous() \
            or not x_ERC.transpose(-2, -1).is_contiguous() or x_ERC.numel() == 0:
        return x_ERC.contiguous()
    x3 = x_ERC if x_ERC.dim() == 3 else x_ERC[None]
    E, R, C = x3.shape
    y = torch.empty((E, R, C), dtype=torch.uint8, device=x3.device)
    grid = lambda meta: (triton.cdiv(R, meta["BR"]), triton.cdiv(C, meta["BC"]), E)  # noqa: E731
    launch_tuned(_transpose_kernel, _tuned, (R, C), grid, (x3.view(torch.uint8), y, R, C), {}, INTERPRETER_CONFIG)
    return y.view(x_ERC.dtype).view(x_ERC.shape)
