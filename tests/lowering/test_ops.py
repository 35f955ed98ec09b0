"""mxfp8_inductor.grouped_mm: accuracy vs bf16, paths, custom-op contracts, compile, bad input."""


import functools
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal, assert_sqnr_near, equalize_columns, make_offs, pow2_scales
from torch._subclasses.fake_tensor import FakeTensorMode

import mxfp8_inductor as mx
from mxfp8_inductor import routes
from mxfp8_inductor.kernels import reference, rowwise, triton_mx
from mxfp8_inductor.lowering import mxfp8 as mx_lowering
from mxfp8_inductor.lowering import ops as gm
from mxfp8_inductor.lowering import rowwise as rw_lowering
from mxfp8_inductor.lowering.impls import IMPLS
from mxfp8_inductor.options import MXFP8Config
from mxfp8_inductor.routes import Route

# uneven groups: empty ones, sizes that are not multiples of 32, and rows past offs[-1]
GROUPS = {
    1: [77],
    4: [100, 0, 37, 119],
    8: [0, 33, 64, 1, 90, 0, 31, 45],
    64: [(7 * i) % 41 for i in range(64)],
}


def _problem(E, K=128, N=96, dtype=torch.bfloat16, transposed=True, seed=0, tail=5):
    g = torch.Generator().manual_seed(seed)
    offs = make_offs(GROUPS[E])
    M = int(offs[-1]) + tail
    a = torch.randn(M, K, generator=g).to(dtype)
    if transposed:  # TorchTitan / HF Mixtral: [E, N, K] parameter passed as a transposed view
        w = (torch.randn(E, N, K, generator=g) * 0.05).to(dtype)
        b_of = lambda w: w.transpose(-2, -1)  # noqa: E731
    else:  # gpt-oss: a contiguous [E, K, N] parameter
        w = (torch.randn(E, K, N, generator=g) * 0.05).to(dtype)
        b_of = lambda w: w  # noqa: E731
    grad = torch.randn(M, N, generator=g).to(dtype)
    return a, w, b_of, offs, grad


def _spread_problem(E: int, transposed: bool = True, dtype: torch.dtype = torch.bfloat16):
    """_problem's tensors with magnitudes spread over 2^-10..2^10 by powers of two, where the
    recipes differ (docs/design.md, "Numerics contract"). One exponent per 32-column block of the
    tokens, divided out of the weight's matching rows: every product keeps its size while each
    token row spans 2^20, which MXFP8's per-block scales hold and fp8_rowwise's one scale per row
    cannot (it flushes the blocks far below the row's max). One exponent per weight row along K:
    harmless where K is the contraction (the forward), ruinous for blocks along K where it is not
    (the input gradient). One per token row of the tokens and of the output gradient. The values
    do not depend on the weight's layout."""
    K, N = 128, 96
    g = torch.Generator().manual_seed(0)
    offs = make_offs(GROUPS[E])
    M = int(offs[-1]) + 5
    block_K = pow2_scales(K, g, run=32)
    a = torch.randn(M, K, generator=g) * pow2_scales(M, g)[:, None] * block_K
    b_EKN = torch.randn(E, K, N, generator=g) * 0.05 * (pow2_scales(K, g) / block_K)[:, None]
    grad = torch.randn(M, N, generator=g) * pow2_scales(M, g)[:, None]
    if transposed:  # TorchTitan / HF Mixtral: [E, N, K] parameter passed as a transposed view
        w, b_of = b_EKN.transpose(-2, -1).contiguous(), lambda w: w.transpose(-2, -1)
    else:  # gpt-oss: a contiguous [E, K, N] parameter
        w, b_of = b_EKN, lambda w: w
    return a.to(dtype), w.to(dtype), b_of, offs, grad.to(dtype)


def _run(fn, a, w, b_of, offs, grad):
    a = a.clone().requires_grad_()
    w = w.clone().requires_grad_()
    out = fn(a, b_of(w), offs)
    out.backward(grad)
    return out.detach(), a.grad, w.grad


def _bf16(a, b, offs):
    return torch._grouped_mm(a, b, offs)


