"""The FP8 rowwise recipe's quantizers: hand-checked scales, layouts, the Triton twins, the emulated GEMM."""

import pytest
import torch
from helpers import assert_bitwise_equal, make_offs, sqnr

from mxfp8_inductor.kernels import rowwise, shared_weight, triton_rowwise

F8 = torch.float8_e4m3fn


@pytest.fixture(params=["group_kernel", "chunk_kernels"])
def groups_path(request, monkeypatch):
    """`triton_rowwise.quantize_groups` by each of its paths, whatever the number of groups."""
    monkeypatch.setattr(triton_rowwise, "GROUPS_KERNEL_MIN_GROUPS", 0 if request.param == "group_kernel" else 10**9)
    return request.param


def test_scales_are_powers_of_two_that_fit_the_row():
    x = torch.tensor([[1.0, -3.0, 0.5], [448.0, 1.0, 0.0], [500.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    data, scale = rowwise.quantize_rows(x, -1)
    # amax 3 = 1.5 * 2^1 <= 1.75 * 2^1: data = x * 2^7; amax 500 = 1.95 * 2^8 > 1.75 * 2^8: x * 2^-1
    # (250 rounds to the float8 256)
    assert scale.tolist() == [2.0**-7, 1.0, 2.0, 2.0**-127]
    assert data.float().tolist() == [[128.0, -384.0, 64.0], [448.0, 1.0, 0.0], [256.0, 0.5, 1.0], [0.0, 0.0, 0.0]]


def test_floor_rounding_saturates_instead_of_shrinking_the_scale():
    data, scale = rowwise.quantize_rows(torch.tensor([[500.0, 1.0]]), -1, "floor")
    assert scale.tolist() == [1.0] and data.float().tolist() == [[448.0, 1.0]]


def test_non_finite_rows_get_nan_scales_and_leave_other_rows_alone():
    x = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0], [1.0, 2.0]], dtype=torch.bfloat16)
    data, scale = rowwise.quantize_rows(x, 1)
    assert scale[:2].isnan().all() and scale[2] == 2.0**-7
    assert data[2].float().tolist() == [128.0, 256.0]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_rows_along_any_dim_match_the_last_dim_case(dim):
    x = torch.randn(3, 40, 48, dtype=torch.bfloat16)
    data, scale = rowwise.quantize_rows(x, dim)
    data_t, scale_t = rowwise.quantize_rows(x.movedim(dim, -1).contiguous(), -1)
    assert_bitwise_equal(data.movedim(dim, -1).contiguous(), data_t)
    assert_bitwise_equal(scale, scale_t)


