"""Dense linears through the pass (targets="all"): the op's numerics, the sites found and decided,
excluded layers untouched, and the pass adding no error of its own."""

import pytest
import torch
from helpers import assert_sqnr_near, equalize_columns, pow2_scales
from models import MoEModel

import mxfp8_inductor as mx
from mxfp8_inductor import check
from mxfp8_inductor.routes import Route

# SQNR (dB) against bf16 of the output, the input gradient with its columns equalized and the
# weight gradient, measured on CPU. As in test_ops.SPREAD_DB: fp8_rowwise's output ~22 dB below
# mxfp8's, floor's 1.9 dB below rceil's; the input gradient's small columns come from w's small
# columns, which blocks along K (the wrong axis for the input gradient) ruin.
LINEAR_DB = {
    ("mxfp8", "rceil"): (28.7, 27.8, 28.5),
    ("mxfp8", "floor"): (26.8, 26.9, 24.4),
    ("fp8_rowwise", "rceil"): (6.4, 27.8, 28.5),
    ("fp8_rowwise", "floor"): (6.6, 27.7, 26.9),
}
TOL_DB = 1.0  # seeded data, deterministic CPU kernels: room for another BLAS's summation order


@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_linear_op_sqnr_vs_bf16(recipe, rounding):
    """Output, input gradient and weight gradient against bf16, with a bias, a 3-D input and a
    token count that is not a multiple of 32, on magnitudes spread as in test_ops._spread_problem:
    one power of two per 32-column block of x divided out of w's matching columns (every product
    keeps its size, each token row spans 2^20), one per column of w, one per token row of x and
    of the output gradient."""
    gen = torch.Generator().manual_seed(0)
    block_K = pow2_scales(256, gen, run=32)
    x = torch.randn(4, 37, 256, generator=gen) * pow2_scales(4 * 37, gen).view(4, 37, 1) * block_K
    w = torch.randn(512, 256, generator=gen) * 256**-0.5 * pow2_scales(256, gen) / block_K
    b = torch.randn(512, generator=gen)
    g = torch.randn(4, 37, 512, generator=gen) * pow2_scales(4 * 37, gen).view(4, 37, 1)
    x, w, b = (t.bfloat16().requires_grad_() for t in (x, w, b))
    g = g.bfloat16()

    def run(fn):
        out = fn(x, w, b)
        out.backward(g)
        grads = (x.grad.clone(), w.grad.clone(), b.grad.clone())
        x.grad = w.grad = b.grad = None
        return (out.detach(), *grads)

    ref = run(torch.nn.functional.linear)
    out, dx, dw, db = run(lambda x, w, b: mx.linear(x, w, b, recipe=recipe, rounding=rounding))
    expected = LINEAR_DB[recipe, rounding]
    assert_sqnr_near(ref[0], out, expected[0], TOL_DB, "output")
    assert_sqnr_near(*equalize_columns(ref[1].flatten(0, 1), dx.flatten(0, 1)), expected[1], TOL_DB, "input gradient")
    assert_sqnr_near(ref[2], dw, expected[2], TOL_DB, "weight gradient")
    assert torch.equal(ref[3], db)  # the bias gradient is a plain sum


