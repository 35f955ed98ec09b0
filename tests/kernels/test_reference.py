"""Hand-computed checks of the pure-torch MXFP8 reference (DESIGN.md sections 3 and 4).

Every expected byte or value below is written literally or derived with simple arithmetic from the
definitions, never by calling the reference. Useful facts:
- 448 = 1.75 * 2^8. For amax = 1.m * 2^e: RCEIL byte = 127 + ceil(log2(amax / 448)) = 119 + e + (1.m > 1.75);
  FLOOR byte = 127 + floor(log2(amax)) - 8 = 119 + e.
- e4m3 bytes: sign | 4-bit exponent (bias 7) | 3-bit mantissa; 448 = 0x7E, 256 = 0x78, 384 = 0x7C,
  240 = 0x77, -320 = 0xFA, 0.125 = 0x20, -2^-6 = 0x88.
"""

import math

import pytest
import torch

from mxfp8_inductor import (
    dequantize,
    dequantize_groups,
    quantize,
    quantize_groups,
    to_blocked,
    to_blocked_groups,
)

ROUNDINGS = ["rceil", "floor"]
BF16_MAX = torch.finfo(torch.bfloat16).max


def u8(t):
    return t.view(torch.uint8)


def e8m0(values, shape=None):
    """uint8 values viewed as e8m0 scale bytes."""
    t = torch.tensor(values, dtype=torch.uint8)
    if shape is not None:
        t = t.reshape(shape)
    return t.view(torch.float8_e8m0fnu)


# ------------------------------------------------------------------------------------------------
# quantize / dequantize: special blocks


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_all_zero_block(rounding, dtype):
    # block 0 all zero, block 1 all ones: the zero block gets byte 0 (2^-127) and data 0
    x = torch.zeros(2, 64, dtype=dtype)
    x[:, 32:] = 1.0
    data, scales = quantize(x, rounding=rounding)
    assert scales.dtype == torch.float8_e8m0fnu and data.dtype == torch.float8_e4m3fn
    assert u8(scales).tolist() == [[0, 119], [0, 119]]
    assert (u8(data)[:, :32] == 0).all()
    # 1.0 with byte 119 (scale 2^-8) stores 256 = 0x78
    assert (u8(data)[:, 32:] == 0x78).all()
    out = dequantize(data, scales)
    assert out.dtype == torch.bfloat16
    assert (out[:, :32] == 0).all() and not out.isnan().any()
    assert (out[:, 32:] == 1).all()


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_block_gets_nan_scale(bad, rounding):
    # three blocks of 2.0; one element of the middle block is non-finite
    x = torch.full((1, 96), 2.0, dtype=torch.bfloat16)
    x[0, 40] = bad
    data, scales = quantize(x, rounding=rounding)
    # 2.0 = 2^1: byte 120 for both roundings
    assert u8(scales).tolist() == [[120, 255, 120]]
    out = dequantize(data, scales, dtype=torch.float32)
    assert out[0, 32:64].isnan().all()
    assert (out[0, :32] == 2.0).all() and (out[0, 64:] == 2.0).all()
    # 2.0 with scale 2^-7 stores 256 in the finite blocks
    assert (data[0, :32].float() == 256).all() and (data[0, 64:].float() == 256).all()


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_nan_block_along_dim0(rounding):
    # the NaN poisons only its own column-block when blocking along dim 0
    x = torch.ones(64, 3, dtype=torch.float32)
    x[35, 1] = float("nan")
    data, scales = quantize(x, dim=0, rounding=rounding)
    assert u8(scales).tolist() == [[119, 119, 119], [119, 255, 119]]
    out = dequantize(data, scales, dim=0, dtype=torch.float32)
    assert out[32:, 1].isnan().all()
    assert not out[:32].isnan().any() and not out[:, [0, 2]].isnan().any()


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_bf16_subnormal_block(rounding):
    # bf16 subnormals: amax 2^-130 is far below 448 * 2^-127, so the exponent clamps to byte 0
    vals = [2.0**-130, -(2.0**-133), 3 * 2.0**-133, 0.0]
    x = torch.tensor(vals * 8, dtype=torch.bfloat16).reshape(1, 32)
    # they really are bf16 subnormals and representable exactly
    assert (x.float().abs() < 2.0**-126).all()
    assert x.float()[0, :4].tolist() == vals
    data, scales = quantize(x, rounding=rounding)
    assert u8(scales).tolist() == [[0]]
    # data = x * 2^127 exactly: 0.125, -2^-6, 3 * 2^-6, 0
    assert data.float()[0, :4].tolist() == [0.125, -(2.0**-6), 0.046875, 0.0]
    assert u8(data)[0, :4].tolist() == [0x20, 0x88, 0x14, 0x00]
    out = dequantize(data, scales)
    # not flushed: exactly x back
    assert out.float()[0, :4].tolist() == vals
    assert torch.equal(out.view(torch.int16), x.view(torch.int16))


