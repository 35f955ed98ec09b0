"""The weight cache: quantized weight operands reused across microbatches, never served stale."""

import gc
import math
import warnings

import pytest
import torch
from helpers import assert_bitwise_equal, make_offs

import mxfp8_inductor as mx
from mxfp8_inductor.kernels import reference, rowwise
from mxfp8_inductor.lowering import mxfp8, weights

SIZES = [40, 0, 64, 17]


# per recipe: the weight quantizer the cache stands in front of, how many of its calls fill the
# cache (fp8_rowwise writes both orientations in one pass), and the bytes an [E, N, K] weight's
# entries hold (fp8_rowwise: float8 data and fp32 scales per orientation; mxfp8 on CPU and
# Hopper: one bf16 copy per orientation)
RECIPES = {
    "fp8_rowwise": (rowwise, "quantize_weight", 1, lambda E, N, K: 2 * E * N * K + E * (N + K) * 4),
    "mxfp8": (mxfp8, "_dequantized_weight", 2, lambda E, N, K: 4 * E * N * K),
}


class Experts(torch.nn.Module):
    def __init__(self, recipe: str, E: int = 4, N: int = 64, K: int = 96) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.recipe = recipe
        self.w_ENK = torch.nn.Parameter((torch.randn(E, N, K, generator=g) * 0.05).bfloat16())

    def forward(self, x_MK: torch.Tensor, offs: torch.Tensor, cache: bool = True) -> torch.Tensor:
        return mx.grouped_mm(x_MK, self.w_ENK.transpose(-2, -1), offs, recipe=self.recipe, weight_cache=cache)


@pytest.fixture(params=list(RECIPES))
def recipe(request):
    return request.param


@pytest.fixture
def quantizations(monkeypatch, recipe):
    """Counts the weight quantizations the cache lets through."""
    weights.clear_weight_cache()
    calls = []
    module, name, _, _ = RECIPES[recipe]
    quantize = getattr(module, name)

    def counted(b, *args):
        calls.append(b.shape)
        return quantize(b, *args)

    monkeypatch.setattr(module, name, counted)
    yield calls
    weights.clear_weight_cache()


def _step(model, x, offs, cache):
    """Output and gradients of one forward and backward."""
    x = x.detach().requires_grad_()
    out = model(x, offs, cache)
    dx, dw = torch.autograd.grad(out.float().square().sum(), [x, model.w_ENK])
    return out, dx, dw


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(SIZES), 96, generator=g).bfloat16(), make_offs(SIZES)


def test_one_quantization_serves_forward_backward_and_later_microbatches(quantizations, recipe):
    model, (x, offs) = Experts(recipe), _inputs()
    want = _step(model, x, offs, cache=False)
    del quantizations[:]  # the uncached GEMMs quantize the weight each time
    for _ in range(3):
        for got, ref in zip(_step(model, x, offs, cache=True), want):
            assert_bitwise_equal(got, ref)
    _, _, fills, nbytes = RECIPES[recipe]
    assert len(quantizations) == fills
    assert weights.cached_bytes() == nbytes(*model.w_ENK.shape)


@pytest.mark.parametrize("change", ["optimizer", "copy_", "load_state_dict", "clear"])
def test_a_changed_weight_is_quantized_again(quantizations, recipe, change):
    model, (x, offs) = Experts(recipe), _inputs()
    _step(model, x, offs, cache=True)
    fills = len(quantizations)
    if change == "optimizer":
        opt = torch.optim.SGD(model.parameters(), lr=10.0)
        model.w_ENK.grad = torch.ones_like(model.w_ENK)
        opt.step()
    elif change == "copy_":
        with torch.no_grad():
            model.w_ENK.copy_(model.w_ENK * 3)
    elif change == "load_state_dict":
        model.load_state_dict({"w_ENK": model.w_ENK.detach() * -2})
    else:
        with torch.no_grad():
            model.w_ENK.data.mul_(5)  # .data bypasses the version counter: the user clears
        weights.clear_weight_cache()
    got = _step(model, x, offs, cache=True)
    assert len(quantizations) == 2 * fills
    for a, b in zip(got, _step(model, x, offs, cache=False)):
        assert_bitwise_equal(a, b)


def test_entries_of_freed_weights_are_dropped(quantizations, recipe):
    x, offs = _inputs()
    model = Experts(recipe)
    _step(model, x, offs, cache=True)
    fills = len(weights._entries)
    del model
    gc.collect()
    _step(Experts(recipe, N=32), x, offs, cache=True)  # a new entry sweeps out the dead ones
    assert len(weights._entries) == fills