def test_native_linear_runs_one_group_grouped_gemms_that_pass_torch_meta_checks(monkeypatch):
    """On compute capability 10.x each GEMM of a dense linear is the experts' native MXFP8 GEMM
    with one group of every token row; its arguments pass torch's meta function (CPU stands in
    for the device: the reference kernels build them, fake CUDA tensors check them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mxfp8_inductor.lowering import mxfp8 as mx_lowering
    from mxfp8_inductor.lowering import ops as gm

    seen = []

    def checked(args):
        with FakeTensorMode():
            fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in args]
            out = torch._scaled_grouped_mm(*fake[:4], offs=fake[4], out_dtype=torch.bfloat16)
        seen.append((tuple(out.shape), int(args[4][-1])))
        return torch.zeros(out.shape, dtype=out.dtype)

    monkeypatch.setattr(mx_lowering, "gemm_path", lambda device, K, N, fused=False: Route.MXFP8_NATIVE)
    monkeypatch.setattr(mx_lowering, "_scaled_grouped_mm", checked)
    M, K, N = 2 * 37, 256, 384
    x = torch.randn(2, 37, K, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(N, K, dtype=torch.bfloat16, requires_grad=True)
    out = mx.linear(x, w, recipe="mxfp8", weight_cache=False)
    out.backward(torch.ones_like(out))
    # forward [M, N], input gradient [M, K], weight gradient [1, N, K] over M rows padded to 32
    assert seen == [((M, N), M), ((M, K), M), ((1, N, K), 96)]
    assert out.shape == (2, 37, N) and x.grad.shape == x.shape and w.grad.shape == w.shape
    # outputs laid out as the ops' fakes promise (compiled graphs assert their strides)
    g = torch.randn(M, N, dtype=torch.bfloat16)
    x_MK, w = x.detach().reshape(M, K), w.detach()
    for op, args in ((gm.linear_op, (x_MK, w, *["mxfp8:rceil"] * 3, None)),
                     (gm.linear_input_grad_op, (g, w, "mxfp8:rceil", None)),
                     (gm.linear_weight_grad_op, (g, x_MK, "mxfp8:rceil"))):
        torch.library.opcheck(op, args, test_utils="test_faketensor")


def test_linear_op_rejects_bad_input():
    with pytest.raises(ValueError, match="multiples of 32"):
        mx.linear(torch.randn(8, 48).bfloat16(), torch.randn(64, 48).bfloat16())
    with pytest.raises(ValueError, match="contraction"):
        mx.linear(torch.randn(8, 32).bfloat16(), torch.randn(64, 64).bfloat16())
    with pytest.raises(ValueError, match="bias must have shape"):
        mx.linear(torch.randn(8, 64).bfloat16(), torch.randn(64, 64).bfloat16(), torch.zeros(3).bfloat16())


def _model(layers=2):
    torch.manual_seed(0)
    return MoEModel(layers=layers, shared_expert=True).bfloat16(), torch.randn(2, 32, 64, dtype=torch.bfloat16)


def test_dense_sites_are_found_and_decided_only_with_targets_all():
    model, x = _model()
    default = mx.explain(model, x)
    assert all("experts" in s.weight_fqn for s in default.sites)
    report = mx.explain(model, x, options={"targets": "all", "dense_min_dim": 64, "exclude": ["layers.1.moe.shared.2"]})
    by = {(s.weight_fqn, s.role): (s.action, s.reason) for s in report.sites}
    assert by[("layers.0.moe.shared.0.weight", "forward")] == ("rewritten", "dense linear")
    assert by[("layers.1.moe.shared.2.weight", "weight-grad")][0] == "excluded"
    assert by[("layers.0.moe.router.weight", "forward")][0] == "skipped"  # N = 4 experts
    small = mx.explain(model, x, options={"targets": "all"})  # the default dense_min_dim > 64
    assert {s.action for s in small.sites if "shared" in s.weight_fqn} == {"skipped"}
    assert all("below dense_min_dim" in s.reason for s in small.sites if "shared" in s.weight_fqn)


def test_router_and_output_projection_stay_bf16_by_default():
    config = mx.MXFP8Config(targets="all")
    assert not config.matches("model.layers.0.mlp.gate", "model.layers.0.mlp.gate.weight", dense=True)[0]
    assert not config.matches("lm_head", "lm_head.weight", dense=True)[0]
    assert config.matches("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj.weight", dense=True)[0]
    assert mx.MXFP8Config(targets="all", include=("lm_head",)).matches("lm_head", "lm_head.weight", dense=True)[0]


def test_excluded_dense_layers_are_bitwise_plain_compile():
    model, x = _model(layers=1)
    grad = torch.randn_like(x)

    def step(compiled):
        torch._dynamo.reset()
        xr = x.clone().requires_grad_()
        out = compiled(xr)
        out.backward(grad)
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return [out.detach(), xr.grad, *grads]

    want = step(torch.compile(model))
    got = step(torch.compile(model, backend="mxfp8", options={
        "targets": "all", "dense_min_dim": 64, "exclude": ["*.shared.*", "*.experts"]}))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_dense_sites_add_no_error_of_their_own():
    """One layer (three Inductor compiles on CI's CPUs): its shared expert's two linears and
    the routed experts' three grouped GEMMs."""
    model, x = _model(layers=1)
    for result in check.compare(model, (x,), targets="all", dense_min_dim=64):
        assert result.sites_rewritten == 5 and result.op_calls == 5 and result.passed, str(result)


def test_marking_takes_routed_experts_only():
    model, _ = _model()
    with pytest.raises(ValueError, match="inductor_options\\(targets='all'\\)"):
        mx.mxfp8(model, targets="all")


class _DenseBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 128, bias=False)
        self.down = torch.nn.Linear(128, 64, bias=False)

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        return x_BLD + self.down(torch.nn.functional.silu(self.up(x_BLD)))


class _CheckpointedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_DenseBlock(), _DenseBlock()])

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x_BLD = torch.utils.checkpoint.checkpoint(block, x_BLD, use_reentrant=False)
        return x_BLD


def test_dense_sites_compose_with_fsdp2_and_activation_checkpointing(tmp_path):
    """TorchTitan's order on a one-process gloo group: each block compiled with targets="all"
    (graph level: the rewrite, AOTAutograd, our decompositions), then FSDP2 per block and root,
    each block activation-checkpointed: every dense GEMM is rewritten and the step follows eager
    bf16 to FP8 rounding."""
    import torch.distributed as dist
    from torch._dynamo.backends.debugging import aot_eager_decomp_partition
    from torch.distributed.fsdp import fully_shard

    from mxfp8_inductor.patterns.rewrite import rewrite

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    config = mx.MXFP8Config(targets="all", dense_min_dim=64, recipe="fp8_rowwise")
    rows = []

    def backend(gm, example_inputs):
        rows.extend(rewrite(gm, config))
        return aot_eager_decomp_partition(gm, example_inputs)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        def step(compile: bool):
            torch.manual_seed(0)
            model = _CheckpointedNet().bfloat16()
            for block in model.blocks:
                if compile:
                    block.compile(backend=backend)
                fully_shard(block)
            fully_shard(model)
            x = torch.randn(2, 32, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
            out = model(x)
            out.float().square().mean().backward()
            return [out.detach()] + [p.grad.full_tensor() for p in model.parameters()]

        torch._dynamo.reset()
        got, want = step(compile=True), step(compile=False)
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    rewritten = {(r.weight_fqn.rsplit(".", 2)[-2], r.role) for r in rows if r.action == "rewritten"}
    assert rewritten == {(layer, role) for layer in ("up", "down") for role in ("forward", "input-grad", "weight-grad")}
    # measured on CPU: output 37.2 dB, gradients 26.1-27.1 dB; Gaussian data, on which the recipes
    # agree (this test is about the composition, test_linear_op_sqnr_vs_bf16 about the recipes)
    assert_sqnr_near(want[0], got[0], 37.2, TOL_DB, "output")
    for name, w, g in zip(("up 0", "down 0", "up 1", "down 1"), want[1:], got[1:]):
        assert_sqnr_near(w, g, 26.6, TOL_DB, f"{name} gradient")
