"""The Triton FP8 rowwise grouped GEMM against the emulation (interpreter on CPU, float8 tensor
cores on a GPU) and against torch's FP8 grouped GEMM (GPU)."""

import pytest
import torch
from helpers import make_offs, sqnr

from mxfp8_inductor.kernels import rowwise, triton_fp8_gemm

# Both sides sum exact float8 products in fp32 (Hopper: in a few bits less within each BK step)
# and round once to bf16: they differ by at most one bf16 ulp (2^-7 relative) unless the sum cancels.
BF16_ULP = 2.0**-7
F8 = torch.float8_e4m3fn
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _assert_close_to_emulation(out: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(out.float(), want.float(), rtol=BF16_ULP, atol=1e-4 * want.float().abs().max().item())


def _tokens(M: int, C: int, g: torch.Generator) -> torch.Tensor:
    """bf16 rows and columns of varied magnitudes, so the rowwise scales differ."""
    return (torch.randn(M, C, generator=g) * torch.rand(M, 1, generator=g) * 8 * torch.rand(C, generator=g)).bfloat16()


def _forward_operands(sizes, K, N, tail=3, seed=0):
    """As `lowering.rowwise.forward`: a [M, K] and b [E, K, N], a transposed view of a
    contiguous [E, N, K]."""
    g = torch.Generator().manual_seed(seed)
    offs = make_offs(sizes, DEVICE)
    x = _tokens(int(offs[-1]) + tail, K, g).to(DEVICE)
    w_ENK = (torch.randn(len(sizes), N, K, generator=g) * 0.1).bfloat16().to(DEVICE)
    a, sa = rowwise.quantize_rows(x, -1)
    w, sw = rowwise.quantize_rows(w_ENK, -1)
    return a.contiguous(), w.contiguous().transpose(-2, -1), sa, sw, offs


FORWARD_CASES = {
    "uneven": ([40, 0, 17, 64], 80, 40),
    "single": ([70], 48, 24),
    "empty_first": ([0, 0, 45], 32, 64),
    "smaller_than_a_tile": ([1, 5, 0, 2, 31], 16, 8),
}


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_2d3d_matches_emulation(case):
    sizes, K, N = FORWARD_CASES[case]
    args = _forward_operands(sizes, K, N)
    end = sum(sizes)
    out = triton_fp8_gemm.scaled_grouped_mm(*args)
    assert out.shape == (args[0].shape[0], N) and out.dtype == torch.bfloat16
    _assert_close_to_emulation(out[:end], rowwise.scaled_grouped_mm(*args)[:end])


def _wgrad_operands(sizes, K, N, seed=0, device=DEVICE, nan_rows=()):
    """As `lowering.rowwise.wgrad`: a [K, T] and b [T, N] (a transposed view of [N, T]), the
    tokens of each group padded with zeros to a multiple of 16, scales per group and column;
    the tokens of `nan_rows` NaN in both operands."""
    g = torch.Generator().manual_seed(seed)
    offs = make_offs(sizes, device)
    x_MK = _tokens(int(offs[-1]), K, g).to(device)
    grad_MN = _tokens(int(offs[-1]), N, g).to(device)
    x_MK[list(nan_rows)] = grad_MN[list(nan_rows)] = float("nan")
    a_KT, sa_GK, padded = rowwise.quantize_groups(x_MK, offs)
    g_NT, sg_GN, _ = rowwise.quantize_groups(grad_MN, offs)
    return a_KT.contiguous(), g_NT.contiguous().t(), sa_GK.reshape(-1), sg_GN.reshape(-1), padded


WGRAD_CASES = {
    "uneven": ([40, 0, 17, 64], 48, 40),
    "single": ([70], 32, 24),
    "empty_last": ([33, 0], 16, 64),
    "smaller_than_a_tile": ([1, 5, 0, 2, 31], 16, 8),
    "rows_off_16_bytes": ([40, 0, 17, 64], 48, 36),  # no TMA store: stored through pointers
    "runs_of_unequal_length": ([40, 0, 17, 64], 48, 72),  # 3 column tiles in runs of at most 2
}


@pytest.mark.parametrize("case", WGRAD_CASES)
def test_2d2d_matches_emulation(case):
    """The weight gradient's layout: every group's block, an empty group's zero."""
    sizes, K, N = WGRAD_CASES[case]
    args = _wgrad_operands(sizes, K, N)
    out = triton_fp8_gemm.scaled_grouped_mm(*args)
    assert out.shape == (len(sizes), K, N) and out.dtype == torch.bfloat16
    want = rowwise.scaled_grouped_mm(*args)
    empty = torch.tensor(sizes) == 0
    assert torch.all(out[empty] == 0)
    _assert_close_to_emulation(out[~empty], want[~empty])


def test_2d2d_group_ends_off_multiples_of_16():
    """Groups that start or end off a multiple of 16 tokens (the weight gradient pads every
    group; a direct call need not), which TMA cannot read: their blocks are NaN, not a fault on a
    GPU; the other groups' blocks are right and an empty group's is zero."""
    g = torch.Generator().manual_seed(3)
    sizes, K, N = [16, 5, 11, 32, 0, 7], 48, 40
    offs = make_offs(sizes, DEVICE)
    T = 80  # past offs[-1] = 71: tokens no group holds
    a_KT = (torch.randn(K, T, generator=g) * 8).to(F8).to(DEVICE)
    b_TN = (torch.randn(N, T, generator=g) * 8).to(F8).to(DEVICE).t()
    scales = [2.0 ** torch.randint(-4, 5, (len(sizes) * C,), generator=g).float().to(DEVICE) for C in (K, N)]
    out = triton_fp8_gemm.scaled_grouped_mm(a_KT, b_TN, *scales, offs)
    # on the CPU: torch's grouped GEMM, which the emulation calls on a GPU, asserts on such groups
    want = rowwise.scaled_grouped_mm(a_KT.cpu(), b_TN.cpu(), *[t.cpu() for t in scales], offs.cpu()).to(DEVICE)
    assert torch.isnan(out[[1, 2, 5]]).all()
    assert torch.all(out[4] == 0)
    _assert_close_to_emulation(out[[0, 3]], want[[0, 3]])


def test_2d2d_nan_stays_in_its_group():
    """A group's contraction ends at its own last token: NaN tokens of the next group (which a
    tile's last step would reach, both operands read past the end) leave it finite."""
    sizes = [40, 24, 17]
    args = _wgrad_operands(sizes, 48, 40, nan_rows=range(40, 64))
    out = triton_fp8_gemm.scaled_grouped_mm(*args)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    want = rowwise.scaled_grouped_mm(*args)
    _assert_close_to_emulation(out[[0, 2]], want[[0, 2]])


def test_second_call_with_other_values_and_group_ends_uses_its_own_tensors():
    """The second call takes the launch bound by the first (`launch.launch_keyed`)."""
    for seed, sizes in enumerate(([40, 0, 17, 64], [64, 17, 0, 40])):
        args = _forward_operands(sizes, 80, 40, seed=seed)
        end = sum(sizes)
        got, want = triton_fp8_gemm.scaled_grouped_mm(*args), rowwise.scaled_grouped_mm(*args)
        _assert_close_to_emulation(got[:end], want[:end])


def test_two_programs_per_sm_cover_every_tile(monkeypatch):
    """A config of PER_SM = 2 (the grid from the config, tiles strided by the grid's size): every
    tile of both layouts written, as with one program per SM."""
    monkeypatch.setattr(triton_fp8_gemm, "INTERPRETER_CONFIG", {**triton_fp8_gemm.INTERPRETER_CONFIG, "PER_SM": 2})
    sizes = [50, 3, 0, 29]
    args = _forward_operands(sizes, 96, 72, seed=5)
    got, want = triton_fp8_gemm.scaled_grouped_mm(*args), rowwise.scaled_grouped_mm(*args)
    _assert_close_to_emulation(got[:sum(sizes)], want[:sum(sizes)])
    args = _wgrad_operands(sizes, 80, 72, seed=5)
    got, want = triton_fp8_gemm.scaled_grouped_mm(*args), rowwise.scaled_grouped_mm(*args)
    assert torch.all(got[2] == 0)
    _assert_close_to_emulation(got[[0, 1, 3]], want[[0, 1, 3]])


def test_only_the_sums_and_the_bf16_rounding_are_inexact():
    """Against the fp64 product of the dequantized operands: within half a bf16 ulp of it, plus
    the error bound of summing K terms in fp32 (K * 2^-24 times the sum of their magnitudes); on
    Hopper, FP8 MMAs add within each BK step in fewer bits (2^-16.5 of the sum measured here)."""
    K = 64
    sum_err = 2.0**-13 if DEVICE == "cuda" else K * 2.0**-24
    a, b, sa, sb, offs = _forward_operands([20, 30], K=K, N=16, tail=0, seed=3)
    out = triton_fp8_gemm.scaled_grouped_mm(a, b, sa, sb, offs).double()
    a_d = a.double() * sa.double()[:, None]
    b_d = b.double() * sb.double()[:, None, :]
    exact = torch.cat([a_d[:20] @ b_d[0], a_d[20:] @ b_d[1]])
    magnitude = torch.cat([a_d[:20].abs() @ b_d[0].abs(), a_d[20:].abs() @ b_d[1].abs()])
    excess = (out - exact).abs() - BF16_ULP / 2 * exact.abs()
    assert torch.all(excess <= sum_err * magnitude), (excess / magnitude).max().item()


def _bad(args, **changes):
    a, b, sa, sb, offs = args
    return {"a": a, "b": b, "scale_a": sa, "scale_b": sb, "offs": offs} | changes


def _shifted(t: torch.Tensor, by: int = 1) -> torch.Tensor:
    """A copy of t that starts `by` elements past an allocation's (aligned) start."""
    buf = torch.zeros(t.numel() + by, dtype=t.dtype, device=t.device)
    return buf[by:].view(t.shape).copy_(t)


F_ARGS = _forward_operands([3, 5], K=16, N=8)
W_ARGS = _wgrad_operands([3, 5], K=16, N=8)
BAD_INPUTS = {
    "a_not_fp8": (_bad(F_ARGS, a=F_ARGS[0].bfloat16()), "float8_e4m3fn"),
    "scale_not_fp32": (_bad(F_ARGS, scale_a=F_ARGS[2].double()), "float32"),
    "offs_not_int32": (_bad(F_ARGS, offs=F_ARGS[4].long()), "int32"),
    "a_3d": (_bad(F_ARGS, a=F_ARGS[0].unsqueeze(0)), "2-D"),
    "a_column_major": (_bad(F_ARGS, a=F_ARGS[0].t().contiguous().t()), "row-major"),
    "b_contiguous": (_bad(F_ARGS, b=F_ARGS[1].contiguous()), r"stride\(-2\) == 1"),
    "k_mismatch": (_bad(F_ARGS, b=F_ARGS[1][:, :8]), "contraction dims"),
    "offs_per_expert": (_bad(F_ARGS, offs=F_ARGS[4][:1]), "one group end per expert"),
    "scale_b_shape": (_bad(F_ARGS, scale_b=F_ARGS[3].reshape(-1)), r"scale_b \[2, 8\]"),
    "b_4d": (_bad(F_ARGS, b=F_ARGS[1][None]), "b 3-D"),
    "a_unaligned": (_bad(F_ARGS, a=_shifted(F_ARGS[0])), "16-byte aligned"),
    "scale_a_2d2d": (_bad(W_ARGS, scale_a=W_ARGS[2][:-1]), r"scale_a \[32\]"),
    "offs_2d2d": (_bad(W_ARGS, offs=W_ARGS[4].to(torch.int64)), "int32"),
    "a_row_stride": (_bad(F_ARGS, a=torch.zeros(8, 24, dtype=F8, device=DEVICE)[:, :16]), "16-byte aligned"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise(case):
    kwargs, match = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=match):
        triton_fp8_gemm.scaled_grouped_mm(**kwargs)


@pytest.mark.gpu
def test_equals_torch_scaled_grouped_mm_on_gpu():
    """Both kernels fold every 128-deep K step of the FP8 MMA into an fp32 accumulator and scale
    in the epilogue: on Hopper their outputs agree bit for bit, partial tiles and empty groups
    included."""
    g = torch.Generator().manual_seed(0)
    sizes = [700, 0, 1, 513, 1200, 31, 900, 251]  # 3596 of 4096 tokens: the rest is past the end
    M, K, N = 4096, 1024, 1024
    offs = make_offs(sizes, "cuda")
    a, sa = rowwise.quantize_rows(_tokens(M, K, g).cuda(), -1)
    w, sw = rowwise.quantize_rows((torch.randn(len(sizes), N, K, generator=g) * 0.1).bfloat16().cuda(), -1)
    args, valid = (a, w.transpose(-2, -1), sa, sw, offs), slice(0, sum(sizes))
    want = torch._scaled_grouped_mm(*args[:4], offs=args[4], out_dtype=torch.bfloat16)
    out = triton_fp8_gemm.scaled_grouped_mm(*args)
    assert torch.equal(out[valid], want[valid]), sqnr(want[valid], out[valid])


@pytest.mark.gpu
def test_2d2d_equals_torch_scaled_grouped_mm_on_gpu():
    sizes = [700, 0, 1, 513, 1200, 31, 900, 251]
    args = _wgrad_operands(sizes, 512, 384, device="cuda")
    want = torch._scaled_grouped_mm(*args[:4], offs=args[4], out_dtype=torch.bfloat16)
    out = triton_fp8_gemm.scaled_grouped_mm(*args)
    full = torch.tensor(sizes) > 0  # torch's kernel leaves an empty group's block unwritten
    assert torch.all(out[~full] == 0)
    assert torch.equal(out[full], want[full]), sqnr(want[full], out[full])


def test_opcheck_of_the_custom_op():
    """`mxfp8::fp8_grouped_mm`, the op the rowwise decomposition emits for small token groups, in
    both layouts: schema, fake shapes and dispatch agree with the kernel (no rows past offs[-1]: those are
    unspecified). Not test_schema: its checker multiplies the inputs, which float8 does not on CPU."""
    from mxfp8_inductor.lowering import rowwise as rw_lowering

    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for operands in (_forward_operands([40, 0, 17, 64], 64, 32, tail=0), _wgrad_operands([40, 0, 17, 64], 48, 32)):
        torch.library.opcheck(rw_lowering.fp8_grouped_mm_op, operands, test_utils=utils)
