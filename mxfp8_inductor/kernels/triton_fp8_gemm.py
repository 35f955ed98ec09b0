"""Triton twin of `torch._scaled_grouped_mm` for the FP8 rowwise recipe (bf16 out), as emulated by
`rowwise.scaled_grouped_mm`, in both of its layouts: the forward and input gradient's (2d-3d,
a [M, K] x b [E, K, N] -> out [M, N], token groups along M) and the weight gradient's (2d-2d,
a [K, T] x b [T, N] -> out [G, K, N], token groups along the contraction T). A blockwise mode
(`blockwise_grouped_mm`, the fp8_blockwise recipe, emulated by `blockwise.scaled_grouped_mm`)
scales each 128-deep contraction step instead of the epilogue.

Both operands are K-major (the contraction dim contiguous: b is a transposed view), the layout
Hopper's FP8 wgmma takes: each step loads byte tiles A [BM, BK] and B [BN, BK] by TMA (tensor
descriptors made in the kernel, which need 16-byte aligned bases and row strides) and
accumulates A @ B^T in fp32, folding every BK step into the fp32 accumulator as torch's kernel
does (on the H200 the two agree bit for bit). The rowwise scales are powers of two, so applying
them to the fp32 accumulator in the epilogue equals the emulation's dequantize-then-multiply up
to summation order.

No host sync: `offs` is never read on the host. Both kernels are persistent (one or two
programs per SM, by config) and find a tile's group in a table built in registers. In 2d-3d
output tiles are counted row tile by column tile, row tiles group after group; a tile never
spans two groups, and its rows past the group's end are loaded but never stored. In 2d-2d a
tile's contraction ends at its group's end: a run of a group's tiles shares descriptors made
with the token dim ending there (TMA fills zeros past it).

On GPU the float8 tiles go to `tl.dot` as they are; the interpreter has no float8 arithmetic, so
there the kernel gets the bytes, decodes them to fp32 in integer math and multiplies in IEEE fp32
(exact: every product of two float8 values fits in fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation

from . import triton_common as tc
from .blockwise import SCALE_TILE, tiles
from .launch import launch_tuned

F8 = torch.float8_e4m3fn

# GPU, the 2d-3d kernel: Hopper FP8 tiles (BK = 128 bytes: one 128-byte swizzled row per operand
# row), tuned per shape; PER_SM programs per SM. FLATTEN pipelines the next tile's loads under
# this one's epilogue, and two programs of 128 x 128 tiles on one SM run one's epilogue under the
# other's main loop.
GPU_CONFIGS = [
    triton.Config({"BM": 256, "BN": 128, "BK": 128, "FLATTEN": False, "PER_SM": 1}, num_warps=8, num_stages=3),
    triton.Config({"BM": 256, "BN": 128, "BK": 128, "FLATTEN": True, "PER_SM": 1}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 256, "BK": 128, "FLATTEN": False, "PER_SM": 1}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 128, "BK": 128, "FLATTEN": False, "PER_SM": 2}, num_warps=4, num_stages=3),
    triton.Config({"BM": 128, "BN": 128, "BK": 128, "FLATTEN": True, "PER_SM": 2}, num_warps=4, num_stages=3),
]
# the weight gradient's 2d-2d kernel also holds its output tile in shared memory for the TMA
# store, so one program of 256 x 128 tiles per SM. RUN tiles of a group share their descriptors
# and one pipeline: longer runs pay less per tile, shorter ones balance uneven groups better
WGRAD_CONFIGS = [
    triton.Config({"BM": 256, "BN": 128, "BK": 128, "RUN": run, "PER_SM": 1}, num_warps=8, num_stages=3)
    for run in (2, 4, 8, 16)
]
# the blockwise mode scales each step's MMA sum before the next step adds to it, so every warp group
# waits on its MMA each step: it runs fastest with 128 x 128 tiles over two warp groups, half the
# accumulator per warp group of the rowwise mode's tiles, in both layouts
BLOCKWISE_CONFIGS = [
    triton.Config({"BM": 128, "BN": 128, "BK": 128, "FLATTEN": False, "PER_SM": 1}, num_warps=8, num_stages=stages)
    for stages in (3, 4)
]
BLOCKWISE_WGRAD_CONFIGS = [
    triton.Config({"BM": 128, "BN": 128, "BK": 128, "RUN": run, "PER_SM": 1}, num_warps=8, num_stages=3)
    for run in (4, 8)
]
# the interpreter: small tiles keep CPU tests fast; runs of two tiles, so some are cut short
INTERPRETER_CONFIG = {"BM": 32, "BN": 32, "BK": 32, "FLATTEN": False, "PER_SM": 1}
WGRAD_INTERPRETER_CONFIG = {"BM": 32, "BN": 32, "BK": 32, "RUN": 2, "PER_SM": 1}


@triton.jit
def _mma(acc, a, b, HW_CVT: tl.constexpr, BK: tl.constexpr):
    """acc + a @ b^T for float8 tiles a [BM, BK] and b [BN, BK] (bytes in the interpreter)."""
    if HW_CVT:
        # Hopper's FP8 MMA sums into a reduced-precision accumulator; folding each BK step into
        # the fp32 one matches torch's kernel's accuracy, at a cost in speed
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.float32, max_num_imprecise_acc=BK)
    else:
        acc = tl.dot(tc.e4m3_decode(a, False), tl.trans(tc.e4m3_decode(b, False)), acc, input_precision="ieee")
    return acc


@triton.jit
def _mma_scaled(acc, a, b, s_rows, s_cols, HW_CVT: tl.constexpr, BK: tl.constexpr):
    """acc + (a @ b^T) * s_rows[:, None] * s_cols[None, :]: one contraction step of the blockwise
    recipe, whose scales change every 128 along the contraction (BK divides 128)."""
    p = _mma(tl.zeros_like(acc), a, b, HW_CVT, BK)
    return acc + p * s_rows[:, None] * s_cols[None, :]


@triton.jit
def _gemm_2d3d_kernel(
    a_ptr, s_am, b_ptr, s_be, s_bn, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K, rows_per_group_p2,
    s_sam, s_sak, s_sbe, s_sbk, s_sbn,
    E: tl.constexpr, EP: tl.constexpr, HW_CVT: tl.constexpr, BLOCKWISE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FLATTEN: tl.constexpr, PER_SM: tl.constexpr,
):
    """A persistent kernel: its programs (PER_SM per SM) take the output tiles in turn. Tile t is
    row tile t // n_tiles, counted group after group (a group spans cdiv(size, BM) tiles), and
    column tile t % n_tiles of expert b[g]: column tiles vary fastest, so the tiles in flight
    share a few A row tiles and one expert's B in L2. Operand tiles arrive by TMA (tensor
    descriptors); rows of a tile past its group's end are loaded (the next group's, or zeros
    past M) but never stored. rows_per_group_p2 is only part of the autotuner's key."""
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [s_am, 1], [BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, [E, N, K], [s_be, s_bn, 1], [1, BN, BK])
    n_tiles = tl.cdiv(N, BN)
    starts, ends, tile_ends = tc.group_table(offs_ptr, E, EP, BM, M)
    tiles = tl.max(tile_ends, 0) * n_tiles
    for t in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
        row_tile = t // n_tiles
        g = tc.group_of(tile_ends, E, row_tile + tl.zeros([1], dtype=tl.int32))  # 1 lane: the helpers take blocks
        start, end = tl.sum(tc.lane_value(starts, g)), tl.sum(tc.lane_value(ends, g))
        m0 = start + (row_tile - tl.sum(tc.lane_value(tile_ends, g)) + (end - start + BM - 1) // BM) * BM
        n0 = (t % n_tiles) * BN
        e = tl.sum(g)
        m = m0 + tl.arange(0, BM)
        m_ok = (m < end) & (m < M)  # m < M: malformed offs must not write past out
        n = n0 + tl.arange(0, BN)
        n_ok = n < N
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            a, b = a_desc.load([m0, k0]), b_desc.load([e, n0, k0]).reshape(BN, BK)
            if BLOCKWISE:  # sa [M, K / 128] per row and tile, sb [E, K / 128, N / 128] per block
                sa = tl.load(sa_ptr + m * s_sam + (k0 // 128) * s_sak, mask=m_ok, other=0.0)
                sb = tl.load(sb_ptr + e * s_sbe + (k0 // 128) * s_sbk + (n // 128) * s_sbn, mask=n_ok, other=0.0)
                acc = _mma_scaled(acc, a, b, sa, sb, HW_CVT, BK)
            else:
                acc = _mma(acc, a, b, HW_CVT, BK)
        if not BLOCKWISE:  # sa [M], sb [E, N]
            sa = tl.load(sa_ptr + m, mask=m_ok, other=0.0)
            sb = tl.load(sb_ptr + e * N + n, mask=n_ok, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        out = out_ptr + m.to(tl.int64)[:, None] * N + n[None, :]
        tc.store_f32(out, acc, m_ok[:, None] & n_ok[None, :], True, HW_CVT)


# keyed on the mean rows per group too (a power of two): the best tile differs between 16 and 512
# rows per group at one (N, K), and a process may meet both (`recipe="auto"` times small buckets)
_gemm_2d3d_tuned = triton.autotune(GPU_CONFIGS, key=["N", "K", "rows_per_group_p2"])(_gemm_2d3d_kernel)
_gemm_2d3d_blockwise_tuned = triton.autotune(BLOCKWISE_CONFIGS, key=["N", "K", "rows_per_group_p2"])(_gemm_2d3d_kernel)


@triton.jit
def _store_tile(out, y, e, k0, n0, K, N, HW_CVT: tl.constexpr, TMA_STORE: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    """Store fp32 tile y as bf16 at out[e, k0:k0 + BM, n0:n0 + BN]: by TMA through descriptor
    `out` (which clips at K and N), else through pointer `out`, masked."""
    if TMA_STORE:
        out.store([e, k0, n0], tc.bf16_tile(y, HW_CVT).reshape(1, BM, BN))
    else:
        k = k0 + tl.arange(0, BM)
        n = n0 + tl.arange(0, BN)
        ptr = out + e.to(tl.int64) * K * N + k.to(tl.int64)[:, None] * N + n[None, :]
        tc.store_f32(ptr, y, (k < K)[:, None] & (n < N)[None, :], True, HW_CVT)


@triton.jit
def _gemm_2d2d_kernel(
    a_ptr, s_ak, b_ptr, s_bn, sa_ptr, sb_ptr, out_ptr, offs_ptr, T, K, N, rows_per_group_p2,
    s_sat, s_sak, s_sbt, s_sbn,
    E: tl.constexpr, EP: tl.constexpr, HW_CVT: tl.constexpr, BLOCKWISE: tl.constexpr, TMA_STORE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RUN: tl.constexpr, PER_SM: tl.constexpr,
):
    """out[g] [K, N] = A[:, group g] @ B[:, group g]^T, scaled by sa[g, k] sb[g, n]: A [K, T] and
    B [N, T] K-major along the grouped tokens T. Persistent; its work unit is a run of at most RUN
    output tiles of one group side by side along N (one row tile of out[g] cut into runs of equal
    length, to a tile), units counted group by group, so the programs in flight share a few
    groups' operands in L2. A unit makes its two load descriptors once, with the token dim
    ending at its group's end (TMA reads zeros past it rather than the next group's tokens), and
    walks its tiles' contraction steps in one loop, which the compiler pipelines across tiles:
    the next tile's loads run under this one's epilogue (a contraction of 512 tokens is only 4
    steps of 128). A group whose start or end
    is not a multiple of 16 tokens is not read and its block is NaN: TMA faults on it (an illegal
    instruction on the H200, which ends the process's CUDA context), and only a direct call
    meets it, since the weight gradient pads every group to 16 (`rowwise.quantize_groups`).
    With TMA_STORE (rows of out 16-byte aligned) tiles are stored by TMA through one descriptor
    of out [E, K, N]. rows_per_group_p2 is only part of the autotuner's key."""
    k_tiles, n_tiles = tl.cdiv(K, BM), tl.cdiv(N, BN)
    runs = tl.cdiv(n_tiles, RUN)  # per row tile of out: runs of n_tiles // runs tiles or one more
    per_group = k_tiles * runs
    starts = tc.group_ends(offs_ptr, E, EP, T, 1)
    ends = tc.group_ends(offs_ptr, E, EP, T, 0)
    if TMA_STORE:
        out = tl.make_tensor_descriptor(out_ptr, [E, K, N], [K.to(tl.int64) * N, N, 1], [1, BM, BN])
    else:
        out = out_ptr
    for u in range(tl.program_id(0), E * per_group, tl.num_programs(0)):
        g = u // per_group + tl.zeros([1], dtype=tl.int32)  # 1 lane: the helpers take blocks
        e = tl.sum(g)
        start, end = tl.sum(tc.lane_value(starts, g)), tl.sum(tc.lane_value(ends, g))
        k0 = (u % per_group) // runs * BM
        r = u % runs
        j0 = r * n_tiles // runs
        tiles = (r + 1) * n_tiles // runs - j0
        align = 128 if BLOCKWISE else 16  # blockwise: each step one tile of scales
        readable = ((start % align == 0) & (end % align == 0)) | (start == end)
        steps = tl.where(readable, (end - start + BK - 1) // BK, 0)
        if steps == 0:  # an empty group's block is zero, an unreadable one's NaN
            fill = tl.zeros([BM, BN], dtype=tl.float32) + tl.where(readable, 0.0, float("nan"))
            for j in range(j0, j0 + tiles):
                _store_tile(out, fill, e, k0, j * BN, K, N, HW_CVT, TMA_STORE, BM, BN)
        else:
            a_desc = tl.make_tensor_descriptor(a_ptr, [K, end], [s_ak, 1], [BM, BK])
            b_desc = tl.make_tensor_descriptor(b_ptr, [N, end], [s_bn, 1], [BN, BK])
            k = k0 + tl.arange(0, BM)
            if not BLOCKWISE:  # sa [G * K], sb [G * N]
                sa = tl.load(sa_ptr + e * K + k, mask=k < K, other=0.0)
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for i in range(0, tiles * steps):
                s = i % steps
                n0 = (j0 + i // steps) * BN
                n = n0 + tl.arange(0, BN)
                m0 = start + s * BK
                a, b = a_desc.load([k0, m0]), b_desc.load([n0, m0])
                if BLOCKWISE:  # sa [T / 128, K], sb [T / 128, N]: per tile of 128 tokens
                    sa = tl.load(sa_ptr + (m0 // 128) * s_sat + k * s_sak, mask=k < K, other=0.0)
                    sb = tl.load(sb_ptr + (m0 // 128) * s_sbt + n * s_sbn, mask=n < N, other=0.0)
                    acc = _mma_scaled(acc, a, b, sa, sb, HW_CVT, BK)
                else:
                    acc = _mma(acc, a, b, HW_CVT, BK)
                if s == steps - 1:
                    if not BLOCKWISE:
                        sb = tl.load(sb_ptr + e * N + n, mask=n < N, other=0.0)
                        acc = acc * sa[:, None] * sb[None, :]
                    _store_tile(out, acc, e, k0, n0, K, N, HW_CVT, TMA_STORE, BM, BN)
                    acc = tl.zeros([BM, BN], dtype=tl.float32)


_gemm_2d2d_tuned = triton.autotune(WGRAD_CONFIGS, key=["K", "N", "rows_per_group_p2"])(_gemm_2d2d_kernel)
_gemm_2d2d_blockwise_tuned = triton.autotune(BLOCKWISE_WGRAD_CONFIGS, key=["K", "N", "rows_per_group_p2"])(
    _gemm_2d2d_kernel
)


def _check(a, b, scale_a, scale_b, offs) -> None:
    if a.dtype != F8 or b.dtype != F8:
        raise ValueError(f"a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        raise ValueError(f"scale_a and scale_b must be float32, got {scale_a.dtype} and {scale_b.dtype}")
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise ValueError(f"offs must be a 1-D int32 tensor of group ends, got {offs.dtype} {tuple(offs.shape)}")
    if len({t.device for t in (a, b, scale_a, scale_b, offs)}) != 1:
        raise ValueError("a, b, scale_a, scale_b and offs must be on one device")
    if a.dim() != 2 or b.dim() not in (2, 3):
        raise ValueError(f"need a 2-D and b 3-D (2d-3d) or 2-D (2d-2d), got {a.dim()}-D and {b.dim()}-D")
    if a.shape[1] != b.shape[-2]:
        raise ValueError(f"contraction dims differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.stride(1) != 1:
        raise ValueError(f"a must be row-major (contraction dim contiguous), got strides {a.stride()}")
    if b.stride(-2) != 1:
        raise ValueError(
            f"b must be a transposed view of a tensor contiguous along the contraction dim "
            f"(b.stride(-2) == 1), got strides {b.stride()}"
        )
    rows = [st for i, st in enumerate(b.stride()) if i != b.dim() - 2]  # every stride but the unit one
    if any(x % 16 for x in (a.stride(0), *rows, a.data_ptr(), b.data_ptr())):
        raise ValueError(
            f"a and b must start at 16-byte aligned addresses with row strides of multiples of 16 bytes "
            f"(TMA), got strides {a.stride()} and {b.stride()}: pass contiguous copies with K a multiple of 16"
        )


def scaled_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """`torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16)` for
    rowwise float8_e4m3fn operands (semantics: `rowwise.scaled_grouped_mm`), contraction dim
    contiguous in both:
      2d-3d  a [M, K], b [E, K, N], scale_a [M], scale_b [E, N], offs [E] group ends along M
             -> [M, N], rows past offs[-1] unwritten;
      2d-2d  a [K, T], b [T, N], scale_a [G * K], scale_b [G * N], offs [G] group ends along T
             -> [G, K, N], an empty group's block zero, the block of a group that starts or
             ends off a multiple of 16 tokens NaN (TMA cannot read it; the weight gradient
             pads each group to 16)."""
    return _grouped_mm(a, b, scale_a, scale_b, offs, blockwise=False)


def blockwise_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """The blockwise recipe's grouped GEMM (semantics: `blockwise.scaled_grouped_mm`): as
    `scaled_grouped_mm`, with scales per 128 along the contraction (any strides):
      2d-3d  scale_a [M, K / 128] per row and tile, scale_b [E, K / 128, N / 128] per block;
      2d-2d  scale_a [T / 128, K] and scale_b [T / 128, N] per tile of 128 tokens; each group
             starts and ends on a multiple of 128 tokens (else its block is NaN)."""
    return _grouped_mm(a, b, scale_a, scale_b, offs, blockwise=True)


def _check_shapes(a, b, scale_a, scale_b, offs, blockwise: bool) -> tuple[int, ...]:
    """`_check`, then the layout's scale and offs shapes (the Gluon kernel's checks too): the
    output's shape."""
    _check(a, b, scale_a, scale_b, offs)
    if b.dim() == 3:
        (M, K), (E, _, N) = a.shape, b.shape
        want_a, want_b = ([M, tiles(K)], [E, tiles(K), tiles(N)]) if blockwise else ([M], [E, N])
        out_shape = (M, N)
        if offs.numel() != E:
            raise ValueError(f"offs must hold one group end per expert: {offs.numel()} for {E} experts")
    else:
        (K, T), (_, N), E = a.shape, b.shape, offs.numel()
        if blockwise and T % SCALE_TILE:
            raise ValueError(f"the blockwise weight gradient takes tokens in whole tiles of {SCALE_TILE}, got {T}")
        want_a, want_b = ([T // SCALE_TILE, K], [T // SCALE_TILE, N]) if blockwise else ([E * K], [E * N])
        out_shape = (E, K, N)
    if list(scale_a.shape) != want_a or list(scale_b.shape) != want_b:
        raise ValueError(
            f"scales must be scale_a {want_a} and scale_b {want_b}, got {list(scale_a.shape)} and {list(scale_b.shape)}"
        )
    return out_shape


def _grouped_mm(a, b, scale_a, scale_b, offs, blockwise: bool) -> torch.Tensor:
    out_shape = _check_shapes(a, b, scale_a, scale_b, offs, blockwise)
    if b.dim() == 3:
        (M, K), (E, _, N) = a.shape, b.shape
    else:
        (K, T), (_, N), E = a.shape, b.shape, offs.numel()
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=a.device)
    if out.numel() == 0:
        return out
    # the interpreter has no float8 arithmetic: it gets the bytes (see `_mma`)
    a_op, b_op = (a, b) if a.is_cuda else (a.view(torch.uint8), b.view(torch.uint8))
    if a.is_cuda:
        _ensure_allocator()
    sms = tc.sms(a.device)
    consts = dict(E=E, EP=tc.pow2(E), HW_CVT=a.is_cuda, BLOCKWISE=blockwise)
    if not blockwise:
        scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
    shared = (scale_a, scale_b, tc.as_bits(out), offs)  # both kernels' middle arguments
    strides = (*scale_a.stride(), *scale_b.stride()) if blockwise else (0,) * (5 if b.dim() == 3 else 4)
    grid = lambda meta: (sms * meta["PER_SM"],)  # noqa: E731
    if b.dim() == 3:
        rows = tc.pow2(M // max(E, 1))
        args = (a_op, a.stride(0), b_op, b.stride(0), b.stride(2), *shared, M, N, K, rows, *strides)
        key = (N, K, rows)
        tuned = _gemm_2d3d_blockwise_tuned if blockwise else _gemm_2d3d_tuned
        launch_tuned(_gemm_2d3d_kernel, tuned, key, grid, args, consts, INTERPRETER_CONFIG)
    else:
        rows = tc.pow2(T // max(E, 1))
        args = (a_op, a.stride(0), b_op, b.stride(1), *shared, T, K, N, rows, *strides)
        consts["TMA_STORE"] = N % 8 == 0  # bf16 rows of a multiple of 16 bytes
        key = (K, N, rows)
        tuned = _gemm_2d2d_blockwise_tuned if blockwise else _gemm_2d2d_tuned
        launch_tuned(_gemm_2d2d_kernel, tuned, key, grid, args, consts, WGRAD_INTERPRETER_CONFIG)
    return out


def _ensure_allocator() -> None:
    """Tensor descriptors made in a kernel need a global scratch buffer from Triton's allocator:
    give Triton a torch-backed one unless the program has set its own."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
