"""Triton twin of `torch._scaled_grouped_mm` for the FP8 rowwise recipe (bf16 out), as emulated by
`rowwise.scaled_grouped_mm`, in the layout of the forward and input-gradient GEMMs (2d-3d):
a [M, K] x b [E, K, N] -> out [M, N], token groups along M.

Both operands are K-major (the contraction dim contiguous: b is a transposed view), the layout
Hopper's FP8 wgmma takes, so each program loads byte tiles A [BM, BK] and B [BN, BK] and
accumulates A @ B^T in fp32. The rowwise scales are powers of two, so applying them to the fp32
accumulator in the epilogue equals the emulation's dequantize-then-multiply up to summation order.

No host sync: `offs` is never read on the host. A program owns one [BM, BN] output tile within
one group: row tiles are counted group after group up to the static bound cdiv(M, BM) + E, each
program finds its group in a table built in registers, and those past the last tile exit.
The weight gradient (2d-2d) has no twin here: `lowering/rowwise.py` says what runs it.

On GPU the bytes are bitcast to float8 and fed to `tl.dot` as is; the interpreter has no float8
arithmetic, so there they are decoded to fp32 in integer math and multiplied in IEEE fp32 (exact:
every product of two float8 values fits in fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_common as tc
from .launch import launch_tuned

F8 = torch.float8_e4m3fn

# GPU: Hopper FP8 tiles (BK = 128 bytes: one 128-byte swizzled row per operand row), tuned per
# shape; BM = 64 wastes less of the partial tiles that many small groups leave.
GPU_CONFIGS = [
    triton.Config({"BM": 128, "BN": 128, "BK": 128}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 128, "BK": 128}, num_warps=8, num_stages=4),
    triton.Config({"BM": 128, "BN": 256, "BK": 128}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 256, "BK": 128}, num_warps=8, num_stages=4),
    triton.Config({"BM": 64, "BN": 128, "BK": 128}, num_warps=4, num_stages=4),
]
# the interpreter: small tiles keep CPU tests fast
INTERPRETER_CONFIG = {"BM": 32, "BN": 32, "BK": 32}


@triton.jit
def _mma(acc, a_rows, a_ok, b_rows, b_ok, k0, k_end, HW_CVT: tl.constexpr, BK: tl.constexpr):
    """acc + A @ B^T over k0 .. k0+BK-1 (< k_end), A and B K-major float8 bytes: a_rows [BM, 1] and
    b_rows [BN, 1] point at each row's element 0."""
    k = k0 + tl.arange(0, BK)
    k_ok = (k < k_end)[None, :]
    a = tl.load(a_rows + k[None, :], mask=a_ok[:, None] & k_ok, other=0)
    b = tl.load(b_rows + k[None, :], mask=b_ok[:, None] & k_ok, other=0)
    if HW_CVT:
        a8 = a.to(tl.float8e4nv, bitcast=True)
        b8 = b.to(tl.float8e4nv, bitcast=True)
        # Hopper's FP8 MMA sums into a reduced-precision accumulator; folding each BK step into
        # the fp32 one matches torch's kernel's accuracy, at a cost in speed
        acc = tl.dot(a8, tl.trans(b8), acc, out_dtype=tl.float32, max_num_imprecise_acc=BK)
    else:
        acc = tl.dot(tc.e4m3_decode(a, False), tl.trans(tc.e4m3_decode(b, False)), acc, input_precision="ieee")
    return acc


