"""Pure-torch MXFP8 reference: the numerics contract every kernel is tested against.

Contract (docs/design.md, "Numerics contract"): blocks of 32 contiguous elements along one dimension, one power-of-two
float8_e8m0fnu scale per block, float8_e4m3fn data.
- RCEIL: scale = 2^ceil(log2(amax / 448)); FLOOR: scale = 2^(floor(log2(amax)) - 8).
  Both exponents are computed exactly from amax's float32 bits (no log2 or division rounding).
- Biased exponents are clamped to [0, MAX_FINITE_BYTE = 246]; a block holding NaN or inf gets
  byte 255 (NaN). At RCEIL's byte 247 (2^120) a block max near the float32 limit rounds to
  256 * 2^120 = 2^128, which dequantizes to inf; at 246 it saturates to 448 * 2^119 instead, as
  FLOOR does, so every finite input dequantizes to a finite value.
- data = saturate_e4m3(x * 2^(127 - byte)), computed in float32 (exact: the factor is a power of two);
  byte 0 (zero or tiny blocks) therefore stores x * 2^127, never flushed.
- Grouped variants block along the token dim inside each group: a block never straddles two
  groups and a group's last block may be short.

These functions may synchronise with the host (they read `offs`); the Triton kernels do not.
Group ends pass through `group_ends` first, as in the kernels.
"""

from __future__ import annotations

import torch

from ..eligibility import check_offs_form
from ..options import check_choice

BLOCK = 32
MAX_FINITE_BYTE = 246  # the largest scale byte of a finite block (see the module docstring)
E4M3_MAX = 448.0

_MANT_MASK = 0x7FFFFF
_E4M3_MAX_MANT = 0x600000  # mantissa bits of 448 = 1.75 * 2^8


def scale_exponent(amax: torch.Tensor, rounding: str) -> torch.Tensor:
    """Biased e8m0 exponent (int32 in [0, 255]) for float32 block maxima.

    With amax = 1.m * 2^(ea-127) and 448 = 1.75 * 2^8: ceil(log2(amax/448)) = ea - 135 + (m > 0.75),
    floor(log2(amax)) - 8 = ea - 135. Subnormal maxima (ea = 0) clamp to byte 0.
    """
    check_choice("rounding", rounding)
    bits = amax.float().view(torch.int32)
    biased = ((bits >> 23) & 0xFF) - 8
    if rounding == "rceil":
        biased = biased + ((bits & _MANT_MASK) > _E4M3_MAX_MANT).int()
    biased = biased.clamp(0, MAX_FINITE_BYTE)
    return torch.where(torch.isfinite(amax), biased, torch.full_like(biased, 255))


def inv_scale(biased: torch.Tensor) -> torch.Tensor:
    """2^(127 - byte) as float32 (always a normal number: finite blocks have byte <= 246); 1 for NaN."""
    bits = torch.where(biased < 255, (254 - biased) << 23, 127 << 23)
    return bits.int().view(torch.float32)


