"""Triton building blocks shared by the package's kernels: float8/e8m0 encoding bit-exact with
`reference.py` (in integer math where the interpreter's casts differ), bf16 loads and stores,
token-group tables held in registers, and host-side helpers for launches."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def group_ends(ends_ptr, G: tl.constexpr, GP: tl.constexpr, LIMIT, SHIFT: tl.constexpr):
    """The G group ends (lane i holds end i - SHIFT; 0 past G and before 0) as the kernels use
    them: each clamped into [0, LIMIT] and raised to the running maximum, so that groups are never
    negative and never pass the rows there are. `offs` cannot be checked on the host without a
    sync, and in compiled graphs not at all: this keeps every read and write in bounds whatever
    it holds (valid `offs` are unchanged)."""
    i = tl.arange(0, GP)
    raw = tl.load(ends_ptr + i - SHIFT, mask=(i >= SHIFT) & (i < G), other=0).to(tl.int32)
    ends = tl.associative_scan(tl.minimum(tl.maximum(raw, 0), LIMIT), 0, _max)
    return tl.where(i < G, ends, 0)


@triton.jit
def group_table(ends_ptr, G: tl.constexpr, GP: tl.constexpr, UNIT: tl.constexpr, LIMIT):
    """Group table in registers from the G group ends (GP = next power of two lanes), made safe
    by `group_ends` for LIMIT rows: each group's start and end row and its end in units, a group
    spanning ceil(size / UNIT) units (32-row blocks, or padded row chunks). Computed by every
    program: cheaper than host ops per call."""
    end = group_ends(ends_ptr, G, GP, LIMIT, 0)
    start = group_ends(ends_ptr, G, GP, LIMIT, 1)
    return start, end, tl.cumsum((end - start + UNIT - 1) // UNIT, 0)


@triton.jit
def group_of(unit_end, G: tl.constexpr, x):
    """The group holding unit x, for a 1-D block x (G past the last group)."""
    i = tl.arange(0, unit_end.shape[0])
    return tl.sum(((unit_end[None, :] <= x[:, None]) & (i < G)[None, :]).to(tl.int32), axis=1)


@triton.jit
def lane_value(v, g):
    """v[g] for a 1-D index block g (v's lanes hold one value per group)."""
    i = tl.arange(0, v.shape[0])
    return tl.sum(tl.where(i[None, :] == g[:, None], v[None, :], 0), axis=1)


@triton.jit
def padded_starts(count, PAD: tl.constexpr):
    """Exclusive running sum of per-group lane counts, each rounded up to a multiple of PAD: where
    each group starts in a layout that pads every group."""
    padded = (count + PAD - 1) // PAD * PAD
    return tl.cumsum(padded, 0) - padded


@triton.jit
def scale_exponent(amax, RCEIL: tl.constexpr):
    """`reference.scale_exponent` of float32 maxima in which NaN already counts as inf."""
    bits = amax.to(tl.int32, bitcast=True)
    biased = ((bits >> 23) & 0xFF) - 8
    if RCEIL:
        biased += ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    biased = tl.minimum(tl.maximum(biased, 0), 246)  # reference.MAX_FINITE_BYTE
    return tl.where(amax == float("inf"), 255, biased)


@triton.jit
def inv_scale(biased):
    """`reference.inv_scale`: 2^(127 - byte) as float32, 1 for NaN blocks."""
    return tl.where(biased == 255, 127 << 23, (254 - biased) << 23).to(tl.float32, bitcast=True)


@triton.jit
def widen(v):
    """Loaded bf16 or fp32 values as fp32. bf16 bits (int16 pointers, see `as_bits`) widen by a
    shift: the interpreter flushes subnormals in a bf16 -> fp32 cast."""
    if v.dtype == tl.int16:
        out = (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        out = v.to(tl.float32)
    return out


@triton.jit
def load_f32(ptr, mask):
    """Load bf16 (or its int16 bits) or fp32 as fp32."""
    return widen(tl.load(ptr, mask=mask, other=0))


@triton.jit
def store_f32(ptr, y, mask, OUT_BF16: tl.constexpr, HW_CVT: tl.constexpr):
    """Store fp32 as fp32, or as bf16 rounded to nearest even: by the hardware cast (to a bf16
    pointer or to int16 bits) or in integer math (int16 bits, for the interpreter; see `as_bits`)."""
    if OUT_BF16:
        tile = bf16_tile(y, HW_CVT)
        if HW_CVT:
            if ptr.dtype.element_ty == tl.int16:
                tile = tile.to(tl.int16, bitcast=True)
        tl.store(ptr, tile, mask=mask)
    else:
        tl.store(ptr, y, mask=mask)


@triton.jit
def bf16_tile(y, HW_CVT: tl.constexpr):
    """fp32 y rounded to nearest even: bf16 by the hardware cast, or its int16 bits in integer
    math (the interpreter, see `bf16_bits`); what `store_f32` and tensor-descriptor stores write."""
    if HW_CVT:
        tile = y.to(tl.bfloat16)
    else:
        tile = bf16_bits(y).to(tl.int16)
    return tile


@triton.jit
def bf16_bits(y):
    """The bf16 bit pattern (in int32) of fp32 y rounded to nearest even, NaN kept, in integer
    math: the interpreter flushes subnormals in its casts."""
    bits = y.to(tl.int32, bitcast=True)
    u = bits & 0x7FFFFFFF
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where(u > 0x7F800000, 0x7FC0, r) | ((bits >> 16) & 0x8000)


@triton.jit
def e4m3_encode(q, sign):
    """float32 |q| <= 448 (or NaN) -> float8_e4m3fn byte, round-to-nearest-even, in integer math.
    For the interpreter, whose float8 cast rounds wrongly; GPUs use the hardware cast."""
    u = q.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    e32 = u >> 23
    # normal e4m3 (>= 2^-6): round away the low 20 mantissa bits, carrying into the exponent
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - (120 << 3)
    # subnormal e4m3: round (1.m * 2^23) / 2^s to an integer, s = 141 - e32
    mfull = (u & 0x7FFFFF) | 0x800000
    s = tl.minimum(141 - e32, 25)
    s = tl.maximum(s, 1)
    half = 1 << (s - 1)
    qi = mfull >> s
    rem = mfull - (qi << s)
    sub = qi + ((rem > half) | ((rem == half) & ((qi & 1) == 1))).to(tl.int32)
    code = tl.where(e32 >= 121, normal, sub)
    code = tl.where(q != q, 0x7F, code)
    return (code | (sign << 7)).to(tl.uint8)


@triton.jit
def scaled_to_e4m3(x, inv, HW_CVT: tl.constexpr):
    """float8_e4m3fn bytes (uint8) of saturate(x * inv); NaN stays NaN."""
    q = x * inv
    if HW_CVT:
        # Triton casts with cvt.rn.satfinite for sm_90 and sm_100, which saturates to +-448 and
        # keeps NaN (tests/kernels/test_triton_mx.py reads the PTX): a clamp here would add
        # instructions per element in kernels bound by instruction issue as much as by memory
        q8 = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        q = tl.where(q != q, q, tl.minimum(tl.maximum(q, -448.0), 448.0))
        q8 = e4m3_encode(q, (x.to(tl.int32, bitcast=True) >> 31) & 1)
    return q8


@triton.jit
def block_amax(x, axis: tl.constexpr):
    """max |x| along `axis` of float32 x, inf where a NaN is met. Taken on the bits, where every
    NaN is above inf: two instructions per element instead of a float max's three (NaN test,
    select, max), and the interpreter's own integer max (a NaN-propagating float max needs a
    custom combine, which the interpreter runs per element in Python)."""
    amax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis)
    return tl.minimum(amax, 0x7F800000).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_decode(byte, HW_CVT: tl.constexpr):
    """float8_e4m3fn byte (uint8) -> float32 (in integer math where the hardware cast is missing)."""
    if HW_CVT:
        out = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        code = byte.to(tl.int32)
        e4 = (code >> 3) & 0xF
        m3 = code & 7
        mag = tl.where(e4 > 0, ((e4 + 120) << 23) | (m3 << 20), 0).to(tl.float32, bitcast=True)
        mag = tl.where(e4 > 0, mag, m3.to(tl.float32) * 0.001953125)  # subnormal: m * 2^-9
        mag = tl.where((code & 0x7F) == 0x7F, float("nan"), mag)
        # OR in the sign bit: Triton negates as 0 - x, which loses the sign of zero
        out = (mag.to(tl.int32, bitcast=True) | ((code & 0x80) << 24)).to(tl.float32, bitcast=True)
    return out


@triton.jit
def e8m0_to_float(biased):
    bits = tl.where(biased > 0, biased << 23, 1 << 22)  # byte 0 is the subnormal 2^-127
    return tl.where(biased == 255, 0x7FC00000, bits).to(tl.float32, bitcast=True)


# --------------------------------------------------------------------------------------------
# Host helpers

# triton.cdiv and triton.next_power_of_2 are constexpr functions, slow to call from host code;
# compiled graphs call the kernels' wrappers per operand per step
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    """The next power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def as_bits(t: torch.Tensor, on_gpu: bool = False) -> torch.Tensor:
    """bf16 tensors travel to the interpreter as int16 bits (see `load_f32`, `store_f32`), and to
    GPUs where `on_gpu`; otherwise GPUs take them as they are: a dtype view per operand per call is
    host time that small MoE layers, whose quantizers take little GPU time, do not have (see
    docs/performance.md, "Host time per op call")."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 and (on_gpu or not t.is_cuda) else t


@functools.cache
def sms(device: torch.device) -> int:
    """The SMs that persistent kernels size their grids by, or a few in the interpreter. Cached:
    the device's properties are a call per launch otherwise."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 3
