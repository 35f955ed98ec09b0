"""The shared weight rounding (kernels/shared_weight.py): one FP8 form of an expert weight that
both of its GEMMs take unchanged under rceil, checked against the rowwise contract applied to
each tile (or matrix) flattened into one row."""

import pytest
import torch
from helpers import assert_bitwise_equal, sqnr

from mxfp8_inductor import fsdp
from mxfp8_inductor.kernels import reference, rowwise, shared_weight


def _wide(E: int = 3, R: int = 64, C: int = 96, seed: int = 0) -> torch.Tensor:
    """A weight whose columns span 2^-12..2^12, so that tiles, rows and matrices scale differently."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, R, C, generator=g) * torch.logspace(-12, 12, C, base=2.0)).bfloat16()


def _by_rows(w_ERC: torch.Tensor, recipe: str, rounding: str) -> torch.Tensor:
    """The shared rounding computed independently: each 32x32 tile (mxfp8) or each matrix
    (fp8_rowwise) flattened into one row of the rowwise contract."""
    E, R, C = w_ERC.shape
    if recipe == "fp8_rowwise":
        blocks = w_ERC.reshape(E, R * C)
    else:
        blocks = w_ERC.reshape(E, R // 32, 32, C // 32, 32).permute(0, 1, 3, 2, 4).reshape(-1, 1024)
    data, scale = rowwise.quantize_rows(blocks, -1, rounding)
    out = (data.float() * scale[:, None]).bfloat16()
    if recipe == "fp8_rowwise":
        return out.reshape(E, R, C)
    return out.reshape(E, R // 32, C // 32, 32, 32).permute(0, 1, 3, 2, 4).reshape(E, R, C)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_rounding_matches_the_rowwise_contract_per_tile_or_matrix(recipe, rounding):
    w = _wide()
    assert_bitwise_equal(shared_weight.quantize_dequantize(w, recipe, rounding), _by_rows(w, recipe, rounding))


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_rounding_is_idempotent(recipe, rounding):
    """What an FP8 all-gather delivers (already rounded) rounds again to itself in the graph."""
    r = shared_weight.quantize_dequantize(_wide(), recipe, rounding)
    assert_bitwise_equal(shared_weight.quantize_dequantize(r, recipe, rounding), r)


def _per_contraction(w: torch.Tensor, recipe: str, rounding: str, dim: int) -> torch.Tensor:
    if recipe == "mxfp8":
        return reference.quantize_dequantize(w, dim, rounding)
    data, scale = rowwise.quantize_rows(w, dim, rounding)
    return (data.float() * scale.unsqueeze(dim)).bfloat16()


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_both_gemms_take_the_rounded_weight_unchanged_under_rceil(recipe):
    """Each GEMM's own quantization (along K forward, along N for the input gradient) of the
    rounded weight is exact under rceil; under floor it saturates some values a second time,
    which is why fsdp_fp8_all_gather requires rceil."""
    r = shared_weight.quantize_dequantize(_wide(), recipe, "rceil")
    for dim in (1, 2):
        assert_bitwise_equal(_per_contraction(r, recipe, "rceil", dim), r)
    f = shared_weight.quantize_dequantize(_wide(), recipe, "floor")
    assert any(not torch.equal(_per_contraction(f, recipe, "floor", dim), f) for dim in (1, 2))


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_dequantize_inverts_quantize_into_any_output_and_scales_have_the_documented_shapes(recipe):
    w = _wide()
    data, scales = shared_weight.quantize(w, recipe)
    assert data.dtype == torch.float8_e4m3fn and data.shape == w.shape
    assert scales.shape == ((3, 2, 3) if recipe == "mxfp8" else (3,))
    assert scales.dtype == (torch.uint8 if recipe == "mxfp8" else torch.float32)
    want = _by_rows(w, recipe, "rceil")
    assert_bitwise_equal(shared_weight.dequantize(data, scales, recipe, torch.bfloat16), want)
    out = torch.empty_like(w)
    assert shared_weight.dequantize(data, scales, recipe, torch.bfloat16, out=out) is out
    assert_bitwise_equal(out, want)
    assert_bitwise_equal(shared_weight.dequantize(data, scales, recipe, torch.float32), want.float())


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_gaussian_weights_lose_no_accuracy_to_the_shared_scales(recipe):
    """FP8 is floating point: a coarser block scale only costs elements far below the block's
    maximum. On Gaussian weights the shared rounding is within 0.5 dB of per-contraction scaling."""
    w = torch.randn(8, 256, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    shared = sqnr(w, shared_weight.quantize_dequantize(w, recipe))
    own = sqnr(w, _per_contraction(w, recipe, "rceil", 1))
    assert shared > 28 and shared > own - 0.5, (shared, own)


@pytest.mark.parametrize("w, recipe, message", [
    (torch.zeros(2, 64, 48), "mxfp8", "multiples of 32"),
    (torch.zeros(64), "mxfp8", r"matrices"),
    (torch.zeros(2, 64, 64), "auto", "defined for"),
    (torch.zeros(2, 64, 64, dtype=torch.int32), "mxfp8", "bf16 or fp32"),
])
def test_bad_inputs_raise(w, recipe, message):
    with pytest.raises(ValueError, match=message):
        shared_weight.quantize(w, recipe)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_extreme_magnitudes_round_as_the_contract(recipe, rounding):
    """Tiles of bf16 subnormals, of values near bf16's maximum and of zeros, beside ordinary
    ones: computing in bf16 rounds exactly as the float32 contract."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(2, 64, 64, generator=g)
    w[0, :32, :32] *= 2.0**-130  # subnormal in bf16
    w[0, 32:, :32] *= 2.0**125
    w[1, :32, 32:] = 0
    w = w.bfloat16()
    assert_bitwise_equal(shared_weight.quantize_dequantize(w, recipe, rounding), _by_rows(w, recipe, rounding))


@pytest.mark.interpreter
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_the_gpu_dequantization_route_is_bit_exact(recipe):
    """What FSDP2's hook takes on CUDA tensors: MXFP8's dequantize kernel (here under the
    interpreter) with the scales given per column, into a given output."""
    from mxfp8_inductor.kernels import triton_mx

    w = _wide(E=2, R=64, C=64)
    w[0, :32, :32] *= 2.0**-120
    data, scales = shared_weight.quantize(w, recipe)
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.empty(w.shape, dtype=dtype)
        got = triton_mx.dequantize(data, shared_weight.column_scales(scales, recipe, data.shape), -2, dtype, out)
        assert got is out
        assert_bitwise_equal(out, shared_weight.dequantize(data, scales, recipe, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_cuda_quantize_and_dequantize_equal_the_cpu_ones(recipe):
    w = _wide(E=2, R=64, C=96)
    data, scales = shared_weight.quantize(w, recipe)
    data_d, scales_d = shared_weight.quantize(w.cuda(), recipe)
    assert_bitwise_equal(data_d.cpu(), data)
    assert_bitwise_equal(scales_d.cpu(), scales)
    out = torch.empty(w.shape, dtype=torch.bfloat16, device="cuda")
    assert fsdp.dequantize(data_d, scales_d, recipe, torch.bfloat16, out) is out
    assert_bitwise_equal(out.cpu(), shared_weight.dequantize(data, scales, recipe, torch.bfloat16))
