"""Triton twins of the FP8-rowwise quantizers: the ones Inductor does badly, the weight-gradient
operand (a segmented max over variable-size token groups, where torch's scatter_reduce uses
atomics, and a gathered, transposed, group-padded write) and both operands of a weight in two
reads of it; and rows along the last dim, which Inductor fuses with their producers in compiled
graphs and these kernels replace in eager calls."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..options import check_choice
from . import reference as ref
from . import rowwise
from . import triton_common as tc
from .launch import launch_keyed

# (rows per load, features per program, warps, pipeline stages) of `_quantize_groups_kernel`, and
# its programs per SM: best of benchmarks/bench_quantize.py --sweep-rowwise
GROUPS_TILE = [64, 32, 2, 4]
GROUPS_PER_SM = 4
# token groups from which `quantize_groups` takes `_quantize_groups_kernel`: with fewer, longer
# groups neither path wins at every shape, and the two kernels, which split the rows into chunks
# across their programs, stay ahead at the widest (bench_quantize.py --rowwise-paths)
GROUPS_KERNEL_MIN_GROUPS = 32


@triton.jit
def _quantize_groups_kernel(
    x_ptr, sx_m, offs_ptr, y_ptr, scales_ptr, padded_ends_ptr, M, K, Mp,
    G: tl.constexpr, GP: tl.constexpr, ALIGN: tl.constexpr, RCEIL: tl.constexpr, HW_CVT: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
):
    """Persistent: of the slabs (g, q), features q*BK.. of token group g numbered group-major,
    program p takes p, p + P, ... (P programs). One pass over a slab's rows takes their max |x|
    per feature (on the bits, NaN above inf, as `triton_common.block_amax`); a second casts them,
    transposed, into the group's padded columns of y[K, Mp], padding as byte 0. The second pass
    rereads what the first just read, which L2 may still hold: a few programs per SM keep fewer
    slabs in flight between a slab's two passes than a program per slab, all in flight at once.
    The last group's slabs also zero the columns past every group, program 0 writes the padded
    group ends (also where there are no slabs: no features)."""
    starts, ends, chunk_ends = tc.group_table(offs_ptr, G, GP, ALIGN, M)
    i = tl.arange(0, GP)
    if tl.program_id(0) == 0:
        tl.store(padded_ends_ptr + i, chunk_ends * ALIGN, mask=i < G)
    QB = tl.cdiv(K, BK)
    for item in tl.range(tl.program_id(0), G * QB, tl.num_programs(0)):
        g = item // QB
        q = item % QB
        k = q * BK + tl.arange(0, BK)
        k_ok = k < K
        start = tl.sum(tl.where(i == g, starts, 0), 0)
        end = tl.sum(tl.where(i == g, ends, 0), 0)
        padded_end = tl.sum(tl.where(i == g, chunk_ends, 0), 0) * ALIGN
        padded_size = (end - start + ALIGN - 1) // ALIGN * ALIGN
        # an elementwise running max, reduced across rows once: a reduction per load would cross
        # warps through shared memory every iteration
        acc = tl.zeros([BM, BK], dtype=tl.int32)
        for r0 in tl.range(start, end, BM, num_stages=STAGES):
            r = r0 + tl.arange(0, BM)
            m = (r < end)[:, None] & k_ok[None, :]
            x = tc.load_f32(x_ptr + r.to(tl.int64)[:, None] * sx_m + k[None, :], m)
            acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        amax = tl.minimum(tl.max(acc, axis=0), 0x7F800000).to(tl.float32, bitcast=True)
        biased = tc.scale_exponent(amax, RCEIL)
        inv = tc.inv_scale(biased)[:, None]
        tl.store(scales_ptr + g * K + k, tc.e8m0_to_float(biased), mask=k_ok)
        y_row = y_ptr + k.to(tl.int64)[:, None] * Mp
        for t0 in tl.range(0, padded_size, BM, num_stages=STAGES):
            t = t0 + tl.arange(0, BM)
            r = start + t
            bits = tl.load(x_ptr + r.to(tl.int64)[:, None] * sx_m + k[None, :],
                           mask=(r < end)[:, None] & k_ok[None, :], other=0)
            # transposing the loaded bf16 bits, not the float8 bytes, measured faster
            q8 = tc.scaled_to_e4m3(tc.widen(tl.trans(bits)), inv, HW_CVT)
            j = padded_end - padded_size + t
            tl.store(y_row + j[None, :], q8, mask=k_ok[:, None] & (t < padded_size)[None, :])
        if g == G - 1:
            for j0 in range(padded_end, Mp, BM):
                j = j0 + tl.arange(0, BM)
                tl.store(y_row + j[None, :], tl.zeros([BK, BM], dtype=tl.uint8),
                         mask=k_ok[:, None] & (j < Mp)[None, :])


# (rows per program, rows per load, columns, warps) of the amax kernel and (features per block,
# blocks per program, warps) of the cast kernel: best of benchmarks/bench_quantize.py --sweep-rowwise
AMAX_TILE = [256, 32, 128, 4]
CAST_TILE = [128, 8, 4]


@triton.jit
def _group_amax_kernel(
    x_ptr, sx_m, offs_ptr, out_ptr, M, K, G: tl.constexpr, GP: tl.constexpr,
    CHUNK: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    """Program (c, q): columns q*BK.. of rows c*CHUNK.., split where groups end; each group's
    part meets the other programs' in an atomic max on the float bits (ordered like the floats:
    all are >= 0). The loop over a part's rows has a constant trip count so that Triton
    pipelines its loads; rows outside the part are masked off, not read."""
    c = tl.program_id(0) * CHUNK
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    i = tl.arange(0, GP)
    ends = tc.group_ends(offs_ptr, G, GP, M, 0)
    stop = tl.minimum(c + CHUNK, tl.max(ends, 0))  # rows past offs[-1] belong to no group
    r0 = c
    while r0 < stop:  # once per group met: each step ends where a group ends, a loaded value
        g = tl.sum(((ends <= r0) & (i < G)).to(tl.int32), 0)  # the group holding row r0
        r1 = tl.minimum(tl.sum(tl.where(i == g, ends, 0), 0), stop)
        # an elementwise running max, reduced across rows once: a reduction per load would
        # cross warps through shared memory every iteration. Taken on the bits of |x| (every NaN
        # above inf, as in `triton_common.block_amax`), which are also what the atomic max takes
        acc = tl.zeros([BM, BK], dtype=tl.int32)
        for t in range(CHUNK // BM):
            r = c + t * BM + tl.arange(0, BM)
            m = ((r >= r0) & (r < r1))[:, None] & (k < K)[None, :]
            x = tc.load_f32(x_ptr + r.to(tl.int64)[:, None] * sx_m + k[None, :], m)
            acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        tl.atomic_max(out_ptr + g * K + k, tl.minimum(tl.max(acc, axis=0), 0x7F800000), mask=k < K)
        r0 = r1


def group_amax(x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """amax_GK float32, as `rowwise.group_amax`, in one read of x."""
    M, K = x_MK.shape
    G = offs.numel()
    if x_MK.stride(1) != 1:
        x_MK = x_MK.contiguous()
    out = torch.zeros(G, K, device=x_MK.device, dtype=torch.int32)
    chunk, bm, bk, warps = tile = tuple(AMAX_TILE)
    tensors = (tc.as_bits(x_MK), offs, out)
    key = (_group_amax_kernel, M, K, x_MK.stride(0), G, tile)
    launch_keyed(key, tensors, lambda: (
        _group_amax_kernel, (tc.cdiv(M, chunk), tc.cdiv(K, bk)), (tensors[0], x_MK.stride(0), offs, out, M, K),
        dict(G=G, GP=tc.pow2(G), CHUNK=chunk, BM=bm, BK=bk, num_warps=warps),
    ))
    return out.view(torch.float32)


@triton.jit
def _padded_token_source(offs_ptr, j, M, G: tl.constexpr, GP: tl.constexpr, ALIGN: tl.constexpr):
    """For padded token columns j of a weight-gradient operand (each group's tokens padded to a
    multiple of ALIGN): the group of each (G past the last), its source row in x, whether that
    row holds a token (not padding), and every group's padded end in units of ALIGN."""
    starts, ends, chunk_ends = tc.group_table(offs_ptr, G, GP, ALIGN, M)
    g = tc.group_of(chunk_ends, G, j // ALIGN)
    start, end = tc.lane_value(starts, g), tc.lane_value(ends, g)
    src = start + j - (tc.lane_value(chunk_ends, g) - (end - start + ALIGN - 1) // ALIGN) * ALIGN
    return g, src, (g < G) & (src < end), chunk_ends


@triton.jit
def _cast_groups_t_kernel(
    x_ptr, sx_m, offs_ptr, amax_ptr, y_ptr, scales_ptr, padded_ends_ptr, M, K, Mp,
    G: tl.constexpr, GP: tl.constexpr, ALIGN: tl.constexpr, RCEIL: tl.constexpr,
    HW_CVT: tl.constexpr, BK: tl.constexpr, KITERS: tl.constexpr,
):
    """Program (p, q): padded token columns p*2*ALIGN.. and features q*KITERS*BK.. of y[K, Mp], BK
    features at a time: gather the source rows, transpose the loaded bits, scale by their
    group's power of two, cast, store. The token-to-group lookup, O(ALIGN * G), is made once for
    all KITERS blocks. It transposes the loaded bf16 bits rather than the float8 bytes, which
    measured faster (bench_quantize.py). Programs (0, q) also write the float scales of their
    features, program (0, 0) the padded group ends: the whole operand comes from this kernel and
    the amax one, with no host ops between them."""
    j = tl.program_id(0) * (2 * ALIGN) + tl.arange(0, 2 * ALIGN)
    g, src, row_ok, chunk_ends = _padded_token_source(offs_ptr, j, M, G, GP, ALIGN)
    x_row = x_ptr + src.to(tl.int64) * sx_m
    # each group holding a token spans whole ALIGN-token chunks, so these 2 * ALIGN columns hold
    # the tokens of at most two groups, the first column's and the last token's: two scale rows
    g_lo = tl.minimum(tl.min(g, 0), G - 1)
    g_hi = tl.max(tl.where(row_ok, g, g_lo), 0)
    lo = (g <= g_lo)[None, :]
    for t in range(KITERS):
        k = (tl.program_id(1) * KITERS + t) * BK + tl.arange(0, BK)
        k_ok = k < K
        bits = tl.load(x_row[:, None] + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0)
        x_KJ = tc.widen(tl.trans(bits))  # padding loads 0 and casts to byte 0
        inv_lo = tc.inv_scale(tc.scale_exponent(tl.load(amax_ptr + g_lo * K + k, mask=k_ok, other=0.0), RCEIL))
        inv_hi = tc.inv_scale(tc.scale_exponent(tl.load(amax_ptr + g_hi * K + k, mask=k_ok, other=0.0), RCEIL))
        q8 = tc.scaled_to_e4m3(x_KJ, tl.where(lo, inv_lo[:, None], inv_hi[:, None]), HW_CVT)
        tl.store(y_ptr + k.to(tl.int64)[:, None] * Mp + j[None, :], q8, mask=k_ok[:, None] & (j < Mp)[None, :])
        if tl.program_id(0) == 0:
            i = tl.arange(0, GP)
            ms = (i < G)[:, None] & k_ok[None, :]
            amax_g = tl.load(amax_ptr + i[:, None] * K + k[None, :], mask=ms, other=0.0)
            scales_g = tc.e8m0_to_float(tc.scale_exponent(amax_g, RCEIL))
            tl.store(scales_ptr + i[:, None] * K + k[None, :], scales_g, mask=ms)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        i = tl.arange(0, GP)
        tl.store(padded_ends_ptr + i, chunk_ends * ALIGN, mask=i < G)


def quantize_groups(
    x_MK: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of `rowwise.quantize_groups` with no device work beside its kernels (host time
    per call matters at small MoE shapes): one persistent kernel for many token groups, an amax
    kernel and a cast kernel for few (`GROUPS_KERNEL_MIN_GROUPS`)."""
    ref.check_float(x_MK)
    check_choice("rounding", rounding)
    M, K = x_MK.shape
    G = offs.numel()
    if x_MK.stride(1) != 1:
        x_MK = x_MK.contiguous()
    Mp = rowwise.padded_rows(M, G)
    data_KMp = torch.empty(K, Mp, dtype=torch.uint8, device=x_MK.device)
    scales_GK = torch.empty(G, K, dtype=torch.float32, device=x_MK.device)
    padded_ends = torch.empty(G, dtype=torch.int32, device=x_MK.device)
    consts = dict(G=G, GP=tc.pow2(G), ALIGN=rowwise.ALIGN, RCEIL=rounding == "rceil", HW_CVT=x_MK.is_cuda)
    if G >= GROUPS_KERNEL_MIN_GROUPS:
        bm, bk, warps, stages = tile = tuple(GROUPS_TILE)
        tensors = (tc.as_bits(x_MK, True), offs, data_KMp, scales_GK, padded_ends)
        programs = max(min(G * tc.cdiv(K, bk), tc.sms(x_MK.device) * GROUPS_PER_SM), 1)
        key = (_quantize_groups_kernel, M, K, x_MK.stride(0), G, rounding, tile, programs)
        launch_keyed(key, tensors, lambda: (
            _quantize_groups_kernel, (programs,), (tensors[0], x_MK.stride(0), *tensors[1:], M, K, Mp),
            dict(consts, BM=bm, BK=bk, STAGES=stages, num_warps=warps),
        ))
    else:
        amax_GK = group_amax(x_MK, offs)
        bk, kiters, warps = tile = tuple(CAST_TILE)
        tensors = (tc.as_bits(x_MK, True), offs, amax_GK, data_KMp, scales_GK, padded_ends)
        key = (_cast_groups_t_kernel, M, K, x_MK.stride(0), G, rounding, tile)
        launch_keyed(key, tensors, lambda: (
            _cast_groups_t_kernel, (tc.cdiv(Mp, 2 * rowwise.ALIGN), max(tc.cdiv(K, bk * kiters), 1)),
            (tensors[0], x_MK.stride(0), *tensors[1:], M, K, Mp), dict(consts, BK=bk, KITERS=kiters, num_warps=warps),
        ))
    return data_KMp.view(torch.float8_e4m3fn), scales_GK, padded_ends


# rows and columns of a weight tile in `quantize_weight_shared`'s kernels, and their warps
WEIGHT_TILE = (64, 64, 4)


@triton.jit
def _matrix_amax_kernel(b_ptr, sb_e, sb_k, sb_n, K, N, amax_ptr, BK: tl.constexpr, BN: tl.constexpr):
    """Program (e, p, q): tile b[e, p*BK.., q*BN..]. Its max |b| meets the other tiles' in
    amax[e]: an atomic maximum on the float bits, NaN as inf (as `triton_common.block_amax`)."""
    e = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    n = tl.program_id(2) * BN + tl.arange(0, BN)
    m = (k < K)[:, None] & (n < N)[None, :]
    x = tc.load_f32(b_ptr + e * sb_e + k.to(tl.int64)[:, None] * sb_k + n.to(tl.int64)[None, :] * sb_n, m)
    bits = tl.minimum(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 0x7F800000)
    tl.atomic_max(amax_ptr + e, tl.max(tl.max(bits, axis=1), axis=0))


@triton.jit
def _matrix_cast_kernel(
    b_ptr, sb_e, sb_k, sb_n, K, N, amax_ptr, q_ptr, sq_e, sq_k, sq_n, s_ptr,
    RCEIL: tl.constexpr, HW_CVT: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
):
    """Program (e, p, q): tile b[e, p*BK.., q*BN..] cast with its matrix's scale into q; the
    first tile of a matrix also writes the float scale."""
    e = tl.program_id(0).to(tl.int64)
    k = (tl.program_id(1) * BK + tl.arange(0, BK)).to(tl.int64)
    n = (tl.program_id(2) * BN + tl.arange(0, BN)).to(tl.int64)
    m = (k < K)[:, None] & (n < N)[None, :]
    x = tc.load_f32(b_ptr + e * sb_e + k[:, None] * sb_k + n[None, :] * sb_n, m)
    biased = tc.scale_exponent(tl.load(amax_ptr + e).to(tl.float32, bitcast=True), RCEIL)
    q = tc.scaled_to_e4m3(x, tc.inv_scale(biased), HW_CVT)
    tl.store(q_ptr + e * sq_e + k[:, None] * sq_k + n[None, :] * sq_n, q, mask=m)
    if (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
        tl.store(s_ptr + e, tc.e8m0_to_float(biased))


def quantize_weight_shared(b_EKN: torch.Tensor, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `shared_weight.quantize(b_EKN, "fp8_rowwise", rounding)`: float8 data laid
    out as `torch.empty_like(b_EKN)` (a transposed view stays one) and a float32 scale per matrix,
    from two reads of the weight (one for the maxima, one for the cast)."""
    ref.check_float(b_EKN)
    check_choice("rounding", rounding)
    if b_EKN.dim() != 3:
        raise ValueError(f"quantize_weight_shared takes an [E, K, N] weight, got shape {tuple(b_EKN.shape)}")
    E, K, N = b_EKN.shape
    dev = b_EKN.device
    amax = torch.zeros(E, dtype=torch.int32, device=dev)
    q = torch.empty_like(b_EKN, dtype=torch.uint8)
    scales = torch.empty(E, device=dev)
    bk, bn, warps = WEIGHT_TILE
    grid = (E, tc.cdiv(K, bk), tc.cdiv(N, bn))
    b, strides = tc.as_bits(b_EKN), b_EKN.stride()
    # bound launches: a weight's quantization runs in the first forward after each optimizer step,
    # where the host, not the GPU, sets the pace
    launch_keyed((_matrix_amax_kernel, *b_EKN.shape, *strides), (b, amax), lambda: (
        _matrix_amax_kernel, grid, (b, *strides, K, N, amax), dict(BK=bk, BN=bn, num_warps=warps)))
    tensors = (b, amax, q, scales)
    launch_keyed((_matrix_cast_kernel, *b_EKN.shape, *strides, *q.stride(), rounding), tensors, lambda: (
        _matrix_cast_kernel, grid, (b, *strides, K, N, amax, q, *q.stride(), scales),
        dict(RCEIL=rounding == "rceil", HW_CVT=b_EKN.is_cuda, BK=bk, BN=bn, num_warps=warps)))
    return q.view(torch.float8_e4m3fn), scales


# rows per program, columns per load and warps of `quantize_rows`
ROWS_TILE = (16, 256, 4)


@triton.jit
def _quantize_rows_kernel(x_ptr, s0, s1, s2, A, R, C, q_ptr, s_ptr,
                          RCEIL: tl.constexpr, HW_CVT: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Program p: rows p*BR.. of x seen as [R, C], row r at (r // A) * s0 + (r % A) * s1 and its
    elements s2 apart. Each row's max |x| (NaN as inf, as `triton_common.block_amax`) from one
    read, its cast from a second, into q[R, C] (row-major) and one float scale per row."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    r_ok = r < R
    r64 = r.to(tl.int64)
    row = x_ptr + (r64 // A) * s0 + (r64 % A) * s1
    acc = tl.zeros([BR, BC], dtype=tl.int32)
    for c0 in range(0, C, BC):
        c = c0 + tl.arange(0, BC)
        x = tc.load_f32(row[:, None] + c.to(tl.int64)[None, :] * s2, r_ok[:, None] & (c < C)[None, :])
        acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    amax = tl.minimum(tl.max(acc, axis=1), 0x7F800000).to(tl.float32, bitcast=True)
    biased = tc.scale_exponent(amax, RCEIL)
    inv = tc.inv_scale(biased)
    for c0 in range(0, C, BC):
        c = c0 + tl.arange(0, BC)
        m = r_ok[:, None] & (c < C)[None, :]
        x = tc.load_f32(row[:, None] + c.to(tl.int64)[None, :] * s2, m)
        tl.store(q_ptr + r64[:, None] * C + c[None, :], tc.scaled_to_e4m3(x, inv[:, None], HW_CVT), mask=m)
    tl.store(s_ptr + r, tc.e8m0_to_float(biased), mask=r_ok)


def quantize_rows(x: torch.Tensor, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `rowwise.quantize_rows(x, -1, rounding)` for 2-D and 3-D x in any layout:
    data float8 shaped like x (row-major), scales float32 x.shape[:-1]; two reads of x."""
    ref.check_float(x)
    check_choice("rounding", rounding)
    if x.dim() not in (2, 3):
        raise ValueError(f"quantize_rows takes 2-D or 3-D tensors, got shape {tuple(x.shape)}")
    x3 = x if x.dim() == 3 else x[None]
    B, A, C = x3.shape
    R = B * A
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scales = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if R and C:
        br, bc, warps = tile = ROWS_TILE
        tensors = (tc.as_bits(x3), q, scales)
        key = (_quantize_rows_kernel, B, A, C, *x3.stride(), rounding, tile)
        launch_keyed(key, tensors, lambda: (
            _quantize_rows_kernel, (tc.cdiv(R, br),), (tensors[0], *x3.stride(), A, R, C, q, scales),
            dict(RCEIL=rounding == "rceil", HW_CVT=x.is_cuda, BR=br, BC=bc, num_warps=warps),
        ))
    elif R:  # rows of no elements: the scale of zero rows, as the reference
        scales.copy_(rowwise.quantize_rows(x.new_zeros(x.shape[:-1] + (1,)), -1, rounding)[1])
    return q.view(torch.float8_e4m3fn), scales