def test_bf16_max_block():
    # bf16 max = (2 - 2^-7) * 2^127: log2 = 127.994...
    x = torch.ones(1, 32, dtype=torch.bfloat16)
    x[0, 7] = BF16_MAX
    assert x[0, 7].float().item() == (2 - 2.0**-7) * 2.0**127
    # FLOOR: 2^(127 - 8) -> byte 127 + 119 = 246; max / 2^119 = 510 saturates to 448
    data, scales = quantize(x, rounding="floor")
    assert u8(scales).tolist() == [[246]]
    assert data.float()[0, 7].item() == 448.0 and u8(data)[0, 7].item() == 0x7E
    out = dequantize(data, scales, dtype=torch.float32)
    assert out[0, 7].item() == 1.75 * 2.0**127
    # RCEIL: max / 448 = 1.138 * 2^119 -> ceil would give 2^120 (byte 247), where max / 2^120 = 255
    # rounds to 256 and dequantizes to 2^128 = inf; the scale is capped at byte 246, as FLOOR's
    data, scales = quantize(x, rounding="rceil")
    assert u8(scales).tolist() == [[246]]
    assert data.float()[0, 7].item() == 448.0 and u8(data)[0, 7].item() == 0x7E
    # the 1.0 elements underflow to 0 with either scale (1 * 2^-120 < e4m3's smallest 2^-9)
    assert (data.float()[0, :7] == 0).all()


@pytest.mark.parametrize(
    "value, rounding, byte, stored, data_byte",
    [
        (1.0, "rceil", 119, 256.0, 0x78),  # 1/448 -> 2^-8
        (1.0, "floor", 119, 256.0, 0x78),  # floor(0) - 8 = -8
        (3.0, "rceil", 120, 384.0, 0x7C),  # 3/448 = 1.71 * 2^-8 -> 2^-7
        (3.0, "floor", 120, 384.0, 0x7C),  # floor(1.58) - 8 = -7
        (-5.0, "rceil", 121, -320.0, 0xFA),  # 5/448 = 1.43 * 2^-7 -> 2^-6
        (-5.0, "floor", 121, -320.0, 0xFA),  # floor(2.32) - 8 = -6
        (1.875, "rceil", 120, 240.0, 0x77),  # 1.875 = 1.875 * 2^0 > 1.75 * 2^0: rounds up to 2^-7
        (1.875, "floor", 119, 448.0, 0x7E),  # 1.875 * 2^8 = 480 saturates
        (-1.875, "floor", 119, -448.0, 0xFE),  # and saturates to -448 when negative
    ],
)
def test_all_equal_blocks(value, rounding, byte, stored, data_byte):
    x = torch.full((3, 32), value, dtype=torch.bfloat16)
    data, scales = quantize(x, rounding=rounding)
    assert u8(scales).tolist() == [[byte]] * 3
    assert (data.float() == stored).all()
    assert (u8(data) == data_byte).all()
    expected = stored * 2.0 ** (byte - 127)
    assert (dequantize(data, scales, dtype=torch.float32) == expected).all()


def test_amax_480():
    # a block of 1.0s with one 480 = 1.875 * 2^8
    x = torch.ones(1, 32, dtype=torch.bfloat16)
    x[0, 3] = 480.0
    data, scales = quantize(x, rounding="floor")
    assert u8(scales).tolist() == [[127]]
    assert data.float()[0, 3].item() == 448.0
    assert dequantize(data, scales, dtype=torch.float32)[0, 3].item() == 448.0
    assert (data.float()[0, :3] == 1.0).all()
    data, scales = quantize(x, rounding="rceil")
    assert u8(scales).tolist() == [[128]]
    assert data.float()[0, 3].item() == 240.0
    out = dequantize(data, scales, dtype=torch.float32)
    assert out[0, 3].item() == 480.0
    assert (out[0, :3] == 1.0).all()  # 1.0 / 2 = 0.5 is exact in e4m3