def test_fsdp2_regathered_weights_follow_the_optimizer(tmp_path, quantizations, recipe):
    """FSDP2 re-gathers a parameter with its version counter preserved: the cache must take the
    optimizer step's update, over steps of two microbatches each, exactly as the uncached run
    does."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        def train(cache: bool) -> list[torch.Tensor]:
            weights.clear_weight_cache()
            model = Experts(recipe)
            fully_shard(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            outs = []
            for step in range(3):
                for micro in range(2):
                    x, offs = _inputs(seed=10 * step + micro)
                    out = model(x, offs, cache)
                    out.float().square().mean().backward()
                    outs.append(out.detach())
                opt.step()
                opt.zero_grad()
            return outs

        want = train(cache=False)
        for got, ref in zip(train(cache=True), want):
            assert_bitwise_equal(got, ref)
    finally:
        dist.destroy_process_group()


def test_a_refill_that_keeps_the_version_is_caught_by_the_next_optimizer_step(quantizations, recipe):
    """What FSDP2's all-gather does to an unsharded weight, done by hand: new values in the same
    storage with the version counter preserved. The cache cannot see it (the case the FSDP2 test
    above relies on the optimizer step for; whether FSDP2 reuses the address is up to the
    allocator), and any optimizer's step clears it."""
    model, (x, offs) = Experts(recipe), _inputs()
    before = _step(model, x, offs, cache=True)
    fills = len(quantizations)
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(model.w_ENK):
        model.w_ENK.mul_(-2)
    for got, ref in zip(_step(model, x, offs, cache=True), before):
        assert_bitwise_equal(got, ref)  # stale: same storage, pointer and version
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]).step()  # an unrelated optimizer
    got = _step(model, x, offs, cache=True)
    assert len(quantizations) == 2 * fills
    for a, b in zip(got, _step(model, x, offs, cache=False)):
        assert_bitwise_equal(a, b)


def test_a_cache_past_its_share_of_device_memory_warns_once(quantizations, recipe, monkeypatch):
    model, (x, offs) = Experts(recipe), _inputs()
    monkeypatch.setattr(weights, "_warned", False)
    monkeypatch.setattr(weights, "_capacity", lambda device: 10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(model, x, offs, cache=True)  # a few KiB: no warning
    monkeypatch.setattr(weights, "_capacity", lambda device: weights.cached_bytes())
    weights.clear_weight_cache()
    with pytest.warns(UserWarning, match="weight_cache=False frees it"):
        _step(model, x, offs, cache=True)
    weights.clear_weight_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(model, x, offs, cache=True)  # once per process


def test_without_the_cache_the_emulation_rounds_the_weight_slice_by_slice(monkeypatch):
    """weight_cache=False: the rounded weight exists one slice of the GEMM's output columns at a
    time, none over UNCACHED_SLICE_BYTES, with the same results as one whole rounding, eager and
    under Inductor (whose graph calls the rounding at run time, so it is counted there)."""
    E, N, K = 4, 384, 384
    model = Experts("mxfp8", E, N, K)
    g = torch.Generator().manual_seed(2)
    x, offs = torch.randn(sum(SIZES), K, generator=g).bfloat16(), make_offs(SIZES)
    rounded = []  # shapes of the weights (3-D; the tokens are 2-D) rounded on the CPU path
    quantize_dequantize = reference.quantize_dequantize

    def counted(x, *args):
        if x.dim() == 3:
            rounded.append(tuple(x.shape))
        return quantize_dequantize(x, *args)

    monkeypatch.setattr(reference, "quantize_dequantize", counted)
    want = _step(model, x, offs, cache=False)
    assert sorted(rounded) == [(E, K, N)] * 2  # small enough for one slice per orientation
    budget = 2 * E * K * N // 3
    monkeypatch.setattr(mxfp8, "UNCACHED_SLICE_BYTES", budget)
    for step in (model, torch.compile(model, fullgraph=True)):
        del rounded[:]
        got = _step(step, x, offs, cache=False)
        # forward: N in 3 slices of 128 columns; input gradient: K in 3
        assert sorted(rounded) == [(E, 128, N)] * 3 + [(E, K, 128)] * 3
        assert all(2 * math.prod(shape) <= budget for shape in rounded)
        for a, b in zip(got, want):
            assert_bitwise_equal(a, b)
