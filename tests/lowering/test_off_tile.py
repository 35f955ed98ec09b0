"""Compiled with Inductor against eager at K and N off 128, and off 32 where the recipe allows it:
every recipe, forward and both gradients. Inductor's C++ backend drops the tail of a loop over
`i // 128` whose length is not a multiple of 128 (kernels/blockwise.py), which left
fp8_blockwise's last short tile unwritten on CPU while eager and aot_eager were right.

Two ways in: a function calling the eager ops compiled with backend="inductor", and a tiny expert
module (weights [E, N, K] used transposed, and a dense layer) compiled with backend="mxfp8". One
compile covers three GEMMs on independent inputs: two grouped, one dense. Outputs and input
gradients equal eager's bit for bit. A weight gradient's GEMM sums in an order set by the layouts
Inductor gives its operands, so it equals eager's up to that order: it is the contract's in one
of its accumulation orders (tests/contract.py), as eager's is (test_contract.py)."""

from __future__ import annotations

from collections.abc import Iterable

import contract
import pytest
import torch
from helpers import make_offs, spread

import mxfp8_inductor as mx
from mxfp8_inductor.kernels import blockwise

SIZES = [20, 0, 27, 17]  # 64 tokens in 4 groups, one empty
# (K, N) of the two grouped GEMMs and the dense one: mxfp8 takes multiples of 32, the FP8
# recipes multiples of 16 (144 and 176 are off 32 too); each off 128 in K, N or both
SHAPES = {
    "mxfp8": [(160, 288), (128, 160), (288, 96)],
    "fp8_rowwise": [(160, 144), (128, 272), (176, 144)],
    "fp8_blockwise": [(160, 144), (128, 272), (176, 144)],
}
ROUNDING = "rceil"


def _no_aot_cache():
    """AOTAutograd's cache keys the graph before Inductor decomposes the ops: under
    backend="inductor", which adds no hash of the package's sources to the keys (backend.py), a
    hit would serve an older formula's compile. (Inductor's own cache keys the decomposed graph.)"""
    return torch._functorch.config.patch(enable_autograd_cache=False)


def _data(recipe: str) -> dict[str, torch.Tensor]:
    """Tokens, weights and output gradients of the three GEMMs: x1, w1 [E, N, K], dout1, ...; w3 [N, K]."""
    gen = torch.Generator().manual_seed(len(recipe))
    E, M = len(SIZES), sum(SIZES)
    data = dict(offs=make_offs(SIZES))
    for i, (K, N) in enumerate(SHAPES[recipe], 1):
        data[f"x{i}"] = spread(M, K, gen=gen)
        data[f"w{i}"] = spread(N, K, gen=gen) if i == 3 else spread(E, N, K, gen=gen)
        data[f"dout{i}"] = spread(M, N, gen=gen)
    return data


LEAVES = ("x1", "w1", "x2", "w2", "x3", "w3")


