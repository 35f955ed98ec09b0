"""The warp-specialized Gluon FP8 grouped GEMM against the `tl` kernels, bit for bit, on a Hopper
GPU: both layouts (2d-3d: forward and input gradient; 2d-2d: weight gradient), both modes
(rowwise scales; blockwise, scales per 128 along the contraction). On CPU only its import guard
and host checks run (Gluon has no interpreter)."""

import pytest
import torch
from helpers import assert_bitwise_equal, make_offs

from mxfp8_inductor.kernels import gluon_fp8_gemm, triton_fp8_gemm
from mxfp8_inductor.kernels.blockwise import SCALE_TILE, tiles

F8 = torch.float8_e4m3fn
POISON = 0x7FC1  # a bf16 NaN neither kernel writes (their NaNs are 0x7FC0 or 0x7FFF)

gpu = pytest.mark.skipif(not gluon_fp8_gemm.available(), reason="needs a 9.x CUDA GPU and Gluon")
MODES = ["rowwise", "blockwise"]

# 2d-3d: (group sizes, K, N, rows past the last group): uneven groups, empty ones first, last and
# between, groups smaller than a tile and not a multiple of one, K not a multiple of the 128-deep
# step, N not a multiple of the tile, 128 experts (the group table's widest), one expert, all empty
CASES_2D3D = {
    "uneven": ([700, 0, 1, 513, 1200, 31, 900, 251], 1024, 1024, 500),
    "empty_ends": ([0, 0, 300, 0, 129, 0], 256, 384, 7),
    "small": ([1, 5, 0, 2, 31], 80, 200, 3),
    "one_step": ([64, 65], 16, 136, 0),
    "experts_128": (None, 512, 256, 64),
    "single": ([1000], 384, 520, 24),
    "all_empty": ([0, 0, 0], 128, 128, 40),
}
# 2d-2d: (token group sizes, K, N, tokens past the last group), rowwise groups multiples of 16
# tokens and blockwise ones of 128 (the weight gradient pads them so): last steps partial (the
# next group's tokens zeroed) and whole, empty groups first, between and last, K and N not
# multiples of the tile, 128 groups; "unreadable" has groups off the alignment, whose blocks and
# every later group's are NaN in both kernels
CASES_2D2D = {
    "uneven": ([512, 0, 48, 1040, 16, 256, 0, 400, 0], 320, 384, 48),
    "groups_128": (None, 256, 136, 0),
    "single": ([2048], 200, 520, 0),
    "unreadable": ([64, 40, 128, 104, 16], 128, 136, 0),
    "all_empty": ([0, 0, 0], 128, 128, 64),
}
BLOCKWISE_2D2D = {
    "uneven": ([512, 0, 128, 1024, 0, 384, 0], 320, 384, 128),
    "groups_128": (None, 256, 136, 0),
    "single": ([2048], 200, 520, 0),
    "unreadable": ([256, 64, 128, 320], 128, 136, 0),
    "all_empty": ([0, 0, 0], 128, 128, 128),
}


@pytest.fixture(scope="module", autouse=True)
def _tl_untuned():
    """The `tl` kernels on one config each, untuned: autotuning them anew at every test shape
    would take most of the suite's time. Their configs differ in tiling only, not in what each
    element sums (benchmarks/bench_gluon_gemm.py checks against the tuned ones)."""
    tuners = [triton_fp8_gemm._gemm_2d3d_tuned, triton_fp8_gemm._gemm_2d3d_blockwise_tuned,
              triton_fp8_gemm._gemm_2d2d_tuned, triton_fp8_gemm._gemm_2d2d_blockwise_tuned]
    saved = [t.configs for t in tuners]
    for t in tuners:
        t.configs = t.configs[:1]
    yield
    for t, configs in zip(tuners, saved):
        t.configs = configs


def _random_f8(shape, g: torch.Generator) -> torch.Tensor:
    """Every finite float8_e4m3fn value, uniformly by bit pattern: products from 2^-18 to 2^17,
    so that the fp32 sums round often and any difference in summation order shows."""
    bits = torch.randint(0, 0x7F, shape, generator=g, dtype=torch.int32)  # 0x7F is NaN
    sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int32) << 7
    return (bits | sign).to(torch.uint8).view(F8)


def _scales(shape, g: torch.Generator, pow2: bool = True, transposed: bool = False) -> torch.Tensor:
    """Powers of two (as the recipes make them), or any positive floats (where the order of the
    multiplications shows); `transposed`: the same values in a tensor of reversed strides."""
    s = 2.0 ** torch.randint(-12, 4, shape, generator=g).float() if pow2 else torch.rand(shape, generator=g) + 0.25
    return s.t().contiguous().t() if transposed else s


def _sizes(sizes, unit: int, g: torch.Generator) -> list[int]:
    if sizes is None:  # 128 groups of 0 to 24 units, a quarter of them empty
        n = torch.randint(0, 25, (128,), generator=g) * unit
        sizes = torch.where(torch.rand(128, generator=g) < 0.25, 0, n).tolist()
    return sizes