def _quantize_blocks(x_fp32: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize [..., nblocks, 32] float32 blocks -> (e4m3 data, biased int32 exponents [..., nblocks])."""
    amax = x_fp32.abs().amax(dim=-1)
    biased = scale_exponent(amax, rounding)
    # a non-finite block keeps x (NaN stays NaN, inf saturates): its NaN scale poisons it anyway
    q = (x_fp32 * inv_scale(biased).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    return q.to(torch.float8_e4m3fn), biased


def check_float(x: torch.Tensor) -> None:
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"MXFP8 quantization needs a bf16 or fp32 tensor, got {x.dtype}")


def _exponent_to_e8m0(biased: torch.Tensor) -> torch.Tensor:
    return biased.to(torch.uint8).view(torch.float8_e8m0fnu)


def exponent_to_float(biased: torch.Tensor) -> torch.Tensor:
    """float32 2^(biased - 127) of int32 biased exponents: 0 -> 2^-127, 255 -> NaN."""
    bits = torch.where(biased > 0, biased << 23, 1 << 22)  # byte 0 is the subnormal 2^-127
    return torch.where(biased < 255, bits.view(torch.float32), float("nan"))


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """float32 value of e8m0 scales: byte 0 -> 2^-127, 255 -> NaN."""
    return exponent_to_float(scales.view(torch.uint8).int())


def quantize(
    x: torch.Tensor, dim: int = -1, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize `x` in blocks of 32 along `dim`.

    Returns (data, scales): data is float8_e4m3fn with x's shape; scales is float8_e8m0fnu with x's
    shape except `dim`, which is divided by 32.
    """
    check_float(x)
    check_choice("rounding", rounding)
    dim = dim % x.dim()
    if x.shape[dim] % BLOCK:
        raise ValueError(f"dim {dim} of shape {tuple(x.shape)} must be a multiple of {BLOCK}")
    x_last = x.movedim(dim, -1).float()
    blocks = x_last.reshape(*x_last.shape[:-1], x_last.shape[-1] // BLOCK, BLOCK)
    q, biased = _quantize_blocks(blocks, rounding)
    data = q.reshape(x_last.shape).movedim(-1, dim)
    scales = _exponent_to_e8m0(biased).movedim(-1, dim)
    return data.contiguous(), scales.contiguous()


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize`: data * scale, computed in float32, returned as `dtype`."""
    dim = dim % data.dim()
    scale = e8m0_to_float(scales).repeat_interleave(BLOCK, dim=dim)
    return (data.float() * scale).to(dtype)


def quantize_dequantize(
    x: torch.Tensor, dim: int = -1, rounding: str = "rceil", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """dequantize(quantize(x)): x rounded to MXFP8 values, in `dtype` (default x.dtype)."""
    data, scales = quantize(x, dim, rounding)
    return dequantize(data, scales, dim, dtype or x.dtype)


# --------------------------------------------------------------------------------------------
# Groups of token rows (weight-gradient operands)


def group_scale_rows(num_rows: int, num_groups: int) -> int:
    """Rows of the per-group scale matrix: a static bound on sum_g ceil(size_g / 32)."""
    return num_rows // BLOCK + num_groups


def group_ends(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """The group ends every path uses (docs/design.md, "Group ends"): each clamped into [0, rows]
    and raised to the running maximum, so that no group is negative or runs past the rows there
    are. Valid `offs` are unchanged. No host sync."""
    return torch.cummax(offs.clamp(0, rows), 0).values.to(torch.int32)


def _group_bounds(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()
    return list(zip([0] + ends[:-1], ends))


def _group_blocks(offs: torch.Tensor):
    """(start, end, first scale row, number of 32-row blocks) of every non-empty group."""
    row = 0
    for start, end in _group_bounds(offs):
        if end > start:
            nblk = -(-(end - start) // BLOCK)
            yield start, end, row, nblk
            row += nblk


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize [M, K] along the token dim M, in blocks that restart at every group.

    `offs` holds the int32 group ends. Returns (data_MK, scales_SK): data float8_e4m3fn [M, K]
    (rows past offs[-1] are 0), scales float8_e8m0fnu [S, K] with S = M // 32 + G; group g's
    ceil(size_g / 32) scale rows start at sum_{j<g} ceil(size_j / 32); unused rows are byte 0.
    """
    check_float(x_MK)
    check_choice("rounding", rounding)
    check_offs_form(offs)
    M, K = x_MK.shape
    offs = group_ends(offs, M)
    data_MK = torch.zeros(M, K, dtype=torch.float8_e4m3fn, device=x_MK.device)
    biased_SK = torch.zeros(group_scale_rows(M, offs.numel()), K, dtype=torch.int32, device=x_MK.device)
    for start, end, row, nblk in _group_blocks(offs):
        size = end - start
        x_KS = x_MK[start:end].float().t()
        x_KS = torch.nn.functional.pad(x_KS, (0, nblk * BLOCK - size))  # zeros do not change amax
        q, biased = _quantize_blocks(x_KS.reshape(K, nblk, BLOCK), rounding)
        data_MK[start:end] = q.reshape(K, -1)[:, :size].t()
        biased_SK[row : row + nblk] = biased.t()
    return data_MK, _exponent_to_e8m0(biased_SK)


def dequantize_groups(
    data_MK: torch.Tensor, scales_SK: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize_groups`; rows past offs[-1] are 0."""
    M, K = data_MK.shape
    offs = group_ends(offs, M)
    out = torch.zeros(M, K, dtype=dtype, device=data_MK.device)
    for start, end, row, nblk in _group_blocks(offs):
        scale = e8m0_to_float(scales_SK[row : row + nblk]).repeat_interleave(BLOCK, dim=0)[: end - start]
        out[start:end] = (data_MK[start:end].float() * scale).to(dtype)
    return out


def quantize_dequantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """dequantize_groups(quantize_groups(x)): per-group MXFP8 rounding along the tokens."""
    data, scales = quantize_groups(x_MK, offs, rounding)
    return dequantize_groups(data, scales, offs, dtype or x_MK.dtype)


# --------------------------------------------------------------------------------------------
# Scale layouts for the native GEMM (docs/design.md, "Scale layouts")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _blocked_2d(scales_HW: torch.Tensor) -> torch.Tensor:
    """Blocked bytes of one 2-D scale matrix: (round_up(H,128), round_up(W,4)) uint8."""
    H, W = scales_HW.shape
    Hp, Wp = _round_up(H, 128), _round_up(W, 4)
    padded = torch.zeros(Hp, Wp, dtype=torch.uint8, device=scales_HW.device)
    padded[:H, :W] = scales_HW.view(torch.uint8)
    # tile (rb, cb) is 128x4; inside it element (r, c) sits at (r % 32) * 16 + (r // 32) * 4 + c
    tiles = padded.view(Hp // 128, 4, 32, Wp // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(Hp, Wp)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Swizzle e8m0 scales into the native GEMM's blocked layout (SWIZZLE_32_4_4).

    2-D (H, W) -> (round_up(H,128), round_up(W,4)); 3-D weight scales (E, N, K/32) -> each expert
    blocked on its own, (E, round_up(N,128) * round_up(K/32,4)).
    """
    if scales.dim() == 2:
        return _blocked_2d(scales).view(torch.float8_e8m0fnu)
    if scales.dim() == 3:
        E = scales.shape[0]
        per_expert = [_blocked_2d(scales[e]).reshape(-1) for e in range(E)]
        blocked = torch.stack(per_expert) if E else scales.new_zeros(0, 0, dtype=torch.uint8)
        return blocked.view(torch.float8_e8m0fnu)
    raise ValueError(f"to_blocked takes 2-D or 3-D scales, got {scales.dim()}-D")


def blocked_group_starts(offs: torch.Tensor, along: str, rows: int) -> torch.Tensor:
    """Start of each group's tiles in a grouped blocked buffer (G+1 entries, int32, no host sync),
    for `rows` token rows.

    along="rows": in rows, multiples of 128; along="cols": in columns, multiples of 4.
    """
    offs = group_ends(offs, rows)
    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    if along == "rows":
        padded = (sizes + 127) // 128 * 128
    elif along == "cols":
        padded = ((sizes + BLOCK - 1) // BLOCK + 3) // 4 * 4
    else:
        raise ValueError(f'along must be "rows" or "cols", got {along!r}')
    return torch.cat([offs.new_zeros(1), torch.cumsum(padded, 0, dtype=torch.int32)])


def to_blocked_groups(
    scales: torch.Tensor, offs: torch.Tensor, along: str = "rows"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block each group's scale sub-matrix on its own and store the groups back to back.

    along="rows": scales [rows, cols], one row per token, groups of rows by `offs`; buffer
    (rows + G*128, round_up(cols,4)), group g's tiles start at row starts[g].
    along="cols": scales [rows, cols] whose columns are per-group 32-token blocks (group g has
    ceil(size_g/32) columns, back to back, as `quantize_groups(...)[1].t()` gives); buffer
    (round_up(rows,128), cols + G*4), group g's tiles start at byte starts[g] * round_up(rows,128).
    Unwritten bytes are 0. Returns (buffer as float8_e8m0fnu, starts int32 [G+1]).
    """
    if scales.dim() != 2:
        raise ValueError(f"to_blocked_groups takes 2-D scales, got {scales.dim()}-D")
    rows, cols = scales.shape
    G = offs.numel()
    offs = group_ends(offs, rows if along == "rows" else cols * BLOCK)
    starts = blocked_group_starts(offs, along, rows if along == "rows" else cols * BLOCK)
    src = scales.view(torch.uint8)
    if along == "rows":
        Wp = _round_up(cols, 4)
        buf = torch.zeros(rows + G * 128, Wp, dtype=torch.uint8, device=scales.device)
        for g, (start, end) in enumerate(_group_bounds(offs)):
            if end > start:
                blk = _blocked_2d(src[start:end])
                s = int(starts[g])
                buf[s : s + blk.shape[0]] = blk
    else:
        Hp = _round_up(rows, 128)
        buf = torch.zeros(Hp * (cols + G * 4), dtype=torch.uint8, device=scales.device)
        col = 0
        for g, (start, end) in enumerate(_group_bounds(offs)):
            ncol = -(-(end - start) // BLOCK) if end > start else 0
            if ncol:
                blk = _blocked_2d(src[:, col : col + ncol]).reshape(-1)
                s = int(starts[g]) * Hp
                buf[s : s + blk.numel()] = blk
            col += ncol
        buf = buf.view(Hp, cols + G * 4)
    return buf.view(torch.float8_e8m0fnu), starts


# --------------------------------------------------------------------------------------------
# Operands of the native GEMM (the Triton twins write the scales straight into these layouts)


def quantize_rows_blocked(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows quantized along K: data [M, K], scales blocked per token group ("rows")."""
    data, scales = quantize(x_MK, -1, rounding)
    return data, to_blocked_groups(scales, offs, "rows")[0]


def quantize_weight_blocked(
    w_ENK: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """3-D weights quantized along the last dim: contiguous data [E, N, K], per-expert blocked
    scales (E, round_up(N,128) * round_up(K/32,4))."""
    data, scales = quantize(w_ENK, -1, rounding)
    return data, to_blocked(scales)


def padded_group_offs(offs: torch.Tensor, align: int = BLOCK) -> torch.Tensor:
    """Group ends after padding every group to a multiple of `align` rows."""
    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    return torch.cumsum((sizes + align - 1) // align * align, 0, dtype=torch.int32)


def quantize_groups_blocked(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-gradient operand: per-group quantization along the tokens, written transposed as
    data [K, round_up(M,32) + 32*G] with every group zero-padded to a multiple of 32 tokens,
    scales blocked per group ("cols"). Returns (data_KMp, scales, padded_offs)."""
    M, K = x_MK.shape
    G = offs.numel()
    offs = group_ends(offs, M)
    data_MK, scales_SK = quantize_groups(x_MK, offs, rounding)
    padded = padded_group_offs(offs)
    data_KMp = torch.zeros(K, _round_up(M, BLOCK) + BLOCK * G, dtype=torch.uint8, device=x_MK.device)
    for (start, end), pend in zip(_group_bounds(offs), padded.tolist()):
        pstart = pend - _round_up(max(end - start, 0), BLOCK)
        data_KMp[:, pstart : pstart + end - start] = data_MK[start:end].view(torch.uint8).t()
    return data_KMp.view(torch.float8_e4m3fn), to_blocked_groups(scales_SK.t(), offs, "cols")[0], padded
