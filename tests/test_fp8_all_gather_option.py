"""`fsdp_fp8_all_gather=True` without FSDP2: marked expert weights become FP8AllGatherWeight
parameters, each expert op rounds its weight once for both of its GEMMs (docs/design.md,
"Shared weight scales"), and the compiled model computes exactly as the eager op given that
rounded weight. The multi-rank FSDP2 runs are in test_fsdp_all_gather.py."""

import copy

import pytest
import torch
from helpers import assert_bitwise_equal, make_offs

import mxfp8_inductor as mx
from mxfp8_inductor import fsdp
from mxfp8_inductor.kernels import shared_weight
from mxfp8_inductor.options import MXFP8Config

SIZES = [40, 0, 64, 24]
E, N, K = 4, 64, 96


class Experts(torch.nn.Module):
    """Two expert GEMMs on transposed [E, N, K] parameters (the layout of transformers and
    TorchTitan), with columns of widely spread magnitude so that the shared rounding differs
    from each GEMM's own."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        spread = torch.logspace(-24, 24, K, base=2.0)  # 16 binades per 32 columns
        self.w1 = torch.nn.Parameter((torch.randn(E, N, K, generator=g) * spread * 0.05).bfloat16())
        self.w2 = torch.nn.Parameter((torch.randn(E, K, N, generator=g) * 0.05).bfloat16())

    def forward(self, x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        h_MN = torch._grouped_mm(x_MK, self.w1.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(torch.nn.functional.silu(h_MN), self.w2.transpose(-2, -1), offs=offs)


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(sum(SIZES), K, generator=g).bfloat16(), make_offs(SIZES)


def _run(fn, params, x, offs):
    """Output, input gradient and parameter gradients of one forward and backward."""
    x = x.detach().requires_grad_()
    out = fn(x, offs)
    grads = torch.autograd.grad(out.float().square().sum(), [x, *params])
    return (out.detach(), *grads)


def _eager(model: Experts, recipe: str):
    """Our op run eagerly at the same sites on the shared-rounded weights."""
    w1, w2 = (p.detach().clone().requires_grad_() for p in (model.w1, model.w2))

    def fn(x, offs):
        r1, r2 = (shared_weight.quantize_dequantize(w, recipe) for w in (w1, w2))
        # the rounding passes gradients through unchanged, as the op in the graph does
        r1, r2 = (w + (r - w).detach() for w, r in ((w1, r1), (w2, r2)))
        h = mx.grouped_mm(x, r1.transpose(-2, -1), offs, recipe=recipe)
        return mx.grouped_mm(torch.nn.functional.silu(h), r2.transpose(-2, -1), offs, recipe=recipe)

    return fn, (w1, w2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_compiled_model_equals_the_eager_op_on_the_rounded_weights(recipe, device):
    base, (x, offs) = Experts().to(device), tuple(t.to(device) for t in _inputs())
    model = mx.mxfp8(copy.deepcopy(base), recipe=recipe, fsdp_fp8_all_gather=True)
    assert all(isinstance(p.data, fsdp.FP8AllGatherWeight) for p in (model.w1, model.w2))
    torch._dynamo.reset()
    got = _run(torch.compile(model), (model.w1, model.w2), x, offs)
    for g, want in zip(got, _run(*_eager(base, recipe), x, offs)):
        assert_bitwise_equal(g, want)
    # the rounding is in effect: the same model without the option computes otherwise
    plain = mx.mxfp8(copy.deepcopy(base), recipe=recipe)
    torch._dynamo.reset()
    assert not torch.equal(torch.compile(plain)(x, offs), got[0])


def test_unwrapped_parameters_compute_the_same():
    """What FSDP2 gathers in bf16 (plain parameters) and in FP8 computes alike under the pass."""
    base, (x, offs) = Experts(), _inputs()
    runs = []
    for unwrap in (False, True):
        model = mx.mxfp8(copy.deepcopy(base), recipe="mxfp8", fsdp_fp8_all_gather=True)
        if unwrap:
            fsdp.unwrap(model)
            assert type(model.w1.data) is torch.Tensor
        torch._dynamo.reset()
        runs.append(_run(torch.compile(model), (model.w1, model.w2), x, offs))
    for a, b in zip(*runs):
        assert_bitwise_equal(a, b)


def test_only_rewritten_experts_are_wrapped_and_marking_again_unwraps():
    model = mx.mxfp8(Experts(), recipe="mxfp8", exclude=["w2"], fsdp_fp8_all_gather=True)
    assert isinstance(model.w1.data, fsdp.FP8AllGatherWeight) and type(model.w2.data) is torch.Tensor
    with pytest.warns(UserWarning, match="marked before with other options"):
        mx.mxfp8(model, recipe="mxfp8")
    assert type(model.w1.data) is torch.Tensor


def test_wrapped_parameters_train_save_and_copy_like_plain_ones():
    base, (x, offs) = Experts(), _inputs()
    plain, wrapped = copy.deepcopy(base), copy.deepcopy(base)
    wrapped.w1 = fsdp.wrap(wrapped.w1, "mxfp8", "rceil")
    for m in (plain, wrapped):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        m(x, offs).float().square().mean().backward()
        opt.step()
    assert_bitwise_equal(wrapped.w1.data._tensor, plain.w1.data)
    state = copy.deepcopy(wrapped).state_dict()
    restored = copy.deepcopy(base)
    restored.w1 = fsdp.wrap(restored.w1, "mxfp8", "rceil")
    restored.load_state_dict(state)
    assert isinstance(restored.w1.data, fsdp.FP8AllGatherWeight)
    assert_bitwise_equal(restored.w1.data._tensor, plain.w1.data)


@pytest.mark.parametrize("options, message", [
    ({"recipe": "auto"}, "use recipe='mxfp8' or 'fp8_rowwise'"),
    ({"rounding": "floor"}, "needs rounding='rceil'"),
    ({"weight_cache": True}, "drop weight_cache"),
    ({"fsdp_fp8_all_gather": 1}, "must be True or False"),
])
def test_bad_option_combinations_raise(options, message):
    with pytest.raises(ValueError, match=message):
        MXFP8Config(**{"fsdp_fp8_all_gather": True, **options})


def test_graph_routes_refuse_the_option():
    with pytest.raises(ValueError, match="before fully_shard"):
        mx.explain(Experts(), *_inputs(), options={"fsdp_fp8_all_gather": True})


def test_marking_a_sharded_model_raises_and_sharded_state_dicts_hold_plain_values(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = fully_shard(Experts())
        with pytest.raises(ValueError, match="before fully_shard"):
            mx.mxfp8(model, recipe="mxfp8", fsdp_fp8_all_gather=True)
        assert type(model.w1.to_local()) is torch.Tensor  # left as it was
        model = fully_shard(mx.mxfp8(Experts(), recipe="mxfp8", fsdp_fp8_all_gather=True))
        assert isinstance(model.w1.to_local(), fsdp.FP8AllGatherWeight)
        state = model.state_dict()
        assert type(state["w1"].to_local()) is torch.Tensor
        assert_bitwise_equal(state["w1"].full_tensor().cpu(), Experts().w1.data)  # FSDP2 moves it to a GPU
    finally:
        dist.destroy_process_group()


def test_checkpoints_hold_plain_values_and_load_into_wrapped_parameters(tmp_path):
    model = mx.mxfp8(Experts(), recipe="fp8_rowwise", fsdp_fp8_all_gather=True)
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")  # weights_only: plain tensors only
    assert type(state["w1"]) is torch.Tensor
    other = mx.mxfp8(copy.deepcopy(model), recipe="fp8_rowwise", fsdp_fp8_all_gather=True)
    with torch.no_grad():
        other.w1.zero_()
    other.load_state_dict(state)
    assert isinstance(other.w1.data, fsdp.FP8AllGatherWeight)
    assert_bitwise_equal(other.w1.data._tensor, model.w1.data._tensor)


class _Mesh:
    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


def test_a_shard_is_quantized_once_per_update():
    """The all-gather inputs of a shard are reused until a write changes it, then made anew from
    the new values: a write through the parameter (an optimizer step, a copy, a state dict load),
    or into a tensor the module's state dicts handed out (a fresh one, or one taken before the
    first all-gather and held), which reaches the data below every `__torch_dispatch__`."""
    p = fsdp.wrap(torch.nn.Parameter(torch.randn(2, 64, 64).bfloat16()), "mxfp8", "rceil")
    shard = p.data
    module = torch.nn.Module()
    module.w = p
    module.register_state_dict_post_hook(fsdp.plain_state_dict)  # as marking does
    gather = lambda: shard.fsdp_pre_all_gather(_Mesh(2), torch.Size((4, 64, 64)), (), module, None)[0]
    held = module.state_dict()
    writes = [lambda: torch.optim.AdamW([p], lr=0.1).step(), lambda: p.copy_(torch.randn(2, 64, 64)),
              lambda: module.load_state_dict({"w": torch.randn(2, 64, 64).bfloat16()}),
              lambda: module.state_dict()["w"].mul_(-1), lambda: held["w"].add_(1)]
    p.grad = torch.randn(2, 64, 64).bfloat16()
    for write in writes:
        first = gather()
        assert gather()[0] is first[0]
        with torch.no_grad():
            write()
        again = gather()
        assert again[0] is not first[0]
        for got, want in zip(again, shared_weight.quantize(shard._tensor, "mxfp8")):
            assert_bitwise_equal(got, want)
