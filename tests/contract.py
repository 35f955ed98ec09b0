"""The numerics contract of docs/design.md ("Numerics contract"), restated plainly for the tests.

Written from the design document, not from the package (which it does not import): slow loops over
token groups and 32-blocks, float64 arithmetic for the scale rule, so that a mistake in the
package's kernels is not repeated here. On CPU the contract of every GEMM is: round each operand
to its FP8 values (quantize, then dequantize to bf16, which holds them exactly) with the blocks the
GEMM's role puts on it, then torch's bf16 GEMM of the rounded operands, group by group.

  GEMM                                    left operand        right operand
  forward      out = a[M, K] @ b[E, K, N]  a along K           b along K
  input grad   da = dout[M, N] @ b^T       dout along N        b along N
  weight grad  db[e] = a_e^T @ dout_e      a along the tokens  dout along the tokens, per group

mxfp8 puts one e8m0 scale on every 32 elements along the contraction (along the tokens the blocks
restart at every group, and a group's last block may be short); fp8_rowwise one power-of-two scale
on the whole contraction of each row (per token group and column in the weight gradient);
fp8_blockwise one power-of-two scale on every 128 elements along the contraction, as mxfp8 with
blocks of 128 (a dim's last block may be short), except that a weight is rounded in 128 x 128
blocks, the same for both of its GEMMs.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

BLOCK = 32
E4M3_MAX = 448.0
MIN_EXP = -127  # e8m0 byte 0: all-zero blocks and blocks of tiny (e.g. bf16 subnormal) values
MAX_EXP = 119  # byte 246: RCEIL's 2^120 could round a block max near the float32 limit to inf
NAN_EXP = 128  # byte 255: the scale of a block holding NaN or inf
RECIPES = ("mxfp8", "fp8_rowwise", "fp8_blockwise")
TILE = 128  # fp8_blockwise's block
ROUNDINGS = ("rceil", "floor")


# --------------------------------------------------------------------------------------------
# Scales and one block's rounding


def scale_exponent(amax: torch.Tensor, rounding: str) -> torch.Tensor:
    """Exponent s (int64) of the power-of-two scale 2^s of blocks with maxima |x| `amax`.

    RCEIL: s = ceil(log2(amax / 448)), so that amax / 2^s <= 448 and nothing clips.
    FLOOR: s = floor(log2(amax)) - 8, so that values past 448 * 2^s saturate.
    s is clamped into [MIN_EXP, MAX_EXP]; amax 0 gives MIN_EXP, NaN or inf NAN_EXP.
    """
    amax = amax.double()  # every float32 or bf16 value, and 448 * 2^s, is exact in float64
    finite = torch.isfinite(amax)
    pos = torch.where(finite & (amax > 0), amax, 1.0)
    if rounding == "rceil":
        # the smallest s with amax <= 448 * 2^s; log2 is fixed up by exact comparisons, since
        # amax / 448 can round across a power of two
        s = torch.ceil(torch.log2(pos / E4M3_MAX))
        s = torch.where(pos > E4M3_MAX * torch.exp2(s), s + 1, s)
        s = torch.where(pos <= E4M3_MAX * torch.exp2(s - 1), s - 1, s)
    elif rounding == "floor":
        # floor(log2(amax)) is the largest f with 2^f <= amax
        f = torch.floor(torch.log2(pos))
        f = torch.where(torch.exp2(f) > pos, f - 1, f)
        f = torch.where(torch.exp2(f + 1) <= pos, f + 1, f)
        s = f - 8
    else:
        raise ValueError(f"unknown rounding {rounding!r}")
    s = s.clamp(MIN_EXP, MAX_EXP).long()
    s = torch.where(amax == 0, MIN_EXP, s)
    return torch.where(finite, s, NAN_EXP)


def scale_byte(s: torch.Tensor) -> torch.Tensor:
    """The e8m0 byte (uint8) of scale exponents: s + 127, and 255 for NaN/inf blocks."""
    return (s + 127).to(torch.uint8)


def scale_value(s: torch.Tensor) -> torch.Tensor:
    """2^s as float64 (exact for s in [-127, 119]); NaN for NaN/inf blocks."""
    return torch.where(s == NAN_EXP, float("nan"), torch.exp2(s.double()))


def quantize_block(x: torch.Tensor, dim: int, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x` with ALL of `dim` as one block: (float8_e4m3fn data, exponents s, dim kept).

    data = saturate(x / 2^s) cast to e4m3 (round to nearest even); a NaN/inf block's data is NaN
    (its NaN scale makes every dequantized value NaN whatever the data).
    """
    x64 = x.double()
    s = scale_exponent(x64.abs().amax(dim, keepdim=True), rounding)
    q = (x64 / torch.exp2(s.double())).clamp(-E4M3_MAX, E4M3_MAX)  # exact: a power of two
    q = torch.where(s == NAN_EXP, float("nan"), q)
    # through float32 (exact above 2^-126; below, every value rounds to e4m3 0 either way)
    return q.float().to(torch.float8_e4m3fn), s


