"""H200 runs: Triton kernels bit-exact with the reference at large shapes; grouped_mm accuracy at
MoE expert sizes of real models. Skipped without a CUDA GPU (CI is CPU-only)."""

import functools

import pytest
import torch
from helpers import assert_bitwise_equal, assert_sqnr_near, equalize_columns, pow2_scales, sqnr

import mxfp8_inductor as mx
from mxfp8_inductor import routes
from mxfp8_inductor.kernels import reference as ref
from mxfp8_inductor.lowering import mxfp8 as mx_lowering
from mxfp8_inductor.routes import Route

pytestmark = pytest.mark.gpu

# (E, D, F) of DeepSeek-V3, Llama-4-Scout, Qwen3-30B-A3B and a 64-expert model; 32768 routed tokens in uneven groups
SHAPES = {"dsv3": (8, 7168, 2048), "l4scout": (4, 5120, 8192), "qwen3_30b": (16, 2048, 768), "fine64": (64, 2048, 1536)}
TOKENS = 32768


def uneven_offs(E: int, M: int, seed: int = 0) -> torch.Tensor:
    """Uneven group sizes summing to M, with one empty group and sizes not multiples of 32."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(E, generator=g) + 0.2
    if E > 1:
        w[1] = 0
    sizes = (w / w.sum() * M).floor().long()
    sizes[0] += M - sizes.sum()
    return sizes.cumsum(0).to(torch.int32).cuda()


def _specials(x: torch.Tensor) -> torch.Tensor:
    flat = x.view(-1)
    flat[7] = float("nan")
    flat[1000] = float("inf")
    flat[5000:5064] = 0
    flat[9000:9032] = 2.0**-130
    return x


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_quantize_16k_bit_exact(dim, rounding):
    torch.manual_seed(0)
    x = _specials(torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16) * 3)
    from mxfp8_inductor.kernels import triton_mx as tri

    d_ref, s_ref = ref.quantize(x, dim, rounding)
    d_tri, s_tri = tri.quantize(x, dim, rounding)
    assert_bitwise_equal(d_tri, d_ref)
    assert_bitwise_equal(s_tri, s_ref)
    del d_tri, s_tri
    assert_bitwise_equal(tri.quantize_dequantize(x, dim, rounding), ref.quantize_dequantize(x, dim, rounding))
    assert_bitwise_equal(tri.dequantize(d_ref, s_ref, dim), ref.dequantize(d_ref, s_ref, dim))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_moe_quantizers_bit_exact(shape):
    from mxfp8_inductor.kernels import triton_mx as tri

    E, D, F = SHAPES[shape]
    torch.manual_seed(1)
    offs = uneven_offs(E, TOKENS)
    x = _specials(torch.randn(TOKENS + 7, D, device="cuda", dtype=torch.bfloat16))
    w_EFD = torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16)
    b_EDF = w_EFD.transpose(-2, -1)
    for got, want in [
        (tri.quantize_groups(x, offs), ref.quantize_groups(x, offs)),
        (tri.quantize_rows_blocked(x, offs), ref.quantize_rows_blocked(x, offs)),
        (tri.quantize_groups_blocked(x, offs), ref.quantize_groups_blocked(x, offs)),
        (tri.quantize_weight_blocked(w_EFD), ref.quantize_weight_blocked(w_EFD)),
        (tri.quantize_weight_blocked(b_EDF), ref.quantize_weight_blocked(b_EDF)),
    ]:
        for a, b in zip(got, want):
            if a.dtype == torch.int32:
                assert torch.equal(a, b)
            else:
                assert_bitwise_equal(a, b)
    assert_bitwise_equal(tri.quantize_dequantize_groups(x, offs), ref.quantize_dequantize_groups(x, offs))
    assert_bitwise_equal(tri.quantize_dequantize(b_EDF, 1), ref.quantize_dequantize(b_EDF, 1))
    assert_bitwise_equal(tri.quantize_dequantize(b_EDF, 2), ref.quantize_dequantize(b_EDF, 2))
    s = ref.quantize(x)[1]
    assert_bitwise_equal(tri.to_blocked(s), ref.to_blocked(s))
    for along, sc in (("rows", s), ("cols", ref.quantize_groups(x, offs)[1].t())):
        got, want = tri.to_blocked_groups(sc, offs, along), ref.to_blocked_groups(sc, offs, along)
        assert_bitwise_equal(got[0], want[0])
        assert torch.equal(got[1], want[1])


def test_h200_takes_the_triton_path():
    assert torch.cuda.get_device_capability()[0] != 10 or pytest.skip("Blackwell: native path")
    assert mx_lowering.gemm_path(torch.device("cuda"), 7168, 2048) == Route.MXFP8_EMULATED


@functools.cache
def spread_moe_problem(shape: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [TOKENS, D], weight [E, F, D] and output gradient [TOKENS, F] of a MoE shape, bf16
    on the CPU (a CPU run measures the same numbers), spread as test_ops._spread_problem spreads
    its own: one power of two across 2^-10..2^10 per 32-column block of the tokens, divided out of
    the weight's matching columns (every product keeps its size, each token row spans 2^20, which
    fp8_rowwise's one scale per row cannot hold), one per weight column along D and one per token
    row of the tokens and of the output gradient."""
    E, D, F = SHAPES[shape]
    g = torch.Generator().manual_seed(2)
    block_D = pow2_scales(D, g, run=32)
    a = torch.randn(TOKENS, D, generator=g) * pow2_scales(TOKENS, g)[:, None] * block_D
    w = torch.randn(E, F, D, generator=g) * D**-0.5 * (pow2_scales(D, g) / block_D)
    grad = torch.randn(TOKENS, F, generator=g) * pow2_scales(TOKENS, g)[:, None]
    return a.bfloat16(), w.bfloat16(), grad.bfloat16()


