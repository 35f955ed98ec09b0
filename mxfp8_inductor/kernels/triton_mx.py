"""Triton MXFP8 kernels, bit-exact with `reference.py`, one pass over memory each.

Every quantizer is one kernel, `_mx_quant_kernel`, over a logical view X[b, r, c] of its input:
blocks of 32 run along r; r may be cut into groups (token groups of the weight gradient; a block
never straddles two groups), c is the other dim, b a batch (experts). The kernel writes either
float8 data + e8m0 scales, or the dequantized values (the fused quantize-dequantize of the Hopper
path). Scales go to one of three layouts (docs/design.md, "Scale layouts"):
  PLAIN       scale[b, block, c] at arbitrary strides;
  BLOCKED_COL groups along the block dim, each group's [C, blocks_g] tiles back to back (wgrad);
  BLOCKED_ROW groups along c (token rows, forward/input-grad) or one group per batch (3-D weights).
No wrapper reads `offs` on the host: grids are sized by static bounds and programs past the
data exit early.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..eligibility import check_offs_form
from ..options import check_choice
from . import reference as ref
from .launch import _MAX_ENTRIES, launch, launch_keyed
from .triton_common import (
    as_bits,
    block_amax,
    cdiv,
    e4m3_decode,
    e8m0_to_float,
    group_ends,
    group_of,
    group_table,
    inv_scale,
    lane_value,
    load_f32,
    padded_starts,
    pow2,
    scale_exponent,
    scaled_to_e4m3,
    store_f32,
)

PLAIN, BLOCKED_COL, BLOCKED_ROW = 0, 1, 2
_BLOCK_C = 64


class Tile(NamedTuple):
    """How one program of `_mx_quant_kernel` covers its input."""

    blocks: int  # 32-blocks along r per program
    columns: int  # columns per tile
    tiles: int  # column tiles per program
    warps: int
    band: int  # 0: a 2-D grid, row strips fastest; n: a 1-D grid walking bands of n row strips


# The tile of each layout, keyed by where the 32-blocks run: along the contiguous dim ("rows"),
# across rows ("cols"), across rows within one token group ("one_group": no group lookup to share
# across tiles) or several ("groups"), and across rows into a transposed output ("transposing":
# the native operands quantized along N or along the tokens). Chosen by
# `benchmarks/bench_quantize.py --sweep` on the H200 (docs/performance.md). One warp keeps a
# block's maximum and the byte transpose inside the warp: Triton splits a block's 32 rows across
# the warps of larger tiles, through shared memory and a barrier. Bands of one row strip keep the
# per-group quantize-dequantize's group table in cache.
TILES = {"rows": Tile(8, 16, 1, 4, 0), "cols": Tile(1, 128, 1, 2, 0), "one_group": Tile(1, 128, 1, 2, 0),
         "groups": Tile(1, 64, 1, 1, 1), "transposing": Tile(2, 64, 1, 1, 0)}


@triton.jit
def _band_order(pid, n_r, n_c, BAND: tl.constexpr):
    """(row strip, column strip) of program `pid` of a 1-D grid over n_r x n_c tiles that walks
    bands of BAND row strips column strip by column strip."""
    per_band = BAND * n_c
    first = (pid // per_band) * BAND
    rows = tl.minimum(n_r - first, BAND)
    local = pid % per_band
    return first + local % rows, local // rows


@triton.jit
def _scale_group_bounds(ends_ptr, G: tl.constexpr, GP: tl.constexpr, LIMIT, MODE: tl.constexpr):
    """Each scale group's first and end index in lanes, from the G group row ends in memory: in
    32-row blocks (BLOCKED_COL: groups along the blocks) or in rows (BLOCKED_ROW)."""
    starts, ends, blk_ends = group_table(ends_ptr, G, GP, 32, LIMIT)
    if MODE == 1:
        starts, ends = blk_ends - (ends - starts + 31) // 32, blk_ends
    return starts, ends


@triton.jit
def _blocked_offset(row, col, Wp):
    """Byte of element (row, col) in a blocked (128x4 tiles, SWIZZLE_32_4_4) matrix Wp columns wide."""
    tile = (row // 128) * (Wp // 4) + col // 4
    return tile * 512 + (row % 32) * 16 + ((row // 32) % 4) * 4 + col % 4


@triton.jit
def _scale_offsets(b, row, col, ss_b, ss_col, ss_row, g_start, g_end, G: tl.constexpr, Hp, Wp, MODE: tl.constexpr):
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
        g = group_of(g_end, G, col)
        first = lane_value(g_start, g)
        nblk = lane_value(g_end - g_start, g)
        base = lane_value(padded_starts(g_end - g_start, 4), g).to(tl.int64) * Hp
        offs = base[:, None] + _blocked_offset(row[None, :], (col - first)[:, None], ((nblk + 3) // 4 * 4)[:, None])
        valid = (g < G)[:, None] & (row[None, :] >= 0)
    else:
        g = group_of(g_end, G, row)
        first = lane_value(g_start, g)
        base = b * Hp * Wp + lane_value(padded_starts(g_end - g_start, 128), g).to(tl.int64) * Wp
        offs = base[None, :] + _blocked_offset((row - first)[None, :], col[:, None], Wp)
        valid = (col[:, None] >= 0) & (g < G)[None, :]
    return offs, valid


@triton.jit
def _mx_quant_kernel(
    x_ptr, sx_b, sx_r, sx_c,
    y_ptr, sy_b, sy_r, sy_c,
    s_ptr, ss_b, ss_blk, ss_c,
    R, C, n_main, n_r, R_y,
    r_ends_ptr, R_GROUPS: tl.constexpr, R_GROUPS_P2: tl.constexpr, padded_ends_ptr,
    s_ends_ptr, S_GROUPS: tl.constexpr, S_GROUPS_P2: tl.constexpr, Hp, Wp,
    RCEIL: tl.constexpr,
    DEQUANT: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    PAD_Y: tl.constexpr,
    GROUPED: tl.constexpr,
    OUT_BF16: tl.constexpr,
    HW_CVT: tl.constexpr,
    NB: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CITERS: tl.constexpr,
    BAND: tl.constexpr,
):
    """Program (p, q, b): blocks p*NB .. p*NB+NB-1 along r (global block ids: group after group),
    columns q*CITERS*BLOCK_C .. in CITERS tiles of [NB, 32, BLOCK_C], batch b; the block-to-group
    lookup is made once for all CITERS tiles. The n_r - n_main programs p >= n_main zero the rows
    of y past the last group end (PAD_Y: its padded end) in turns of NB*32 rows, taking every
    (n_r - n_main)-th chunk of them: no quantizer leaves a row of its output unwritten."""
    if BAND == 0:
        pid, pid_c = tl.program_id(0), tl.program_id(1)
    else:
        pid, pid_c = _band_order(tl.program_id(0), n_r, tl.cdiv(C, BLOCK_C * CITERS), BAND)
    b = tl.program_id(2).to(tl.int64)
    rr = tl.arange(0, 32)
    if pid >= n_main:
        if PAD_Y:  # y's rows: every group padded to whole blocks, then up to R_y
            _, _, blk_ends = group_table(r_ends_ptr, R_GROUPS, R_GROUPS_P2, 32, R)
            last = tl.max(blk_ends, 0) * 32
        else:
            last = tl.max(group_ends(r_ends_ptr, R_GROUPS, R_GROUPS_P2, R, 0), 0).to(tl.int32)
        zero = tl.zeros([NB, 32, BLOCK_C], dtype=y_ptr.dtype.element_ty)
        r0 = last + (pid - n_main) * NB * 32
        while r0 < R_y:  # not a range: the interpreter's scalars are 1-element arrays, not indices
            r = r0 + tl.arange(0, NB)[:, None] * 32 + rr[None, :]
            for t in range(CITERS):
                c = (pid_c * CITERS + t) * BLOCK_C + tl.arange(0, BLOCK_C)
                m = ((r < R_y)[:, :, None]) & (c < C)[None, None, :]
                tl.store(y_ptr + b * sy_b + r[:, :, None] * sy_r + c[None, None, :] * sy_c, zero, mask=m)
            r0 += (n_r - n_main) * NB * 32
    else:
        jb = pid * NB + tl.arange(0, NB)
        if GROUPED:
            starts, ends, blk_ends = group_table(r_ends_ptr, R_GROUPS, R_GROUPS_P2, 32, R)
            g = group_of(blk_ends, R_GROUPS, jb)
            row0 = lane_value(starts, g)
            g_end = lane_value(ends, g)
            first_blk = lane_value(blk_ends, g) - (g_end - row0 + 31) // 32
            r = (row0 + (jb - first_blk) * 32)[:, None] + rr[None, :]
        else:
            # no group table: r is then provably 32-aligned, so loads along r vectorise
            g = (jb * 32 >= R).to(tl.int32)  # the one group, or 1: past the end
            g_end = jb * 0 + R
            r = jb[:, None] * 32 + rr[None, :]
        r_ok = r < g_end[:, None]
        if PAD_Y:
            # every group padded to whole blocks: block jb's rows start at jb * 32. Padding rows
            # are stored too (the zeros loaded for them, byte 0), so the mask is constant per
            # block and the provably aligned stores vectorise (16 bytes per thread instead of 1)
            r_y = jb[:, None] * 32 + rr[None, :]
            y_ok = tl.broadcast_to((g < R_GROUPS)[:, None], (NB, 32))
            if (pid == 0) & (pid_c == 0) & (tl.program_id(2) == 0):
                i = tl.arange(0, R_GROUPS_P2)
                tl.store(padded_ends_ptr + i, blk_ends * 32, mask=i < R_GROUPS)  # the padded group ends
        else:
            r_y = r
            y_ok = r_ok
        if SCALE_MODE == 0:
            s_first, s_end = jb, jb  # unread: plain scales take strides
        else:
            s_first, s_end = _scale_group_bounds(s_ends_ptr, S_GROUPS, S_GROUPS_P2, R if SCALE_MODE == 1 else C,
                                                 SCALE_MODE)
        for t in range(CITERS):
            c = (pid_c * CITERS + t) * BLOCK_C + tl.arange(0, BLOCK_C)
            c_ok = c < C
            m = r_ok[:, :, None] & c_ok[None, None, :]
            x = load_f32(x_ptr + b * sx_b + r[:, :, None] * sx_r + c[None, None, :] * sx_c, m)

            # NaN counts as inf, so amax == inf marks every non-finite block
            amax = block_amax(x, 1)
            biased = scale_exponent(amax, RCEIL)
            inv = inv_scale(biased)
            q8 = scaled_to_e4m3(x, inv[:, None, :], HW_CVT)

            y_offs = b * sy_b + r_y[:, :, None] * sy_r + c[None, None, :] * sy_c
            m_y = y_ok[:, :, None] & c_ok[None, None, :]
            if DEQUANT:
                y = e4m3_decode(q8, HW_CVT) * e8m0_to_float(biased)[:, None, :]
                store_f32(y_ptr + y_offs, y, m_y, OUT_BF16, HW_CVT)
            else:
                tl.store(y_ptr + y_offs, q8, mask=m_y)
                s_offs, s_ok = _scale_offsets(b, c, jb, ss_b, ss_blk, ss_c, s_first, s_end, S_GROUPS, Hp, Wp,
                                              SCALE_MODE)
                s_ok = s_ok & c_ok[None, :] & (g < R_GROUPS)[:, None]
                tl.store(s_ptr + s_offs, biased.to(tl.uint8), mask=s_ok)


@triton.jit
def _dequant_kernel(
    q_ptr, sq_b, sq_r, sq_c, s_ptr, ss_b, ss_r, ss_c, y_ptr, sy_b, sy_r, sy_c, C,
    OUT_BF16: tl.constexpr, HW_CVT: tl.constexpr, BLOCK_C: tl.constexpr,
):
    j = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    r = j * 32 + tl.arange(0, 32)
    q = tl.load(q_ptr + b * sq_b + r[:, None] * sq_r + c[None, :] * sq_c, mask=c_ok[None, :])
    biased = tl.load(s_ptr + b * ss_b + j * ss_r + c * ss_c, mask=c_ok).to(tl.int32)
    y = e4m3_decode(q, HW_CVT) * e8m0_to_float(biased)[None, :]
    store_f32(y_ptr + b * sy_b + r[:, None] * sy_r + c[None, :] * sy_c, y, c_ok[None, :], OUT_BF16, HW_CVT)


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
    first, end = _scale_group_bounds(ends_ptr, G, GP, rows if MODE == 2 else cols * 32, MODE)
    offs, ok = _scale_offsets(b, row, col, 0, 0, 0, first, end, G, Hp, Wp, MODE)
    tl.store(out_ptr + offs, v, mask=m & ok)


# --------------------------------------------------------------------------------------------
# Host wrappers (no host synchronisation)


class View3(NamedTuple):
    """A tensor seen as X[b, r, c]: the tensor itself (the kernels' pointer), and the shape and
    strides of the 3-D view, computed rather than made (a torch view op costs microseconds of host
    time, and compiled MoE blocks call the quantizers per operand per step)."""

    t: torch.Tensor
    shape: tuple[int, int, int]
    strides: tuple[int, int, int]


def _view3(x: torch.Tensor, dim: int) -> View3:
    """x (or its scales, same rank) as X[b, r, c] with blocks along r = `dim`."""
    n = x.dim()
    if n > 3:
        raise ValueError(f"Triton MXFP8 kernels take 1-D to 3-D tensors, got {n}-D")
    size, stride = x.shape, x.stride()
    if n == 1:
        return View3(x, (1, size[0], 1), (size[0] * stride[0], stride[0], stride[0]))  # as view(1, -1, 1)
    dim = dim % n
    if n == 2:  # the batch dim of size 1 takes the stride unsqueeze(0) would give it
        return View3(x, (1, size[dim], size[1 - dim]), (size[dim] * stride[dim], stride[dim], stride[1 - dim]))
    bdim = 0 if dim != 0 else 1
    other = 3 - dim - bdim
    return View3(x, (size[bdim], size[dim], size[other]), (stride[bdim], stride[dim], stride[other]))


@functools.lru_cache(maxsize=256)
def _one_group(n: int, device: torch.device) -> torch.Tensor:
    """[n] as a device tensor, made once: building it from a host list would copy host to
    device, which waits for the stream, on every call."""
    return torch.full((1,), n, dtype=torch.int32, device=device)


def _tile(r_stride: int, groups: int, y_r_stride: int | None = None) -> Tile:
    """The `TILES` entry of a launch: blocks along r of stride `r_stride` in x and `y_r_stride`
    in y (default: x's), in `groups` token groups (0: ungrouped)."""
    if r_stride == 1:
        return Tile(*TILES["rows"])
    if y_r_stride == 1:
        return Tile(*TILES["transposing"])
    return Tile(*TILES["cols" if not groups else "groups" if groups > 1 else "one_group"])


def _launch_quant(
    x3: View3, y3: View3, rounding: str, *, dequant: bool,
    s3: View3 | None = None, scale_mode: int = PLAIN,
    r_ends: torch.Tensor | None = None, padded_ends: torch.Tensor | None = None,
    s_ends: torch.Tensor | None = None, Hp: int = 0, Wp: int = 0, scale_buf: torch.Tensor | None = None,
) -> Callable[..., None] | None:
    """One `_mx_quant_kernel` launch, bound once per shape, layout and mode (`launch_keyed`),
    which it returns (None for an empty x: nothing to launch).
    `r_ends`: token group ends along r; `padded_ends`: when given, y holds every group padded to whole
    blocks and `padded_ends` receives the padded ends; `s_ends`: group ends of BLOCKED_ROW
    scales along c (default: one group; BLOCKED_COL scales take `r_ends`)."""
    B, R, C = x3.shape
    if B * R * C == 0:
        return None
    grouped = r_ends is not None
    tile = _tile(x3.strides[1], r_ends.numel() if grouped else 0, y3.strides[1])
    # the grouped quantize-dequantize takes bf16 as int16 bits on GPUs too, where that measured
    # faster than bf16 pointers (benchmarks/bench_quantize.py)
    bits = grouped and dequant
    tensors = (as_bits(x3.t, bits), as_bits(y3.t, bits), scale_buf, r_ends, padded_ends, s_ends)
    key = (_mx_quant_kernel, x3.shape, x3.strides, y3.strides, s3.strides if s3 is not None else None, rounding,
           dequant, scale_mode, Hp, Wp, tile)
    return launch_keyed(
        key, tensors, lambda: _quant_launch(tensors, x3, y3, s3, rounding, dequant, scale_mode, Hp, Wp, tile))


_TAIL_CHUNKS = 16


def _quant_launch(tensors, x3, y3, s3, rounding, dequant, scale_mode, Hp, Wp, tile) -> tuple:
    """(kernel, grid, args, kwargs) of the launch `_launch_quant` describes."""
    check_choice("rounding", rounding)
    x, y, scale_buf, r_ends, padded_ends, s_ends = tensors
    B, R, C = x3.shape
    grouped = r_ends is not None
    if not grouped and R % ref.BLOCK:
        raise ValueError(f"block dim of size {R} is not a multiple of {ref.BLOCK}")
    R_GROUPS = r_ends.numel() if grouped else 1
    NB, BLOCK_C, citers, warps, band = tile
    n_main = cdiv(ref.group_scale_rows(R, R_GROUPS) if grouped else R // 32, NB)
    # extra programs zero the rows past the last group end, which the host does not read: enough
    # for all of y's rows at up to _TAIL_CHUNKS chunks of NB*32 rows each, each looping only over
    # the rows there are: a few programs instead of one per chunk, which cost whole waves of
    # programs on large inputs
    R_y = y3.shape[1]  # y's rows: R, or every group padded (PAD_Y)
    n_tail = cdiv(R_y, 32 * NB * _TAIL_CHUNKS) if grouped else 0
    if s_ends is None and scale_mode != PLAIN:  # BLOCKED_COL scales are grouped as the blocks are
        s_ends = r_ends if scale_mode == BLOCKED_COL else _one_group(C, x.device)
    S_GROUPS = s_ends.numel() if s_ends is not None else 1
    n_r, n_c = n_main + n_tail, cdiv(C, BLOCK_C * citers)
    grid = (n_r, n_c, B) if band == 0 else (n_r * n_c, 1, B)
    # pointers the kernel never reads in this mode get y, not device tensors made for the call
    args = (
        x, *x3.strides, y, *y3.strides, y if scale_buf is None else scale_buf,
        *(s3.strides if s3 is not None else (0, 0, 0)), R, C, n_main, n_r, R_y,
        r_ends if grouped else y, R_GROUPS, pow2(R_GROUPS), y if padded_ends is None else padded_ends,
        y if s_ends is None else s_ends, S_GROUPS, pow2(S_GROUPS), Hp, Wp,
    )
    consts = dict(
        RCEIL=rounding == "rceil", DEQUANT=dequant, SCALE_MODE=scale_mode, PAD_Y=padded_ends is not None,
        GROUPED=grouped,
        OUT_BF16=y3.t.dtype == torch.bfloat16, HW_CVT=x.is_cuda, NB=NB, BLOCK_C=BLOCK_C, CITERS=citers,
        BAND=band, num_warps=warps,
    )
    return _mx_quant_kernel, grid, args, consts


def quantize(x: torch.Tensor, dim: int = -1, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `reference.quantize` (1-D to 3-D inputs, any strides)."""
    ref.check_float(x)
    dim = dim % x.dim()
    if x.shape[dim] % ref.BLOCK:
        raise ValueError(f"dim {dim} of shape {tuple(x.shape)} must be a multiple of {ref.BLOCK}")
    data = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    s_shape = list(x.shape)
    s_shape[dim] //= ref.BLOCK
    scales = torch.empty(s_shape, dtype=torch.uint8, device=x.device)
    _launch_quant(_view3(x, dim), _view3(data, dim), rounding, dequant=False, s3=_view3(scales, dim),
                  scale_buf=scales)
    return data.view(torch.float8_e4m3fn), scales.view(torch.float8_e8m0fnu)


# The quantize-dequantize wrappers' calls by everything they depend on (x's layout, dtype, device
# and alignment, the group ends' count and alignment, the arguments, the tile): (output strides, dtype,
# whether bf16 travels as bits, bound launch). A compiled MoE block calls these wrappers 16 times
# per step with the same layouts; a known call skips the checks, views and key building above
# the launch, the host time that bounds the small MoE shapes (benchmarks/bench_launch.py).
_plans: dict[tuple, tuple] = {}


def _planned(key: tuple, x: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor | None:
    """The output of a known quantize-dequantize call, launched; None for a new call."""
    plan = _plans.get(key)
    if plan is None:
        return None
    strides, dtype, bits, relaunch = plan
    y = torch.empty_strided(x.shape, strides, dtype=dtype, device=x.device)
    relaunch(as_bits(x, bits), as_bits(y, bits), None, offs, None, None)  # `_launch_quant`'s tensor order
    return y


def _plan(key: tuple, y: torch.Tensor, bits: bool, relaunch: Callable[..., None] | None) -> torch.Tensor:
    if relaunch is not None:
        if len(_plans) >= _MAX_ENTRIES:
            _plans.clear()
        _plans[key] = (y.stride(), y.dtype, bits, relaunch)
    return y


def quantize_dequantize(
    x: torch.Tensor, dim: int = -1, rounding: str = "rceil", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Fused dequantize(quantize(x)) in one pass; the output keeps x's strides when x is dense."""
    key = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, dim, rounding, dtype, _tile(x.stride(dim), 0))
    y = _planned(key, x, None)
    if y is not None:
        return y
    ref.check_float(x)
    dim = dim % x.dim()
    if x.shape[dim] % ref.BLOCK:
        raise ValueError(f"dim {dim} of shape {tuple(x.shape)} must be a multiple of {ref.BLOCK}")
    y = torch.empty_like(x, dtype=dtype or x.dtype)  # x's memory layout: coalesced writes
    return _plan(key, y, False, _launch_quant(_view3(x, dim), _view3(y, dim), rounding, dequant=True))


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Triton twin of `reference.dequantize`."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dequantize writes bf16 or fp32, got {dtype}")
    dim = dim % data.dim()
    y = torch.empty(data.shape, dtype=dtype, device=data.device)
    q3 = _view3(data.view(torch.uint8), dim)
    s3 = _view3(scales.view(torch.uint8), dim)
    y3 = _view3(y, dim)
    B, R, C = q3.shape
    launch(
        _dequant_kernel, (R // 32, cdiv(C, _BLOCK_C), B),
        q3.t, *q3.strides, s3.t, *s3.strides, as_bits(y3.t), *y3.strides, C,
        OUT_BF16=dtype == torch.bfloat16, HW_CVT=data.is_cuda, BLOCK_C=_BLOCK_C,
    )
    return y


def _check_groups(x_MK: torch.Tensor, offs: torch.Tensor) -> None:
    ref.check_float(x_MK)
    if x_MK.dim() != 2:
        raise ValueError(f"grouped quantization takes a 2-D [M, K] tensor, got {tuple(x_MK.shape)}")
    check_offs_form(offs)


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `reference.quantize_groups`: data [M, K], scales [M // 32 + G, K]."""
    _check_groups(x_MK, offs)
    M, K = x_MK.shape
    data = torch.empty(M, K, dtype=torch.uint8, device=x_MK.device)
    scales = torch.zeros(ref.group_scale_rows(M, offs.numel()), K, dtype=torch.uint8, device=x_MK.device)
    _launch_quant(_view3(x_MK, 0), _view3(data, 0), rounding, dequant=False, s3=_view3(scales, 0),
                  r_ends=offs, scale_buf=scales)
    return data.view(torch.float8_e4m3fn), scales.view(torch.float8_e8m0fnu)


def quantize_dequantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Fused per-group quantize-dequantize along the tokens; rows past offs[-1] are 0."""
    key = (x_MK.shape, x_MK.stride(), x_MK.dtype, x_MK.device, x_MK.data_ptr() % 16,
           offs.shape, offs.dtype, offs.device, offs.data_ptr() % 16, rounding, dtype,
           _tile(x_MK.stride(0), offs.numel()))
    y = _planned(key, x_MK, offs)
    if y is not None:
        return y
    _check_groups(x_MK, offs)
    y = torch.empty(x_MK.shape, dtype=dtype or x_MK.dtype, device=x_MK.device)
    # the grouped quantize-dequantize takes bf16 as bits on GPUs too (see `_launch_quant`)
    return _plan(key, y, True, _launch_quant(_view3(x_MK, 0), _view3(y, 0), rounding, dequant=True, r_ends=offs))


# --------------------------------------------------------------------------------------------
# Operands of the native GEMM: scales written straight into the blocked layout


def quantize_rows_blocked(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize token rows along K; scales blocked per token group (`to_blocked_groups` "rows")."""
    _check_groups(x_MK, offs)
    M, K = x_MK.shape
    if K % ref.BLOCK:
        raise ValueError(f"K={K} must be a multiple of {ref.BLOCK}")
    Wp = ref._round_up(K // ref.BLOCK, 4)
    G = offs.numel()
    data = torch.empty(M, K, dtype=torch.uint8, device=x_MK.device)
    buf = torch.zeros(M + G * 128, Wp, dtype=torch.uint8, device=x_MK.device)
    _launch_quant(_view3(x_MK, 1), _view3(data, 1), rounding, dequant=False,
                  scale_mode=BLOCKED_ROW, s_ends=offs, Hp=0, Wp=Wp, scale_buf=buf)
    return data.view(torch.float8_e4m3fn), buf.view(torch.float8_e8m0fnu)


def quantize_weight_blocked(
    w_ENK: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize 3-D weights [E, N, K] along K (any strides) into contiguous data [E, N, K] and
    per-expert blocked scales (E, round_up(N,128) * round_up(K/32,4))."""
    ref.check_float(w_ENK)
    E, N, K = w_ENK.shape
    if K % ref.BLOCK:
        raise ValueError(f"K={K} must be a multiple of {ref.BLOCK}")
    Hp, Wp = ref._round_up(N, 128), ref._round_up(K // ref.BLOCK, 4)
    data = torch.empty(E, N, K, dtype=torch.uint8, device=w_ENK.device)
    buf = torch.zeros(E, Hp * Wp, dtype=torch.uint8, device=w_ENK.device)
    _launch_quant(_view3(w_ENK, 2), _view3(data, 2), rounding, dequant=False,
                  scale_mode=BLOCKED_ROW, Hp=Hp, Wp=Wp, scale_buf=buf)
    return data.view(torch.float8_e4m3fn), buf.view(torch.float8_e8m0fnu)


def quantize_groups_blocked(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-gradient operand: quantize [M, K] along the tokens per group, written transposed as
    data [K, M + 32*G] with each group zero-padded to a multiple of 32 rows, scales blocked per
    group (`to_blocked_groups` "cols" of [K, blocks]). Returns (data_KMp, scales, padded_offs)."""
    _check_groups(x_MK, offs)
    M, K = x_MK.shape
    G = offs.numel()
    Mp = ref._round_up(M, 32) + 32 * G
    # the kernel writes every byte, padding included; an empty x launches none
    data = (torch.empty if M * K else torch.zeros)(K, Mp, dtype=torch.uint8, device=x_MK.device)
    Hp = ref._round_up(K, 128)
    S = ref.group_scale_rows(M, G)
    buf = torch.zeros(Hp, S + 4 * G, dtype=torch.uint8, device=x_MK.device)
    # the kernel writes the padded group ends; an empty x launches no kernel
    padded_offs = (torch.empty(G, dtype=torch.int32, device=x_MK.device) if M * K
                   else ref.padded_group_offs(ref.group_ends(offs, M)))
    _launch_quant(_view3(x_MK, 0), _view3(data, 1), rounding, dequant=False,
                  scale_mode=BLOCKED_COL, r_ends=offs, padded_ends=padded_offs, Hp=Hp, scale_buf=buf)
    return data.view(torch.float8_e4m3fn), buf.view(torch.float8_e8m0fnu), padded_offs


# --------------------------------------------------------------------------------------------
# Standalone layout kernels


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Triton twin of `reference.to_blocked`."""
    if scales.dim() not in (2, 3):
        raise ValueError(f"to_blocked takes 2-D or 3-D scales, got {scales.dim()}-D")
    s3 = scales.view(torch.uint8)
    s3 = s3.unsqueeze(0) if s3.dim() == 2 else s3
    B, H, W = s3.shape
    Hp, Wp = ref._round_up(H, 128), ref._round_up(W, 4)
    out = torch.zeros(B, Hp * Wp, dtype=torch.uint8, device=scales.device)
    _launch_blocked(s3, out, BLOCKED_ROW, _one_group(H, scales.device), Hp, Wp)
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
    grid = (cdiv(H, 64), cdiv(W, 16), B)
    launch(_to_blocked_kernel, grid, s3, *s3.stride(), out, H, W, ends, ends.numel(), pow2(ends.numel()),
           Hp, Wp, MODE=mode, BLOCK_R=64, BLOCK_W=16)