def _step(fn, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One forward and backward of fn(x1, w1, x2, w2, x3, w3, offs) -> (out1, out2, out3): the
    outputs and the gradients of every input, by name."""
    leaves = {k: data[k].clone().requires_grad_() for k in LEAVES}
    outs = fn(*leaves.values(), data["offs"])
    torch.autograd.backward(outs, [data[f"dout{i}"] for i in (1, 2, 3)])
    return {**{f"out{i}": o.detach() for i, o in enumerate(outs, 1)}, **{f"d{k}": t.grad for k, t in leaves.items()}}


def _eager_ops(recipe: str, **options):
    def gemms(x1, w1, x2, w2, x3, w3, offs):
        return (mx.grouped_mm(x1, w1.transpose(-2, -1), offs, recipe=recipe, **options),
                mx.grouped_mm(x2, w2.transpose(-2, -1), offs, recipe=recipe, **options),
                mx.linear(x3, w3, recipe=recipe, **options))

    return gemms


def _bf16(x1, w1, x2, w2, x3, w3, offs):
    return (torch._grouped_mm(x1, w1.transpose(-2, -1), offs=offs),
            torch._grouped_mm(x2, w2.transpose(-2, -1), offs=offs), torch.nn.functional.linear(x3, w3))


class _Experts(torch.nn.Module):
    """Two routed-expert GEMMs on [E, N, K] weights used transposed and a dense layer, each on its
    own tokens, as model code writes them."""

    def __init__(self, data: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(data["w1"].clone())
        self.w2 = torch.nn.Parameter(data["w2"].clone())
        self.dense = torch.nn.Linear(data["w3"].shape[1], data["w3"].shape[0], bias=False, dtype=torch.bfloat16)
        self.dense.weight.data.copy_(data["w3"])

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, offs: torch.Tensor):
        return (torch._grouped_mm(x1, self.w1.transpose(-2, -1), offs=offs),
                torch._grouped_mm(x2, self.w2.transpose(-2, -1), offs=offs), self.dense(x3))


def _one_of(actual: torch.Tensor, candidates: Iterable[torch.Tensor]) -> bool:
    return any(torch.equal(actual, c) for c in candidates)


def _assert_matches_eager(got: dict, want: dict, bf16: dict, data: dict, recipe: str) -> None:
    offs = data["offs"]
    for name in ("out1", "out2", "out3", "dx1", "dx2", "dx3"):
        assert torch.equal(got[name], want[name]), f"{name}: {(got[name] - want[name]).abs().max().item()} from eager"
    for i in (1, 2):
        db_EKN = got[f"dw{i}"].transpose(-2, -1)
        assert _one_of(db_EKN, contract.grouped_wgrad(data[f"dout{i}"], data[f"x{i}"], offs, recipe, ROUNDING)), i
    assert _one_of(got["dw3"], contract.linear_wgrad(data["dout3"], data["x3"], recipe, ROUNDING))
    for name, value in got.items():
        assert not torch.equal(value, bf16[name]), f"{name} is bf16's: the GEMM did not run in FP8"


@pytest.mark.parametrize("recipe", sorted(SHAPES))
def test_eager_ops_compiled_match_eager(recipe):
    """The weights quantized in the graph."""
    data = _data(recipe)
    want = _step(_eager_ops(recipe), data)
    torch._dynamo.reset()
    with _no_aot_cache():
        got = _step(torch.compile(_eager_ops(recipe), backend="inductor", dynamic=False), data)
    _assert_matches_eager(got, want, _step(_bf16, data), data, recipe)


@pytest.mark.parametrize("recipe", sorted(SHAPES))
def test_pass_compiled_matches_eager(recipe):
    """The weights' quantizations taken from the weight cache, in an opaque op."""
    data = _data(recipe)
    want = _step(_eager_ops(recipe, weight_cache=True), data)
    model = _Experts(data)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="mxfp8", dynamic=False,
                             options=dict(recipe=recipe, targets="all", dense_min_dim=0, weight_cache=True))
    xs = [data[f"x{i}"].clone().requires_grad_() for i in (1, 2, 3)]
    outs = compiled(*xs, data["offs"])
    torch.autograd.backward(outs, [data[f"dout{i}"] for i in (1, 2, 3)])
    got = {**{f"out{i}": o.detach() for i, o in enumerate(outs, 1)}, **{f"dx{i}": x.grad for i, x in enumerate(xs, 1)},
           "dw1": model.w1.grad, "dw2": model.w2.grad, "dw3": model.dense.weight.grad}
    _assert_matches_eager(got, want, _step(_bf16, data), data, recipe)


def test_tile_broadcast_compiled_matches_eager():
    """The tile broadcast alone, along the last dim, along the first of a transposed view, and
    along two at once (a weight's blocks), every dim two tiles with a short last one: Inductor's
    result is eager's."""
    gen = torch.Generator().manual_seed(0)
    data_RC = torch.randn(8, 144, generator=gen).to(torch.float8_e4m3fn)
    data_EKN = torch.randn(2, 160, 144, generator=gen).to(torch.float8_e4m3fn)
    s_RT, s_ETT = torch.rand(8, 2, generator=gen), torch.rand(2, 2, 2, generator=gen)

    def broadcasts(data_RC, data_EKN, s_RT, s_ETT):
        return (blockwise.dequantize_tiles(data_RC, s_RT, 1),
                blockwise.dequantize_tiles(data_RC.t(), s_RT.t(), 0, dtype=torch.bfloat16),
                blockwise.dequantize_tiles(data_EKN, s_ETT, 1, 2, dtype=torch.bfloat16))

    args = (data_RC, data_EKN, s_RT, s_ETT)
    torch._dynamo.reset()
    got = torch.compile(broadcasts, backend="inductor", dynamic=False)(*args)
    for g, w in zip(got, broadcasts(*args)):
        assert torch.equal(g, w)


def test_one_compiled_function_quantizes_at_every_shape():
    """One function, the weight an input, compiled once and called at two shapes, as a probe
    looping over shapes does (an H100 probe found such calls equal to bf16 bit for bit): Dynamo
    compiles the second with K and N dynamic, and its GEMM must still be the eager op's."""
    torch._dynamo.reset()
    fn = torch.compile(lambda x_MK, b_EKN, offs: torch._grouped_mm(x_MK, b_EKN, offs=offs), backend="mxfp8",
                       options={"recipe": "fp8_blockwise"})
    gen = torch.Generator().manual_seed(1)
    offs = make_offs(SIZES)
    for K, N in [(144, 128), (128, 144)]:
        x_MK, w_ENK = spread(sum(SIZES), K, gen=gen), spread(len(SIZES), N, K, gen=gen)
        got = fn(x_MK, w_ENK.transpose(-2, -1), offs)
        assert torch.equal(got, mx.grouped_mm(x_MK, w_ENK.transpose(-2, -1), offs, recipe="fp8_blockwise")), (K, N)