# SQNR (dB) against bf16 on spread_moe_problem of the output, the input gradient with its columns
# equalized (test_ops.SPREAD_DB says why) and the weight gradient, by (shape, recipe): measured
# on the CPU with the same data, its bf16 GEMMs done in fp32 and rounded to bf16 as the GPU's
# are (the quantized operands are bit-exact with the GPU's, only the summation order differs).
# fp8_rowwise's output sits 22-23 dB below mxfp8's.
MOE_SHAPES_DB = {
    ("dsv3", "mxfp8"): (28.5, 28.5, 28.5),
    ("dsv3", "fp8_rowwise"): (5.6, 28.5, 28.5),
    ("fine64", "mxfp8"): (28.5, 28.5, 28.5),
    ("fine64", "fp8_rowwise"): (6.4, 28.5, 28.5),
    ("l4scout", "mxfp8"): (28.5, 28.5, 28.5),
    ("l4scout", "fp8_rowwise"): (5.7, 28.5, 28.5),
    ("qwen3_30b", "mxfp8"): (28.5, 28.5, 28.5),
    ("qwen3_30b", "fp8_rowwise"): (5.4, 28.5, 28.5),
}
GPU_TOL_DB = 1.5  # the summation order of cuBLAS and of the FP8 GEMMs, against the CPU's


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_grouped_mm_sqnr_moe_shapes(shape, transposed, recipe):
    E, D, F = SHAPES[shape]
    offs = uneven_offs(E, TOKENS, seed=3)
    a, w, grad = (t.cuda() for t in spread_moe_problem(shape))
    if not transposed:
        w = w.transpose(-2, -1).contiguous()

    def run(fn):
        a_ = a.clone().requires_grad_()
        w_ = w.clone().requires_grad_()
        out = fn(a_, w_.transpose(-2, -1) if transposed else w_, offs)
        out.backward(grad)
        return out, a_.grad, w_.grad

    out, da, dw = run(lambda a, b, offs: mx.grouped_mm(a, b, offs, recipe=recipe))
    out_r, da_r, dw_r = run(torch._grouped_mm)
    expected = MOE_SHAPES_DB[shape, recipe]
    assert_sqnr_near(out_r, out, expected[0], GPU_TOL_DB, "output")
    assert_sqnr_near(*equalize_columns(da_r, da), expected[1], GPU_TOL_DB, "input gradient")
    assert_sqnr_near(dw_r, dw, expected[2], GPU_TOL_DB, "weight gradient")


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_compile_fullgraph_on_gpu(recipe):
    E, D, F = SHAPES["qwen3_30b"]
    offs = uneven_offs(E, 4096)
    a = torch.randn(4096, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fn = lambda a, b, offs: mx.grouped_mm(a, b, offs, recipe=recipe)  # noqa: E731
    out = torch.compile(fn, fullgraph=True)(a, w.transpose(-2, -1), offs)
    out.sum().backward()
    want = fn(a.detach(), w.detach().transpose(-2, -1), offs)
    # the compiled rowwise quantizers are the same functions, fused: bit-identical operands
    assert_bitwise_equal(out.detach(), want)


@pytest.mark.parametrize("shape", ["fine64", "dsv3"])
def test_rowwise_fp8_gemms_match_their_emulation(monkeypatch, shape):
    """The FP8 grouped GEMMs (forward 2d-3d, input grad, weight grad 2d-2d on padded groups)
    compute what the CPU emulation computes, up to fp32 accumulation order: ours at fine64's ~512
    tokens per group, torch's at dsv3's ~4096 (`routes.route`)."""
    E, D, F = SHAPES[shape]
    torch.manual_seed(4)
    offs = uneven_offs(E, TOKENS)
    a = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16) * D**-0.5
    grad = torch.randn(TOKENS, F, device="cuda", dtype=torch.bfloat16)

    def run():
        a_, w_ = a.clone().requires_grad_(), w.clone().requires_grad_()
        out = mx.grouped_mm(a_, w_.transpose(-2, -1), offs, recipe="fp8_rowwise")
        out.backward(grad)
        return out, a_.grad, w_.grad

    got = run()
    monkeypatch.setattr(routes, "has_fp8_grouped_mm", lambda device: False)
    want = run()
    L = int(offs[-1])
    assert sqnr(want[0][:L], got[0][:L]) >= 40
    assert sqnr(want[1][:L], got[1][:L]) >= 40
    assert sqnr(want[2], got[2]) >= 40