# SQNR (dB) against bf16 on _spread_problem, measured on CPU, by (E, recipe, rounding): output,
# input gradient with its columns equalized, weight gradient. fp8_rowwise's output sits 23-26 dB
# below mxfp8's (its one scale per token row flushes the blocks 2^20 below the row's max); floor
# loses 1.6-2.8 dB on the output to rceil (block maxima past 448 saturate). The input gradient's
# columns are equalized because the weight's rows along K differ by up to 2^20: blocks along K
# for the input gradient (the wrong axis) ruin the small rows' columns (10-13 dB), which the plain
# SQNR, made of the large columns, would not show.
SPREAD_DB = {
    (1, "mxfp8", "rceil"): (27.5, 27.6, 28.3),
    (1, "mxfp8", "floor"): (25.0, 26.6, 24.3),
    (1, "fp8_rowwise", "rceil"): (3.4, 27.6, 28.3),
    (1, "fp8_rowwise", "floor"): (3.4, 27.4, 25.5),
    (4, "mxfp8", "rceil"): (28.7, 27.7, 28.1),
    (4, "mxfp8", "floor"): (25.9, 26.6, 26.9),
    (4, "fp8_rowwise", "rceil"): (5.0, 27.7, 28.1),
    (4, "fp8_rowwise", "floor"): (5.0, 27.2, 27.3),
    (8, "mxfp8", "rceil"): (28.4, 28.1, 29.1),
    (8, "mxfp8", "floor"): (26.3, 26.9, 26.0),
    (8, "fp8_rowwise", "rceil"): (5.0, 28.1, 29.1),
    (8, "fp8_rowwise", "floor"): (5.0, 27.8, 26.2),
    (64, "mxfp8", "rceil"): (28.4, 28.5, 28.4),
    (64, "mxfp8", "floor"): (26.8, 27.2, 25.2),
    (64, "fp8_rowwise", "rceil"): (2.5, 28.5, 28.4),
    (64, "fp8_rowwise", "floor"): (2.5, 27.8, 25.2),
}
# the data is seeded and the CPU kernels deterministic: 1 dB is room for another BLAS's summation
# order, and keeps rceil and floor (at least 1.6 dB apart on each mxfp8 output) apart
SPREAD_TOL_DB = 1.0


def _assert_spread_sqnrs(ref: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...], L: int,
                         expected: tuple[float, float, float]) -> None:
    """Output, equalized input gradient (rows below L) and weight gradient near their expected SQNRs."""
    (out_r, da_r, dw_r), (out, da, dw) = ref, got
    assert_sqnr_near(out_r[:L], out[:L], expected[0], SPREAD_TOL_DB, "output")
    assert_sqnr_near(*equalize_columns(da_r[:L], da[:L]), expected[1], SPREAD_TOL_DB, "input gradient")
    assert_sqnr_near(dw_r, dw, expected[2], SPREAD_TOL_DB, "weight gradient")


@pytest.mark.parametrize("E", sorted(GROUPS))
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_sqnr_vs_bf16(E, rounding, transposed, recipe):
    a, w, b_of, offs, grad = _spread_problem(E, transposed=transposed)
    fn = lambda a, b, o: mx.grouped_mm(a, b, o, recipe=recipe, rounding=rounding)  # noqa: E731
    got = _run(fn, a, w, b_of, offs, grad)
    _assert_spread_sqnrs(_run(_bf16, a, w, b_of, offs, grad), got, int(offs[-1]), SPREAD_DB[E, recipe, rounding])
    empty = torch.tensor(GROUPS[E]) == 0
    assert torch.all(got[2][empty] == 0)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_wgrad_bf16_keeps_weight_gradient_exact(recipe):
    a, w, b_of, offs, grad = _problem(8)
    _, _, dw = _run(lambda a, b, o: mx.grouped_mm(a, b, o, recipe=recipe, wgrad="bf16"), a, w, b_of, offs, grad)
    _, _, dw_r = _run(_bf16, a, w, b_of, offs, grad)
    assert torch.equal(dw, dw_r)


# fp32 inputs are quantized as they are, against the bf16 run on their bf16 casts: near the bf16
# inputs' values (SPREAD_DB's E=4), fp8_rowwise's output again ~24 dB below mxfp8's
FP32_SPREAD_DB = {"mxfp8": (28.7, 27.8, 28.1), "fp8_rowwise": (5.0, 27.8, 28.1)}


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_fp32_inputs(recipe):
    a, w, b_of, offs, grad = _spread_problem(4, dtype=torch.float32)
    got = _run(lambda a, b, o: mx.grouped_mm(a, b, o, recipe=recipe), a, w, b_of, offs, grad)
    assert got[0].dtype == got[1].dtype == got[2].dtype == torch.float32
    ref = _run(_bf16, a.bfloat16(), w.bfloat16(), b_of, offs, grad.bfloat16())
    _assert_spread_sqnrs(ref, got, int(offs[-1]), FP32_SPREAD_DB[recipe])