def operands_2d3d(case: str, blockwise: bool, seed: int = 0, expert_pad: int = 0, pow2: bool = True,
                  transposed: bool = False):
    """a [M, K], b [E, K, N] (a transposed view of [E, N + expert_pad, K] cut to N rows per
    expert), scales (rowwise [M] and [E, N]; blockwise [M, K / 128] and [E, K / 128, N / 128]),
    offs, on the GPU; M runs `tail` rows past the last group."""
    g = torch.Generator().manual_seed(seed)
    sizes, K, N, tail = CASES_2D3D[case]
    sizes = _sizes(sizes, 8, g)
    E, M = len(sizes), sum(sizes) + tail
    a_MK = _random_f8((M, K), g)
    b_ENK = _random_f8((E, N + expert_pad, K), g)[:, :N]
    if blockwise:
        sa, sb = _scales((M, tiles(K)), g, pow2, transposed), _scales((E, tiles(K), tiles(N)), g, pow2)
    else:
        sa, sb = _scales((M,), g), _scales((E, N), g)
    args = (a_MK, b_ENK.transpose(-2, -1), sa, sb, make_offs(sizes))
    return tuple(t.cuda() for t in args)


def operands_2d2d(case: str, blockwise: bool, seed: int = 0, pow2: bool = True, transposed: bool = False):
    """a [K, T], b [T, N] (a transposed view of [N, T]), scales (rowwise [G * K] and [G * N];
    blockwise [T / 128, K] and [T / 128, N]), offs, on the GPU; T runs `tail` tokens past the last
    group."""
    g = torch.Generator().manual_seed(seed)
    sizes, K, N, tail = (BLOCKWISE_2D2D if blockwise else CASES_2D2D)[case]
    sizes = _sizes(sizes, SCALE_TILE if blockwise else 16, g)
    G, T = len(sizes), sum(sizes) + tail
    a_KT = _random_f8((K, T), g)
    b_NT = _random_f8((N, T), g)
    if blockwise:
        sa, sb = _scales((T // SCALE_TILE, K), g, pow2, transposed), _scales((T // SCALE_TILE, N), g, pow2, transposed)
    else:
        sa, sb = _scales((G * K,), g), _scales((G * N,), g)
    args = (a_KT, b_NT.t(), sa, sb, make_offs(sizes))
    return tuple(t.cuda() for t in args)


def _poisoned(shape) -> torch.Tensor:
    return torch.full(shape, POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)


def _assert_bit_equal(cfg, args, blockwise: bool) -> None:
    """The Gluon kernel's output on a poisoned buffer equals the `tl` kernel's bit for bit (any
    NaN matching any NaN); in 2d-3d it left every row past the last group untouched, in 2d-2d it
    wrote every element."""
    a, b, _, _, offs = args
    want = (triton_fp8_gemm.blockwise_grouped_mm if blockwise else triton_fp8_gemm.scaled_grouped_mm)(*args)
    out = gluon_fp8_gemm._grouped_mm(*args, cfg, blockwise=blockwise, out=_poisoned(want.shape))
    if b.dim() == 3:
        end = int(offs[-1]) if offs.numel() else 0
        assert_bitwise_equal(out[:end], want[:end])
        assert torch.all(out[end:].view(torch.int16) == POISON), "rows past the last group were written"
    else:
        assert_bitwise_equal(out, want)
        assert torch.all(out.view(torch.int16) != POISON), "elements left unwritten"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("operands, case", [(operands_2d3d, c) for c in CASES_2D3D] +
                         [(operands_2d2d, c) for c in CASES_2D2D])
def test_bit_equal_to_tl_kernel(operands, case, mode):
    blockwise = mode == "blockwise"
    _assert_bit_equal(gluon_fp8_gemm.DEFAULT, operands(case, blockwise), blockwise)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", gluon_fp8_gemm.VARIANTS[1:], ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["2d3d", "2d2d"])
def test_every_variant_bit_equal(layout, mode, cfg):
    blockwise = mode == "blockwise"
    make = operands_2d3d if layout == "2d3d" else operands_2d2d
    _assert_bit_equal(cfg, make("uneven", blockwise, seed=1), blockwise)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["2d3d", "2d2d"])
def test_blockwise_any_scales(layout):
    """Scales of any value (the products no longer exact: the order of the multiplications and
    the add shows) and of any strides (scale_a transposed)."""
    make = operands_2d3d if layout == "2d3d" else operands_2d2d
    _assert_bit_equal(gluon_fp8_gemm.DEFAULT, make("uneven", True, seed=5, pow2=False, transposed=True), True)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["2d3d", "2d2d"])