def dequantize_block(data: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """data * 2^s, rounded once to bf16 (bf16 holds every finite e4m3 value times such a scale,
    except below its normal range)."""
    return (data.double() * scale_value(s)).to(torch.bfloat16)


def round_block(x: torch.Tensor, dim: int, rounding: str) -> torch.Tensor:
    """x rounded to its FP8 values, all of `dim` as one block, in bf16."""
    return dequantize_block(*quantize_block(x, dim, rounding))


# --------------------------------------------------------------------------------------------
# Operands


def mx_quantize(x: torch.Tensor, dim: int, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 blocks of 32 along `dim` (a multiple of 32): (e4m3 data like x, e8m0 bytes with
    `dim` divided by 32)."""
    dim = dim % x.dim()
    assert x.shape[dim] % BLOCK == 0, (x.shape, dim)
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    byte_shape = list(x.shape)
    byte_shape[dim] //= BLOCK
    bytes_ = torch.empty(byte_shape, dtype=torch.uint8)
    for blk in range(x.shape[dim] // BLOCK):
        q, s = quantize_block(x.narrow(dim, blk * BLOCK, BLOCK), dim, rounding)
        data.narrow(dim, blk * BLOCK, BLOCK).copy_(q)
        bytes_.narrow(dim, blk, 1).copy_(scale_byte(s))
    return data, bytes_


def mx_quantize_tokens(x_MC: torch.Tensor, ends: list[int], rounding: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """MXFP8 blocks along the tokens (dim 0) restarting at every group start: (e4m3 data [M, C],
    rows past the last end 0; the e8m0 bytes [C] of every block, in order)."""
    data = torch.zeros(x_MC.shape, dtype=torch.float8_e4m3fn)
    bytes_ = []
    for start, end in zip([0, *ends[:-1]], ends):
        for lo in range(start, end, BLOCK):
            hi = min(lo + BLOCK, end)  # a group not a multiple of 32 ends with a short block
            q, s = quantize_block(x_MC[lo:hi], 0, rounding)
            data[lo:hi] = q
            bytes_.append(scale_byte(s[0]))
    return data, bytes_


def round_along(x: torch.Tensor, dim: int, recipe: str, rounding: str) -> torch.Tensor:
    """x rounded for a GEMM contracting `dim`: mxfp8 in 32-blocks, fp8_blockwise in 128-blocks (the
    last one short where `dim` is not a multiple of 128), fp8_rowwise the whole `dim`."""
    if recipe == "fp8_rowwise":
        return round_block(x, dim, rounding)
    assert recipe in ("mxfp8", "fp8_blockwise"), recipe
    step = BLOCK if recipe == "mxfp8" else TILE
    dim = dim % x.dim()
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    for lo in range(0, x.shape[dim], step):
        width = min(step, x.shape[dim] - lo)
        out.narrow(dim, lo, width).copy_(round_block(x.narrow(dim, lo, width), dim, rounding))
    return out


def round_weight(w: torch.Tensor, dim: int, recipe: str, rounding: str, shared: bool = False) -> torch.Tensor:
    """A weight (the last two dims one expert's matrix) rounded for a GEMM contracting `dim`: as
    `round_along`, except fp8_blockwise, which rounds 128 x 128 blocks whatever the contraction,
    and with `shared` fp8_rowwise (a reused weight, docs/design.md "Shared weight scales"), which
    rounds each matrix as one block whatever the contraction."""
    if shared and recipe == "fp8_rowwise":
        return round_block(w.reshape(*w.shape[:-2], -1), -1, rounding).view(w.shape)
    if recipe != "fp8_blockwise":
        return round_along(w, dim, recipe, rounding)
    out = torch.empty(w.shape, dtype=torch.bfloat16)
    R, C = w.shape[-2:]
    for r in range(0, R, TILE):
        for c in range(0, C, TILE):
            block = w[..., r : r + TILE, c : c + TILE]
            flat = block.reshape(*block.shape[:-2], -1)  # the block's maximum over both dims
            out[..., r : r + TILE, c : c + TILE] = round_block(flat, -1, rounding).view(block.shape)
    return out


def round_tokens(x_MC: torch.Tensor, ends: list[int], recipe: str, rounding: str) -> torch.Tensor:
    """x rounded for the weight gradient, contracting the tokens group by group: mxfp8 in 32-blocks
    and fp8_blockwise in 128-blocks, restarting at each group start, fp8_rowwise one scale per
    group and column; "bf16" as it is. Rows past the last end belong to no group (left 0)."""
    if recipe == "bf16":
        return x_MC.bfloat16()
    out = torch.zeros(x_MC.shape, dtype=torch.bfloat16)
    for start, end in zip([0, *ends[:-1]], ends):
        step = {"mxfp8": BLOCK, "fp8_blockwise": TILE}.get(recipe, max(end - start, 1))
        for lo in range(start, end, step):
            hi = min(lo + step, end)
            out[lo:hi] = round_block(x_MC[lo:hi], 0, rounding)
    return out


# --------------------------------------------------------------------------------------------
# GEMMs: the rounded operands into torch's bf16 GEMM, one group at a time
#
# torch's CPU bf16 GEMM accumulates in fp32 in an order set by the operands' memory layouts (both
# row-major or both column-major, only the left, or only the right column-major give three
# orders), and zero rows padded into the contraction can move elements between its vector lanes
# and its scalar tail. The contract fixes neither layouts nor padding (a GPU GEMM has orders of its
# own), so each GEMM below yields its result in each such order in turn (lazily: one is usually
# enough): the op's result is the contract's when it equals one of them in every element.

LAYOUTS = ("rr", "cr", "rc")  # left and right operand row- (r) or column-major (c)
PADS = (1, 16, 32, 128)  # the weight gradient's tokens per group padded to a multiple of these


def _as_layout(x: torch.Tensor, major: str) -> torch.Tensor:
    return x.contiguous() if major == "r" else x.t().contiguous().t()


def gemm(x_IJ: torch.Tensor, y_JL: torch.Tensor, layout: str = "rr", pad: int = 1) -> torch.Tensor:
    """torch's bf16 x @ y (fp32 accumulation) with the operands laid out per `layout` and the
    contraction J zero-padded to a multiple of `pad`."""
    extra = -x_IJ.shape[1] % pad
    x_IJ = torch.nn.functional.pad(x_IJ, (0, extra))
    y_JL = torch.nn.functional.pad(y_JL, (0, 0, 0, extra))
    return torch.mm(_as_layout(x_IJ, layout[0]), _as_layout(y_JL, layout[1]))


def _groups(offs: torch.Tensor) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of every group."""
    ends = offs.tolist()
    return [(e, start, end) for e, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]


def _rows_gemm(x_q_MC: torch.Tensor, w_q_ECL: torch.Tensor, offs: torch.Tensor) -> Iterator[torch.Tensor]:
    """out[M, L]: group e's rows of x times w[e], in each layout; rows past offs[-1] 0."""
    for layout in LAYOUTS:
        out_ML = torch.zeros(x_q_MC.shape[0], w_q_ECL.shape[2], dtype=torch.bfloat16)
        for e, start, end in _groups(offs):
            out_ML[start:end] = gemm(x_q_MC[start:end], w_q_ECL[e], layout)
        yield out_ML


def grouped_forward(a_MK: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor,
                    recipe: str, rounding: str, shared: bool = False) -> Iterator[torch.Tensor]:
    """out[M, N]: group e's rows of a times b[e], both rounded along K (b as `round_weight`)."""
    return _rows_gemm(round_along(a_MK, 1, recipe, rounding), round_weight(b_EKN, 1, recipe, rounding, shared), offs)


def grouped_dgrad(dout_MN: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor,
                  recipe: str, rounding: str, shared: bool = False) -> Iterator[torch.Tensor]:
    """da[M, K]: group e's rows of dout times b[e]^T, both rounded along N (b as `round_weight`)."""
    b_q_ENK = round_weight(b_EKN, 2, recipe, rounding, shared).transpose(1, 2)
    return _rows_gemm(round_along(dout_MN, 1, recipe, rounding), b_q_ENK, offs)


def grouped_wgrad(dout_MN: torch.Tensor, a_MK: torch.Tensor, offs: torch.Tensor,
                  recipe: str, rounding: str) -> Iterator[torch.Tensor]:
    """db[E, K, N]: a_e^T @ dout_e over group e's rows, both rounded along the tokens ("bf16": not
    rounded); an empty group's is 0."""
    ends = offs.tolist()
    a_q = round_tokens(a_MK, ends, recipe, rounding)
    g_q = round_tokens(dout_MN, ends, recipe, rounding)
    for pad in PADS:
        for layout in LAYOUTS:
            db_EKN = torch.zeros(len(ends), a_MK.shape[1], dout_MN.shape[1], dtype=torch.bfloat16)
            for e, start, end in _groups(offs):
                if end > start:
                    db_EKN[e] = gemm(a_q[start:end].t(), g_q[start:end], layout, pad)
            yield db_EKN


def linear_forward(x_MK: torch.Tensor, w_NK: torch.Tensor, recipe: str, rounding: str,
                   shared: bool = False) -> Iterator[torch.Tensor]:
    """out[M, N] = x @ w^T, both rounded along K (w as `round_weight`)."""
    x_q, w_q = round_along(x_MK, 1, recipe, rounding), round_weight(w_NK, 1, recipe, rounding, shared)
    return (gemm(x_q, w_q.t(), layout) for layout in LAYOUTS)


def linear_dgrad(dout_MN: torch.Tensor, w_NK: torch.Tensor, recipe: str, rounding: str,
                 shared: bool = False) -> Iterator[torch.Tensor]:
    """dx[M, K] = dout @ w, both rounded along N (w as `round_weight`)."""
    g_q, w_q = round_along(dout_MN, 1, recipe, rounding), round_weight(w_NK, 0, recipe, rounding, shared)
    return (gemm(g_q, w_q, layout) for layout in LAYOUTS)


def linear_wgrad(dout_MN: torch.Tensor, x_MK: torch.Tensor, recipe: str, rounding: str) -> Iterator[torch.Tensor]:
    """dw[N, K] = dout^T @ x, both rounded along the tokens as one group of all M rows (its last
    block short where M is not a multiple of 32; "bf16": not rounded)."""
    ends = [x_MK.shape[0]]
    g_q, x_q = round_tokens(dout_MN, ends, recipe, rounding), round_tokens(x_MK, ends, recipe, rounding)
    return (gemm(g_q.t(), x_q, layout, pad) for pad in PADS for layout in LAYOUTS)
