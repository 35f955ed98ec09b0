"""The device kernels of the Triton MXFP8 quantizers (`triton_mx` sizes and launches them),
bit-exact with `reference.py`, one pass over memory each.

Every quantizer is one kernel, `mx_quant_kernel`, over a logical view X[b, r, c] of its input:
blocks of 32 run along r; r may be cut into groups (token groups of the weight gradient; a block
never straddles two groups), c is the other dim, b a batch (experts). What a launch writes is one
of the named `Layout`s below: float8 data + e8m0 scales, the scales in one of the layouts of
`triton_mx_scale_layout` (PLAIN, BLOCKED_COL, BLOCKED_ROW), or the dequantized values (the fused
quantize-dequantize of the Hopper path). No kernel reads `offs` on the host: grids are sized by
static bounds and programs past the data exit early.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from . import triton_common as tc
from .triton_mx_scale_layout import BLOCKED_COL, BLOCKED_ROW, PLAIN, scale_group_bounds, scale_offsets


class Layout(NamedTuple):
    """What a `mx_quant_kernel` launch writes, as the kernel's constexprs of the same names (the
    launch passes `**layout._asdict()`); each quantizer launches one of the named layouts below."""

    DEQUANT: bool  # y holds the dequantized values and no scales are written, else float8 data + scales
    GROUPED: bool  # blocks run within the token groups whose ends are r_ends
    PAD_Y: bool  # y holds every group padded to whole blocks, and the padded group ends are written
    SCALE_MODE: int  # where the scales go (`triton_mx_scale_layout`): PLAIN, BLOCKED_COL or BLOCKED_ROW


# float8 data, scales [b, block, c] at any strides
PLAIN_SCALES = Layout(DEQUANT=False, GROUPED=False, PAD_Y=False, SCALE_MODE=PLAIN)
# the dequantized values of blocks along r
DEQUANTIZED = Layout(DEQUANT=True, GROUPED=False, PAD_Y=False, SCALE_MODE=PLAIN)
# float8 data in blocks within token groups, scales [blocks of every group, c]
GROUPS_PLAIN_SCALES = Layout(DEQUANT=False, GROUPED=True, PAD_Y=False, SCALE_MODE=PLAIN)
# the dequantized values of blocks within token groups, zeros past the last group
GROUPS_DEQUANTIZED = Layout(DEQUANT=True, GROUPED=True, PAD_Y=False, SCALE_MODE=PLAIN)
# a native GEMM operand, rows blocked along K (r = K): scales in the GEMM's swizzled blocked layout,
# grouped along the rows (token groups, or one group per expert of the weights)
ROWS_BLOCKED_SCALES = Layout(DEQUANT=False, GROUPED=False, PAD_Y=False, SCALE_MODE=BLOCKED_ROW)
# the native weight-gradient operand, blocked along the tokens (r = M): every token group padded to
# whole blocks in y, scales in the GEMM's swizzled blocked layout per group
GROUPS_PADDED_BLOCKED_SCALES = Layout(DEQUANT=False, GROUPED=True, PAD_Y=True, SCALE_MODE=BLOCKED_COL)


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
def mx_quant_kernel(
    x_ptr, sx_b, sx_r, sx_c,
    y_ptr, sy_b, sy_r, sy_c,
    s_ptr, ss_b, ss_blk, ss_c,
    R, C, n_main, n_r, R_y,
    r_ends_ptr, R_GROUPS: tl.constexpr, R_GROUPS_P2: tl.constexpr, padded_ends_ptr,
    s_ends_ptr, S_GROUPS: tl.constexpr, S_GROUPS_P2: tl.constexpr, Hp, Wp,
    RCEIL: tl.constexpr,
    DEQUANT: tl.constexpr,  # DEQUANT to SCALE_MODE: the fields of the launch's `Layout`
    GROUPED: tl.constexpr,
    PAD_Y: tl.constexpr,
    SCALE_MODE: tl.constexpr,
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
            _, _, blk_ends = tc.group_table(r_ends_ptr, R_GROUPS, R_GROUPS_P2, 32, R)
            last = tl.max(blk_ends, 0) * 32
        else:
            last = tl.max(tc.group_ends(r_ends_ptr, R_GROUPS, R_GROUPS_P2, R, 0), 0).to(tl.int32)
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
            starts, ends, blk_ends = tc.group_table(r_ends_ptr, R_GROUPS, R_GROUPS_P2, 32, R)
            g = tc.group_of(blk_ends, R_GROUPS, jb)
            row0 = tc.lane_value(starts, g)
            g_end = tc.lane_value(ends, g)
            first_blk = tc.lane_value(blk_ends, g) - (g_end - row0 + 31) // 32
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
            s_first, s_end = scale_group_bounds(s_ends_ptr, S_GROUPS, S_GROUPS_P2, R if SCALE_MODE == 1 else C,
                                                SCALE_MODE)
        for t in range(CITERS):
            c = (pid_c * CITERS + t) * BLOCK_C + tl.arange(0, BLOCK_C)
            c_ok = c < C
            m = r_ok[:, :, None] & c_ok[None, None, :]
            x = tc.load_f32(x_ptr + b * sx_b + r[:, :, None] * sx_r + c[None, None, :] * sx_c, m)

            # NaN counts as inf, so amax == inf marks every non-finite block
            amax = tc.block_amax(x, 1)
            biased = tc.scale_exponent(amax, RCEIL)
            inv = tc.inv_scale(biased)
            q8 = tc.scaled_to_e4m3(x, inv[:, None, :], HW_CVT)

            y_offs = b * sy_b + r_y[:, :, None] * sy_r + c[None, None, :] * sy_c
            m_y = y_ok[:, :, None] & c_ok[None, None, :]
            if DEQUANT:
                y = tc.e4m3_decode(q8, HW_CVT) * tc.e8m0_to_float(biased)[:, None, :]
                tc.store_f32(y_ptr + y_offs, y, m_y, OUT_BF16, HW_CVT)
            else:
                tl.store(y_ptr + y_offs, q8, mask=m_y)
                s_offs, s_ok = scale_offsets(b, c, jb, ss_b, ss_blk, ss_c, s_first, s_end, S_GROUPS, Hp, Wp,
                                             SCALE_MODE)
                s_ok = s_ok & c_ok[None, :] & (g < R_GROUPS)[:, None]
                tl.store(s_ptr + s_offs, biased.to(tl.uint8), mask=s_ok)


@triton.jit
def dequant_kernel(
    q_ptr, sq_b, sq_r, sq_c, s_ptr, ss_b, ss_r, ss_c, y_ptr, sy_b, sy_r, sy_c, C,
    OUT_BF16: tl.constexpr, HW_CVT: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Program (j, q, b): block j along r, columns q*BLOCK_C.., batch b of plain data and scales."""
    j = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    r = j * 32 + tl.arange(0, 32)
    q = tl.load(q_ptr + b * sq_b + r[:, None] * sq_r + c[None, :] * sq_c, mask=c_ok[None, :])
    biased = tl.load(s_ptr + b * ss_b + j * ss_r + c * ss_c, mask=c_ok).to(tl.int32)
    y = tc.e4m3_decode(q, HW_CVT) * tc.e8m0_to_float(biased)[None, :]
    tc.store_f32(y_ptr + b * sy_b + r[:, None] * sy_r + c[None, :] * sy_c, y, c_ok[None, :], OUT_BF16, HW_CVT)
