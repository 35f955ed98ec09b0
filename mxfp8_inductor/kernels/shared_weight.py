"""Expert weights rounded once for both of their GEMMs (docs/design.md, "Shared weight scales").

The forward GEMM scales an expert weight [.., K, N] along K and the input gradient along N, so
their FP8 forms differ and neither derives from the other. A shared rounding scales blocks that
serve both orientations: 32x32 tiles for mxfp8 (one e8m0 scale each), the whole matrix for
fp8_rowwise (one float32 power of two). The exponent rule is the recipe's (`reference.scale_exponent`).
Both GEMMs then quantize the rounded weight as always; under rceil that leaves its values
unchanged (each row's or block's scale is at most the tile's, and a value of 4 significant bits
at most 448 stays representable), and rounding is idempotent under both rules. So a weight rounded
before an FSDP2 all-gather and dequantized after it computes exactly as the same weight rounded in
the graph.

Tiles and matrices are the last two dims, in either layout ([E, N, K] or [E, K, N]). Pure torch,
no host syncs: the same functions are the CPU reference, Inductor's decomposition of the in-graph
rounding, and the all-gather's quantizer.
"""

from __future__ import annotations

import torch

from .reference import E4M3_MAX, check_float, exponent_to_float, inv_scale, scale_exponent

SHARED_TILE = 32
SUPPORTED = ("mxfp8", "fp8_rowwise")


def _check(w: torch.Tensor, recipe: str) -> None:
    check_float(w)
    if recipe not in SUPPORTED:
        raise ValueError(f"shared weight rounding is defined for {SUPPORTED}, got {recipe!r}")
    if w.dim() < 2:
        raise ValueError(f"shared weight rounding takes matrices ([..., R, C]), got shape {tuple(w.shape)}")
    if recipe == "mxfp8" and (w.shape[-1] % SHARED_TILE or w.shape[-2] % SHARED_TILE):
        raise ValueError(f"mxfp8 weight tiles are {SHARED_TILE}x{SHARED_TILE}: the last two dims of {tuple(w.shape)} "
                         f"must be multiples of {SHARED_TILE}")


def _tiles(x: torch.Tensor) -> torch.Tensor:
    """[..., R, C] -> [..., R/32, 32, C/32, 32]."""
    *lead, R, C = x.shape
    return x.reshape(*lead, R // SHARED_TILE, SHARED_TILE, C // SHARED_TILE, SHARED_TILE)


def _block_exponents(w: torch.Tensor, recipe: str, rounding: str) -> torch.Tensor:
    """Biased exponents: [..., R/32, C/32] per tile, or [...] per matrix."""
    a = w.abs()
    amax = _tiles(a).amax(dim=(-3, -1)) if recipe == "mxfp8" else a.amax(dim=(-2, -1))
    return scale_exponent(amax.float(), rounding)


def _per_element(biased: torch.Tensor, recipe: str) -> torch.Tensor:
    """Block exponents broadcast against the weight (as [..., R/32, 1, C/32, 1] or [..., 1, 1])."""
    return biased[..., :, None, :, None] if recipe == "mxfp8" else biased[..., None, None]


def quantize(w: torch.Tensor, recipe: str, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn data shaped like w, scales): mxfp8 scales are uint8 e8m0 bytes
    [..., R/32, C/32], fp8_rowwise scales float32 [...] (w.shape without the last two dims).
    Computed in w's dtype, which is exact: scaling by a power of two rounds nothing that the
    cast to e4m3 keeps."""
    _check(w, recipe)
    biased = _block_exponents(w, recipe, rounding)
    x = _tiles(w) if recipe == "mxfp8" else w
    inv = inv_scale(_per_element(biased, recipe)).to(w.dtype)
    q = (x * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    data = q.reshape(w.shape)
    if recipe == "mxfp8":
        return data, biased.to(torch.uint8)
    return data, exponent_to_float(biased)


def dequantize(data: torch.Tensor, scales: torch.Tensor, recipe: str, dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of `quantize`, as `dtype` (bf16 or fp32), into `out` (data's shape) if given.
    Computed in `dtype`, which is exact: an e4m3 value times a power of two is one rounding of the
    float32 product either way."""
    x = data.to(dtype)
    if recipe == "mxfp8":
        scale = _per_element(exponent_to_float(scales.int()).to(dtype), recipe)
        x, shape = _tiles(x), _tiles(data).shape
    else:
        scale, shape = scales.to(dtype)[..., None, None], data.shape
    if out is None:
        return (x * scale).reshape(data.shape)
    torch.mul(x, scale, out=out.view(shape))
    return out


def column_scales(scales: torch.Tensor, recipe: str, shape: torch.Size) -> torch.Tensor:
    """The scales as MXFP8 ones along the rows ([..., R/32, C] e8m0, `reference.dequantize`'s
    layout along dim -2; R a multiple of 32): a tile's byte over its 32 columns, a matrix's power
    of two (an exact e8m0 value) everywhere. With them MXFP8's dequantize kernel dequantizes in
    one pass."""
    *lead, R, C = shape
    if recipe == "mxfp8":
        return scales.repeat_interleave(SHARED_TILE, dim=-1).view(torch.float8_e8m0fnu)
    biased = ((scales.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)  # 2^-127 and NaN map to 0 and 255
    return biased[..., None, None].expand(*lead, R // SHARED_TILE, C).contiguous().view(torch.float8_e8m0fnu)


def quantize_dequantize(w: torch.Tensor, recipe: str, rounding: str = "rceil") -> torch.Tensor:
    """w rounded to its shared-scale FP8 values, in w's dtype."""
    return dequantize(*quantize(w, recipe, rounding), recipe, w.dtype)
