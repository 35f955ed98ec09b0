"""The fused MXFP8 grouped GEMMs (interpreter on CPU): the rounding in registers is bit-exact with
the reference quantizers, and the products are the reference's MXFP8 products in fp32, through
the bf16 dot (Hopper and older) and through `tl.dot_scaled` (native, compute capability 10.x)."""

import functools

import pytest
import torch
from helpers import make_offs

from mxfp8_inductor.kernels import reference as ref
from mxfp8_inductor.kernels import triton_mx_gemm as fused

pytestmark = pytest.mark.interpreter

GROUPS = {  # group sizes: empty groups, sizes off the 32-blocks, rows past the last end (tail)
    "uneven": ([37, 0, 64, 1, 90], 5),
    "one": ([33], 0),
    "empty_last": ([32, 40, 0], 7),
}


def _wide(shape, seed, specials=False):
    """Values over many binades, with zeros and subnormals; NaN and inf where `specials`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-40, 40, shape, generator=g).float())
    flat = x.view(-1)
    flat[::29] = 0.0
    flat[3::31] = 2.0**-130
    if specials:
        flat[5], flat[flat.numel() // 2], flat[-7] = float("nan"), float("inf"), -float("inf")
    return x.bfloat16()


def _grouped(fn, offs, M):
    """fn(start, end, e) for every group, the groups as `reference.group_ends` makes them safe."""
    start = 0
    for e, end in enumerate(ref.group_ends(offs, M).tolist()):
        fn(start, end, e)
        start = end


def _rows_reference(a_MK, b_EKN, offs, rounding):
    a_q = ref.quantize_dequantize(a_MK, -1, rounding).float()
    b_q = ref.quantize_dequantize(b_EKN, 1, rounding).float()
    out = torch.zeros(a_MK.shape[0], b_EKN.shape[-1])

    mag = torch.zeros_like(out)

    def gemm(s, t, e):
        out[s:t] = a_q[s:t] @ b_q[e]
        mag[s:t] = a_q[s:t].abs() @ b_q[e].abs()

    _grouped(gemm, offs, a_MK.shape[0])
    return out, mag


def _groups_reference(a_MK, g_MN, offs, rounding):
    a_q = ref.quantize_dequantize_groups(a_MK, offs, rounding).float()
    g_q = ref.quantize_dequantize_groups(g_MN, offs, rounding).float()
    out = torch.zeros(offs.numel(), a_MK.shape[1], g_MN.shape[1])

    mag = torch.zeros_like(out)

    def gemm(s, t, e):
        out[e] = a_q[s:t].t() @ g_q[s:t]
        mag[e] = a_q[s:t].t().abs() @ g_q[s:t].abs()

    _grouped(gemm, offs, a_MK.shape[0])
    return out, mag


def _assert_products(got, want):
    """The fp32 products rounded once to bf16: equal up to the order of the fp32 sums. `want` may
    come with the sums of the products' magnitudes, which bound what another summation order can
    change where the terms cancel (values here span 80 binades)."""
    want, mag = want if isinstance(want, tuple) else (want, torch.zeros_like(want))
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    got, want, mag = got.float()[finite], want[finite], mag[finite]
    reordered = (got - want).abs() <= 2**-18 * mag + 2**-8 * got.abs()  # fp32 reordering, then one bf16 rounding
    torch.testing.assert_close(got[~reordered], want.bfloat16().float()[~reordered], rtol=2**-7, atol=1e-30)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("groups", sorted(GROUPS))
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("layout", ["transposed", "plain"])
def test_rows_kernel_is_the_mxfp8_product(groups, rounding, layout, native):
    sizes, tail = GROUPS[groups]
    offs = make_offs(sizes)
    M, K, N, E = int(offs[-1]) + tail, 96, 64, len(sizes)
    a = _wide((M, K), 1, specials=groups == "uneven")
    w = _wide((E, N, K) if layout == "transposed" else (E, K, N), 2)
    b = w.transpose(-2, -1) if layout == "transposed" else w  # forward's view / input gradient's form
    got = fused.grouped_mm(a, b, offs, rounding, native=native)
    _assert_products(got, _rows_reference(a, b, offs, rounding))
    assert (got[int(offs[-1]):] == 0).all()  # rows past the last group end


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("groups", sorted(GROUPS))
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_groups_kernel_is_the_mxfp8_product(groups, rounding, native):
    sizes, tail = GROUPS[groups]
    offs = make_offs(sizes)
    M = int(offs[-1]) + tail
    a, g = _wide((M, 64), 3, specials=groups == "uneven"), _wide((M, 96), 4)
    got = fused.grouped_mm_wgrad(a, g, offs, rounding, native=native)
    _assert_products(got, _groups_reference(a, g, offs, rounding))
    empty = torch.tensor(sizes) == 0
    assert (got[empty] == 0).all()  # an empty group's weight gradient


def _assert_values_equal(got, want):
    """Equal values: bit for bit but for the sign of zero, which a sum of products drops."""
    assert got.shape == want.shape and torch.equal(got.float(), want.float())


@pytest.mark.slow
def test_300_groups():
    """300 experts, most without tokens: the group tables take 512 lanes. One column tile, so
    that the interpreter runs one program per row tile and expert."""
    offs = make_offs([(i % 7 == 0) * (i % 5 + 33) for i in range(300)])
    M = int(offs[-1]) + 3
    a, w, g = _wide((M, 32), 12, specials=True), _wide((300, 32, 32), 13), _wide((M, 32), 14)
    _assert_products(fused.grouped_mm(a, w, offs, "floor"), _rows_reference(a, w, offs, "floor"))
    _assert_products(fused.grouped_mm_wgrad(a, g, offs, "rceil", native=True), _groups_reference(a, g, offs, "rceil"))


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_rounding_in_registers_is_bit_exact(rounding, native):
    """An identity operand returns the other operand's MXFP8 values exactly, so each operand's
    in-register rounding is compared with the reference quantizer's values."""
    fused_mm = functools.partial(fused.grouped_mm, native=native)
    fused_wgrad = functools.partial(fused.grouped_mm_wgrad, native=native)
    B, E = 64, 3
    offs = make_offs([B, B, B])
    eye = torch.eye(B, dtype=torch.bfloat16)
    rows_eye = torch.cat([eye] * E)
    x = _wide((E * B, B), 5)
    w = _wide((E, B, B), 6)
    _assert_values_equal(fused_mm(x, eye.expand(E, B, B), offs, rounding), ref.quantize_dequantize(x, -1, rounding))
    for b in (w, w.transpose(-2, -1)):
        _assert_values_equal(fused_mm(rows_eye, b, offs, rounding).view(E, B, B),
                             ref.quantize_dequantize(b, 1, rounding))
    want = ref.quantize_dequantize_groups(x, offs, rounding).view(E, B, B)
    _assert_values_equal(fused_wgrad(rows_eye, x, offs, rounding), want)
    _assert_values_equal(fused_wgrad(x, rows_eye, offs, rounding), want.transpose(-2, -1))