def _groups_case(sizes, K=48, tail=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    offs = make_offs(sizes)
    x = (torch.randn(int(offs[-1]) + tail, K, generator=g) * torch.rand(K, generator=g) * 8).bfloat16()
    return x, offs


@pytest.mark.parametrize("sizes", [[77], [100, 0, 37, 19], [0, 16, 1, 0, 33, 15]])
def test_group_quantization_layout(sizes):
    """Each group's tokens, quantized along the tokens on their own, sit transposed at its padded
    start; padding is zero and ends are multiples of 16."""
    x, offs = _groups_case(sizes)
    data_KMp, scales_GK, pends = rowwise.quantize_groups(x, offs)
    assert data_KMp.shape == (48, rowwise.padded_rows(x.shape[0], len(sizes)))
    assert torch.all(pends % rowwise.ALIGN == 0)
    expected = torch.zeros_like(data_KMp.view(torch.uint8))
    start = pstart = 0
    for g, size in enumerate(sizes):
        if size:
            d, s = rowwise.quantize_rows(x[start : start + size], 0)
            expected[:, pstart : pstart + size] = d.t().view(torch.uint8)
            assert_bitwise_equal(scales_GK[g], s)
        start += size
        pstart = int(pends[g])
    assert_bitwise_equal(data_KMp, expected.view(F8))


def test_group_amax_ignores_rows_past_the_end_and_counts_nan_as_inf():
    x, offs = _groups_case([5, 0, 7], K=4, tail=2)
    x[-1] = 1e4  # past offs[-1]
    x[6, 1] = float("nan")
    amax = rowwise.group_amax(x, offs)
    assert amax[1].tolist() == [0.0] * 4
    assert amax[2, 1] == float("inf")
    assert torch.equal(amax[0], x[:5].float().abs().amax(0))


@pytest.mark.interpreter
@pytest.mark.parametrize("sizes", [[300], [100, 0, 37, 119, 1], [0] * 3 + [64]])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_group_amax_is_bit_exact(sizes, dtype):
    x, offs = _groups_case(sizes, K=200, tail=9, seed=len(sizes))
    x = x.to(dtype)
    x[3, 7] = float("nan")
    x[-1] = float("inf")  # past offs[-1]
    assert_bitwise_equal(triton_rowwise.group_amax(x, offs), rowwise.group_amax(x, offs))


def test_emulated_scaled_grouped_mm_is_the_dequantized_product():
    g = torch.Generator().manual_seed(1)
    offs = make_offs([32, 0, 48])
    a, w = torch.randn(90, 64, generator=g), torch.randn(3, 32, 64, generator=g)
    a8, sa = rowwise.quantize_rows(a, -1)
    w8, sw = rowwise.quantize_rows(w, -1)
    out = rowwise.scaled_grouped_mm(a8, w8.transpose(-2, -1), sa, sw, offs)
    a_d, w_d = a8.double() * sa[:, None].double(), w8.double() * sw[..., None].double()
    for e, (s, t) in enumerate([(0, 32), (32, 32), (32, 80)]):
        assert sqnr(a_d[s:t] @ w_d[e].t(), out[s:t]) > 45 if t > s else True
    # 2d-2d: dW = a^T dY per group, scales per group and row of each operand
    dy = torch.randn(90, 32, generator=g)
    a8t, sa_g, pends = rowwise.quantize_groups(a, offs)
    d8t, sd_g, _ = rowwise.quantize_groups(dy, offs)
    dw = rowwise.scaled_grouped_mm(a8t, d8t.t(), sa_g.reshape(-1), sd_g.reshape(-1), pends)
    exact = [a[s:t].double().t() @ dy[s:t].double() for s, t in [(0, 32), (32, 32), (32, 80)]]
    assert sqnr(exact[0], dw[0]) > 25 and sqnr(exact[2], dw[2]) > 25
    assert torch.all(dw[1] == 0)


@pytest.mark.interpreter
@pytest.mark.parametrize("sizes", [[300], [100, 0, 37, 119, 1], [0] * 3 + [64]])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_triton_group_quantizer_is_bit_exact(groups_path, sizes, rounding):
    x, offs = _groups_case(sizes, K=80, tail=9, seed=len(sizes))
    x[3, 7] = float("nan")
    x[5, 1] = -2.0**-133  # a bf16 subnormal
    got, want = triton_rowwise.quantize_groups(x, offs, rounding), rowwise.quantize_groups(x, offs, rounding)
    for a, b in zip(got, want):
        assert_bitwise_equal(a, b)


@pytest.mark.interpreter
@pytest.mark.parametrize("tile, dtype", [((16, 32, 4, 2), torch.bfloat16), ((32, 16, 4, 1), torch.float32)])
@pytest.mark.parametrize("per_sm", [1, 10**6])
def test_triton_group_kernel_tiles_smaller_than_groups(monkeypatch, tile, dtype, per_sm):
    """Tiles far smaller than the defaults, so that both passes take several loads per group (the
    last one ragged, padding included), feature blocks are ragged, groups are empty or end inside
    a load, and padded columns lie past the last group; each program taking many slabs (the
    interpreter's few SMs) or one: still bit-exact, NaN and inf included."""
    monkeypatch.setattr(triton_rowwise, "GROUPS_TILE", list(tile))
    monkeypatch.setattr(triton_rowwise, "GROUPS_PER_SM", per_sm)
    monkeypatch.setattr(triton_rowwise, "GROUPS_KERNEL_MIN_GROUPS", 0)
    x, offs = _groups_case([70, 0, 5, 3, 1, 0, 130, 33], K=104, tail=7, seed=5)
    x = x.to(dtype)
    x[3, 7], x[80, 100] = float("nan"), float("-inf")
    x[-1] = float("inf")  # past offs[-1]
    got, want = triton_rowwise.quantize_groups(x, offs), rowwise.quantize_groups(x, offs)
    for a, b in zip(got, want):
        assert_bitwise_equal(a, b)


@pytest.mark.interpreter
@pytest.mark.parametrize("amax_tile, cast_tile, dtype", [((64, 16, 32, 4), (32, 2, 4), torch.bfloat16),
                                                        ((32, 32, 16, 4), (16, 3, 4), torch.float32)])
def test_triton_chunk_kernels_tiles_smaller_than_groups(monkeypatch, amax_tile, cast_tile, dtype):
    """Tiles far smaller than the defaults, so that amax chunks take several loads and span group
    ends, cast programs loop over several feature blocks (the last one ragged), and token tiles
    meet two groups with empty ones between them, or lie past the last group: still bit-exact."""
    monkeypatch.setattr(triton_rowwise, "AMAX_TILE", list(amax_tile))
    monkeypatch.setattr(triton_rowwise, "CAST_TILE", list(cast_tile))
    monkeypatch.setattr(triton_rowwise, "GROUPS_KERNEL_MIN_GROUPS", 10**9)
    x, offs = _groups_case([70, 0, 5, 3, 1, 0, 130, 33], K=104, tail=7, seed=5)
    x = x.to(dtype)
    got, want = triton_rowwise.quantize_groups(x, offs), rowwise.quantize_groups(x, offs)
    for a, b in zip(got, want):
        assert_bitwise_equal(a, b)


@pytest.mark.interpreter
def test_triton_group_quantizer_second_call_uses_its_own_tensors(groups_path):
    """A second call with new values and other group ends of the same shapes takes the bound
    launches of the first (`launch.launch_keyed`) and must read and write its own tensors."""
    for seed, sizes in enumerate(([70, 0, 33], [5, 64, 34])):
        x, offs = _groups_case(sizes, K=48, tail=5, seed=seed)
        for a, b in zip(triton_rowwise.quantize_groups(x, offs), rowwise.quantize_groups(x, offs)):
            assert_bitwise_equal(a, b)


def test_rowwise_and_mxfp8_differ_only_where_a_row_spans_a_wide_range():
    """Power-of-two scales shift exponents without changing mantissas, so the two recipes round
    alike until one scale must cover values far below the row's max: rowwise pushes them into
    float8 subnormals (or zero), MXFP8 gives each block of 32 its own scale."""
    from mxfp8_inductor.kernels import reference

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g)
    mx_x = reference.quantize_dequantize(x, -1, "rceil", torch.float32)
    data, scale = rowwise.quantize_rows(x, -1)
    assert torch.equal(data.float() * scale[:, None], mx_x)
    x[:, 32:] *= 1e-6  # the second block of each row, 10^6 below the first
    mx_x = reference.quantize_dequantize(x, -1, "rceil", torch.float32)
    data, scale = rowwise.quantize_rows(x, -1)
    assert sqnr(x[:, 32:], mx_x[:, 32:]) > 25 > 5 > sqnr(x[:, 32:], data[:, 32:].float() * scale[:, None])


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", [(3, 64, 96), (4, 70, 33), (3, 130, 40)])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("layout", ["EKN", "ENK"])
def test_triton_shared_weight_quantizer_is_bit_exact(shape, rounding, layout):
    """A weight's shared form (one scale per expert) from one kernel pair, in either layout the
    weight arrives in (a transposed view of [E, N, K], or contiguous) and kept in it, tiles ragged
    at both ends: bit-exact with the contract, a NaN expert, an inf one, a zero row and
    subnormals included."""
    g = torch.Generator().manual_seed(sum(shape))
    b = (torch.randn(*shape, generator=g) * torch.logspace(-40, 30, shape[-1], base=2)).bfloat16()
    b[0, 0, 0], b[1, 1, 2], b[-1, 3] = float("nan"), float("inf"), 0.0
    b[-1, :, 5] = -2.0**-133  # a bf16 subnormal column
    if layout == "ENK":
        b = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    got = triton_rowwise.quantize_weight_shared(b, rounding)
    want = shared_weight.quantize(b, "fp8_rowwise", rounding)
    for a, w in zip(got, want):
        assert_bitwise_equal(a, w)
    assert got[0].stride() == b.stride() and got[1].shape == (shape[0],)