@pytest.mark.interpreter
def test_triton_path_matches_reference_path(monkeypatch):
    """The GPU emulation path (Triton quantize-dequantize + bf16 grouped GEMM) equals the CPU path bit for bit."""
    a, w, b_of, offs, grad = _problem(4, K=64, N=64)
    expected = _run(mx.grouped_mm, a, w, b_of, offs, grad)
    monkeypatch.setattr(mx_lowering, "implementation", lambda device: triton_mx)
    got = _run(mx.grouped_mm, a, w, b_of, offs, grad)
    L = int(offs[-1])
    assert_bitwise_equal(got[0][:L], expected[0][:L])
    assert_bitwise_equal(got[1][:L], expected[1][:L])
    assert_bitwise_equal(got[2], expected[2])


@pytest.mark.interpreter
@pytest.mark.parametrize("transposed", [True, False])
def test_fused_path_matches_reference_path(monkeypatch, transposed):
    """The fused GEMMs multiply the reference path's MXFP8 values: output and both gradients
    equal up to the order of the fp32 sums (one bf16 rounding of the same products)."""
    a, w, b_of, offs, grad = _problem(8, K=64, N=96, transposed=transposed)
    expected = _run(mx.grouped_mm, a, w, b_of, offs, grad)
    monkeypatch.setattr(mx_lowering, "gemm_path", lambda device, K, N, fused=False: Route.MXFP8_FUSED)
    got = _run(mx.grouped_mm, a, w, b_of, offs, grad)
    L = int(offs[-1])
    for x, y in ((got[0][:L], expected[0][:L]), (got[1][:L], expected[1][:L]), (got[2], expected[2])):
        torch.testing.assert_close(x, y, rtol=2**-7, atol=0)


def test_opcheck():
    # no rows past offs[-1]: like torch._grouped_mm, the op leaves those output rows unspecified
    a, w, b_of, offs, grad = _problem(4, K=64, N=64, tail=0)
    b = b_of(w)
    for spec in [f"{impl}:rceil" for impl in IMPLS] + ["mxfp8:rceil+fused"]:
        reused = f"{spec}+reuse_weight"
        args = (a.requires_grad_(), b.requires_grad_(), offs, reused, reused, spec, w)
        torch.library.opcheck(gm.grouped_mm_op, args)
        floor = spec.replace("rceil", "floor")
        torch.library.opcheck(gm.grouped_mm_op, (a, b, offs, floor, floor, "bf16:floor", None))
        torch.library.opcheck(gm.grouped_mm_input_grad_op, (grad, b.detach(), offs, reused, w.detach()))
        torch.library.opcheck(gm.grouped_mm_weight_grad_op, (grad, a.detach(), offs, spec))
    torch.library.opcheck(rw_lowering.quantize_groups_rowwise_op, (a.detach(), offs, "floor"))
    a_fp8, a_scales = rowwise.quantize_rows(a.detach(), -1)
    for dgrad, x_fp8, x_scales in ((False, a_fp8, a_scales), (True, *rowwise.quantize_rows(grad, -1))):
        # (opcheck's schema test compares inputs with allclose, which float8 tensors lack)
        torch.library.opcheck(rw_lowering.cached_weight_gemm_op,
                              (x_fp8, x_scales, b.detach(), w.detach(), offs, "rceil", dgrad),
                              test_utils=("test_faketensor", "test_autograd_registration"))
    torch.library.opcheck(mx_lowering.quantize_dequantize_op, (b.detach(), 1, "rceil"))
    torch.library.opcheck(mx_lowering.quantize_dequantize_groups_op, (a.detach(), offs, "floor"))


