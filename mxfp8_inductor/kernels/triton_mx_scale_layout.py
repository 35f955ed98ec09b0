"""Where MXFP8 scales go on the device (docs/design.md, "Scale layouts"): the index math every
layout shares, used by the quantize kernel (`triton_mx_quant`) to write scales straight into
their layout, and the standalone kernel that moves plain scales into the native GEMM's blocked
layout (`to_blocked`, `to_blocked_groups`).

The layouts, of the scales of a logical view X[b, r, c] with blocks of 32 along r:
  PLAIN       scale[b, block, c] at arbitrary strides;
  BLOCKED_COL groups along the block dim, each group's [C, blocks_g] tiles back to back (wgrad);
  BLOCKED_ROW groups along c (token rows, forward/input-grad) or one group per batch (3-D weights).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import reference as ref
from . import triton_common as tc
from .launch import launch

PLAIN, BLOCKED_COL, BLOCKED_ROW = 0, 1, 2


@triton.jit
def scale_group_bounds(ends_ptr, G: tl.constexpr, GP: tl.constexpr, LIMIT, MODE: tl.constexpr):
    """Each scale group's first and end index in lanes, from the G group row ends in memory: in
    32-row blocks (BLOCKED_COL: groups along the blocks) or in rows (BLOCKED_ROW)."""
    starts, ends, blk_ends = tc.group_table(ends_ptr, G, GP, 32, LIMIT)
    if MODE == 1:
        starts, ends = blk_ends - (ends - starts + 31) // 32, blk_ends
    return starts, ends


@triton.jit
def _blocked_offset(row, col, Wp):
    """Byte of element (row, col) in a blocked (128x4 tiles, SWIZZLE_32_4_4) matrix Wp columns wide."""
    tile = (row // 128) * (Wp // 4) + col // 4
    return tile * 512 + (row % 32) * 16 + ((row // 32) % 4) * 4 + col % 4


@triton.jit
def scale_offsets(b, row, col, ss_b, ss_col, ss_row, g_start, g_end, G: tl.constexpr, Hp, Wp, MODE: tl.constexpr):
    """Offsets [len(col), len(row)] of the scales of blocks `col` of native-orientation rows `row`
    (1-D each), and a validity mask.

    `g_start`, `g_end`: each group's bounds in lanes, in blocks (BLOCKED_COL: groups along col) or
    in rows (BLOCKED_ROW: groups along row). Each group's place in the buffer follows from them
    (tiles padded to 4 columns or 128 rows), so no host op makes a table per call.
    """
    if MODE == 0:
        offs = b * ss_b + col[:, None] * ss_col + row[None, :] * ss_row
        valid = (col[:, None] >= 0) & (row[None, :] >= 0)
    elif MODE == 1:
        g = tc.group_of(g_end, G, col)
        first = tc.lane_value(g_start, g)
        nblk = tc.lane_value(g_end - g_start, g)
        base = tc.lane_value(tc.padded_starts(g_end - g_start, 4), g).to(tl.int64) * Hp
        offs = base[:, None] + _blocked_offset(row[None, :], (col - first)[:, None], ((nblk + 3) // 4 * 4)[:, None])
        valid = (g < G)[:, None] & (row[None, :] >= 0)
    else:
        g = tc.group_of(g_end, G, row)
        first = tc.lane_value(g_start, g)
        base = b * Hp * Wp + tc.lane_value(tc.padded_starts(g_end - g_start, 128), g).to(tl.int64) * Wp
        offs = base[None, :] + _blocked_offset((row - first)[None, :], col[:, None], Wp)
        valid = (col[:, None] >= 0) & (g < G)[None, :]
    return offs, valid


@triton.jit
def _to_blocked_kernel(
    s_ptr, ss_b, ss_r, ss_c, out_ptr, rows, cols, ends_ptr, G: tl.constexpr, GP: tl.constexpr,
    Hp, Wp, MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
):
    b = tl.program_id(2).to(tl.int64)
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = (col < cols)[:, None] & (row < rows)[None, :]
    v = tl.load(s_ptr + b * ss_b + row[None, :] * ss_r + col[:, None] * ss_c, mask=m)
    first, end = scale_group_bounds(ends_ptr, G, GP, rows if MODE == 2 else cols * 32, MODE)
    offs, ok = scale_offsets(b, row, col, 0, 0, 0, first, end, G, Hp, Wp, MODE)
    tl.store(out_ptr + offs, v, mask=m & ok)


@functools.lru_cache(maxsize=256)
def one_group(n: int, device: torch.device) -> torch.Tensor:
    """[n] as a device tensor, made once: building it from a host list would copy host to
    device, which waits for the stream, on every call."""
    return torch.full((1,), n, dtype=torch.int32, device=device)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Triton twin of `reference.to_blocked`."""
    if scales.dim() not in (2, 3):
        raise ValueError(f"to_blocked takes 2-D or 3-D scales, got {scales.dim()}-D")
    s3 = scales.view(torch.uint8)
    s3 = s3.unsqueeze(0) if s3.dim() == 2 else s3
    B, H, W = s3.shape
    Hp, Wp = ref._round_up(H, 128), ref._round_up(W, 4)
    out = torch.zeros(B, Hp * Wp, dtype=torch.uint8, device=scales.device)
    _launch_blocked(s3, out, BLOCKED_ROW, one_group(H, scales.device), Hp, Wp)
    out = out.view(Hp, Wp) if scales.dim() == 2 else out
    return out.view(torch.float8_e8m0fnu)


def to_blocked_groups(
    scales: torch.Tensor, offs: torch.Tensor, along: str = "rows"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `reference.to_blocked_groups`."""
    if scales.dim() != 2:
        raise ValueError(f"to_blocked_groups takes 2-D scales, got {scales.dim()}-D")
    rows, cols = scales.shape
    G = offs.numel()
    starts = ref.blocked_group_starts(offs, along, rows if along == "rows" else cols * ref.BLOCK)
    s3 = scales.view(torch.uint8).unsqueeze(0)
    if along == "rows":
        Wp = ref._round_up(cols, 4)
        out = torch.zeros(rows + G * 128, Wp, dtype=torch.uint8, device=scales.device)
        _launch_blocked(s3, out, BLOCKED_ROW, offs, 0, Wp)
    else:
        Hp = ref._round_up(rows, 128)
        out = torch.zeros(Hp, cols + G * 4, dtype=torch.uint8, device=scales.device)
        _launch_blocked(s3, out, BLOCKED_COL, offs, Hp, 0)
    return out.view(torch.float8_e8m0fnu), starts


def _launch_blocked(s3, out, mode, ends, Hp, Wp) -> None:
    B, H, W = s3.shape
    grid = (tc.cdiv(H, 64), tc.cdiv(W, 16), B)
    launch(_to_blocked_kernel, grid, s3, *s3.stride(), out, H, W, ends, ends.numel(), tc.pow2(ends.numel()),
           Hp, Wp, MODE=mode, BLOCK_R=64, BLOCK_W=16)
