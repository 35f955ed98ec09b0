"""A warp-specialized Gluon twin of `triton_fp8_gemm.scaled_grouped_mm` for Hopper (sm_90), 2d-3d
layout only (the forward and the input gradient): a [M, K] float8 x b [E, K, N] float8 (b a
transposed view, K contiguous) with scale_a [M] and scale_b [E, N] -> bf16 out [M, N], token groups
along M by `offs` (group ends, int32, never read on the host), rows past offs[-1] unwritten.

Not wired into the dispatch: `available()` says whether this process can run it at all (CUDA, a
9.x device, a Gluon whose Hopper API this module was written against); the `tl` kernel stays the
CPU/interpreter path and the fallback, and the two agree bit for bit on the GPU.

Schedule, per persistent program (one per SM), in four partitions:
  - two consumer warpgroups (the default partition and a 4-warp worker), each owning its own
    output tile of BM x BN at a time, taking the program's tiles in turn (consumer c the tiles
    c, c + 2, ... of the program's list), so that one's epilogue (rowwise scales, bf16 stores) runs
    under the other's asynchronous wgmma;
  - two one-warp producers, one per consumer, each issuing the TMA loads of its consumer's tiles
    into that consumer's ring of STAGES shared-memory stages, every stage guarded by a `ready`
    mbarrier (TMA bytes landed) and an `empty` one (the consumer's wgmma has read it).
Each consumer has its own ring and producer so that the phase parity of every barrier only ever
runs one phase ahead of its waiter, whichever consumer is ahead. The consumers run free by default:
each fp32 add (below) waits for its chain of wgmmas, so one warpgroup alone leaves the tensor cores
idle between its chains, and the other consumer's chains fill those gaps. ORDERED adds CUTLASS's
strict ping-pong order (a consumer starts a tile's main loop only once the other finished its own),
which forbids that filling; it is kept to compare against.

Numerics, the `tl` kernel's exactly: each 128-deep contraction step (BK) is one chain of four
k=32 wgmmas started from zero, added to the fp32 accumulator in fp32 (what Triton's lowering of
`tl.dot(..., max_num_imprecise_acc=BK)` does); the epilogue multiplies by scale_a per row, then by
scale_b per column, and rounds to bf16 to nearest even. Every tile is two sub-blocks of 64 x 128
(BM x BN = 128 x 128: two row halves; 64 x 256: two column halves): a chain writes a 64-register
partial, which must be waited for before its add, and two full partials beside the 128-register
accumulator would not fit the 240 registers a consumer gets.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import triton_common as tc
from . import triton_fp8_gemm as tfg

try:  # Gluon's Hopper API as of triton 3.6; any other triton may lack or move a name
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # noqa: BLE001 - a CPU machine's triton must not break the package import
    _IMPORT_ERROR = exc

F8 = torch.float8_e4m3fn
BK = 128  # one contraction step: 128 bytes of K per operand row, the 128-byte swizzle's width
SUB_M, SUB_N = 64, 128  # a sub-block: one wgmma row group (4 warps x 16 rows) by one instruction's N
# the register cap at entry, which the warp-specialized region redistributes by warpgroup: 12 warps
# (the two one-warp producers share one) within the 64K registers of an SM
MAXNREG = 168


@dataclass(frozen=True)
class Config:
    """BM x BN output tile per consumer (128 x 128 or 64 x 256), ring depth per consumer, strict
    ping-pong order between the consumers' main loops, 128 x 128 tiles as four 64 x 64 sub-blocks
    (`_consumer_quarters`), and the registers of a consumer and of a producer (per thread; the
    warpgroups' counts must fit the SM's 64K with the default partition's share)."""

    BM: int = 128
    BN: int = 128
    STAGES: int = 3
    ORDERED: bool = False
    QUARTERS: bool = False
    CONSUMER_REGS: int = 240
    PRODUCER_REGS: int = 24


DEFAULT = Config()
# what the tests check bit for bit and benchmarks/bench_gluon_gemm.py times side by side (gluon0..3)
VARIANTS = [DEFAULT, Config(ORDERED=True), Config(BM=64, BN=256, STAGES=2), Config(QUARTERS=True)]


def available() -> bool:
    """Whether this process can run the Gluon kernel: Gluon imported, a CUDA device of compute
    capability 9.x. Costs no GPU work."""
    return _IMPORT_ERROR is None and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


if _IMPORT_ERROR is None:

    @gluon.jit
    def _max_combine(x, y):
        return gl.maximum(x, y)

    @gluon.jit
    def _add_combine(x, y):
        return x + y

    @gluon.jit
    def _group_ends(offs_ptr, E, EP: gl.constexpr, M, SHIFT: gl.constexpr, L: gl.constexpr):
        """`triton_common.group_ends`: lane i holds group end i - SHIFT, clamped into [0, M] and
        raised to the running maximum (malformed offs stay in bounds), 0 past E and before 0."""
        i = gl.arange(0, EP, layout=L)
        raw = gl.load(offs_ptr + i - SHIFT, mask=(i >= SHIFT) & (i < E), other=0)
        ends = gl.associative_scan(gl.minimum(gl.maximum(raw, 0), M), 0, _max_combine)
        return gl.where(i < E, ends, 0)

    @gluon.jit
    def _tile_origin(t, starts, ends, tile_ends, E, EP: gl.constexpr, n_tiles,
                     BM: gl.constexpr, BN: gl.constexpr, L: gl.constexpr):
        """Output tile t -> (expert, first row, group end, first column). As the `tl` kernel
        counts them: row tile t // n_tiles, group after group (a group spans cdiv(size, BM) row
        tiles), column tile t % n_tiles."""
        i = gl.arange(0, EP, layout=L)
        row_tile = t // n_tiles
        g = gl.sum(((tile_ends <= row_tile) & (i < E)).to(gl.int32), axis=0)
        start = gl.sum(gl.where(i == g, starts, 0), axis=0)
        end = gl.sum(gl.where(i == g, ends, 0), axis=0)
        tile_end = gl.sum(gl.where(i == g, tile_ends, 0), axis=0)
        m0 = start + (row_tile - tile_end + (end - start + BM - 1) // BM) * BM
        return g, m0, end, (t % n_tiles) * BN

    @gluon.jit
    def _group_table(offs_ptr, E, EP: gl.constexpr, M, BM: gl.constexpr, L: gl.constexpr):
        """Each group's start and end row and its end in row tiles, one lane per group, in the
        calling partition's layout L (partitions cannot hand each other tensors)."""
        ends = _group_ends(offs_ptr, E, EP, M, 0, L)
        starts = _group_ends(offs_ptr, E, EP, M, 1, L)
        tile_ends = gl.associative_scan((ends - starts + BM - 1) // BM, 0, _add_combine)
        return starts, ends, tile_ends

    @gluon.jit
    def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, offs_ptr, M, N, K,
                  C: gl.constexpr, E, EP: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  STAGES: gl.constexpr, L1: gl.constexpr):
        """Consumer C's loads: for each of its tiles, every contraction step's A rows [BM, BK] and
        B rows [BN, BK] (b as [E * N, K]) into the next stage of its ring, once that stage is free."""
        AH: gl.constexpr = BM // 64
        BH: gl.constexpr = BN // 128
        STEP_BYTES: gl.constexpr = (BM + BN) * 128
        starts, ends, tile_ends = _group_table(offs_ptr, E, EP, M, BM, L1)
        n_tiles = gl.cdiv(N, BN)
        tiles = gl.max(tile_ends, axis=0) * n_tiles
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        k_steps = gl.cdiv(K, 128)
        cnt = 0
        for t in range(pid + C * P, tiles, 2 * P):
            e, m0, end, n0 = _tile_origin(t, starts, ends, tile_ends, E, EP, n_tiles, BM, BN, L1)
            for k in range(k_steps):
                s = cnt % STAGES
                # a fresh barrier counts as having completed the phase before its first: the
                # first pass over the ring does not wait
                mbarrier.wait(empty.index(s), ((cnt // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, STEP_BYTES)
                for h in gl.static_range(AH):
                    tma.async_copy_global_to_shared(a_desc, [m0 + 64 * h, k * 128], bar, a_ring.index(s * AH + h))
                for h in gl.static_range(BH):
                    tma.async_copy_global_to_shared(b_desc, [e * N + n0 + 128 * h, k * 128], bar,
                                                    b_ring.index(s * BH + h))
                cnt += 1

    @gluon.jit
    def _epilogue_block(acc, row0, col0, end, e, sa_ptr, sb_ptr, out_ptr, M, N, W: gl.constexpr,
                        MMA: gl.constexpr, STORE: gl.constexpr):
        """out[row0:row0 + 64, col0:col0 + W] = bf16(acc * sa[rows] * sb[e, cols]), rows below
        the group's end (and M), columns below N. The scales in the accumulator's layout, in the
        `tl` kernel's order; the bf16 tile moved to 16-byte-per-thread rows for the stores."""
        rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
        cols = col0 + gl.arange(0, W, layout=gl.SliceLayout(0, MMA))
        sa = gl.load(sa_ptr + rows, mask=(rows < end) & (rows < M), other=0.0)
        sb = gl.load(sb_ptr + e * N + cols, mask=cols < N, other=0.0)
        y = (acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)).to(gl.bfloat16)
        y = gl.convert_layout(y, STORE)
        rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, STORE))
        cols = col0 + gl.arange(0, W, layout=gl.SliceLayout(0, STORE))
        ptr = out_ptr + gl.expand_dims(rows.to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims((rows < end) & (rows < M), 1) & gl.expand_dims(cols < N, 0)
        gl.store(ptr, y, mask=mask)

    @gluon.jit
    def _consumer(a_ring, b_ring, ready, empty, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
                  C: gl.constexpr, E, EP: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  STAGES: gl.constexpr, ORDERED: gl.constexpr, L4: gl.constexpr):
        """Consumer C (one warpgroup): its tiles' main loops, one 128-deep step at a time, each
        sub-block's chain of wgmmas waited for and added in fp32; then the tile's epilogue."""
        AH: gl.constexpr = BM // 64
        BH: gl.constexpr = BN // 128
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
        STORE: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        starts, ends, tile_ends = _group_table(offs_ptr, E, EP, M, BM, L4)
        n_tiles = gl.cdiv(N, BN)
        tiles = gl.max(tile_ends, axis=0) * n_tiles
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        k_steps = gl.cdiv(K, 128)
        cnt = 0
        turn = 0
        for t in range(pid + C * P, tiles, 2 * P):
            e, m0, end, n0 = _tile_origin(t, starts, ends, tile_ends, E, EP, n_tiles, BM, BN, L4)
            if ORDERED:  # consumer 0 goes first: its first wait passes on the fresh barrier
                mbarrier.wait(order.index(C), (turn & 1) ^ (1 - C))
            acc0 = gl.zeros([64, 128], gl.float32, MMA)
            acc1 = gl.zeros([64, 128], gl.float32, MMA)
            part = gl.zeros([64, 128], gl.float32, MMA)
            for _ in range(k_steps):
                s = cnt % STAGES
                mbarrier.wait(ready.index(s), (cnt // STAGES) & 1)
                b0 = b_ring.index(s * BH).permute((1, 0))
                part = warpgroup_mma(a_ring.index(s * AH), b0, part, use_acc=False, is_async=True)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                acc0 = acc0 + part
                b1 = b_ring.index(s * BH + BH - 1).permute((1, 0))
                part = warpgroup_mma(a_ring.index(s * AH + AH - 1), b1, part, use_acc=False, is_async=True)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                acc1 = acc1 + part
                mbarrier.arrive(empty.index(s), count=1)
                cnt += 1
            if ORDERED:
                mbarrier.arrive(order.index(1 - C), count=1)
            turn += 1
            _epilogue_block(acc0, m0, n0, end, e, sa_ptr, sb_ptr, out_ptr, M, N, 128, MMA, STORE)
            # sub-block 1: rows 64-127 (BM 128) or columns 128-255 (BN 256)
            _epilogue_block(acc1, m0 + 64 * (AH - 1), n0 + 128 * (BH - 1), end, e, sa_ptr, sb_ptr, out_ptr, M, N,
                            128, MMA, STORE)

    @gluon.jit
    def _consumer_quarters(a_ring, b_ring, ready, empty, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
                           C: gl.constexpr, E, EP: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                           STAGES: gl.constexpr, ORDERED: gl.constexpr, L4: gl.constexpr):
        """`_consumer` for 128 x 128 tiles cut into four 64 x 64 sub-blocks, two partials in flight:
        a sub-block's add runs under the next one's chain, at the cost of n = 64 wgmmas (A read
        from shared memory twice per step)."""
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 32])
        STORE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        starts, ends, tile_ends = _group_table(offs_ptr, E, EP, M, BM, L4)
        n_tiles = gl.cdiv(N, BN)
        tiles = gl.max(tile_ends, axis=0) * n_tiles
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        k_steps = gl.cdiv(K, 128)
        cnt = 0
        turn = 0
        for t in range(pid + C * P, tiles, 2 * P):
            e, m0, end, n0 = _tile_origin(t, starts, ends, tile_ends, E, EP, n_tiles, BM, BN, L4)
            if ORDERED:
                mbarrier.wait(order.index(C), (turn & 1) ^ (1 - C))
            acc00 = gl.zeros([64, 64], gl.float32, MMA)
            acc01 = gl.zeros([64, 64], gl.float32, MMA)
            acc10 = gl.zeros([64, 64], gl.float32, MMA)
            acc11 = gl.zeros([64, 64], gl.float32, MMA)
            pa = gl.zeros([64, 64], gl.float32, MMA)
            pb = gl.zeros([64, 64], gl.float32, MMA)
            for _ in range(k_steps):
                s = cnt % STAGES
                mbarrier.wait(ready.index(s), (cnt // STAGES) & 1)
                a0 = a_ring.index(2 * s)
                a1 = a_ring.index(2 * s + 1)
                b0 = b_ring.index(s).slice(0, 64).permute((1, 0))
                b1 = b_ring.index(s).slice(64, 64).permute((1, 0))
                pa = warpgroup_mma(a0, b0, pa, use_acc=False, is_async=True)
                pb = warpgroup_mma(a0, b1, pb, use_acc=False, is_async=True)
                pa = warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
                acc00 = acc00 + pa
                pa = warpgroup_mma(a1, b0, pa, use_acc=False, is_async=True)
                pb = warpgroup_mma_wait(num_outstanding=1, deps=(pb,))
                acc01 = acc01 + pb
                pb = warpgroup_mma(a1, b1, pb, use_acc=False, is_async=True)
                pa = warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
                acc10 = acc10 + pa
                pb = warpgroup_mma_wait(num_outstanding=0, deps=(pb,))
                acc11 = acc11 + pb
                mbarrier.arrive(empty.index(s), count=1)
                cnt += 1
            if ORDERED:
                mbarrier.arrive(order.index(1 - C), count=1)
            turn += 1
            _epilogue_block(acc00, m0, n0, end, e, sa_ptr, sb_ptr, out_ptr, M, N, 64, MMA, STORE)
            _epilogue_block(acc01, m0, n0 + 64, end, e, sa_ptr, sb_ptr, out_ptr, M, N, 64, MMA, STORE)
            _epilogue_block(acc10, m0 + 64, n0, end, e, sa_ptr, sb_ptr, out_ptr, M, N, 64, MMA, STORE)
            _epilogue_block(acc11, m0 + 64, n0 + 64, end, e, sa_ptr, sb_ptr, out_ptr, M, N, 64, MMA, STORE)

    @gluon.jit
    def _gemm_2d3d_kernel(a_desc, b_desc, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K, E,
                          EP: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                          STAGES: gl.constexpr, ORDERED: gl.constexpr, QUARTERS: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
        """Persistent: program p takes output tiles p, p + P, ...; consumer c of them every other
        one from its c-th. Launched with 4 warps (consumer 0); the partitions add 4 + 1 + 1."""
        AH: gl.constexpr = BM // 64
        BH: gl.constexpr = BN // 128
        # the group table: every warp holds all EP (>= 32) lanes, so that a tile's lookups reduce
        # within a warp (shuffles) rather than across the partition's warps (shared memory, barriers)
        L1: gl.constexpr = gl.BlockedLayout([EP // 32], [32], [1], [0])
        L4: gl.constexpr = gl.BlockedLayout([EP // 32], [32], [4], [0])
        a0 = gl.allocate_shared_memory(a_desc.dtype, [STAGES * AH] + a_desc.block_type.shape, a_desc.layout)
        b0 = gl.allocate_shared_memory(b_desc.dtype, [STAGES * BH] + b_desc.block_type.shape, b_desc.layout)
        a1 = gl.allocate_shared_memory(a_desc.dtype, [STAGES * AH] + a_desc.block_type.shape, a_desc.layout)
        b1 = gl.allocate_shared_memory(b_desc.dtype, [STAGES * BH] + b_desc.block_type.shape, b_desc.layout)
        ready0 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty0 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ready1 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty1 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready0.index(i), count=1)
            mbarrier.init(empty0.index(i), count=1)
            mbarrier.init(ready1.index(i), count=1)
            mbarrier.init(empty1.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(order.index(i), count=1)
        # the two consumers run one function; partitions cannot be picked through a constexpr value
        if QUARTERS:
            gl.warp_specialize([
                (_consumer_quarters, (a0, b0, ready0, empty0, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
                                      0, E, EP, BM, BN, STAGES, ORDERED, L4)),
                (_consumer_quarters, (a1, b1, ready1, empty1, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
                                      1, E, EP, BM, BN, STAGES, ORDERED, L4)),
                (_producer, (a_desc, b_desc, a0, b0, ready0, empty0, offs_ptr, M, N, K, 0, E, EP, BM, BN, STAGES, L1)),
                (_producer, (a_desc, b_desc, a1, b1, ready1, empty1, offs_ptr, M, N, K, 1, E, EP, BM, BN, STAGES, L1)),
            ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (a0, b0, ready0, empty0, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
                             0, E, EP, BM, BN, STAGES, ORDERED, L4)),
                (_consumer, (a1, b1, ready1, empty1, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, M, N, K,
                             1, E, EP, BM, BN, STAGES, ORDERED, L4)),
                (_producer, (a_desc, b_desc, a0, b0, ready0, empty0, offs_ptr, M, N, K, 0, E, EP, BM, BN, STAGES, L1)),
                (_producer, (a_desc, b_desc, a1, b1, ready1, empty1, offs_ptr, M, N, K, 1, E, EP, BM, BN, STAGES, L1)),
            ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])


@functools.cache
def _layouts():
    """The operand tiles' shared layouts: byte rows of BK = 128 (the 128-byte swizzle)."""
    return (gl.NVMMASharedLayout.get_default_for([SUB_M, BK], gl.float8e4nv),
            gl.NVMMASharedLayout.get_default_for([SUB_N, BK], gl.float8e4nv))


def _check_2d3d(a, b, scale_a, scale_b, offs) -> None:
    """`triton_fp8_gemm`'s checks for the 2d-3d layout (the one this kernel takes)."""
    tfg._check(a, b, scale_a, scale_b, offs)
    if b.dim() != 3:
        raise ValueError(f"the Gluon kernel takes the 2d-3d layout only (b [E, K, N]), got b {b.dim()}-D")
    M, (E, _, N) = a.shape[0], b.shape
    if offs.numel() != E:
        raise ValueError(f"offs must hold one group end per expert: {offs.numel()} for {E} experts")
    if list(scale_a.shape) != [M] or list(scale_b.shape) != [E, N]:
        raise ValueError(f"scales must be scale_a {[M]} and scale_b {[E, N]}, got {list(scale_a.shape)} and "
                         f"{list(scale_b.shape)}")


def scaled_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """`triton_fp8_gemm.scaled_grouped_mm` for the 2d-3d layout on a Hopper GPU, bit for bit:
    a [M, K], b [E, K, N] (a transposed view of a tensor contiguous along K), scale_a [M],
    scale_b [E, N], offs [E] group ends along M -> bf16 [M, N], rows past offs[-1] unwritten.
    Layouts the kernel's 2-D view of b cannot take (experts not one stride apart of N rows) and
    empty contractions go to the `tl` kernel."""
    return _grouped_mm(a, b, scale_a, scale_b, offs, DEFAULT)


def _grouped_mm(a, b, scale_a, scale_b, offs, cfg: Config, out: torch.Tensor | None = None) -> torch.Tensor:
    """`scaled_grouped_mm` with tile config `cfg`, into `out` [M, N] bf16 if given (the tests
    poison it: rows past offs[-1] must keep what they held)."""
    _check_2d3d(a, b, scale_a, scale_b, offs)
    if not a.is_cuda or _IMPORT_ERROR is not None:
        raise RuntimeError(f"the Gluon FP8 GEMM runs on a CUDA Hopper GPU only (gluon: {_IMPORT_ERROR!r})")
    (M, K), (E, _, N) = a.shape, b.shape
    b_ENK = b.transpose(-2, -1)
    if K == 0 or E == 0 or b_ENK.stride(0) != N * b_ENK.stride(1):
        if out is not None:
            raise ValueError("out= takes the Gluon path only; this layout goes to the tl kernel")
        return tfg.scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    if out is None:
        out = torch.empty((M, N), dtype=torch.bfloat16, device=a.device)
    elif out.shape != (M, N) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{M}, {N}], got {out.dtype} {tuple(out.shape)}")
    if out.numel() == 0:
        return out
    # b as [E * N, K] rows: a tile's rows past its expert's N are the next expert's (or TMA's zeros
    # past the last), and only feed output columns that are not stored
    b_rows = b_ENK.as_strided((E * N, K), (b_ENK.stride(1), 1))
    a_layout, b_layout = _layouts()
    a_desc = TensorDescriptor(a, [M, K], [a.stride(0), 1], [SUB_M, BK], a_layout)
    b_desc = TensorDescriptor(b_rows, [E * N, K], [b_ENK.stride(1), 1], [SUB_N, BK], b_layout)
    grid = (tfg._sms(a.device),)
    _gemm_2d3d_kernel[grid](
        a_desc, b_desc, scale_a.contiguous(), scale_b.contiguous(), out, offs, M, N, K, E,
        EP=max(tc.pow2(E), 32), BM=cfg.BM, BN=cfg.BN, STAGES=cfg.STAGES, ORDERED=cfg.ORDERED, QUARTERS=cfg.QUARTERS,
        CONSUMER_REGS=cfg.CONSUMER_REGS, PRODUCER_REGS=cfg.PRODUCER_REGS, num_warps=4, maxnreg=MAXNREG)
    return out
