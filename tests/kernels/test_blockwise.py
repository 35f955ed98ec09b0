"""The FP8 blockwise recipe: its quantizers against the contract restated in tests/contract.py
(tiles that cross 128, short last tiles, groups that restart them), its Triton GEMM against the
emulation (interpreter on CPU, float8 tensor cores on a GPU)."""

import contract
import pytest
import torch
from helpers import assert_bitwise_equal, make_offs, spread

from mxfp8_inductor.kernels import blockwise, triton_fp8_gemm

F8 = torch.float8_e4m3fn
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16_ULP = 2.0**-7
SIZES = [130, 0, 1, 300, 128, 7]  # a group past one tile, an empty one, a whole tile, short ones


def _dequantized(data: torch.Tensor, scales: torch.Tensor, *dims: int) -> torch.Tensor:
    return blockwise.dequantize_tiles(data, scales, *dims, dtype=torch.bfloat16)


@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
@pytest.mark.parametrize("dim", [0, 1])
def test_tiles_match_contract(dim, rounding):
    x = spread(200, 300, gen=torch.Generator().manual_seed(dim))
    data, scales = blockwise.quantize_tiles(x, dim, rounding)
    assert data.shape == x.shape and scales.shape == ((2, 300) if dim == 0 else (200, 3))
    assert_bitwise_equal(_dequantized(data, scales, dim), contract.round_along(x, dim, "fp8_blockwise", rounding))


@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
def test_weight_blocks_match_contract_in_both_orientations(rounding):
    b_EKN = spread(3, 300, 136, gen=torch.Generator().manual_seed(1))
    data_ENK, scales = blockwise.quantize_weight(b_EKN, rounding)
    assert data_ENK.is_contiguous() and scales.shape == (3, 3, 2)
    b_q = _dequantized(data_ENK.transpose(-2, -1), scales, 1, 2)
    for dim in (1, 2):
        assert_bitwise_equal(b_q, contract.round_weight(b_EKN, dim, "fp8_blockwise", rounding))