@pytest.mark.parametrize(
    "amax, byte",
    [
        (448.0 / 8, 124),  # 448 * 2^-3
        (448.0, 127),
        (896.0, 128),
        (448.0 * 2**20, 147),
        (450.0, 128),  # just above 448 (next bf16) rounds up
        (446.0, 127),  # just below stays
    ],
)
def test_rceil_exact_multiples_of_448(amax, byte):
    x = torch.full((1, 32), 0.5, dtype=torch.bfloat16)
    x[0, 31] = -amax
    data, scales = quantize(x, rounding="rceil")
    assert u8(scales).item() == byte
    # the max element never clips under RCEIL
    assert abs(data.float()[0, 31].item() * 2.0 ** (byte - 127) + amax) <= amax * 2.0**-4


# ------------------------------------------------------------------------------------------------
# quantize: dims, shapes, argument checks


def test_quantize_dim0_transposes_dim_last():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 96, generator=g) * 10).to(torch.bfloat16)
    d0, s0 = quantize(x, dim=0)
    d1, s1 = quantize(x.t().contiguous(), dim=-1)
    assert d0.shape == (64, 96) and s0.shape == (2, 96)
    assert d1.shape == (96, 64) and s1.shape == (96, 2)
    assert torch.equal(u8(d0), u8(d1).t())
    assert torch.equal(u8(s0), u8(s1).t())
    # blocking along dim 0 is not blocking along dim 1
    d2, s2 = quantize(x, dim=-1)
    assert s2.shape == (64, 3)


def test_quantize_dim0_hand_bytes():
    # x[i, j] = 2^(j - 10) for i < 32 and 2^(j - 9) below: block (b, j) has amax 2^(j - 10 + b),
    # so its byte is 119 + j - 10 + b = 109 + j + b, and every element stores 256
    j = torch.arange(8, dtype=torch.float32)
    x = torch.cat([(2.0 ** (j - 10)).expand(32, 8), (2.0 ** (j - 9)).expand(32, 8)]).contiguous()
    data, scales = quantize(x, dim=0)
    assert u8(scales).tolist() == [[109 + c for c in range(8)], [110 + c for c in range(8)]]
    assert (data.float() == 256).all()


def test_quantize_3d_middle_dim():
    x = torch.ones(2, 64, 3, dtype=torch.float32)
    x[1, 40, 2] = 4.0
    data, scales = quantize(x, dim=1)
    assert data.shape == (2, 64, 3) and scales.shape == (2, 2, 3)
    expected = torch.full((2, 2, 3), 119, dtype=torch.uint8)
    expected[1, 1, 2] = 121
    assert torch.equal(u8(scales), expected)


@pytest.mark.parametrize("shape, dim", [((4, 33), -1), ((33, 32), 0), ((2, 48, 32), 1)])
def test_quantize_non_multiple_of_32_raises(shape, dim):
    with pytest.raises(ValueError):
        quantize(torch.ones(shape), dim=dim)


@pytest.mark.parametrize("rounding", ["RCEIL", "nearest", "ceil", ""])
def test_quantize_bad_rounding_raises(rounding):
    with pytest.raises(ValueError):
        quantize(torch.ones(1, 32), rounding=rounding)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float16, torch.uint8])
def test_quantize_bad_dtype_raises(dtype):
    with pytest.raises(ValueError):
        quantize(torch.ones(1, 32, dtype=dtype))