def test_fresh_data_every_run_and_public_entry(layout, mode):
    """Three draws through the public functions: the same function on any input."""
    blockwise = mode == "blockwise"
    ours = gluon_fp8_gemm.blockwise_grouped_mm if blockwise else gluon_fp8_gemm.scaled_grouped_mm
    theirs = triton_fp8_gemm.blockwise_grouped_mm if blockwise else triton_fp8_gemm.scaled_grouped_mm
    for seed in (2, 3, 4):
        if layout == "2d3d":
            args = operands_2d3d("uneven", blockwise, seed)
            end = int(args[4][-1])
            assert torch.equal(ours(*args)[:end].view(torch.int16), theirs(*args)[:end].view(torch.int16))
        else:
            args = operands_2d2d("uneven", blockwise, seed)
            assert torch.equal(ours(*args).view(torch.int16), theirs(*args).view(torch.int16))


@gpu
@pytest.mark.gpu
def test_experts_not_one_stride_apart_fall_back():
    """b whose experts are not N rows apart (a cut of a padded weight) cannot be one [E * N, K]
    view: the call goes to the `tl` kernel and still agrees."""
    args = operands_2d3d("empty_ends", False, expert_pad=8)
    end = int(args[4][-1])
    assert torch.equal(gluon_fp8_gemm.scaled_grouped_mm(*args)[:end], triton_fp8_gemm.scaled_grouped_mm(*args)[:end])


def test_imports_and_refuses_without_a_hopper_gpu():
    """Importing never fails (a CPU machine's triton may lack Gluon's Hopper API); the host checks
    are the `tl` kernel's, in both layouts and modes; off a Hopper GPU the call says why instead
    of launching."""
    a = torch.zeros(4, 16, dtype=F8)
    b = torch.zeros(2, 32, 16, dtype=F8).transpose(-2, -1)
    sa, sb, offs = torch.ones(4), torch.ones(2, 32), torch.tensor([2, 4], dtype=torch.int32)
    a_KT, b_TN = torch.zeros(16, 128, dtype=F8), torch.zeros(48, 128, dtype=F8).t()  # the weight gradient's
    with pytest.raises(ValueError, match="scale_a"):
        gluon_fp8_gemm.scaled_grouped_mm(a, b, torch.ones(5), sb, offs)
    with pytest.raises(ValueError, match="scale_a"):
        gluon_fp8_gemm.scaled_grouped_mm(a_KT, b_TN, torch.ones(16), torch.ones(96), offs)
    with pytest.raises(ValueError, match="scale_a"):
        gluon_fp8_gemm.blockwise_grouped_mm(a, b, sa, torch.ones(2, 1, 1), offs)
    with pytest.raises(ValueError, match="whole tiles"):
        gluon_fp8_gemm.blockwise_grouped_mm(a_KT[:, :112], torch.zeros(48, 112, dtype=F8).t(), torch.ones(0, 16),
                                            torch.ones(0, 48), offs)
    if not a.is_cuda:
        for call in (lambda: gluon_fp8_gemm.scaled_grouped_mm(a, b, sa, sb, offs),
                     lambda: gluon_fp8_gemm.scaled_grouped_mm(a_KT, b_TN, torch.ones(32), torch.ones(96), offs),
                     lambda: gluon_fp8_gemm.blockwise_grouped_mm(a_KT, b_TN, torch.ones(1, 16), torch.ones(1, 48),
                                                                 offs)):
            with pytest.raises(RuntimeError, match="CUDA Hopper GPU"):
                call()


@gpu
@pytest.mark.gpu
def test_the_ops_run_gluon_on_hopper_with_the_tl_kernels_bits(monkeypatch):
    """The package's FP8 grouped-GEMM ops run the Gluon kernel on a Hopper GPU, in both layouts
    and modes, and give the `tl` kernel's bits."""
    from mxfp8_inductor.lowering.blockwise import blockwise_grouped_mm_op
    from mxfp8_inductor.lowering.rowwise import fp8_grouped_mm_op

    taken = []
    for kernel in ("scaled_grouped_mm", "blockwise_grouped_mm"):
        fn = getattr(gluon_fp8_gemm, kernel)
        monkeypatch.setattr(gluon_fp8_gemm, kernel, lambda *a, _fn=fn, _k=kernel: taken.append(_k) or _fn(*a))
    for op, kernel, blockwise in ((fp8_grouped_mm_op, "scaled_grouped_mm", False),
                                  (blockwise_grouped_mm_op, "blockwise_grouped_mm", True)):
        for layout, args in (("2d-3d", operands_2d3d("uneven", blockwise, seed=7)),
                             ("2d-2d", operands_2d2d("uneven", blockwise, seed=7))):
            taken.clear()
            got = op(*args)
            want = getattr(triton_fp8_gemm, kernel)(*args)
            assert taken == [kernel], (kernel, layout)
            rows = int(args[4][-1]) if layout == "2d-3d" else got.shape[0]
            assert_bitwise_equal(got[:rows], want[:rows])
