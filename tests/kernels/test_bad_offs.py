"""Whatever `offs` holds (negative, decreasing, past the rows, empty groups, 1 to 64 groups),
every kernel that reads it stays in bounds and computes what the reference computes from the
group ends `reference.group_ends` makes of it (the Triton kernels in the interpreter, where an
out-of-bounds access crashes or corrupts the process). Group tables of 1 to 64 lanes here; the
512-lane table of `triton_common.group_table`, which every kernel shares, is test_300_groups's in
test_triton_mx_gemm.py (at 300 groups the interpreter runs hundreds of programs per quantizer call)."""

import pytest
import torch
from helpers import assert_bitwise_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxfp8_inductor.kernels import reference as ref
from mxfp8_inductor.kernels import rowwise, triton_mx, triton_rowwise

pytestmark = pytest.mark.interpreter

M, K = 70, 64


@st.composite
def bad_offs(draw):
    G = draw(st.integers(1, 64))
    values = st.integers(-2 * M, 3 * M)
    ends = draw(st.lists(values, min_size=G, max_size=G))
    return torch.tensor(ends, dtype=torch.int32)


def _x(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g) * 3).bfloat16()


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(offs=bad_offs(), seed=st.integers(0, 2**16))
def test_mxfp8_quantizers_on_any_offs(offs, seed):
    x = _x(seed)
    for got, want in (
        (triton_mx.quantize_groups(x, offs), ref.quantize_groups(x, offs)),
        (triton_mx.quantize_groups_blocked(x, offs), ref.quantize_groups_blocked(x, offs)),
        (triton_mx.quantize_rows_blocked(x, offs), ref.quantize_rows_blocked(x, offs)),
        ((triton_mx.quantize_dequantize_groups(x, offs),), (ref.quantize_dequantize_groups(x, offs),)),
    ):
        for g, w in zip(got, want):
            assert_bitwise_equal(g, w)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(offs=bad_offs(), seed=st.integers(0, 2**16))
def test_rowwise_quantizers_and_layouts_on_any_offs(offs, seed):
    x = _x(seed)
    for min_groups in (0, 10**9):  # both paths of quantize_groups
        with pytest.MonkeyPatch.context() as m:
            m.setattr(triton_rowwise, "GROUPS_KERNEL_MIN_GROUPS", min_groups)
            for g, w in zip(triton_rowwise.quantize_groups(x, offs), rowwise.quantize_groups(x, offs)):
                assert_bitwise_equal(g, w)
    scales = ref.quantize(x, -1)[1]
    for along, s in (("rows", scales), ("cols", scales.t().contiguous())):
        for g, w in zip(triton_mx.to_blocked_groups(s, offs, along), ref.to_blocked_groups(s, offs, along)):
            assert_bitwise_equal(g, w)


def test_group_ends_clamp_and_run():
    offs = torch.tensor([30, 101, -5, 50, 60], dtype=torch.int32)
    assert ref.group_ends(offs, 100).tolist() == [30, 100, 100, 100, 100]
    valid = torch.tensor([0, 10, 10, 64], dtype=torch.int32)
    assert torch.equal(ref.group_ends(valid, 64), valid)