@pytest.mark.interpreter
def test_triton_weight_quantizer_second_call_uses_its_own_tensors():
    """The second weight of a shape takes the launches bound by the first (`launch.launch_keyed`):
    its own values in, its own operands out."""
    g = torch.Generator().manual_seed(7)
    for scale in (1.0, 2.0**20):
        b = (torch.randn(2, 48, 72, generator=g) * scale).bfloat16()
        got, want = triton_rowwise.quantize_weight_shared(b), shared_weight.quantize(b, "fp8_rowwise")
        for a, w in zip(got, want):
            assert_bitwise_equal(a, w)


def test_quantizers_take_zero_tokens():
    """An expert-parallel rank may receive no tokens: empty operands, and rows of no elements
    (the weight gradient's, along the tokens) scaled as zero rows."""
    x, offs = torch.zeros(0, 48, dtype=torch.bfloat16), make_offs([0, 0, 0])
    data, scale = rowwise.quantize_rows(x, -1)
    assert data.shape == (0, 48) and scale.shape == (0,)
    for t, dim in ((x, 0), (x.t(), -1)):
        data, scale = rowwise.quantize_rows(t, dim)
        assert data.shape == t.shape and scale.shape == (48,) and torch.all(scale == 2.0**-127)
    assert torch.equal(rowwise.group_amax(x, offs), torch.zeros(3, 48))
    data_KMp, scales_GK, pends = rowwise.quantize_groups(x, offs)
    assert data_KMp.shape == (48, rowwise.padded_rows(0, 3)) and torch.all(data_KMp.view(torch.uint8) == 0)
    assert torch.all(scales_GK == 2.0**-127) and pends.tolist() == [0, 0, 0]


