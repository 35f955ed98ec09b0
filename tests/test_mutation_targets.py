"""Behaviour the other tests left unchecked, found by tests/mutation_score.py: the weight cache's key
and validity, eager and under the pass (docs/design.md, "Weight cache"), each checked against
quantizing anew; and the interpreter's float8 saturation (docs/design.md, "Numerics contract")."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bitwise_equal, make_offs

import mxfp8_inductor as mx
from mxfp8_inductor.kernels import reference, shared_weight
from mxfp8_inductor.lowering import weight_cache as weights
from mxfp8_inductor.options import MXFP8Config
from mxfp8_inductor.patterns.rewrite import rewrite


def _shared_rowwise(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8_rowwise weight quantization the cache holds (the shared form)."""
    return shared_weight.quantize(b, "fp8_rowwise")


E, K, N = 3, 64, 96
SIZES = [20, 0, 28]


@pytest.fixture(autouse=True)
def _empty_cache():
    weights.clear_weight_cache()
    yield
    weights.clear_weight_cache()


def _data(*shape: int, seed: int) -> torch.Tensor:
    """bf16 data whose rows and columns span 2^-6..2^6, so that both roundings and both weight
    orientations give different float8 values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    x = x * torch.exp2(torch.randint(-6, 7, (*shape[:-1], 1), generator=g).float())
    return (x * torch.exp2(torch.randint(-6, 7, (shape[-1],), generator=g).float())).bfloat16()


def _step(w: torch.nn.Parameter, a_MK: torch.Tensor, dout_MN: torch.Tensor, **options) -> tuple[torch.Tensor, ...]:
    """(out, da, db) of one eager forward and backward of the op on w[E, N, K] used transposed."""
    a = a_MK.clone().requires_grad_()
    out = mx.grouped_mm(a, w.transpose(-2, -1), make_offs(SIZES), recipe="fp8_rowwise", **options)
    da, db = torch.autograd.grad(out, [a, w], dout_MN)
    return out.detach(), da, db


def _fresh(w: torch.nn.Parameter, a_MK: torch.Tensor, dout_MN: torch.Tensor, **options) -> tuple[torch.Tensor, ...]:
    """`_step` with the cache's numerics (the shared form), quantized anew: on a new parameter,
    which no entry serves."""
    return _step(torch.nn.Parameter(w.detach().clone()), a_MK, dout_MN, weight_cache=True, **options)


def test_cached_weight_serves_only_its_own_rounding():
    """With the cache on, one weight alternating RCEIL and FLOOR: every step is what the op
    computes without the cache for that rounding, and the two roundings differ."""
    w = torch.nn.Parameter(_data(E, N, K, seed=0))
    with torch.no_grad():  # each matrix's maximum with a mantissa past 1.75: the roundings scale it apart
        w[:, 0, 0] = 1.875 * 2.0**15
    a, dout = _data(sum(SIZES), K, seed=1), _data(sum(SIZES), N, seed=2)
    fresh = {r: _fresh(w, a, dout, rounding=r) for r in ("rceil", "floor")}
    assert not torch.equal(fresh["rceil"][0], fresh["floor"][0])
    assert not torch.equal(fresh["rceil"][1], fresh["floor"][1])
    for rounding in ("rceil", "floor", "rceil", "floor"):
        for got, want in zip(_step(w, a, dout, rounding=rounding, weight_cache=True), fresh[rounding]):
            assert_bitwise_equal(got, want)


def test_a_tensor_outside_the_parameters_storage_is_never_served_from_the_cache():
    """A weight of the parameter's dtype and layout that is not a view of its storage (a copy the
    graph edits, say) is quantized anew each time: the cache's entry for the parameter, made for
    the same key, is not its quantization."""
    param = torch.nn.Parameter(_data(E, K, N, seed=3))
    kind = ("fp8_rowwise", "rceil")
    with torch.no_grad():  # as inside the ops: no entry holds an autograd graph (and with it the parameter)
        served = weights.quantized(param, param, kind, _shared_rowwise)
        for got, want in zip(served, _shared_rowwise(param)):
            assert_bitwise_equal(got, want)
        copy = param.clone()
        copy[1] = -4 * copy[1]  # same dtype, shape, strides and offset as the parameter; other values
        for got, want in zip(weights.quantized(copy, param, kind, _shared_rowwise),
                             _shared_rowwise(copy)):
            assert_bitwise_equal(got, want)


class _Experts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(_data(E, N, K, seed=4))

    def forward(self, a_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(a_MK, self.w.transpose(-2, -1), offs=offs)


def _pass_then_aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    """The pass's rewrite as backend="mxfp8" applies it, then AOTAutograd without Inductor's code
    generation (as `check.compare(compiler="aot_eager_decomp_partition")` runs it): seconds, not
    a C++ compile."""
    rewrite(gm, MXFP8Config.from_options({"recipe": "fp8_rowwise", "weight_cache": True}))
    return torch._dynamo.lookup_backend("aot_eager_decomp_partition")(gm, example_inputs)


def test_under_the_pass_one_weight_quantization_serves_every_microbatch(monkeypatch):
    """The pass keys the cache on the parameter: over three microbatches' forwards and backwards
    the weight is quantized once, and the results are the eager op's quantizing it anew."""
    calls = []
    quantize = shared_weight.quantize

    def counted(b, *args):
        calls.append(tuple(b.shape))
        return quantize(b, *args)

    monkeypatch.setattr(shared_weight, "quantize", counted)
    model, offs = _Experts(), make_offs(SIZES)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=_pass_then_aot_eager)
    for seed in range(3):
        a, dout = _data(sum(SIZES), K, seed=10 + seed), _data(sum(SIZES), N, seed=20 + seed)
        x = a.clone().requires_grad_()
        out = compiled(x, offs)
        da, db = torch.autograd.grad(out, [x, model.w], dout)
        assert calls == [(E, K, N)]
        wants = _fresh(model.w, a, dout)
        del calls[1:]  # the fresh parameter's own quantization
        for got, want in zip((out.detach(), da, db), wants):
            assert_bitwise_equal(got, want)


@pytest.mark.interpreter
def test_triton_quantizer_saturates_floor_blocks_past_448():
    """FLOOR scales a block by 2^(floor(log2(amax)) - 8), so a max with a mantissa past 1.75 lands
    past 448 and must saturate to +-448 (e4m3 bytes 0x7E, 0xFE), as the reference does; the
    interpreter encodes float8 bytes in integer arithmetic, which saturates only if told to."""
    from mxfp8_inductor.kernels import triton_mx  # triton is optional off Linux

    x = torch.full((2, 64), 1.9 * 2**30)
    x[:, 1::2] *= -1
    x[1, 32:] = torch.linspace(-3, 3, 32)  # a block that fits: nothing saturates
    data, scales = triton_mx.quantize(x.bfloat16(), -1, "floor")
    assert scales.view(torch.uint8)[0].tolist() == [127 + 30 - 8] * 2
    assert data.view(torch.uint8)[0].tolist() == [0x7E, 0xFE] * 32
    for got, want in zip((data, scales), reference.quantize(x.bfloat16(), -1, "floor")):
        assert_bitwise_equal(got, want)
