"""Pure-torch FP8 blockwise recipe: the numerics contract of `recipe="fp8_blockwise"`.

float8_e4m3fn data with one float32 power-of-two scale per tile of SCALE_TILE = 128 elements along the
GEMM's contraction: per token row and 128 columns (1 x 128) for the forward's and the input
gradient's activation operands; per 128 x 128 block for the weights, so that one quantization
serves both orientations; per column and 128 tokens (128 x 1) for the weight gradient's operands,
with every token group zero-padded to whole tiles so that no tile spans two groups. A dim that is
not a multiple of 128 ends in a short tile. The exponent is the MXFP8 one with the tile as the
block (`reference.scale_exponent`), as in `rowwise`; a tile holding NaN or inf gets a NaN scale.

Every scale depends on one tile only: a quantization is a reduction over 128 elements (128 x 128
for a weight) that needs no pass over a whole row or group, and Inductor fuses that of an
activation's 1 x 128 tiles with the kernel producing the activation (docs/design.md, "Where the
operands are quantized"). Everything here is traceable without host syncs: the same
functions are the CPU reference and, decomposed under Inductor, the GPU quantizers.

Inductor's C++ backend (torch 2.13) miscompiles a loop that reads one value per tile (a scale, a
tile's maximum) at `i // SCALE_TILE` when the loop's length is not a multiple of SCALE_TILE: it splits the
loop at SCALE_TILE and drops the remainder (pytorch/pytorch#195582), so a dim's last short tile is
never written. Each function here takes its per-tile values on data zero-padded to whole tiles
(`pad_tiles`), a tile dim beside each dim of SCALE_TILE, and slices the padding off after; but a
consumer that copies such a slice (`.contiguous()`, a cast, an op's fixed input strides) computes
it in a loop of the slice's length, which brings the division back. So on CPU the recipe keeps
its tensors in whole tiles up to an opaque op (lowering/blockwise.py); on GPUs, where Triton
computes the division per element, it need not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import check_float, exponent_to_float, group_ends, scale_exponent
from .rowwise import _cast, pad_groups

SCALE_TILE = 128


def tiles(n: int) -> int:
    """Tiles along a dim of n elements."""
    return -(-n // SCALE_TILE)


def pad_tiles(x: torch.Tensor, *dims: int) -> torch.Tensor:
    """x zero-padded at the end of every dim in `dims` to whole tiles."""
    pad = [0] * (2 * x.dim())  # F.pad's (before, after) pairs, the last dim first
    for d in dims:
        pad[2 * (x.dim() - 1 - d % x.dim()) + 1] = -x.shape[d] % SCALE_TILE
    return F.pad(x, pad)


def quantize_tiles(x: torch.Tensor, dim: int, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per SCALE_TILE elements along `dim`: (data float8 shaped like x, scales float32 shaped
    like x with `dim` of tiles(x.shape[dim]))."""
    check_float(x)
    x_RC = x.float().movedim(dim, -1)
    C = x_RC.shape[-1]
    x_RTt = pad_tiles(x_RC, -1).unflatten(-1, (-1, SCALE_TILE))
    biased = scale_exponent(x_RTt.abs().amax(-1, keepdim=True), rounding)
    data = _cast(x_RTt, biased).flatten(-2)[..., :C]
    return data.movedim(-1, dim), exponent_to_float(biased).squeeze(-1).movedim(-1, dim)


def quantize_weight(b_EKN: torch.Tensor, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """A weight b[E, K, N] in 128 x 128 blocks, which serve both of its GEMMs: (data_ENK
    contiguous, the forward's operand with its contraction K contiguous, and the input
    gradient's once transposed; scales [E, tiles(K), tiles(N)])."""
    check_float(b_EKN)
    E, K, N = b_EKN.shape
    b_pad = pad_tiles(b_EKN.float(), 1, 2)
    b_blocks = b_pad.view(E, tiles(K), SCALE_TILE, tiles(N), SCALE_TILE)
    biased = scale_exponent(b_blocks.abs().amax((2, 4), keepdim=True), rounding)
    data_EKN = _cast(b_blocks, biased).view(b_pad.shape)[:, :K, :N]
    return data_EKN.transpose(-2, -1).contiguous(), exponent_to_float(biased)[:, :, 0, :, 0]


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-gradient operand: one scale per column and tile of 128 tokens, each token group
    zero-padded to whole tiles. Returns (data_KT, scales_TtK, padded_offs): data float8
    [K, T] with T = rowwise.padded_rows(M, G, SCALE_TILE), the tokens transposed; scales float32
    [T / SCALE_TILE, K]; padded_offs the int32 group ends in data_KT."""
    check_float(x_MK)
    K = x_MK.shape[1]
    x_TK, _, padded_ends = pad_groups(x_MK, group_ends(offs, x_MK.shape[0]), SCALE_TILE)
    x_TtK = x_TK.view(-1, SCALE_TILE, K)
    biased = scale_exponent(x_TtK.abs().amax(1, keepdim=True), rounding)
    return _cast(x_TtK, biased).view(x_TK.shape).t().contiguous(), exponent_to_float(biased).squeeze(1), padded_ends


def dequantize_tiles(data: torch.Tensor, scales: torch.Tensor, *dims: int,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """data * scale in float32 (exact), as `dtype`, each scale over its tile of SCALE_TILE elements
    along every dim in `dims`: scales has tiles(data.shape[d]) along each of them and data's
    sizes elsewhere. Product and cast are taken on whole tiles (see above)."""
    x_pad = pad_tiles(data.float(), *dims)
    x_tiled, s_tiled = x_pad, scales
    for d in sorted((d % data.dim() for d in dims), reverse=True):  # the lower dims keep their index
        x_tiled, s_tiled = x_tiled.unflatten(d, (-1, SCALE_TILE)), s_tiled.unsqueeze(d + 1)
    y_pad = (x_tiled * s_tiled).to(dtype).view(x_pad.shape)
    return y_pad[tuple(slice(0, n) for n in data.shape)]


def dequantize_operands(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`scaled_grouped_mm`'s operands dequantized to bf16 (exact: float8 times a power of two)."""
    bf16 = torch.bfloat16
    if b.dim() == 3:
        return dequantize_tiles(a, scale_a, 1, dtype=bf16), dequantize_tiles(b, scale_b, 1, 2, dtype=bf16)
    return dequantize_tiles(a, scale_a.t(), 1, dtype=bf16), dequantize_tiles(b, scale_b, 0, dtype=bf16)


def scaled_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """The blockwise grouped GEMM (bf16 out) emulated: operands dequantized to bf16 into the bf16
    grouped GEMM, which accumulates in fp32.

    2d-3d: a [M, K], b [E, K, N], scale_a [M, tiles(K)], scale_b [E, tiles(K), tiles(N)].
    2d-2d: a [K, T], b [T, N] grouped along T by offs, scale_a [T / SCALE_TILE, K], scale_b [T / SCALE_TILE, N].
    """
    return torch._grouped_mm(*dequantize_operands(a, b, scale_a, scale_b), offs)