def test_inductor_sees_the_quantizers_and_computes_shared_ones_once():
    """Under Inductor the GEMM ops decompose into the tokens' quantize-dequantize and a GEMM, so
    the tokens feeding w1 and w3 are quantized once; the emulation rounds each weight beside
    them, whether or not a parameter is given (it reuses no weight quantization)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    gm.register_decompositions()

    a, w, b_of, offs, grad = _problem(4, K=64, N=64, tail=0)
    w3 = w.clone()

    from torch._functorch.compile_utils import fx_graph_cse

    def block(a, w, w3):
        h = torch.nn.functional.silu(gm.grouped_mm_op(a, b_of(w), offs, *["mxfp8:rceil+reuse_weight"] * 3, w))
        return h * gm.grouped_mm_op(a, b_of(w3), offs, *["mxfp8:rceil+reuse_weight"] * 3, w3)

    graph = fx_graph_cse(make_fx(block, decomposition_table=select_decomp_table())(a, w, w3).graph)
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert targets.count("mxfp8.quantize_dequantize.default") == 3  # a once (w, w3), w, w3
    assert targets.count("aten._grouped_mm.default") == 2
    assert not any("mxfp8.grouped_mm" in t for t in targets)


def test_compile_fullgraph_matches_eager():
    a, w, b_of, offs, grad = _problem(4, K=64, N=64)
    torch._dynamo.reset()
    compiled = torch.compile(mx.grouped_mm, fullgraph=True)
    got = _run(compiled, a, w, b_of, offs, grad)
    want = _run(mx.grouped_mm, a, w, b_of, offs, grad)
    L = int(offs[-1])
    assert_bitwise_equal(got[0][:L], want[0][:L])
    assert_bitwise_equal(got[1][:L], want[1][:L])
    assert_bitwise_equal(got[2], want[2])


# --------------------------------------------------------------------------------------------
# Native (compute capability 10.x) path: arguments checked by torch's own meta function


def _fake_cuda(mode, t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")


@pytest.mark.parametrize(
    "builder, shape",
    [
        (mx_lowering.native_forward_args, lambda M, K, N, E: (M, N)),
        (mx_lowering.native_dgrad_args, lambda M, K, N, E: (M, K)),
        (mx_lowering.native_wgrad_args, lambda M, K, N, E: (E, K, N)),
    ],
)
def test_native_args_pass_torch_meta_checks(builder, shape):
    E, K, N = 8, 256, 128
    a, w, b_of, offs, grad = _problem(E, K=K, N=N)
    M = a.shape[0]
    first = a if builder is mx_lowering.native_forward_args else grad
    second = a if builder is mx_lowering.native_wgrad_args else b_of(w)
    args = builder(reference, first, second, offs, "rceil")
    with FakeTensorMode() as mode:
        fake = [_fake_cuda(mode, t) for t in args]
        out = torch._scaled_grouped_mm(*fake[:4], offs=fake[4], out_dtype=torch.bfloat16)
    assert tuple(out.shape) == shape(M, K, N, E) and out.dtype == torch.bfloat16


def test_meta_check_rejects_unblocked_weight_scales():
    """Guards the test above: the meta function does check MXFP8 scale shapes."""
    a, w, b_of, offs, _ = _problem(8, K=256, N=128)
    args = list(mx_lowering.native_forward_args(reference, a, b_of(w), offs, "rceil"))
    args[3] = reference.quantize(w, -1)[1]  # [E, N, K/32], not blocked
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="MXFP8"):
        fake = [_fake_cuda(mode, t) for t in args]
        torch._scaled_grouped_mm(*fake[:4], offs=fake[4], out_dtype=torch.bfloat16)


@pytest.mark.parametrize("transposed", [True, False])
def test_rowwise_operands_pass_torch_meta_checks(monkeypatch, transposed):
    """The forward, input-grad and weight-grad operands of fp8_rowwise (layouts, fp32 scale
    shapes, 16-aligned padded groups) are accepted by torch's FP8 grouped GEMM meta function."""
    from mxfp8_inductor.kernels import rowwise

    seen = []
    emulate = rowwise.scaled_grouped_mm

    def checked(a, b, scale_a, scale_b, offs):
        with FakeTensorMode() as mode:
            fake = [_fake_cuda(mode, t) for t in (a, b, scale_a, scale_b, offs)]
            out = torch._scaled_grouped_mm(*fake[:4], offs=fake[4], out_dtype=torch.bfloat16)
        seen.append(tuple(out.shape))
        return emulate(a, b, scale_a, scale_b, offs)

    monkeypatch.setattr(rowwise, "scaled_grouped_mm", checked)
    a, w, b_of, offs, grad = _problem(8, K=128, N=96, transposed=transposed)
    _run(lambda a, b, o: mx.grouped_mm(a, b, o, recipe="fp8_rowwise"), a, w, b_of, offs, grad)
    M, E = a.shape[0], 8
    assert sorted(seen) == sorted([(M, 96), (M, 128), (E, 96, 128) if transposed else (E, 128, 96)])


