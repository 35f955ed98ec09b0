"""Triton grouped GEMMs that quantize-dequantize their bf16 operands to MXFP8 in registers, as
each tile is loaded (docs/design.md, "Fused grouped GEMMs").

Two kernels cover the three GEMMs of a grouped matmul:
  `_rows_kernel`    out[M, N] = A[M, K] @ B[e][K, N] over the token rows of each group e: the
                    forward (A = tokens, B = weight) and the input gradient (A = output gradient,
                    B = the weight transposed). Blocks of 32 run along K, the contraction, in both.
  `_groups_kernel`  out[e][K, N] = A[rows of e, K]^T @ G[rows of e, N]: the weight gradient.
                    Blocks of 32 run along the rows, restarting at every group start.
A tile of BLOCK_K >= 32 holds whole blocks, so the quantization is one pass per operand tile,
bit-exact with the quantizer kernels (`triton_mx_quant`). Where NATIVE (compute capability 10.x) the
float8 bytes and e8m0 scales go to `tl.dot_scaled`, the hardware MXFP8 MMA; elsewhere the tile
is dequantized in registers (exact MXFP8 values, which bf16 holds) into a bf16 dot. Both give
the MXFP8 products accumulated in fp32. QUANT_A / QUANT_B = False leave an operand in bf16:
both off, the yardstick for the Triton GEMM itself against torch's `_grouped_mm`.

`offs` holds the G group ends; like the quantizers (`triton_common.group_ends`), the kernels
clamp them so that no read or write leaves the tensors whatever they hold. Output rows past the
last group end are zero, and an empty group's weight gradient is zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..options import check_choice
from ..routes import has_mxfp8_mma
from . import triton_common as tc
from .launch import launch_tuned


@triton.jit
def _round_bf16(y, HW_CVT: tl.constexpr):
    """fp32 -> bf16, round to nearest even: the hardware cast, or in the interpreter `bf16_bits`,
    kept as fp32 values."""
    if HW_CVT:
        out = y.to(tl.bfloat16)
    else:
        out = (tc.bf16_bits(y) << 16).to(tl.float32, bitcast=True)
    return out


@triton.jit
def _quantize_tile(ptr, offs, mask, R: tl.constexpr, C: tl.constexpr, BLOCKS_ALONG: tl.constexpr,
                   RCEIL: tl.constexpr, HW_CVT: tl.constexpr):
    """A bf16 [R, C] tile quantized in blocks of 32 along rows (BLOCKS_ALONG=0) or columns (1):
    float8 bytes in the blocked view ([R // 32, 32, C] or [R, C // 32, 32]) and the blocks' biased
    e8m0 exponents, broadcastable against it. The arithmetic of `triton_mx_quant.mx_quant_kernel`,
    so bit-exact with it and with the reference."""
    x = tc.load_f32(ptr + offs, mask)
    if BLOCKS_ALONG == 0:
        x = tl.reshape(x, [R // 32, 32, C])
        biased = tl.expand_dims(tc.scale_exponent(tc.block_amax(x, 1), RCEIL), 1)
    else:
        x = tl.reshape(x, [R, C // 32, 32])
        biased = tl.expand_dims(tc.scale_exponent(tc.block_amax(x, 2), RCEIL), 2)
    return tc.scaled_to_e4m3(x, tc.inv_scale(biased), HW_CVT), biased


@triton.jit
def _scaled_operand(ptr, offs, mask, R: tl.constexpr, C: tl.constexpr, BLOCKS_ALONG: tl.constexpr,
                    RCEIL: tl.constexpr, HW_CVT: tl.constexpr):
    """An [R, C] tile as `tl.dot_scaled` takes it: float8 data [R, C] and its scale bytes, one per
    block of 32 along rows ([C, R // 32], BLOCKS_ALONG=0) or columns ([R, C // 32], 1)."""
    q8, biased = _quantize_tile(ptr, offs, mask, R, C, BLOCKS_ALONG, RCEIL, HW_CVT)
    if BLOCKS_ALONG == 0:
        scales = tl.trans(tl.reshape(biased, [R // 32, C]))
    else:
        scales = tl.reshape(biased, [R, C // 32])
    return tl.reshape(q8, [R, C]).to(tl.float8e4nv, bitcast=True), scales.to(tl.uint8)


@triton.jit
def _operand(ptr, offs, mask, R: tl.constexpr, C: tl.constexpr, BLOCKS_ALONG: tl.constexpr,
             QUANT: tl.constexpr, RCEIL: tl.constexpr, HW_CVT: tl.constexpr):
    """An [R, C] operand tile ready for tl.dot: bf16 (fp32 in the interpreter), rounded to MXFP8
    values in blocks of 32 along rows (BLOCKS_ALONG=0) or columns (1) where QUANT."""
    if QUANT:
        q8, biased = _quantize_tile(ptr, offs, mask, R, C, BLOCKS_ALONG, RCEIL, HW_CVT)
        out = _round_bf16(tl.reshape(tc.e4m3_decode(q8, HW_CVT) * tc.e8m0_to_float(biased), [R, C]), HW_CVT)
    elif HW_CVT:
        out = tl.load(ptr + offs, mask=mask, other=0.0)
    else:
        out = tc.load_f32(ptr + offs, mask)
    return out


@triton.jit
def _rows_kernel(
    a_ptr, sa_m, sa_k,
    b_ptr, sb_e, sb_k, sb_n,
    c_ptr, sc_m, sc_n,
    ends_ptr, M, N, K,
    # the mode (`_consts`), then the tile (the autotuner's configs)
    G: tl.constexpr, GP: tl.constexpr, QUANT_A: tl.constexpr, QUANT_B: tl.constexpr, RCEIL: tl.constexpr,
    NATIVE: tl.constexpr, HW_CVT: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (t, n): row tile t, output columns n*BLOCK_N... Tiles run group after group, each
    group's rows cut into ceil(rows / BLOCK_M) tiles; programs past them zero the rows after the
    last group end, BLOCK_M rows each. Row tiles take the grid's first axis, the one without a
    65535 limit."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    starts, ends, tile_ends = tc.group_table(ends_ptr, G, GP, BLOCK_M, M)
    n_tiles = tl.max(tile_ends, 0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if pid_m < n_tiles:
        g = tc.group_of(tile_ends, G, pid_m + tl.zeros([1], dtype=tl.int32))  # a 1-lane block: the helpers take blocks
        g_start, g_end = tc.lane_value(starts, g), tc.lane_value(ends, g)
        first_tile = tc.lane_value(tile_ends, g) - tl.cdiv(g_end - g_start, BLOCK_M)
        rows = g_start + (pid_m - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < g_end
        a_rows = a_ptr + rows.to(tl.int64)[:, None] * sa_m
        b_cols = b_ptr + g.to(tl.int64)[:, None] * sb_e + cols[None, :] * sb_n
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < K
            a_offs, a_ok = kk[None, :] * sa_k, row_ok[:, None] & k_ok[None, :]
            b_offs, b_ok = kk[:, None].to(tl.int64) * sb_k, k_ok[:, None] & col_ok[None, :]
            if NATIVE:
                a8, a_s = _scaled_operand(a_rows, a_offs, a_ok, BLOCK_M, BLOCK_K, 1, RCEIL, HW_CVT)
                b8, b_s = _scaled_operand(b_cols, b_offs, b_ok, BLOCK_K, BLOCK_N, 0, RCEIL, HW_CVT)
                acc = tl.dot_scaled(a8, a_s, "e4m3", b8, b_s, "e4m3", acc)
            else:
                a = _operand(a_rows, a_offs, a_ok, BLOCK_M, BLOCK_K, 1, QUANT_A, RCEIL, HW_CVT)
                b = _operand(b_cols, b_offs, b_ok, BLOCK_K, BLOCK_N, 0, QUANT_B, RCEIL, HW_CVT)
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
    else:
        rows = tl.max(ends, 0) + (pid_m - n_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    offs = rows.to(tl.int64)[:, None] * sc_m + cols[None, :] * sc_n
    tc.store_f32(c_ptr + offs, acc, row_ok[:, None] & col_ok[None, :], True, HW_CVT)


@triton.jit
def _groups_kernel(
    a_ptr, sa_m, sa_k,
    g_ptr, sg_m, sg_n,
    c_ptr, sc_e, sc_k, sc_n,
    ends_ptr, M, K, N,
    # the mode (`_consts`), then the tile (the autotuner's configs)
    G: tl.constexpr, GP: tl.constexpr, QUANT_A: tl.constexpr, QUANT_B: tl.constexpr, RCEIL: tl.constexpr,
    NATIVE: tl.constexpr, HW_CVT: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (kn, e): the [BLOCK_K, BLOCK_N] tile kn of group e's weight gradient, walking the
    group's rows from its start, BLOCK_M (a multiple of 32) at a time, so that every 32-row block
    of the tile starts where the group's blocks do."""
    pid, e = tl.program_id(0), tl.program_id(1)
    n_cols = tl.cdiv(N, BLOCK_N)
    kk = (pid // n_cols) * BLOCK_K + tl.arange(0, BLOCK_K)
    nn = (pid % n_cols) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ok, n_ok = kk < K, nn < N
    i = tl.arange(0, GP)
    g_end = tl.sum(tl.where(i == e, tc.group_ends(ends_ptr, G, GP, M, 0), 0), 0)
    g_start = tl.sum(tl.where(i == e, tc.group_ends(ends_ptr, G, GP, M, 1), 0), 0)
    acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
    for t in range(0, tl.cdiv(g_end - g_start, BLOCK_M)):
        rows = g_start + t * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < g_end
        r64 = rows.to(tl.int64)[:, None]
        a_offs, a_ok = r64 * sa_m + kk[None, :] * sa_k, row_ok[:, None] & k_ok[None, :]
        g_offs, g_ok = r64 * sg_m + nn[None, :] * sg_n, row_ok[:, None] & n_ok[None, :]
        if NATIVE:
            a8, a_s = _scaled_operand(a_ptr, a_offs, a_ok, BLOCK_M, BLOCK_K, 0, RCEIL, HW_CVT)
            g8, g_s = _scaled_operand(g_ptr, g_offs, g_ok, BLOCK_M, BLOCK_N, 0, RCEIL, HW_CVT)
            acc = tl.dot_scaled(tl.trans(a8), a_s, "e4m3", g8, g_s, "e4m3", acc)
        else:
            a = _operand(a_ptr, a_offs, a_ok, BLOCK_M, BLOCK_K, 0, QUANT_A, RCEIL, HW_CVT)
            gr = _operand(g_ptr, g_offs, g_ok, BLOCK_M, BLOCK_N, 0, QUANT_B, RCEIL, HW_CVT)
            acc = tl.dot(tl.trans(a), gr, acc, input_precision=PRECISION)
    offs = e.to(tl.int64) * sc_e + kk[:, None] * sc_k + nn[None, :] * sc_n
    tc.store_f32(c_ptr + offs, acc, k_ok[:, None] & n_ok[None, :], True, HW_CVT)


# Tile configurations autotuned on GPUs per layer shape and operand layout (token counts change
# every step: they are not in the key); the interpreter runs small tiles.
_ROWS_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for m, n, k, w, s in [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 128, 128, 8, 3),
                          (128, 64, 64, 4, 4), (64, 256, 64, 8, 3)]
]
_GROUPS_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_K": k, "BLOCK_N": n}, num_warps=w, num_stages=s)
    for m, k, n, w, s in [(64, 128, 128, 8, 3), (64, 128, 256, 8, 3), (128, 128, 128, 8, 3), (64, 64, 128, 4, 4),
                          (128, 256, 128, 8, 3), (32, 128, 128, 4, 4)]
]
_INTERPRETER = {"rows": {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64},
                "groups": {"BLOCK_M": 64, "BLOCK_K": 32, "BLOCK_N": 32}}
_MODE = ["G", "QUANT_A", "QUANT_B", "RCEIL", "NATIVE"]
_KERNELS = {
    "rows": (_rows_kernel, triton.autotune(_ROWS_CONFIGS, key=["N", "K", "sb_k", "sb_n", *_MODE])(_rows_kernel)),
    "groups": (_groups_kernel,
               triton.autotune(_GROUPS_CONFIGS, key=["K", "N", "sa_m", "sg_m", *_MODE])(_groups_kernel)),
}


def _run(kind: str, grid, args: tuple, consts: dict, layout: tuple) -> None:
    kernel, tuned = _KERNELS[kind]
    launch_tuned(kernel, tuned, (*layout, *consts.values()), grid, args, consts, _INTERPRETER[kind])


def _check(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, rows_form: bool) -> None:
    """The shapes each kernel indexes by: a [M, K] with b [E, K, N] and E group ends (rows form),
    or a [M, K] and g [M, N] (groups form); offs 1-D int32, all on one device."""
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs must be a 1-D int32 tensor of group ends, got {offs.dtype} {tuple(offs.shape)}")
    if len({a.device, b.device, offs.device}) != 1:
        raise ValueError("the operands and offs must be on one device")
    if rows_form and (a.dim() != 2 or b.dim() != 3 or a.shape[1] != b.shape[1] or b.shape[0] != offs.numel()):
        raise ValueError(f"need a [M, K], b [E, K, N] and E group ends, got {tuple(a.shape)}, {tuple(b.shape)} "
                         f"and {offs.numel()} ends")
    if not rows_form and (a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[0]):
        raise ValueError(f"need a [M, K] and g [M, N], got {tuple(a.shape)} and {tuple(b.shape)}")


def _consts(offs: torch.Tensor, quant: tuple[bool, bool], rounding: str, native: bool, on_gpu: bool) -> dict:
    check_choice("rounding", rounding)
    if native and quant != (True, True):
        raise ValueError("native=True multiplies MXFP8 operands: quant must be (True, True)")
    if native and on_gpu and not has_mxfp8_mma(offs.device):
        raise ValueError("native=True needs compute capability 10.x (the MXFP8 MMA)")
    G = offs.numel()
    return dict(G=G, GP=tc.pow2(G), QUANT_A=quant[0], QUANT_B=quant[1], RCEIL=rounding == "rceil", NATIVE=native,
                HW_CVT=on_gpu, PRECISION="tf32" if on_gpu else "ieee")


def grouped_mm(a_MK: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil",
               quant: tuple[bool, bool] = (True, True), native: bool = False) -> torch.Tensor:
    """out[M, N] = A @ B[e] over the rows of each group e (bf16 out): `torch._grouped_mm(a, b,
    offs)` on the MXFP8 values, in blocks of 32 along K, of a (where quant[0]) and b (quant[1]).
    b may be any strided [E, K, N] view, e.g. the input gradient's transposed weight. `native`:
    the hardware MXFP8 MMA (`tl.dot_scaled`; compute capability 10.x or the interpreter)."""
    _check(a_MK, b_EKN, offs, rows_form=True)
    M, K = a_MK.shape
    E, _, N = b_EKN.shape
    out_MN = torch.empty(M, N, dtype=torch.bfloat16, device=a_MK.device)
    if M * N == 0:
        return out_MN
    on_gpu = a_MK.is_cuda
    a, b, out = tc.as_bits(a_MK), tc.as_bits(b_EKN), tc.as_bits(out_MN)
    consts = _consts(offs, quant, rounding, native, on_gpu)

    def grid(meta):  # group tiles (at most one partial per group), then the tail past the last end
        return 2 * tc.cdiv(M, meta["BLOCK_M"]) + E, tc.cdiv(N, meta["BLOCK_N"])

    _run("rows", grid, (a, *a.stride(), b, *b.stride(), out, *out.stride(), offs, M, N, K), consts,
         (N, K, b.stride(1), b.stride(2)))
    return out_MN


def grouped_mm_wgrad(a_MK: torch.Tensor, g_MN: torch.Tensor, offs: torch.Tensor, rounding: str = "rceil",
                     quant: tuple[bool, bool] = (True, True), native: bool = False) -> torch.Tensor:
    """out[E, K, N] = A[rows of e]^T @ G[rows of e] (bf16 out): `torch._grouped_mm(a.t(), g,
    offs)` on the MXFP8 values, in blocks of 32 along the rows restarting at every group start,
    of a (where quant[0]) and g (quant[1]). `native` as for `grouped_mm`."""
    _check(a_MK, g_MN, offs, rows_form=False)
    M, K = a_MK.shape
    N = g_MN.shape[1]
    E = offs.numel()
    out_EKN = torch.empty(E, K, N, dtype=torch.bfloat16, device=a_MK.device)
    if E * K * N == 0:
        return out_EKN
    on_gpu = a_MK.is_cuda
    a, g, out = tc.as_bits(a_MK), tc.as_bits(g_MN), tc.as_bits(out_EKN)
    consts = _consts(offs, quant, rounding, native, on_gpu)

    def grid(meta):
        return tc.cdiv(K, meta["BLOCK_K"]) * tc.cdiv(N, meta["BLOCK_N"]), E

    _run("groups", grid, (a, *a.stride(), g, *g.stride(), out, *out.stride(), offs, M, K, N), consts,
         (K, N, a.stride(0), g.stride(0)))
    return out_EKN
