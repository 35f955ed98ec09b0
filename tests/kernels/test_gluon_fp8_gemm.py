"""The warp-specialized Gluon FP8 grouped GEMM (2d-3d) against the `tl` kernel, bit for bit, on a
Hopper GPU; on CPU only its import guard and host checks run (Gluon has no interpreter)."""

import pytest
import torch
from helpers import make_offs

from mxfp8_inductor.kernels import gluon_fp8_gemm, triton_fp8_gemm

F8 = torch.float8_e4m3fn
POISON = 0x7FC1  # a bf16 NaN no product of finite operands gives: an element left unwritten keeps it

gpu = pytest.mark.skipif(not gluon_fp8_gemm.available(), reason="needs a 9.x CUDA GPU and Gluon")

# (group sizes, K, N, rows past the last group): uneven groups, empty ones first, last and between,
# groups smaller than a tile and not a multiple of one, K not a multiple of the 128-deep step, N
# not a multiple of the tile, 128 experts (the group table's widest), one expert, all empty
CASES = {
    "uneven": ([700, 0, 1, 513, 1200, 31, 900, 251], 1024, 1024, 500),
    "empty_ends": ([0, 0, 300, 0, 129, 0], 256, 384, 7),
    "small": ([1, 5, 0, 2, 31], 80, 200, 3),
    "one_step": ([64, 65], 16, 136, 0),
    "experts_128": (None, 512, 256, 64),
    "single": ([1000], 384, 520, 24),
    "all_empty": ([0, 0, 0], 128, 128, 40),
}


def _sizes(case: str, g: torch.Generator) -> list[int]:
    sizes = CASES[case][0]
    if sizes is None:  # 128 experts of 0 to 199 rows, a quarter of them empty
        n = torch.randint(0, 200, (128,), generator=g)
        sizes = torch.where(torch.rand(128, generator=g) < 0.25, 0, n).tolist()
    return sizes


def _random_f8(shape, g: torch.Generator) -> torch.Tensor:
    """Every finite float8_e4m3fn value, uniformly by bit pattern: products from 2^-18 to 2^17,
    so that the fp32 sums round often and any difference in summation order shows."""
    bits = torch.randint(0, 0x7F, shape, generator=g, dtype=torch.int32)  # 0x7F is NaN
    sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int32) << 7
    return (bits | sign).to(torch.uint8).view(F8)


def _pow2(shape, g: torch.Generator) -> torch.Tensor:
    return 2.0 ** torch.randint(-12, 4, shape, generator=g).float()


def _operands(case: str, seed: int = 0, expert_pad: int = 0):
    """a [M, K], b [E, K, N] (a transposed view of [E, N + expert_pad, K] cut to N rows per
    expert), scale_a [M], scale_b [E, N], offs on the GPU; M runs `tail` rows past the last group."""
    g = torch.Generator().manual_seed(seed)
    _, K, N, tail = CASES[case]
    sizes = _sizes(case, g)
    E, M = len(sizes), sum(sizes) + tail
    a_MK = _random_f8((M, K), g)
    b_ENK = _random_f8((E, N + expert_pad, K), g)[:, :N]
    args = (a_MK, b_ENK.transpose(-2, -1), _pow2((M,), g), _pow2((E, N), g), make_offs(sizes))
    return tuple(t.cuda() for t in args)


def _poisoned(M: int, N: int) -> torch.Tensor:
    return torch.full((M, N), POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)


def _assert_bit_equal(cfg, args) -> None:
    """The Gluon kernel's output on a poisoned buffer equals the `tl` kernel's bit for bit on the
    rows of the groups, and it left every row past the last group untouched."""
    a, b, _, _, offs = args
    M, N = a.shape[0], b.shape[-1]
    end = int(offs[-1]) if offs.numel() else 0
    want = triton_fp8_gemm.scaled_grouped_mm(*args)
    out = gluon_fp8_gemm._grouped_mm(*args, cfg, out=_poisoned(M, N))
    bits, want_bits = out.view(torch.int16), want.view(torch.int16)
    diff = (bits[:end] != want_bits[:end]).sum().item()
    assert diff == 0, f"{diff} of {end * N} elements differ from the tl kernel's"
    assert torch.all(bits[end:] == POISON), "rows past the last group were written"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_bit_equal_to_tl_kernel(case):
    _assert_bit_equal(gluon_fp8_gemm.DEFAULT, _operands(case))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", gluon_fp8_gemm.VARIANTS, ids=str)
@pytest.mark.parametrize("case", ["uneven", "small", "experts_128"])
def test_every_variant_bit_equal(case, cfg):
    _assert_bit_equal(cfg, _operands(case, seed=1))


@gpu
@pytest.mark.gpu
def test_fresh_data_every_run_and_public_entry():
    """Three draws through `scaled_grouped_mm` itself: the same function on any input."""
    for seed in (2, 3, 4):
        args = _operands("uneven", seed)
        end = int(args[4][-1])
        assert torch.equal(gluon_fp8_gemm.scaled_grouped_mm(*args)[:end].view(torch.int16),
                           triton_fp8_gemm.scaled_grouped_mm(*args)[:end].view(torch.int16))


@gpu
@pytest.mark.gpu
def test_experts_not_one_stride_apart_fall_back():
    """b whose experts are not N rows apart (a cut of a padded weight) cannot be one [E * N, K]
    view: the call goes to the `tl` kernel and still agrees."""
    args = _operands("empty_ends", expert_pad=8)
    end = int(args[4][-1])
    assert torch.equal(gluon_fp8_gemm.scaled_grouped_mm(*args)[:end], triton_fp8_gemm.scaled_grouped_mm(*args)[:end])


def test_imports_and_refuses_without_a_hopper_gpu():
    """Importing never fails (a CPU machine's triton may lack Gluon's Hopper API); the host checks
    are the `tl` kernel's; off a Hopper GPU the call says why instead of launching."""
    a = torch.zeros(4, 16, dtype=F8)
    b = torch.zeros(2, 32, 16, dtype=F8).transpose(-2, -1)
    sa, sb, offs = torch.ones(4), torch.ones(2, 32), torch.tensor([2, 4], dtype=torch.int32)
    a_KT, b_TN = torch.zeros(16, 32, dtype=F8), torch.zeros(48, 32, dtype=F8).t()  # the weight gradient's
    with pytest.raises(ValueError, match="2d-3d"):
        gluon_fp8_gemm.scaled_grouped_mm(a_KT, b_TN, torch.ones(32), torch.ones(96), offs)
    with pytest.raises(ValueError, match="scale_a"):
        gluon_fp8_gemm.scaled_grouped_mm(a, b, torch.ones(5), sb, offs)
    if not a.is_cuda:
        with pytest.raises(RuntimeError, match="CUDA Hopper GPU"):
            gluon_fp8_gemm.scaled_grouped_mm(a, b, sa, sb, offs)