def _rowwise_forward(a, w_ENK, offs, cache):
    spec = "fp8_rowwise:rceil+reuse_weight" if cache else "fp8_rowwise:rceil"
    return gm.grouped_mm_op(a, w_ENK.transpose(-2, -1), offs, *[spec] * 3, w_ENK if cache else None)


@pytest.mark.parametrize("tokens_per_group, K, N, gemm", [(64, 128, 96, "mxfp8.fp8_grouped_mm.default"),
                                                           (2048, 128, 96, "mxfp8.fp8_grouped_mm.default"),
                                                           (2048, 2048, 2048, "aten._scaled_grouped_mm.default")])
def test_rowwise_forward_decomposes_to_fusible_ops_and_a_visible_fp8_gemm(monkeypatch, tokens_per_group, K, N, gemm):
    """On Hopper, Inductor sees fp8_rowwise as plain aten quantization (fusible with producers)
    and one FP8 grouped GEMM: `aten._scaled_grouped_mm` (which max-autotune can tune) for large
    token groups of large GEMMs, our Triton one elsewhere (`routes.route`)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    gm.register_decompositions()

    monkeypatch.setattr(routes, "has_fp8_grouped_mm", lambda device: True)
    with FakeTensorMode() as mode:
        a = torch.empty(4 * tokens_per_group, K, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(4, N, K, dtype=torch.bfloat16, device="cuda")
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        graphs = [make_fx(functools.partial(_rowwise_forward, cache=cache),
                          decomposition_table=select_decomp_table())(a, w, offs).graph
                  for cache in (False, True)]
    targets = [str(n.target) for n in graphs[0].nodes if n.op == "call_function"]
    assert [t for t in targets if "grouped_mm" in t] == [gemm]
    assert targets.count("aten.amax.default") == 2  # one scale per token row, one per expert row
    assert not any(t.startswith("mxfp8.") and t != gemm for t in targets)
    # with the weight cache the weight's quantization and the GEMM are one opaque op
    cached = [str(n.target) for n in graphs[1].nodes if n.op == "call_function"]
    assert [t for t in cached if t.startswith("mxfp8.") or "grouped_mm" in t] == [
        "mxfp8.rowwise_cached_weight_gemm.default"]
    assert cached.count("aten.amax.default") == 1
    # the weight gradient (2d-2d): its operands transposed and padded per group by our quantizer,
    # into the same GEMM choice (on the meta device: a CPU-only torch cannot run the row gather's fake kernel for CUDA)
    with mode:
        a, offs = a.to("meta"), offs.to("meta")
        grad = torch.empty(4 * tokens_per_group, N, dtype=torch.bfloat16, device="meta")
        wgrad = make_fx(lambda g, a, o: gm.grouped_mm_weight_grad_op(g, a, o, "fp8_rowwise:rceil"),
                        decomposition_table=select_decomp_table())(grad, a, offs).graph
    wgrad_ops = [str(n.target) for n in wgrad.nodes if n.op == "call_function" and str(n.target).startswith("mxfp8.")
                 or "grouped_mm" in str(n.target)]
    assert wgrad_ops == ["mxfp8.quantize_groups_rowwise.default"] * 2 + [gemm]


@pytest.mark.interpreter
@pytest.mark.parametrize("transposed", [True, False])
def test_rowwise_triton_route_compiles_and_matches_the_emulation(monkeypatch, transposed):
    """fp8_rowwise as Hopper runs it, our FP8 grouped GEMMs in all three roles (the Triton
    interpreter on CPU), compiled: output and both gradients equal the emulation's up to the
    order of the fp32 sums."""
    a, w, b_of, offs, grad = _problem(4, K=64, N=96, transposed=transposed)
    L = int(offs[-1])
    want = _run(lambda a, b, offs: mx.grouped_mm(a, b, offs, recipe="fp8_rowwise"), a, w, b_of, offs, grad)
    monkeypatch.setattr(routes, "has_fp8_grouped_mm", lambda device: True)
    seen = []
    monkeypatch.setattr(rw_lowering, "fp8_grouped_mm_op", lambda *args: seen.append(args[1].dim()) or
                        rw_lowering.torch.ops.mxfp8.fp8_grouped_mm(*args))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, offs: mx.grouped_mm(a, b, offs, recipe="fp8_rowwise"), fullgraph=True)
    # compile anew: the caches key on the graph and the package, not on the patched capability
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        got = _run(compiled, a, w, b_of, offs, grad)
    assert sorted(seen) == [2, 3, 3]  # the weight gradient (2d-2d), forward and input gradient (2d-3d)
    for x, y in ((got[0][:L], want[0][:L]), (got[1][:L], want[1][:L]), (got[2], want[2])):
        torch.testing.assert_close(x, y, rtol=2**-7, atol=1e-3 * y.abs().max().item())


@pytest.mark.parametrize(
    "capability, K, N, path",
    [((9, 0), 256, 256, "emulated"), ((8, 0), 256, 256, "emulated"), ((12, 0), 256, 256, "emulated"),
     ((10, 0), 256, 256, "native"), ((10, 0), 96, 256, "emulated"), ((10, 3), 256, 160, "emulated")],
)
@pytest.mark.parametrize("fused", [False, True])
def test_gemm_path_by_capability(monkeypatch, capability, K, N, path, fused):
    """The fused GEMMs (opt-in) run on every CUDA GPU, ahead of the native path."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    path = "fused" if fused else path
    assert mx_lowering.gemm_path(torch.device("cuda"), K, N, fused) == Route(f"mxfp8 {path}")
    assert mx_lowering.gemm_path(torch.device("cpu"), K, N, fused) == Route.MXFP8_REFERENCE