def test_fp8_gemm_autotunes_per_rows_per_group():
    """One (N, K) at 16 and at 512 rows per group gets a config tuned for each, in both layouts
    (2d-2d group ends are multiples of 16, as the weight gradient pads them), and the 2d-3d
    result equals torch's FP8 grouped GEMM."""
    from mxfp8_inductor.kernels import launch, triton_fp8_gemm

    E, K, N = 64, 256, 384
    b_ENK = torch.randn(E, N, K, device="cuda").to(torch.float8_e4m3fn)
    for rows in (16, 512):
        M = E * rows
        a_MK = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
        offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * rows
        sa, sb = torch.rand(M, device="cuda") + 0.5, torch.rand(E, N, device="cuda") + 0.5
        got = triton_fp8_gemm.scaled_grouped_mm(a_MK, b_ENK.transpose(-2, -1), sa, sb, offs)
        want = torch._scaled_grouped_mm(a_MK, b_ENK.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16)
        assert_bitwise_equal(got, want)
        g_NM = torch.randn(N, M, device="cuda").to(torch.float8_e4m3fn)
        triton_fp8_gemm.scaled_grouped_mm(a_MK.t().contiguous(), g_NM.t(), torch.ones(E * K, device="cuda"),
                                          torch.ones(E * N, device="cuda"), offs)
    for tuned, nk in ((triton_fp8_gemm._gemm_2d3d_tuned, (N, K)), (triton_fp8_gemm._gemm_2d2d_tuned, (K, N))):
        keys = {key for t, key in launch._picked if t is tuned and key[:2] == nk}
        assert keys == {(*nk, 16), (*nk, 512)}