@triton.jit
def _contract(
    a_rows, a_ok, b_rows, b_ok, K,
    HW_CVT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """fp32 sum over k < K of A[:, k] B[:, k]^T (see `_mma`)."""
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    if HW_CVT:  # range() is software-pipelined (num_stages); the interpreter cannot take runtime bounds
        for k0 in range(0, K, BK):
            acc = _mma(acc, a_rows, a_ok, b_rows, b_ok, k0, K, HW_CVT, BK)
    else:
        k0 = 0
        while k0 < K:
            acc = _mma(acc, a_rows, a_ok, b_rows, b_ok, k0, K, HW_CVT, BK)
            k0 += BK
    return acc


@triton.jit
def _gemm_2d3d_kernel(
    a_ptr, s_am, b_ptr, s_be, s_bn, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
    E: tl.constexpr, EP: tl.constexpr, HW_CVT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """Program p: row tile p // n_tiles, counted group after group (a group spans cdiv(size, BM)
    tiles), and column tile p % n_tiles of expert b[g]. Column tiles vary fastest, so the
    programs in flight share a few A row tiles and one expert's B in L2."""
    n_tiles = tl.cdiv(N, BN)
    pid = tl.program_id(0) // n_tiles
    starts, ends, tile_ends = tc.group_table(offs_ptr, E, EP, BM, M)
    if pid >= tl.max(tile_ends, 0):
        return
    g = tc.group_of(tile_ends, E, pid + tl.zeros([1], dtype=tl.int32))  # a 1-lane block: the helpers take blocks
    start, end = tc.lane_value(starts, g), tc.lane_value(ends, g)
    first_tile = tc.lane_value(tile_ends, g) - (end - start + BM - 1) // BM
    m = start + (pid - first_tile) * BM + tl.arange(0, BM)
    m_ok = (m < end) & (m < M)  # m < M: malformed offs must not write past out
    n = (tl.program_id(0) % n_tiles) * BN + tl.arange(0, BN)
    n_ok = n < N
    a_rows = a_ptr + m.to(tl.int64)[:, None] * s_am
    b_rows = b_ptr + g.to(tl.int64)[:, None] * s_be + n.to(tl.int64)[:, None] * s_bn
    acc = _contract(a_rows, m_ok, b_rows, n_ok, K, HW_CVT, BM, BN, BK)
    sa = tl.load(sa_ptr + m, mask=m_ok, other=0.0)
    sb = tl.load(sb_ptr + g * N + n, mask=n_ok, other=0.0)
    out = out_ptr + m.to(tl.int64)[:, None] * N + n[None, :]
    tc.store_f32(out, acc * sa[:, None] * sb[None, :], m_ok[:, None] & n_ok[None, :], True, HW_CVT)


_gemm_2d3d_tuned = triton.autotune(GPU_CONFIGS, key=["N", "K"])(_gemm_2d3d_kernel)


def _check(a, b, scale_a, scale_b, offs) -> None:
    if a.dtype != F8 or b.dtype != F8:
        raise ValueError(f"a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        raise ValueError(f"scale_a and scale_b must be float32, got {scale_a.dtype} and {scale_b.dtype}")
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs must be a 1-D int32 tensor of group ends, got {offs.dtype} {tuple(offs.shape)}")
    if len({t.device for t in (a, b, scale_a, scale_b, offs)}) != 1:
        raise ValueError("a, b, scale_a, scale_b and offs must be on one device")
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(
            f"need a 2-D and b 3-D (the 2d-3d layout; use torch._scaled_grouped_mm for 2d-2d), "
            f"got {a.dim()}-D and {b.dim()}-D"
        )
    if a.shape[1] != b.shape[-2]:
        raise ValueError(f"contraction dims differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.stride(1) != 1:
        raise ValueError(f"a must be row-major (contraction dim contiguous), got strides {a.stride()}")
    if b.stride(-2) != 1:
        raise ValueError(
            f"b must be a transposed view of a tensor contiguous along the contraction dim "
            f"(b.stride(-2) == 1), got strides {b.stride()}"
        )


def scaled_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """`torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16)` for
    rowwise float8_e4m3fn operands a [M, K], b [E, K, N], scale_a [M], scale_b [E, N] and offs [E]
    group ends along M (semantics: `rowwise.scaled_grouped_mm`); returns [M, N], rows past
    offs[-1] unwritten."""
    _check(a, b, scale_a, scale_b, offs)
    (M, K), (E, _, N) = a.shape, b.shape
    if offs.numel() != E:
        raise ValueError(f"offs must hold one group end per expert: {offs.numel()} for {E} experts")
    if scale_a.shape != (M,) or scale_b.shape != (E, N):
        raise ValueError(
            f"scales must be scale_a [M]={[M]} and scale_b [E, N]={[E, N]}, "
            f"got {list(scale_a.shape)} and {list(scale_b.shape)}"
        )
    out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    if out.numel() == 0:
        return out
    a8, b8 = a.view(torch.uint8), b.view(torch.uint8)
    grid = lambda c: ((tc.cdiv(M, c["BM"]) + E) * tc.cdiv(N, c["BN"]),)
    launch_tuned(
        _gemm_2d3d_kernel, _gemm_2d3d_tuned, (N, K), grid,
        (a8, a8.stride(0), b8, b8.stride(0), b8.stride(2), scale_a.contiguous(), scale_b.contiguous(), tc.as_bits(out),
         offs, M, N, K), dict(E=E, EP=tc.pow2(E), HW_CVT=a.is_cuda), INTERPRETER_CONFIG,
    )
    return out