@pytest.mark.interpreter
@pytest.mark.parametrize("M, K, sizes", [(0, 48, [0, 0, 0]), (40, 0, [10, 0, 30])])
def test_triton_quantizers_take_zero_tokens_or_features(groups_path, M, K, sizes):
    """No tokens, or tokens of no features: the padded group ends are still written."""
    x, offs = torch.zeros(M, K, dtype=torch.bfloat16), make_offs(sizes)
    for a, b in zip(triton_rowwise.quantize_groups(x, offs), rowwise.quantize_groups(x, offs)):
        assert_bitwise_equal(a, b)


def test_fp8_rowwise_grouped_mm_takes_zero_tokens():
    import mxfp8_inductor as mx

    x = torch.zeros(0, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3, 48, 32, dtype=torch.bfloat16, requires_grad=True)
    out = mx.grouped_mm(x, w.transpose(-2, -1), offs=make_offs([0, 0, 0]), recipe="fp8_rowwise")
    assert out.shape == (0, 48)
    out.sum().backward()
    assert x.grad.shape == (0, 32) and w.grad.shape == w.shape and torch.all(w.grad == 0)


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", [(37, 300), (2, 70, 33), (3, 5, 0), (0, 16)])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_triton_row_quantizer_is_bit_exact(shape, rounding, layout):
    """Rows along the last dim, in the layouts the eager GEMMs pass (row-major activations, a
    weight's [E, K, N] view of [E, N, K] storage and its transpose), ragged tiles, NaN/inf rows,
    subnormals and empty rows: bit-exact with the pure-torch contract."""
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * torch.logspace(-40, 30, shape[-1], base=2)).bfloat16()
    if x.numel():
        x.view(-1, shape[-1])[0, 0], x.view(-1, shape[-1])[-1, 1] = float("nan"), float("inf")
        x.view(-1, shape[-1])[1, :] = -2.0**-133  # a bf16 subnormal row
    if layout == "transposed":
        x = x.transpose(-2, -1).contiguous().transpose(-2, -1)
    got, want = triton_rowwise.quantize_rows(x, rounding), rowwise.quantize_rows(x, -1, rounding)
    for a, w in zip(got, want):
        assert_bitwise_equal(a, w)
    assert got[0].is_contiguous() and got[1].shape == shape[:-1]
    y = x * -3  # a second call of the same launch: its own tensors
    for a, w in zip(triton_rowwise.quantize_rows(y, rounding), rowwise.quantize_rows(y, -1, rounding)):
        assert_bitwise_equal(a, w)


def test_triton_row_quantizer_rejects_other_ranks():
    with pytest.raises(ValueError, match="2-D or 3-D"):
        triton_rowwise.quantize_rows(torch.zeros(4, dtype=torch.bfloat16))