@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
def test_groups_match_contract_with_tiles_restarting_at_each_group(rounding):
    x_MK = spread(sum(SIZES) + 5, 40, gen=torch.Generator().manual_seed(2))  # 5 rows past every group
    offs = make_offs(SIZES)
    data_KT, scales_TK, padded = blockwise.quantize_groups(x_MK, offs, rounding)
    assert padded.tolist() == [256, 256, 384, 768, 896, 1024]
    assert data_KT.shape == (40, 640 + 128 * len(SIZES)) and scales_TK.shape == (data_KT.shape[1] // 128, 40)
    want = contract.round_tokens(x_MK, offs.tolist(), "fp8_blockwise", rounding)
    got = _dequantized(data_KT.t(), scales_TK, 0)
    starts, pstarts = [0, *offs.tolist()[:-1]], [0, *padded.tolist()[:-1]]
    for start, end, pstart, pend in zip(starts, offs.tolist(), pstarts, padded.tolist()):
        assert_bitwise_equal(got[pstart : pstart + end - start], want[start:end])
        assert torch.all(data_KT[:, pstart + end - start : pend].view(torch.uint8) == 0)  # the padding


def test_non_finite_tile_gets_a_nan_scale_alone():
    x = torch.ones(2, 300, dtype=torch.bfloat16)
    x[1, 130] = float("inf")
    _, scales = blockwise.quantize_tiles(x, -1)
    assert scales[1, 1].isnan() and torch.isfinite(scales[0]).all() and torch.isfinite(scales[1, [0, 2]]).all()


def test_no_tokens():
    data_KT, scales_TK, padded = blockwise.quantize_groups(torch.zeros(0, 32, dtype=torch.bfloat16), make_offs([0, 0]))
    assert padded.tolist() == [0, 0] and torch.all(data_KT.view(torch.uint8) == 0)
    data, scales = blockwise.quantize_tiles(torch.zeros(0, 32), -1)
    assert data.shape == (0, 32) and scales.shape == (0, 1)


# --------------------------------------------------------------------------------------------
# The Triton GEMM's blockwise mode


def _close_to_emulation(out: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(out.float(), want.float(), rtol=BF16_ULP, atol=1e-4 * want.float().abs().max().item())


def _within_sum_error(out_MN: torch.Tensor, a_MK: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor) -> None:
    """out against the fp64 product of the dequantized operands: within half a bf16 ulp of it, plus
    the error of summing in fp32 (K * 2^-24 of the sum of the terms' magnitudes), or on Hopper in
    the FP8 MMA's fewer bits within each step (2^-13 of it, as for the rowwise mode)."""
    sum_err = 2.0**-13 if out_MN.is_cuda else a_MK.shape[1] * 2.0**-24
    a, b = a_MK.double().cpu(), b_EKN.double().cpu()
    for e, (start, end) in enumerate(zip([0, *offs.tolist()[:-1]], offs.tolist())):
        exact, magnitude = a[start:end] @ b[e], a[start:end].abs() @ b[e].abs()
        excess = (out_MN[start:end].double().cpu() - exact).abs() - BF16_ULP / 2 * exact.abs()
        assert torch.all(excess <= sum_err * magnitude), (excess / magnitude).max().item()


def _tokens(M: int, C: int, g: torch.Generator) -> torch.Tensor:
    """Rows and columns of varied magnitudes, so that the scales differ from tile to tile."""
    return (torch.randn(M, C, generator=g) * torch.rand(M, 1, generator=g) * 8 * torch.rand(C, generator=g)).bfloat16()


@pytest.mark.parametrize("dgrad", [False, True])
def test_2d3d_matches_emulation(dgrad):
    """The forward (weight blocks as quantized) and the input gradient (their transposed views),
    with K and N past one tile and not multiples of 128."""
    g = torch.Generator().manual_seed(4)
    sizes, K, N = [40, 0, 170, 64], 272, 144
    offs = make_offs(sizes, DEVICE)
    w_EKN = (torch.randn(len(sizes), K, N, generator=g) * 0.1).bfloat16()
    data_ENK, scales = blockwise.quantize_weight(w_EKN)
    if dgrad:
        b, sb, C = data_ENK.transpose(-2, -1).contiguous().transpose(-2, -1), scales.transpose(-2, -1), N
    else:
        b, sb, C = data_ENK.transpose(-2, -1), scales, K
    a, sa = blockwise.quantize_tiles(_tokens(sum(sizes) + 3, C, g), -1)
    args = [t.to(DEVICE) for t in (a, b, sa, sb, offs)]
    out = triton_fp8_gemm.blockwise_grouped_mm(*args)
    _within_sum_error(out, blockwise.dequantize_tiles(a, sa, 1), blockwise.dequantize_tiles(b, sb, 1, 2), offs)


def test_2d2d_matches_emulation():
    g = torch.Generator().manual_seed(5)
    K, N = 48, 144
    offs = make_offs(SIZES)
    a_KT, sa_TK, padded = blockwise.quantize_groups(_tokens(sum(SIZES), K, g), offs)
    g_NT, sg_TN, _ = blockwise.quantize_groups(_tokens(sum(SIZES), N, g), offs)
    args = [t.to(DEVICE) for t in (a_KT, g_NT.t(), sa_TK, sg_TN, padded)]
    out = triton_fp8_gemm.blockwise_grouped_mm(*args)
    assert out.shape == (len(SIZES), K, N) and torch.all(out[1] == 0)
    _close_to_emulation(out, blockwise.scaled_grouped_mm(*args))


def test_2d2d_group_off_a_tile_is_nan():
    """A direct call whose group does not start on a multiple of 128 tokens (the weight gradient
    pads every group to whole tiles) would take the wrong tiles' scales: its block is NaN."""
    K, N, T = 32, 32, 512
    a_KT = torch.ones(K, T, dtype=F8, device=DEVICE)
    b_TN = torch.ones(N, T, dtype=F8, device=DEVICE).t()
    offs = torch.tensor([128, 200, 384], dtype=torch.int32, device=DEVICE)
    ones = torch.ones(T // 128, K, device=DEVICE), torch.ones(T // 128, N, device=DEVICE)
    out = triton_fp8_gemm.blockwise_grouped_mm(a_KT, b_TN, *ones, offs)
    assert torch.isnan(out[1:]).all() and torch.all(out[0] == 128)


def test_blockwise_scale_shapes_are_checked():
    a = torch.zeros(8, 256, dtype=F8, device=DEVICE)
    b = torch.zeros(2, 16, 256, dtype=F8, device=DEVICE).transpose(-2, -1)
    offs = make_offs([3, 5], DEVICE)
    with pytest.raises(ValueError, match=r"scale_a \[8, 2\] and scale_b \[2, 2, 1\]"):
        triton_fp8_gemm.blockwise_grouped_mm(a, b, torch.ones(8, device=DEVICE), torch.ones(2, 16, device=DEVICE), offs)
    with pytest.raises(ValueError, match="whole tiles of 128"):
        triton_fp8_gemm.blockwise_grouped_mm(torch.zeros(16, 96, dtype=F8, device=DEVICE),
                                             torch.zeros(16, 96, dtype=F8, device=DEVICE).t(),
                                             torch.ones(1, 16, device=DEVICE), torch.ones(1, 16, device=DEVICE), offs)