# ------------------------------------------------------------------------------------------------
# quantize_groups: blocks restart at every group


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize_groups_hand_case(rounding):
    # M = 96, K = 2; groups: [0, 0) empty, [0, 33) (33 rows), [33, 73) (40 rows); rows 73..95 unused
    M = 96
    offs = torch.tensor([0, 33, 73], dtype=torch.int32)
    col = torch.empty(M)
    col[0:32] = 1.0
    col[5] = 4.0  # group 1 block 0 (rows 0..31): amax 4 = 2^2
    col[32] = 16.0  # group 1 block 1 (row 32 alone): amax 16 = 2^4
    col[33:65] = 0.5
    col[64] = 2.0  # group 2 block 0 (rows 33..64): amax 2 = 2^1
    col[65:73] = 8.0  # group 2 block 1 (rows 65..72, short): amax 8 = 2^3
    col[73:] = 1000.0  # past offs[-1]: ignored
    x = torch.stack([col, -2 * col], dim=1).to(torch.bfloat16)  # column 1: amax doubled -> byte + 1
    data, scales = quantize_groups(x, offs, rounding=rounding)
    # power-of-two maxima 2^e give byte 119 + e under both roundings
    assert scales.shape == (M // 32 + 3, 2)
    assert u8(scales).tolist() == [[121, 122], [123, 124], [120, 121], [122, 123], [0, 0], [0, 0]]
    d = data.float()
    # each element / its block scale: rows 0..31 scale 2^-6, row 32 2^-4, rows 33..64 2^-7, 65..72 2^-5
    expected = torch.empty(M)
    expected[0:32] = 64.0
    expected[5] = 256.0
    expected[32] = 256.0
    expected[33:65] = 64.0
    expected[64] = 256.0
    expected[65:73] = 256.0
    expected[73:] = 0.0
    assert torch.equal(d[:, 0], expected)
    assert torch.equal(d[:, 1], -expected)  # -2x over a doubled scale
    assert (u8(data)[73:] == 0).all()
    out = dequantize_groups(data, scales, offs, dtype=torch.float32)
    assert torch.equal(out[:73], x[:73].float())
    assert (out[73:] == 0).all()


def test_quantize_groups_short_block_is_not_merged():
    # one group of 40 rows then one of 24: the short block 32..39 and the group 40..63 are separate
    offs = torch.tensor([40, 64], dtype=torch.int32)
    x = torch.ones(64, 1, dtype=torch.float32)
    x[45] = 64.0  # only in group 1's block
    data, scales = quantize_groups(x, offs)
    # S = 64 // 32 + 2 = 4: rows 0 (g0 b0), 1 (g0 b1, rows 32..39), 2 (g1 b0), 3 unused
    assert u8(scales).flatten().tolist() == [119, 119, 125, 0]
    assert (data.float()[32:40] == 256).all()  # not divided by group 1's 64
    assert data.float()[45].item() == 256 and data.float()[44].item() == 4.0


# ------------------------------------------------------------------------------------------------
# to_blocked (2-D and 3-D)


def blocked_pos(r, c, Wp):
    """Byte of element (r, c) in the blocked layout of a matrix padded to Wp columns."""
    tile = (r // 128) * (Wp // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def value(r, c, salt=0):
    return 1 + (r * 7 + c * 3 + salt) % 250  # nonzero, varies with r and c


def test_to_blocked_2d_130x5():
    H, W = 130, 5
    src = torch.tensor([[value(r, c) for c in range(W)] for r in range(H)], dtype=torch.uint8)
    out = to_blocked(src.view(torch.float8_e8m0fnu))
    assert out.dtype == torch.float8_e8m0fnu
    assert out.shape == (256, 8)
    flat = u8(out).reshape(-1)
    # literal positions
    assert flat[0].item() == value(0, 0)
    assert flat[1].item() == value(0, 1)
    assert flat[16].item() == value(1, 0)
    assert flat[4].item() == value(32, 0)
    assert flat[511].item() == value(127, 3)  # 31*16 + 3*4 + 3
    assert flat[512].item() == value(0, 4)  # tile (0, 1)
    assert flat[1024].item() == value(128, 0)  # tile (1, 0)
    assert flat[1552].item() == value(129, 4)  # tile (1, 1): 3*512 + 16
    # every element, and padding bytes zero
    covered = torch.zeros(256 * 8, dtype=torch.bool)
    for r in range(H):
        for c in range(W):
            p = blocked_pos(r, c, 8)
            assert flat[p].item() == value(r, c), (r, c, p)
            covered[p] = True
    assert int(covered.sum()) == H * W
    assert (flat[~covered] == 0).all()


def test_to_blocked_2d_aligned_is_permutation():
    # 128 x 4: a single tile, output byte (r%32)*16 + (r//32)*4 + c
    src = torch.arange(512, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(128, 4)
    flat = u8(to_blocked(src.view(torch.float8_e8m0fnu))).reshape(-1)
    assert flat.shape == (512,)
    assert flat[16 * 5 + 4 * 2 + 3].item() == (69 * 4 + 3) % 256  # element (69, 3)
    assert flat[:4].tolist() == [0, 1, 2, 3]  # row 0
    assert flat[4:8].tolist() == [128, 129, 130, 131]  # row 32


def test_to_blocked_3d_per_expert():
    E, N, KB = 2, 130, 5
    src = torch.tensor(
        [[[value(r, c, salt=100 * e) for c in range(KB)] for r in range(N)] for e in range(E)],
        dtype=torch.uint8,
    )
    out = to_blocked(src.view(torch.float8_e8m0fnu))
    assert out.shape == (E, 256 * 8)
    b = u8(out)
    for e in range(E):
        covered = torch.zeros(256 * 8, dtype=torch.bool)
        for r in range(N):
            for c in range(KB):
                p = blocked_pos(r, c, 8)
                assert b[e, p].item() == value(r, c, salt=100 * e), (e, r, c)
                covered[p] = True
        assert (b[e][~covered] == 0).all()
    # a 3-D layout small enough to write out: E=2, N=1, K/32=1 -> each expert one 512-byte tile
    out = to_blocked(e8m0([7, 9], (2, 1, 1)))
    assert out.shape == (2, 512)
    assert u8(out)[:, 0].tolist() == [7, 9] and int(u8(out)[:, 1:].sum()) == 0


def test_to_blocked_bad_dim_raises():
    with pytest.raises(ValueError):
        to_blocked(e8m0([1, 2, 3, 4]))


# ------------------------------------------------------------------------------------------------
# to_blocked_groups


def test_to_blocked_groups_rows():
    # 100 token rows, 6 scale columns; groups [0, 40), [40, 40) empty, [40, 100)
    rows, cols = 100, 6
    offs = torch.tensor([40, 40, 100], dtype=torch.int32)
    src = torch.tensor([[value(r, c) for c in range(cols)] for r in range(rows)], dtype=torch.uint8)
    buf, starts = to_blocked_groups(src.view(torch.float8_e8m0fnu), offs, along="rows")
    assert buf.dtype == torch.float8_e8m0fnu
    assert buf.shape == (rows + 3 * 128, 8)  # (484, 8)
    # sizes 40, 0, 60 -> padded 128, 0, 128
    assert starts.dtype == torch.int32
    assert starts.tolist() == [0, 128, 128, 256]
    flat = u8(buf).reshape(-1)
    # literal positions (Wp = 8: each 128-row group block is two tiles, 1024 bytes)
    assert flat[0].item() == value(0, 0)
    assert flat[629].item() == value(39, 5)  # g0 local (39, 5): 512 + 7*16 + 4 + 1
    assert flat[1024].item() == value(40, 0)  # g2 local (0, 0) at row 128
    assert flat[1973].item() == value(99, 5)  # g2 local (59, 5): 1024 + 512 + 27*16 + 4 + 1
    covered = torch.zeros(flat.numel(), dtype=torch.bool)
    for g, (lo, hi) in enumerate([(0, 40), (40, 40), (40, 100)]):
        for r in range(lo, hi):
            for c in range(cols):
                p = [0, 128, 128][g] * 8 + blocked_pos(r - lo, c, 8)
                assert flat[p].item() == value(r, c), (g, r, c)
                covered[p] = True
    assert int(covered.sum()) == rows * cols
    assert (flat[~covered] == 0).all()


def test_to_blocked_groups_cols():
    # scale matrix [130, 6] as quantize_groups(...)[1].t() gives for 100 tokens and offs [40, 40, 100]:
    # group 0 has ceil(40/32) = 2 columns (0, 1), group 1 none, group 2 ceil(60/32) = 2 (2, 3);
    # columns 4, 5 are the unused (zero) scale rows
    rows, cols = 130, 6
    offs = torch.tensor([40, 40, 100], dtype=torch.int32)
    src = torch.tensor(
        [[value(r, c) if c < 4 else 0 for c in range(cols)] for r in range(rows)], dtype=torch.uint8
    )
    buf, starts = to_blocked_groups(src.view(torch.float8_e8m0fnu), offs, along="cols")
    assert buf.shape == (256, cols + 3 * 4)  # (256, 18)
    # columns 2, 0, 2 -> padded 4, 0, 4
    assert starts.tolist() == [0, 4, 4, 8]
    flat = u8(buf).reshape(-1)
    # group g's tiles start at byte starts[g] * 256; a group block (256 x 4) is two tiles
    assert flat[0].item() == value(0, 0)
    assert flat[529].item() == value(129, 1)  # g0, tile 1: 512 + 16 + 1
    assert flat[1104].item() == value(5, 2)  # g2 local col 0: 1024 + 5*16
    assert flat[1533].item() == value(127, 3)  # g2 local (127, 1): 1024 + 31*16 + 3*4 + 1
    assert flat[1537].item() == value(128, 3)  # g2 local (128, 1): 1024 + 512 + 1
    covered = torch.zeros(flat.numel(), dtype=torch.bool)
    for g, (c0, ncol) in enumerate([(0, 2), (2, 0), (2, 2)]):
        for r in range(rows):
            for c in range(c0, c0 + ncol):
                p = [0, 4, 4][g] * 256 + blocked_pos(r, c - c0, 4)
                assert flat[p].item() == value(r, c), (g, r, c)
                covered[p] = True
    assert int(covered.sum()) == rows * 4
    assert (flat[~covered] == 0).all()


def test_to_blocked_groups_cols_matches_quantize_groups():
    # end to end on the shapes the weight-gradient path produces: 64 tokens in groups of 33 and 31,
    # K = 4: quantize_groups gives 2 + 1 scale rows (S = 64 // 32 + 2 = 4, last one unused)
    offs = torch.tensor([33, 64], dtype=torch.int32)
    x = torch.ones(64, 4, dtype=torch.float32)
    x[32, 1] = 8.0  # g0 block 1 (row 32 alone), column 1: 2^3 -> 122
    x[50, 3] = 0.25  # smaller than the rest: g1 stays 119
    _, scales = quantize_groups(x, offs)
    assert u8(scales).tolist() == [[119] * 4, [119, 122, 119, 119], [119] * 4, [0] * 4]
    buf, starts = to_blocked_groups(scales.t(), offs, along="cols")
    assert starts.tolist() == [0, 4, 8]  # ceil(33/32)=2 -> 4, ceil(31/32)=1 -> 4
    assert buf.shape == (128, 4 + 2 * 4)
    flat = u8(buf).reshape(-1)
    # g0: K-row k, block column b at k*16 + b; g1 at 512 + k*16
    assert flat[0 * 16 + 0].item() == 119 and flat[1 * 16 + 1].item() == 122
    assert flat[3 * 16 + 1].item() == 119 and flat[512 + 3 * 16].item() == 119
    nonzero = sorted(torch.nonzero(flat).flatten().tolist())
    assert nonzero == sorted([k * 16 + b for k in range(4) for b in range(2)] + [512 + k * 16 for k in range(4)])


def test_to_blocked_groups_bad_along_raises():
    with pytest.raises(ValueError):
        to_blocked_groups(e8m0([1] * 8, (2, 4)), torch.tensor([2], dtype=torch.int32), along="diag")


def test_rceil_scale_is_ceil_log2_over_sampled_values():
    # independent check of the RCEIL/FLOOR definitions on a spread of normal bf16 maxima, using math.log2
    amaxes = [1.0, 1.5, 1.75, 1.7578125, 2.0, 3.5, 7.0, 480.0, 1e-20, 3e30, 0.001, 448.0 * 3]
    for a in amaxes:
        a_bf = torch.tensor(a, dtype=torch.bfloat16).item()
        x = torch.zeros(1, 32, dtype=torch.bfloat16)
        x[0, 0] = a_bf
        rceil = u8(quantize(x, rounding="rceil")[1]).item()
        floor = u8(quantize(x, rounding="floor")[1]).item()
        assert rceil == 127 + math.ceil(math.log2(a_bf / 448)), a_bf
        assert floor == 127 + math.floor(math.log2(a_bf)) - 8, a_bf


@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_block_max_near_float32_limit_dequantizes_finite(rounding):
    """RCEIL would pick 2^120 for a block max of 3.38e38 and round it to 256 * 2^120 = inf; the
    capped scale 2^119 saturates it to 448 * 2^119, the same as FLOOR."""
    x = torch.zeros(2, 32)
    x[0, 0], x[0, 1], x[1, 0] = 3.38e38, -1.0, torch.finfo(torch.float32).max
    data, scales = quantize(x, -1, rounding)
    assert u8(scales).tolist() == [[246], [246]]
    y = dequantize(data, scales, -1, torch.float32)
    assert torch.isfinite(y).all() and y[0, 0].item() == 448 * 2.0**119 == y[1, 0].item()