def test_plain_bf16_mode_is_the_bf16_product():
    offs = make_offs([37, 0, 64])
    a, w = _wide((105, 64), 7), _wide((3, 64, 32), 8)
    want = torch.zeros(105, 32)

    def gemm(s, t, e):
        want[s:t] = a[s:t].float() @ w[e].float()

    _grouped(gemm, offs, 105)
    _assert_products(fused.grouped_mm(a, w, offs, quant=(False, False)), want)


@pytest.mark.parametrize(
    "call, match",
    [(lambda a, w, g, o: fused.grouped_mm(a, w, o, quant=(True, False), native=True), "quant must be"),
     (lambda a, w, g, o: fused.grouped_mm(a, w[:1], o), "E group ends"),  # offs beyond the experts
     (lambda a, w, g, o: fused.grouped_mm(a, w.transpose(-2, -1)[:, :16], o), r"b \[E, K, N\]"),
     (lambda a, w, g, o: fused.grouped_mm(a, w, o.long()), "int32"),
     (lambda a, w, g, o: fused.grouped_mm_wgrad(a, g[:5], o), r"g \[M, N\]"),
     (lambda a, w, g, o: fused.grouped_mm(a, w, o, rounding="up"), "rounding")],
)
def test_bad_arguments_raise_value_error(call, match):
    a, w, g = _wide((64, 32), 15), _wide((2, 32, 32), 16), _wide((64, 32), 17)
    with pytest.raises(ValueError, match=match):
        call(a, w, g, make_offs([30, 34]))


@pytest.mark.parametrize("ends", [[50, 20, 90], [-5, 40, 400], [200, 10, 2**30]])
def test_malformed_offs_stay_in_bounds(ends):
    """offs the host cannot check (compiled graphs, no sync): the kernels clamp them as the
    reference's `group_ends` does, so every read and write stays inside the tensors."""
    offs = torch.tensor(ends, dtype=torch.int32)
    a, w, g = _wide((70, 64), 9), _wide((3, 64, 32), 10), _wide((70, 32), 11)
    _assert_products(fused.grouped_mm(a, w, offs), _rows_reference(a, w, offs, "rceil"))
    _assert_products(fused.grouped_mm_wgrad(a, g, offs), _groups_reference(a, g, offs, "rceil"))
