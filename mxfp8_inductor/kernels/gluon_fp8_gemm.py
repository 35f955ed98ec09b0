"""A warp-specialized Gluon twin of `triton_fp8_gemm` for Hopper (sm_90): both layouts of
`scaled_grouped_mm` (rowwise scales) and of `blockwise_grouped_mm` (scales per 128 along the
contraction), made to equal the `tl` kernels bit for bit (tests/kernels/test_gluon_fp8_gemm.py
checks it on a Hopper GPU):
  2d-3d  the forward and the input gradient: a [M, K] x b [E, K, N] -> out [M, N], token groups
         along M by `offs`, rows past offs[-1] unwritten;
  2d-2d  the weight gradient: a [K, T] x b [T, N] -> out [G, K, N], token groups along the
         contraction T by `offs`; an empty group's block zero, an unreadable one's NaN (as the
         `tl` kernel: a group off a multiple of 16 tokens, or of 128 in the blockwise mode).
Both operands K-major (b a transposed view); `offs` (group ends, int32) is never read on the host.

The package's FP8 grouped-GEMM ops (`lowering/library.define_fp8_grouped_mm`) run it wherever
`available()` (CUDA, a 9.x device, a Gluon whose Hopper API this module was written against): it
measured faster than the `tl` kernel in every layout and mode (docs/performance.md, "Gluon FP8
grouped GEMM"). The `tl` kernels stay the CPU/interpreter path and the fallback.

Schedule, per persistent program (one per SM), in four partitions:
  - two consumer warpgroups (the default partition and a 4-warp worker), each owning its own
    128 x 128 output tile at a time, taking the program's tiles in turn (consumer c the tiles
    c, c + 2, ... of the program's list), so that one's epilogue (scales, bf16 stores) and, in the
    blockwise mode, its per-step scaling run under the other's asynchronous wgmma;
  - two one-warp producers (`_producer`), one per consumer, each issuing the TMA loads of its
    consumer's tiles into that consumer's ring of STAGES shared-memory stages, every stage guarded
    by a `ready` mbarrier (TMA bytes landed) and an `empty` one (the consumer's wgmma has read it).
Each consumer has its own ring and producer so that the phase parity of every barrier only ever
runs one phase ahead of its waiter, whichever consumer is ahead. The consumers run free by default:
each fp32 add (below) waits for its chain of wgmmas, so one warpgroup alone leaves the tensor cores
idle between its chains, and the other consumer's chains fill those gaps. ORDERED adds CUTLASS's
strict ping-pong order (a consumer starts a tile's main loop only once the other finished its own),
which forbids that filling; it is kept to compare against.

Both layouts walk tiles the same way (`_tile`): a tile is an output block of rows r0.. (of out in
2d-3d, of out[g] in 2d-2d) by columns n0.., a run of contraction steps from c0 (0 in 2d-3d, the
group's first token in 2d-2d), and the row of B its expert's (2d-3d: b as [E * N, K] rows).
The 2d-2d descriptors span all T tokens, where the `tl` kernel makes per-group ones that end at
the group's end: a group's last, partial step loads the next group's first tokens, and the
consumer zeroes them in shared memory before its wgmma (`_zero_from`), so the wgmma sees the
bytes the `tl` kernel's TMA gives it (zeros), NaN in the next group included.

Numerics, the `tl` kernel's exactly: each 128-deep contraction step is one chain of four k=32
wgmmas started from zero, added to the fp32 accumulator in fp32 (what Triton's lowering of
`tl.dot(..., max_num_imprecise_acc=128)` does); rowwise: the epilogue multiplies by scale_a per
row, then by scale_b per column; blockwise: each chain is multiplied by its step's row scale,
then by its column (block) scale, before the add; bf16 rounds to nearest even. A tile is two
sub-blocks of 64 x 128 (row halves): a chain writes a 64-register partial, which must be waited
for before its add, and two full partials beside the 128-register accumulator would not fit the
240 registers a consumer gets.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..routes import has_fp8_grouped_mm
from . import triton_common as tc
from . import triton_fp8_gemm as tfg
from .launch import launch_keyed

try:  # Gluon's Hopper API as of triton 3.6; any other triton may lack or move a name
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # noqa: BLE001 - a CPU machine's triton must not break the package import
    _IMPORT_ERROR = exc

F8 = torch.float8_e4m3fn
BK = 128  # one contraction step: 128 bytes per operand row, the 128-byte swizzle's width
BM = BN = 128  # a consumer's output tile
SUB_M = 64  # a sub-block's rows: one wgmma row group (4 warps x 16 rows)
# the register cap at entry, which the warp-specialized region redistributes by warpgroup: 12 warps
# (the two one-warp producers share one) within the 64K registers of an SM
MAXNREG = 168


@dataclass(frozen=True)
class Config:
    """Ring depth per consumer, strict ping-pong order between the consumers' main loops, and the
    registers of a consumer and of a producer (per thread; the warpgroups' counts must fit the
    SM's 64K with the default partition's share)."""

    STAGES: int = 3
    ORDERED: bool = False
    CONSUMER_REGS: int = 240
    PRODUCER_REGS: int = 24


DEFAULT = Config()
# what the tests check bit for bit and benchmarks/bench_gluon_gemm.py times side by side (gluon0,
# gluon1), in every layout and mode
VARIANTS = [DEFAULT, Config(ORDERED=True)]


@functools.cache
def available() -> bool:
    """Whether this process can run the Gluon kernel: Gluon imported, the current CUDA device one
    of compute capability 9.x (`routes.has_fp8_grouped_mm`). Costs no GPU work."""
    return _IMPORT_ERROR is None and _hopper()


@functools.cache  # asked on every GEMM call, and a device's capability does not change
def _hopper() -> bool:
    return torch.cuda.is_available() and has_fp8_grouped_mm(torch.device("cuda", torch.cuda.current_device()))


if _IMPORT_ERROR is None:
    # the tile sizes as the kernels see them (a jit function reads only constexpr globals)
    _BK, _BM, _BN, _SUB_M = gl.constexpr(BK), gl.constexpr(BM), gl.constexpr(BN), gl.constexpr(SUB_M)

    @gluon.jit
    def _max_combine(x, y):
        return gl.maximum(x, y)

    @gluon.jit
    def _add_combine(x, y):
        return x + y

    @gluon.jit
    def _group_ends(offs_ptr, E, EP: gl.constexpr, LIMIT, SHIFT: gl.constexpr, L: gl.constexpr):
        """`triton_common.group_ends`: lane i holds group end i - SHIFT, clamped into [0, LIMIT]
        and raised to the running maximum (malformed offs stay in bounds), 0 past E and before 0."""
        i = gl.arange(0, EP, layout=L)
        raw = gl.load(offs_ptr + i - SHIFT, mask=(i >= SHIFT) & (i < E), other=0)
        ends = gl.associative_scan(gl.minimum(gl.maximum(raw, 0), LIMIT), 0, _max_combine)
        return gl.where(i < E, ends, 0)

    @gluon.jit
    def _lane(v, g, L: gl.constexpr):
        """v[g] of a one-lane-per-group table."""
        i = gl.arange(0, v.shape[0], layout=L)
        return gl.sum(gl.where(i == g, v, 0), axis=0)

    @gluon.jit
    def _tiles(offs_ptr, R, N, C, E, EP: gl.constexpr, WGRAD: gl.constexpr, L: gl.constexpr):
        """Each group's start and end (rows of a in 2d-3d, tokens in 2d-2d) and, in 2d-3d, its end
        in row tiles, one lane per group, in the calling partition's layout L (partitions cannot
        hand each other tensors); and the number of output tiles."""
        limit = C if WGRAD else R
        ends = _group_ends(offs_ptr, E, EP, limit, 0, L)
        starts = _group_ends(offs_ptr, E, EP, limit, 1, L)
        tile_ends = gl.associative_scan((ends - starts + _BM - 1) // _BM, 0, _add_combine)
        if WGRAD:  # every group's whole [R, N] block
            count = E * gl.cdiv(R, _BM) * gl.cdiv(N, _BN)
        else:
            count = gl.max(tile_ends, axis=0) * gl.cdiv(N, _BN)
        return starts, ends, tile_ends, count

    @gluon.jit
    def _tile(t, starts, ends, tile_ends, R, N, C, E, WGRAD: gl.constexpr, BLOCKWISE: gl.constexpr,
              L: gl.constexpr):
        """Output tile t, as the `tl` kernels count them -> (group e, first row r0, rows stored below
        row_end, first column n0, first contraction index c0, the group's end, contraction steps,
        whether the group is readable).
        2d-3d: row tile t // n_tiles, group after group (a group spans cdiv(size, BM) row tiles),
        column tile t % n_tiles; the whole K.
        2d-2d: group t // (k_tiles * n_tiles), then row tile, then column tile; the group's tokens,
        none where the `tl` kernel cannot read the group (its block is then NaN)."""
        n_tiles = gl.cdiv(N, _BN)
        if WGRAD:
            per_group = gl.cdiv(R, _BM) * n_tiles
            e = t // per_group
            start = _lane(starts, e, L)
            end = _lane(ends, e, L)
            r0 = (t % per_group) // n_tiles * _BM
            ALIGN: gl.constexpr = 128 if BLOCKWISE else 16
            readable = ((start % ALIGN == 0) & (end % ALIGN == 0)) | (start == end)
            steps = gl.where(readable, (end - start + _BK - 1) // _BK, 0)
            row_end = R
            c0 = start
            c_end = end
        else:
            i = gl.arange(0, starts.shape[0], layout=L)
            row_tile = t // n_tiles
            e = gl.sum(((tile_ends <= row_tile) & (i < E)).to(gl.int32), axis=0)
            start = _lane(starts, e, L)
            row_end = _lane(ends, e, L)
            r0 = start + (row_tile - _lane(tile_ends, e, L) + (row_end - start + _BM - 1) // _BM) * _BM
            c0 = 0
            c_end = C
            steps = gl.cdiv(C, _BK)
            readable = True
        return e, r0, row_end, (t % n_tiles) * _BN, c0, c_end, steps, readable

    @gluon.jit
    def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, offs_ptr, R, N, C, E,
                  SIDE: gl.constexpr, EP: gl.constexpr, WGRAD: gl.constexpr, BLOCKWISE: gl.constexpr,
                  STAGES: gl.constexpr, L1: gl.constexpr):
        """Consumer SIDE's loads: for each of its tiles, every contraction step's A rows [BM, BK]
        (two [64, BK] boxes) and B rows [BN, BK] into the next stage of its ring, once it is free."""
        STEP_BYTES: gl.constexpr = (_BM + _BN) * _BK
        starts, ends, tile_ends, count = _tiles(offs_ptr, R, N, C, E, EP, WGRAD, L1)
        P = gl.num_programs(0)
        cnt = 0
        for t in range(gl.program_id(0) + SIDE * P, count, 2 * P):
            e, r0, row_end, n0, c0, c_end, steps, readable = _tile(t, starts, ends, tile_ends, R, N, C, E, WGRAD,
                                                                   BLOCKWISE, L1)
            b_row = n0 if WGRAD else e * N + n0
            for k in range(steps):
                s = cnt % STAGES
                # a fresh barrier counts as having completed the phase before its first: the
                # first pass over the ring does not wait
                mbarrier.wait(empty.index(s), ((cnt // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, STEP_BYTES)
                tma.async_copy_global_to_shared(a_desc, [r0, c0 + k * _BK], bar, a_ring.index(2 * s))
                tma.async_copy_global_to_shared(a_desc, [r0 + _SUB_M, c0 + k * _BK], bar, a_ring.index(2 * s + 1))
                tma.async_copy_global_to_shared(b_desc, [b_row, c0 + k * _BK], bar, b_ring.index(s))
                cnt += 1

    @gluon.jit
    def _zero_from(tile, valid, L: gl.constexpr):
        """Zero the contraction columns from `valid` on of a [rows, BK] byte tile in shared memory
        (tokens of the next group, in a 2d-2d group's last step)."""
        view = tile._reinterpret(gl.uint8, tile.shape, tile.layout)
        x = view.load(L)
        cols = gl.arange(0, _BK, layout=gl.SliceLayout(0, L))
        view.store(gl.where(gl.expand_dims(cols < valid, 0), x, gl.zeros_like(x)))

    @gluon.jit
    def _step_scales(e, r0, row_end, n0, kt, sa_ptr, sb_ptr, N, s_sar, s_sak, s_sbe, s_sbk, s_sbn,
                     WGRAD: gl.constexpr, MMA: gl.constexpr, COLS: gl.constexpr):
        """The blockwise scales of contraction tile kt, as the `tl` kernel loads them: per row of
        each sub-block (0 past row_end); per column (2d-2d, 0 past N), one per thread in layout
        COLS, which `_column_scales` spreads over the accumulator's columns only when they are
        needed (32 registers per thread there); or one per 128-column block (2d-3d, which a tile
        never spans two of)."""
        rows = r0 + gl.arange(0, _SUB_M, layout=gl.SliceLayout(1, MMA))
        sa0 = gl.load(sa_ptr + rows * s_sar + kt * s_sak, mask=rows < row_end, other=0.0)
        rows = rows + _SUB_M
        sa1 = gl.load(sa_ptr + rows * s_sar + kt * s_sak, mask=rows < row_end, other=0.0)
        if WGRAD:
            cols = n0 + gl.arange(0, _BN, layout=COLS)
            sb = gl.load(sb_ptr + kt * s_sbk + cols * s_sbn, mask=cols < N, other=0.0)
        else:
            sb = gl.load(sb_ptr + e * s_sbe + kt * s_sbk + (n0 // 128) * s_sbn)
        return gl.expand_dims(sa0, 1), gl.expand_dims(sa1, 1), sb

    @gluon.jit
    def _column_scales(sb, WGRAD: gl.constexpr, MMA: gl.constexpr):
        """`_step_scales`' column scales, broadcastable against the accumulator."""
        if WGRAD:
            sb = gl.expand_dims(gl.convert_layout(sb, gl.SliceLayout(0, MMA)), 0)
        return sb

    @gluon.jit
    def _epilogue_block(acc, row0, n0, row_end, e, steps, readable, sa_ptr, sb_ptr, out_ptr, R, N,
                        WGRAD: gl.constexpr, BLOCKWISE: gl.constexpr, MMA: gl.constexpr, STORE: gl.constexpr):
        """out rows row0:row0 + 64 (of out[e] in 2d-2d), columns n0:n0 + 128 = bf16 of the sub-block,
        rows below row_end, columns below N. Rowwise: acc * sa[rows] * sb[e, cols], the scales in
        the accumulator's layout, in the `tl` kernel's order. A 2d-2d tile without steps holds its
        group's fill, unscaled (0, or NaN where unreadable). The bf16 tile moved to
        16-byte-per-thread rows for the stores."""
        rows = row0 + gl.arange(0, _SUB_M, layout=gl.SliceLayout(1, MMA))
        cols = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(0, MMA))
        y = acc
        if not BLOCKWISE:
            sa_row0 = e * R if WGRAD else 0  # sa [G * K] in 2d-2d, [M] in 2d-3d
            sa = gl.load(sa_ptr + sa_row0 + rows, mask=rows < row_end, other=0.0)
            sb = gl.load(sb_ptr + e * N + cols, mask=cols < N, other=0.0)
            y = acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
        if WGRAD:
            if steps == 0:
                y = gl.zeros([_SUB_M, _BN], gl.float32, MMA) + gl.where(readable, 0.0, float("nan"))
        y = gl.convert_layout(y.to(gl.bfloat16), STORE)
        rows = row0 + gl.arange(0, _SUB_M, layout=gl.SliceLayout(1, STORE))
        cols = n0 + gl.arange(0, _BN, layout=gl.SliceLayout(0, STORE))
        out_row0 = e.to(gl.int64) * R if WGRAD else 0
        ptr = out_ptr + gl.expand_dims((out_row0 + rows.to(gl.int64)) * N, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(rows < row_end, 1) & gl.expand_dims(cols < N, 0)
        gl.store(ptr, y, mask=mask)

    @gluon.jit
    def _consumer(a_ring, b_ring, ready, empty, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, R, N, C, E,
                  s_sar, s_sak, s_sbe, s_sbk, s_sbn, SIDE: gl.constexpr, EP: gl.constexpr, WGRAD: gl.constexpr,
                  BLOCKWISE: gl.constexpr, STAGES: gl.constexpr, ORDERED: gl.constexpr, L4: gl.constexpr):
        """Consumer SIDE (one warpgroup): its tiles' main loops, one 128-deep step at a time, each
        sub-block's chain of wgmmas waited for and added in fp32 (blockwise: scaled first); then
        the tile's epilogue."""
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
        STORE: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        BYTES: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        COLS: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        starts, ends, tile_ends, count = _tiles(offs_ptr, R, N, C, E, EP, WGRAD, L4)
        P = gl.num_programs(0)
        cnt = 0
        turn = 0
        for t in range(gl.program_id(0) + SIDE * P, count, 2 * P):
            e, r0, row_end, n0, c0, c_end, steps, readable = _tile(t, starts, ends, tile_ends, R, N, C, E, WGRAD,
                                                                   BLOCKWISE, L4)
            if ORDERED:  # consumer 0 goes first: its first wait passes on the fresh barrier
                mbarrier.wait(order.index(SIDE), (turn & 1) ^ (1 - SIDE))
            acc0 = gl.zeros([_SUB_M, _BN], gl.float32, MMA)
            acc1 = gl.zeros([_SUB_M, _BN], gl.float32, MMA)
            part = gl.zeros([_SUB_M, _BN], gl.float32, MMA)
            for k in range(steps):
                s = cnt % STAGES
                mbarrier.wait(ready.index(s), (cnt // STAGES) & 1)
                if WGRAD and not BLOCKWISE:  # blockwise groups are whole 128-token tiles
                    valid = c_end - (c0 + k * _BK)
                    if valid < _BK:  # every warp's zeros land before any warp's wgmma reads the tile
                        _zero_from(a_ring.index(2 * s), valid, BYTES)
                        _zero_from(a_ring.index(2 * s + 1), valid, BYTES)
                        _zero_from(b_ring.index(s), valid, BYTES)
                        fence_async_shared()
                        gl.thread_barrier()
                b = b_ring.index(s).permute((1, 0))
                part = warpgroup_mma(a_ring.index(2 * s), b, part, use_acc=False, is_async=True)
                if BLOCKWISE:  # the scale loads run under the chain
                    sa0, sa1, sb = _step_scales(e, r0, row_end, n0, c0 // _BK + k, sa_ptr, sb_ptr, N,
                                                s_sar, s_sak, s_sbe, s_sbk, s_sbn, WGRAD, MMA, COLS)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                if BLOCKWISE:
                    sb = _column_scales(sb, WGRAD, MMA)
                    acc0 = acc0 + part * sa0 * sb
                else:
                    acc0 = acc0 + part
                part = warpgroup_mma(a_ring.index(2 * s + 1), b, part, use_acc=False, is_async=True)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                if BLOCKWISE:
                    acc1 = acc1 + part * sa1 * sb
                else:
                    acc1 = acc1 + part
                mbarrier.arrive(empty.index(s), count=1)
                cnt += 1
            if ORDERED:
                mbarrier.arrive(order.index(1 - SIDE), count=1)
            turn += 1
            _epilogue_block(acc0, r0, n0, row_end, e, steps, readable, sa_ptr, sb_ptr, out_ptr, R, N,
                            WGRAD, BLOCKWISE, MMA, STORE)
            _epilogue_block(acc1, r0 + _SUB_M, n0, row_end, e, steps, readable, sa_ptr, sb_ptr, out_ptr, R, N,
                            WGRAD, BLOCKWISE, MMA, STORE)

    # The sizes stay specialized: the epilogue's bf16 stores are plain stores, not TMA, and only
    # N known a multiple of 16 (out's row stride) lets each thread's 8 columns go out as one 16-byte
    # store; without it every element is its own 2-byte store, 8 times the store instructions and
    # partial-sector writes to L2, which the 2d-2d layout (a 128 x 128 output tile per few contraction
    # steps) pays the most. The blockwise scale strides only index per-thread scalar loads: plain ints.
    @gluon.jit(do_not_specialize=["s_sar", "s_sak", "s_sbe", "s_sbk", "s_sbn"])
    def _gemm_kernel(a_desc, b_desc, sa_ptr, sb_ptr, out_ptr, offs_ptr, R, N, C, E,
                     s_sar, s_sak, s_sbe, s_sbk, s_sbn,
                     EP: gl.constexpr, WGRAD: gl.constexpr, BLOCKWISE: gl.constexpr, STAGES: gl.constexpr,
                     ORDERED: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
        """Persistent: program p takes output tiles p, p + P, ...; consumer c of them every other
        one from its c-th. R output rows (M, or K per group), N columns, C the contraction (K, or
        T tokens), E groups. Launched with 4 warps (consumer 0); the partitions add 4 + 1 + 1."""
        # the group table: every warp holds all EP (>= 32) lanes, so that a tile's lookups reduce
        # within a warp (shuffles) rather than across the partition's warps (shared memory, barriers)
        L1: gl.constexpr = gl.BlockedLayout([EP // 32], [32], [1], [0])
        L4: gl.constexpr = gl.BlockedLayout([EP // 32], [32], [4], [0])
        a0 = gl.allocate_shared_memory(a_desc.dtype, [STAGES * 2] + a_desc.block_type.shape, a_desc.layout)
        b0 = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        a1 = gl.allocate_shared_memory(a_desc.dtype, [STAGES * 2] + a_desc.block_type.shape, a_desc.layout)
        b1 = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        ready0, empty0, ready1, empty1 = _barriers(STAGES), _barriers(STAGES), _barriers(STAGES), _barriers(STAGES)
        order = _barriers(2)
        gl.warp_specialize([
            (_consumer, (a0, b0, ready0, empty0, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, R, N, C, E,
                         s_sar, s_sak, s_sbe, s_sbk, s_sbn, 0, EP, WGRAD, BLOCKWISE, STAGES, ORDERED, L4)),
            (_consumer, (a1, b1, ready1, empty1, order, sa_ptr, sb_ptr, out_ptr, offs_ptr, R, N, C, E,
                         s_sar, s_sak, s_sbe, s_sbk, s_sbn, 1, EP, WGRAD, BLOCKWISE, STAGES, ORDERED, L4)),
            (_producer, (a_desc, b_desc, a0, b0, ready0, empty0, offs_ptr, R, N, C, E, 0, EP, WGRAD, BLOCKWISE,
                         STAGES, L1)),
            (_producer, (a_desc, b_desc, a1, b1, ready1, empty1, offs_ptr, R, N, C, E, 1, EP, WGRAD, BLOCKWISE,
                         STAGES, L1)),
        ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])

    @gluon.jit
    def _barriers(n: gl.constexpr):
        """n mbarriers of one arrival each, initialised."""
        bars = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(n):
            mbarrier.init(bars.index(i), count=1)
        return bars


@functools.cache
def _layouts():
    """The operand tiles' shared layouts: byte rows of BK = 128 (the 128-byte swizzle)."""
    return (gl.NVMMASharedLayout.get_default_for([SUB_M, BK], gl.float8e4nv),
            gl.NVMMASharedLayout.get_default_for([BN, BK], gl.float8e4nv))


def scaled_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """`triton_fp8_gemm.scaled_grouped_mm` on a Hopper GPU, bit for bit, both layouts:
      2d-3d  a [M, K], b [E, K, N], scale_a [M], scale_b [E, N], offs [E] group ends along M
             -> bf16 [M, N], rows past offs[-1] unwritten;
      2d-2d  a [K, T], b [T, N], scale_a [G * K], scale_b [G * N], offs [G] group ends along T
             -> bf16 [G, K, N].
    Layouts the kernel's 2-D view of b cannot take (2d-3d experts not one stride apart of N rows)
    and empty contractions go to the `tl` kernel."""
    return _grouped_mm(a, b, scale_a, scale_b, offs, DEFAULT)


def blockwise_grouped_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """`triton_fp8_gemm.blockwise_grouped_mm` on a Hopper GPU, bit for bit: as `scaled_grouped_mm`
    with scales per 128 along the contraction (any strides): 2d-3d scale_a [M, K / 128],
    scale_b [E, K / 128, N / 128]; 2d-2d scale_a [T / 128, K], scale_b [T / 128, N]."""
    return _grouped_mm(a, b, scale_a, scale_b, offs, DEFAULT, blockwise=True)


def _grouped_mm(a, b, scale_a, scale_b, offs, cfg: Config, blockwise: bool = False,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """`scaled_grouped_mm` (or `blockwise_grouped_mm`) with config `cfg`, into `out` (bf16, the
    output's shape, contiguous) if given: the tests poison it (2d-3d rows past offs[-1] must keep
    what they held)."""
    out_shape = tfg._check_shapes(a, b, scale_a, scale_b, offs, blockwise)
    if not a.is_cuda or _IMPORT_ERROR is not None:
        raise RuntimeError(f"the Gluon FP8 GEMM runs on a CUDA Hopper GPU only (gluon: {_IMPORT_ERROR!r})")
    wgrad = b.dim() == 2
    R, C = a.shape
    if wgrad:  # b [T, N] as [N, T] rows
        E, N = offs.numel(), b.shape[1]
        b_rows = b.t()
        one_view = True
    else:  # b [E, K, N] as [E * N, K] rows: a tile's rows past its expert's N are the next expert's (or
        # TMA's zeros past the last), and only feed output columns that are not stored
        E, N = b.shape[0], b.shape[2]
        b_ENK = b.transpose(-2, -1)
        one_view = b_ENK.stride(0) == N * b_ENK.stride(1)
        b_rows = b_ENK.as_strided((E * N, C), (b_ENK.stride(1), 1)) if one_view else None
    if C == 0 or E == 0 or not one_view:
        if out is not None:
            raise ValueError("out= takes the Gluon path only; this call goes to the tl kernel")
        return (tfg.blockwise_grouped_mm if blockwise else tfg.scaled_grouped_mm)(a, b, scale_a, scale_b, offs)
    if out is None:
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=a.device)
    elif out.shape != out_shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 {list(out_shape)}, got {out.dtype} {tuple(out.shape)}")
    if out.numel() == 0:
        return out
    if not blockwise:
        scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
        strides = (0,) * 5
    elif wgrad:  # sa [T / 128, K]: (row, token tile); sb [T / 128, N]: (no expert, token tile, column)
        strides = (scale_a.stride(1), scale_a.stride(0), 0, *scale_b.stride())
    else:  # sa [M, K / 128], sb [E, K / 128, N / 128]
        strides = (*scale_a.stride(), *scale_b.stride())
    B = b_rows.shape[0]

    def prepare():
        a_layout, b_layout = _layouts()
        a_desc = TensorDescriptor(a, [R, C], [a.stride(0), 1], [SUB_M, BK], a_layout)
        b_desc = TensorDescriptor(b_rows, [B, C], [b_rows.stride(0), 1], [BN, BK], b_layout)
        consts = dict(EP=max(tc.pow2(E), 32), WGRAD=wgrad, BLOCKWISE=blockwise, STAGES=cfg.STAGES,
                      ORDERED=cfg.ORDERED, CONSUMER_REGS=cfg.CONSUMER_REGS, PRODUCER_REGS=cfg.PRODUCER_REGS,
                      num_warps=4, maxnreg=MAXNREG)
        args = (a_desc, b_desc, scale_a, scale_b, out, offs, R, N, C, E, *strides)
        return _gemm_kernel, (tc.sms(a.device),), args, consts

    # bound once per key (kernels/launch.py), which fixes every launch argument but the tensors,
    # the descriptors' shapes and strides included: Triton's own launch binds and checks each
    # argument and builds both descriptors on every call, more host time than a small GEMM's GPU time
    key = (_gemm_kernel, cfg, blockwise, R, N, C, E, B, a.stride(0), b_rows.stride(0), *strides)
    launch_keyed(key, (a, b_rows, scale_a, scale_b, out, offs), prepare)
    return out