def test_rowwise_dense_linear_matches_its_emulation(monkeypatch):
    """A dense fp8_rowwise linear with a token count that is not a multiple of 16: its weight
    gradient pads the tokens for torch's FP8 GEMM (`rowwise.dense_wgrad`), which must add nothing;
    all three GEMMs compute what the CPU emulation computes, up to fp32 accumulation order."""
    torch.manual_seed(5)
    M, K, N = 1000, 2048, 1536
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5
    grad = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)

    def run():
        x_, w_ = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = mx.linear(x_, w_, recipe="fp8_rowwise")
        out.backward(grad)
        return out, x_.grad, w_.grad

    got = run()
    monkeypatch.setattr(routes, "has_fp8_grouped_mm", lambda device: False)
    for want, have in zip(run(), got):
        assert sqnr(want, have) >= 40


@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("groups", [64, 8])  # the one-kernel path and the two-kernel one
def test_rowwise_group_quantizer_bit_exact_on_gpu(rounding, groups):
    from mxfp8_inductor.kernels import rowwise, triton_rowwise

    assert (groups >= triton_rowwise.GROUPS_KERNEL_MIN_GROUPS) == (groups == 64)
    offs = uneven_offs(groups, TOKENS)
    x = _specials(torch.randn(TOKENS + 5, 2048, device="cuda", dtype=torch.bfloat16))
    for got, want in zip(triton_rowwise.quantize_groups(x, offs, rounding), rowwise.quantize_groups(x, offs, rounding)):
        assert_bitwise_equal(got, want)


@pytest.mark.parametrize("shape", [(8, 2048, 1536), (3, 70, 200)])
def test_rowwise_weight_quantizer_bit_exact_on_gpu(shape):
    from mxfp8_inductor.kernels import shared_weight, triton_rowwise

    b = _specials(torch.randn(*shape, device="cuda").bfloat16())
    for view in (b, b.transpose(-2, -1).contiguous().transpose(-2, -1)):
        got = triton_rowwise.quantize_weight_shared(view)
        for g, want in zip(got, shared_weight.quantize(view, "fp8_rowwise")):
            assert_bitwise_equal(g, want)
        assert got[0].stride() == view.stride()


@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("shape", [(TOKENS + 5, 2048), (8, 2048, 1536), (3, 70, 200)])
def test_rowwise_row_quantizer_bit_exact_on_gpu(shape, rounding):
    """The eager GEMMs' rows along the last dim (activations; a weight's rows along K or N)."""
    from mxfp8_inductor.kernels import rowwise, triton_rowwise

    x = _specials(torch.randn(*shape, device="cuda").bfloat16())
    for view in (x, x.transpose(-2, -1).contiguous().transpose(-2, -1)):
        for got, want in zip(triton_rowwise.quantize_rows(view, rounding), rowwise.quantize_rows(view, -1, rounding)):
            assert_bitwise_equal(got, want)


def test_cached_launch_keys_alignment_and_layout():
    """Repeated calls take the bound launch of the first (`launch.bind`): an aligned input, the
    same shape one element off 16-byte alignment, and its transposed view must each get their
    own compiled kernel, bit-exact."""
    from mxfp8_inductor.kernels import launch
    from mxfp8_inductor.kernels import triton_mx as tri

    base = torch.randn(1024 * 256 + 8, device="cuda", dtype=torch.bfloat16)
    aligned = base[: 1024 * 256].view(1024, 256)
    misaligned = base[1 : 1024 * 256 + 1].view(1024, 256)
    assert misaligned.data_ptr() % 16 != 0
    launch._compiled.clear()
    launch._bound.clear()
    tri._plans.clear()
    for x in (aligned, misaligned, aligned.t()):
        for _ in range(3):  # the first call fills the cache, the others launch from it
            assert_bitwise_equal(tri.quantize_dequantize(x, 1, "rceil"), ref.quantize_dequantize(x, 1, "rceil"))
    compiled = [entry[0] for entry in launch._compiled.values()]
    assert len(compiled) == 3 and len(set(map(id, compiled))) == 3
    assert len(launch._bound) == 3
