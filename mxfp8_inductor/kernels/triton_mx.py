"""Triton MXFP8 quantizers for CUDA tensors (`kernels.mx.implementation` on GPUs), bit-exact with
`reference.py` and offering the same functions: host wrappers that size, key and launch the
device kernels of `triton_mx_quant`, with scales in the layouts of `triton_mx_scale_layout`.
No wrapper reads `offs` on the host (no host synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..eligibility import check_offs_form
from ..options import check_choice
from . import reference as ref
from . import triton_common as tc
from .launch import _MAX_ENTRIES, launch, launch_keyed
from .triton_mx_quant import (
    DEQUANTIZED,
    GROUPS_DEQUANTIZED,
    GROUPS_PADDED_BLOCKED_SCALES,
    GROUPS_PLAIN_SCALES,
    PLAIN_SCALES,
    ROWS_BLOCKED_SCALES,
    Layout,
    dequant_kernel,
    mx_quant_kernel,
)
from .triton_mx_scale_layout import BLOCKED_COL, PLAIN, one_group, to_blocked, to_blocked_groups

# the quantizer API this module shares with `reference` (`mx.implementation` returns either)
__all__ = [
    "dequantize", "quantize", "quantize_dequantize", "quantize_dequantize_groups", "quantize_groups",
    "quantize_groups_blocked", "quantize_rows_blocked", "quantize_weight_blocked", "to_blocked", "to_blocked_groups",
]

_BLOCK_C = 64


class Tile(NamedTuple):
    """How one program of `mx_quant_kernel` covers its input."""

    blocks: int  # 32-blocks along r per program
    columns: int  # columns per tile
    tiles: int  # column tiles per program
    warps: int
    band: int  # 0: a 2-D grid, row strips fastest; n: a 1-D grid walking bands of n row strips


# The tile of each launch, keyed by where the 32-blocks run: along the contiguous dim ("rows"),
# across rows ("cols"), across rows within one token group ("one_group": no group lookup to share
# across tiles) or several ("groups"), and across rows into a transposed output ("transposing":
# the native operands quantized along N or along the tokens). Chosen by
# `benchmarks/bench_quantize.py --sweep` (see docs/performance.md). One warp keeps a
# block's maximum and the byte transpose inside the warp: Triton splits a block's 32 rows across
# the warps of larger tiles, through shared memory and a barrier. Bands of one row strip keep the
# per-group quantize-dequantize's group table in cache.
TILES = {"rows": Tile(8, 16, 1, 4, 0), "cols": Tile(1, 128, 1, 2, 0), "one_group": Tile(1, 128, 1, 2, 0),
         "groups": Tile(1, 64, 1, 1, 1), "transposing": Tile(2, 64, 1, 1, 0)}


class View3(NamedTuple):
    """A tensor seen as X[b, r, c]: the tensor itself (the kernels' pointer), and the shape and
    strides of the 3-D view, computed rather than made (a torch view op costs host time, and
    compiled MoE blocks call the quantizers per operand per step)."""

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


def _tile(r_stride: int, groups: int, y_r_stride: int | None = None) -> Tile:
    """The `TILES` entry of a launch: blocks along r of stride `r_stride` in x and `y_r_stride`
    in y (default: x's), in `groups` token groups (0: ungrouped)."""
    if r_stride == 1:
        return Tile(*TILES["rows"])
    if y_r_stride == 1:
        return Tile(*TILES["transposing"])
    return Tile(*TILES["cols" if not groups else "groups" if groups > 1 else "one_group"])


def _bf16_as_bits(layout: Layout) -> bool:
    """Whether bf16 tensors travel as int16 bits on GPUs too: the grouped quantize-dequantize runs
    faster with them than with bf16 pointers (benchmarks/bench_quantize.py)."""
    return layout.GROUPED and layout.DEQUANT


def _launch_quant(
    x3: View3, y3: View3, rounding: str, layout: Layout, *, s3: View3 | None = None,
    r_ends: torch.Tensor | None = None, padded_ends: torch.Tensor | None = None,
    s_ends: torch.Tensor | None = None, Hp: int = 0, Wp: int = 0, scale_buf: torch.Tensor | None = None,
) -> Callable[..., None] | None:
    """One `mx_quant_kernel` launch writing `layout`, bound once per shape and layout
    (`launch_keyed`), which it returns (None for an empty x: nothing to launch).
    `r_ends`: token group ends along r (GROUPED); `padded_ends` receives the padded group ends
    (PAD_Y); `s_ends`: group ends of BLOCKED_ROW scales along c (default: one group; BLOCKED_COL
    scales take `r_ends`)."""
    B, R, C = x3.shape
    if B * R * C == 0:
        return None
    tile = _tile(x3.strides[1], r_ends.numel() if layout.GROUPED else 0, y3.strides[1])
    bits = _bf16_as_bits(layout)
    tensors = (tc.as_bits(x3.t, bits), tc.as_bits(y3.t, bits), scale_buf, r_ends, padded_ends, s_ends)
    key = (mx_quant_kernel, x3.shape, x3.strides, y3.strides, s3.strides if s3 is not None else None, rounding,
           layout, Hp, Wp, tile)
    return launch_keyed(key, tensors, lambda: _quant_launch(tensors, x3, y3, s3, rounding, layout, Hp, Wp, tile))


_TAIL_CHUNKS = 16


def _quant_launch(tensors, x3, y3, s3, rounding, layout, Hp, Wp, tile) -> tuple:
    """(kernel, grid, args, kwargs) of the launch `_launch_quant` describes."""
    check_choice("rounding", rounding)
    x, y, scale_buf, r_ends, padded_ends, s_ends = tensors
    B, R, C = x3.shape
    grouped = layout.GROUPED
    if not grouped and R % ref.BLOCK:
        raise ValueError(f"block dim of size {R} is not a multiple of {ref.BLOCK}")
    R_GROUPS = r_ends.numel() if grouped else 1
    NB, BLOCK_C, citers, warps, band = tile
    n_main = tc.cdiv(ref.group_scale_rows(R, R_GROUPS) if grouped else R // 32, NB)
    # extra programs zero the rows past the last group end, which the host does not read: enough
    # for all of y's rows at up to _TAIL_CHUNKS chunks of NB*32 rows each, each looping only over
    # the rows there are: a few programs instead of one per chunk, which cost whole waves of
    # programs on large inputs
    R_y = y3.shape[1]  # y's rows: R, or every group padded (PAD_Y)
    n_tail = tc.cdiv(R_y, 32 * NB * _TAIL_CHUNKS) if grouped else 0
    if s_ends is None and layout.SCALE_MODE != PLAIN:  # BLOCKED_COL scales are grouped as the blocks are
        s_ends = r_ends if layout.SCALE_MODE == BLOCKED_COL else one_group(C, x.device)
    S_GROUPS = s_ends.numel() if s_ends is not None else 1
    n_r, n_c = n_main + n_tail, tc.cdiv(C, BLOCK_C * citers)
    grid = (n_r, n_c, B) if band == 0 else (n_r * n_c, 1, B)
    # pointers the kernel never reads in this mode get y, not device tensors made for the call
    args = (
        x, *x3.strides, y, *y3.strides, y if scale_buf is None else scale_buf,
        *(s3.strides if s3 is not None else (0, 0, 0)), R, C, n_main, n_r, R_y,
        r_ends if grouped else y, R_GROUPS, tc.pow2(R_GROUPS), y if padded_ends is None else padded_ends,
        y if s_ends is None else s_ends, S_GROUPS, tc.pow2(S_GROUPS), Hp, Wp,
    )
    consts = dict(
        RCEIL=rounding == "rceil", **layout._asdict(), OUT_BF16=y3.t.dtype == torch.bfloat16, HW_CVT=x.is_cuda,
        NB=NB, BLOCK_C=BLOCK_C, CITERS=citers, BAND=band, num_warps=warps,
    )
    return mx_quant_kernel, grid, args, consts


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
    _launch_quant(_view3(x, dim), _view3(data, dim), rounding, PLAIN_SCALES, s3=_view3(scales, dim),
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
    relaunch(tc.as_bits(x, bits), tc.as_bits(y, bits), None, offs, None, None)  # `_launch_quant`'s tensor order
    return y


def _plan(key: tuple, y: torch.Tensor, layout: Layout, relaunch: Callable[..., None] | None) -> torch.Tensor:
    if relaunch is not None:
        if len(_plans) >= _MAX_ENTRIES:
            _plans.clear()
        _plans[key] = (y.stride(), y.dtype, _bf16_as_bits(layout), relaunch)
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
    return _plan(key, y, DEQUANTIZED, _launch_quant(_view3(x, dim), _view3(y, dim), rounding, DEQUANTIZED))


def dequantize(
    data: torch.Tensor, scales: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton twin of `reference.dequantize`, into `out` (data's shape, `dtype`) if given."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dequantize writes bf16 or fp32, got {dtype}")
    dim = dim % data.dim()
    if out is not None and (out.shape != data.shape or out.dtype != dtype or out.device != data.device):
        raise ValueError(f"out must be {dtype} of shape {tuple(data.shape)} on {data.device}")
    y = torch.empty(data.shape, dtype=dtype, device=data.device) if out is None else out
    q3 = _view3(data.view(torch.uint8), dim)
    s3 = _view3(scales.view(torch.uint8), dim)
    y3 = _view3(y, dim)
    B, R, C = q3.shape
    launch(
        dequant_kernel, (R // 32, tc.cdiv(C, _BLOCK_C), B),
        q3.t, *q3.strides, s3.t, *s3.strides, tc.as_bits(y3.t), *y3.strides, C,
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
    _launch_quant(_view3(x_MK, 0), _view3(data, 0), rounding, GROUPS_PLAIN_SCALES, s3=_view3(scales, 0),
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
    layout = GROUPS_DEQUANTIZED
    return _plan(key, y, layout, _launch_quant(_view3(x_MK, 0), _view3(y, 0), rounding, layout, r_ends=offs))


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
    _launch_quant(_view3(x_MK, 1), _view3(data, 1), rounding, ROWS_BLOCKED_SCALES, s_ends=offs, Hp=0, Wp=Wp,
                  scale_buf=buf)
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
    _launch_quant(_view3(w_ENK, 2), _view3(data, 2), rounding, ROWS_BLOCKED_SCALES, Hp=Hp, Wp=Wp, scale_buf=buf)
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
    _launch_quant(_view3(x_MK, 0), _view3(data, 1), rounding, GROUPS_PADDED_BLOCKED_SCALES, r_ends=offs,
                  padded_ends=padded_offs, Hp=Hp, scale_buf=buf)
    return data.view(torch.float8_e4m3fn), buf.view(torch.float8_e8m0fnu), padded_offs