@pytest.mark.parametrize("capability, fp8", [((9, 0), True), ((8, 9), False), ((10, 0), False), ((10, 3), False)])
def test_rowwise_fp8_gemm_only_where_verified(monkeypatch, capability, fp8):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert routes.has_fp8_grouped_mm(torch.device("cuda")) == fp8
    assert not routes.has_fp8_grouped_mm(torch.device("cpu"))
    for tokens, K, N, route in ((64, 4096, 4096, Route.ROWWISE_TRITON), (4096, 4096, 4096, Route.ROWWISE_TORCH),
                                (4096, 1024, 4096, Route.ROWWISE_TRITON), (4096, 4096, 768, Route.ROWWISE_TRITON),
                                (None, 256, 256, Route.ROWWISE_TORCH)):
        got = routes.route("fp8_rowwise", torch.device("cuda"), K, N, tokens)
        assert got == (route if fp8 else Route.ROWWISE_EMULATED)
    assert routes.route("fp8_rowwise", torch.device("cpu"), 256, 256, 64) == Route.ROWWISE_EMULATED


# --------------------------------------------------------------------------------------------
# Bad input


def _bad(**over):
    a, w, b_of, offs, _ = _problem(4, K=64, N=64)
    args = {"a": a, "b": b_of(w), "offs": offs}
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, match",
    [
        ({"a": torch.randn(361, 64).half(), "b": torch.randn(4, 64, 64).half()}, "bf16 or fp32"),
        ({"a": torch.randn(361, 64), "b": torch.randn(4, 64, 64).bfloat16()}, "share a dtype"),
        ({"a": torch.randn(361, 48).bfloat16(), "b": torch.randn(4, 48, 64).bfloat16()}, "multiples of 32"),
        ({"b": torch.randn(4, 64, 40).bfloat16()}, "multiples of 32"),
        ({"b": torch.randn(4, 32, 64).bfloat16()}, "contraction"),
        ({"offs": make_offs([100, 0, 37, 119]).long()}, "int32"),
        ({"offs": torch.tensor([100, 50, 137, 256], dtype=torch.int32)}, "non-decreasing"),
        ({"offs": torch.tensor([100, 100, 137, 400], dtype=torch.int32)}, "past the 261 rows"),
        ({"offs": make_offs([100, 37, 119])}, "E=4"),
        ({"rounding": "nearest"}, "rounding"),
        ({"wgrad": "fp8"}, "wgrad"),
        ({"recipe": "fp8"}, "recipe"),
        ({"recipe": "fp8_rowwise", "b": torch.randn(4, 64, 40).bfloat16()}, "multiples of 16"),
    ],
)
def test_bad_input_raises_value_error(over, match):
    kwargs = {k: over.pop(k) for k in ("recipe", "rounding", "wgrad") if k in over}
    args = _bad(**over)
    with pytest.raises(ValueError, match=match):
        mx.grouped_mm(args["a"], args["b"], args["offs"], **kwargs)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_zero_tokens_give_empty_outputs_and_zero_weight_gradients(recipe):
    """An expert-parallel rank that receives no tokens: the incoming gradient of the empty output
    arrives expanded (zero strides), which the GEMMs do not take."""
    w = torch.nn.Parameter(torch.randn(4, 64, 32).bfloat16())
    x = torch.zeros(0, 32, dtype=torch.bfloat16, requires_grad=True)
    out = mx.grouped_mm(x, w.transpose(-2, -1), torch.zeros(4, dtype=torch.int32), recipe=recipe)
    out.sum().backward()
    assert out.shape == (0, 64) and x.grad.shape == (0, 32)
    assert_bitwise_equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize("capability", [(9, 4), (10, 0)])
def test_rocm_runs_no_native_or_fp8_grouped_gemm_whatever_capability_it_reports(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", "6.4")
    cuda = torch.device("cuda")
    assert not routes.has_mxfp8_mma(cuda) and not routes.has_fp8_grouped_mm(cuda)
    assert mx_lowering.gemm_path(cuda, 256, 256) == Route.MXFP8_EMULATED


def test_mxfp8_fused_option_reaches_each_grouped_gemm(monkeypatch):
    """`mxfp8_fused=True` puts the fused flag in every GEMM's spec in the op, and the op asks the
    path for the fused kernels in all three (the dense GEMMs have none); it computes mxfp8's numbers."""
    from models import MoEModel

    torch.manual_seed(0)
    report = mx.explain(MoEModel(layers=1).bfloat16(), torch.randn(2, 8, 64, dtype=torch.bfloat16),
                        options={"recipe": "mxfp8", "mxfp8_fused": True})
    code = "".join(report.graphs)
    assert code.count("'mxfp8:rceil+fused', 'mxfp8:rceil+fused', 'mxfp8:rceil+fused'") == 3
    assert "'mxfp8:rceil'" not in code
    asked = []
    path = mx_lowering.gemm_path
    monkeypatch.setattr(mx_lowering, "gemm_path", lambda device, K, N, fused=False: (
        asked.append(fused), path(device, K, N, fused))[1])
    a = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4, 128, 64, dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    outs = []
    for spec in ("mxfp8:rceil+fused", "mxfp8:rceil"):
        out = torch.ops.mxfp8.grouped_mm(a, w.transpose(-2, -1), offs, spec, spec, spec, None)
        out.float().square().sum().backward()
        outs.append((out, a.grad, w.grad))
        a.grad = w.grad = None
    assert asked == [True] * 3 + [False] * 3
    for x, y in zip(*outs):
        assert_bitwise_equal(x, y)


@pytest.mark.parametrize("flag, value", [("weight_cache", "False"), ("weight_cache", 1), ("autotune", "False"),
                                         ("autotune", None)])
def test_eager_flags_take_only_bools_as_the_config_does(flag, value):
    """weight_cache="False" is truthy: accepted, it would turn reuse on. Each eager op refuses a
    non-bool flag with `MXFP8Config`'s own message."""
    message = re.escape(f"{flag} must be True or False, got {value!r}")
    with pytest.raises(ValueError, match=message):
        MXFP8Config(**{flag: value})
    a, w, b_of, offs, _ = _problem(4, K=64, N=64)
    with pytest.raises(ValueError, match=message):
        mx.grouped_mm(a, b_of(w), offs, **{flag: value})
    with pytest.raises(ValueError, match=message):
        mx.linear(a, w[0], **{flag: value})


# (K, N) with one of them empty; E = 4 token groups of _EMPTY_SIZES (an empty one among them)
_EMPTY = [(0, 64), (64, 0)]
_EMPTY_SIZES = [10, 0, 25, 5]


def _empty_operands(K: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens a[40, K] and a weight w[4, N, K] (used transposed), an empty dimension's strides
    padded to 16 bytes: torch._grouped_mm's checks refuse the default stride of 1 element there
    (and Dynamo's trace runs them), so torch computes an empty K only on these."""
    g = torch.Generator().manual_seed(0)
    M, E = sum(_EMPTY_SIZES), len(_EMPTY_SIZES)
    a = torch.randn(M, K, generator=g).bfloat16() if K else torch.empty_strided((M, 0), (16, 1), dtype=torch.bfloat16)
    w = (torch.randn(E, N, K, generator=g).bfloat16() if K else
         torch.empty_strided((E, N, 0), (16 * N, 16, 1), dtype=torch.bfloat16))
    return a, w


def _assert_torchs_empty_result(K: int, N: int, out: torch.Tensor, da: torch.Tensor, dw: torch.Tensor) -> None:
    """torch._grouped_mm's forward on the same operands (zeros for an empty K, empty for an empty
    N), and the gradients it implies: zeros, or empty (torch's own backward refuses an empty N)."""
    a, w = _empty_operands(K, N)
    assert_bitwise_equal(out, torch._grouped_mm(a, w.transpose(-2, -1), make_offs(_EMPTY_SIZES)))
    assert_bitwise_equal(da, torch.zeros_like(a))
    assert_bitwise_equal(dw, torch.zeros_like(w))


@pytest.mark.parametrize("K, N", _EMPTY)
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise", "fp8_blockwise", "auto"])
def test_an_empty_k_or_n_gives_torchs_result(recipe, K, N):
    """An empty K or N has nothing to multiply: the eager ops return torch's result (zeros, or
    empty), forward and both gradients, where the quantizers refused the empty dimension's
    strides; the tokens here have the default strides, which torch._grouped_mm refuses too."""
    a, w = _empty_operands(K, N)
    a = a.contiguous().requires_grad_()
    w = torch.nn.Parameter(w.contiguous())
    offs = make_offs(_EMPTY_SIZES)
    out = mx.grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe)
    _assert_torchs_empty_result(K, N, out, *torch.autograd.grad(out, [a, w], torch.randn_like(out)))
    if recipe in ("mxfp8", "fp8_rowwise"):  # fsdp_fp8_all_gather's weight, rounded once for both its GEMMs
        spec = f"{recipe}:rceil+shared_weight"
        out = torch.ops.mxfp8.grouped_mm(a, w.transpose(-2, -1), offs, spec, spec, f"{recipe}:rceil", None)
        _assert_torchs_empty_result(K, N, out, *torch.autograd.grad(out, [a, w], torch.randn_like(out)))
    out = mx.linear(a, w[0], recipe=recipe)
    assert_bitwise_equal(out, torch.zeros(a.shape[0], N, dtype=torch.bfloat16))
    da, dw = torch.autograd.grad(out, [a, w], torch.randn_like(out))
    assert_bitwise_equal(da, torch.zeros_like(a))
    assert_bitwise_equal(dw, torch.zeros_like(w))


class _EmptySite(torch.nn.Module):
    """A grouped matmul on the weight w[4, N, K] of `_empty_operands`, or a linear on w[N, K]."""

    def __init__(self, K: int, N: int, dense: bool) -> None:
        super().__init__()
        self.dense = dense
        self.w = torch.nn.Parameter(torch.ones(N, K, dtype=torch.bfloat16) if dense else _empty_operands(K, N)[1])

    def forward(self, a: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return F.linear(a, self.w) if self.dense else torch._grouped_mm(a, self.w.transpose(-2, -1), offs=offs)


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("K, N", _EMPTY)
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise", "fp8_blockwise"])
def test_an_empty_k_or_n_under_the_pass_gives_torchs_result(recipe, K, N, dense):
    """The pass rewrites the site into the op, whose decomposition (what Inductor compiles, run
    here without its code generation) computes torch's result, forward and both gradients."""
    from mxfp8_inductor.patterns.rewrite import rewrite

    rows = []

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        rows.extend(rewrite(graph, MXFP8Config(recipe=recipe, targets="all", dense_min_dim=0)))
        return torch._dynamo.lookup_backend("aot_eager_decomp_partition")(graph, example_inputs)

    model = _EmptySite(K, N, dense)
    a = _empty_operands(K, N)[0].requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(a, make_offs(_EMPTY_SIZES))
    assert [(r.action, r.impl) for r in rows] == [("rewritten", recipe)] * 3
    da, dw = torch.autograd.grad(out, [a, model.w], torch.randn_like(out))
    if dense:
        for got in (out, da, dw):
            assert_bitwise_equal(got, torch.zeros_like(got))
        assert out.shape == (a.shape[0], N)
    else:
        _assert_torchs_empty_result(K, N, out, da, dw)
