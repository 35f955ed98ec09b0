"""The ops against the numerics contract restated in tests/contract.py, bit for bit: eager and
under the pass with Inductor, every recipe, rounding, wgrad mode, weight layout and weight cache
setting, on small awkward groups, with data spanning 2^-10..2^10 along rows and columns (with
magnitudes alike along a block, a block on the wrong axis or in the wrong place rounds the same).

A GEMM result is the contract's when it equals, in every bit, the contract's GEMM in one of the
accumulation orders torch's CPU GEMM takes for some operand layout (contract.py, "GEMMs")."""

from __future__ import annotations

from collections.abc import Iterable

import contract
import pytest
import torch
from helpers import assert_bitwise_equal, make_offs, spread

import mxfp8_inductor as mx

K, N = 64, 96
# group sizes: one expert with a short last block; an empty group, a whole block and short groups;
# 70 experts, a quarter empty, most of 1 to 3 rows, some of up to 40; rows past the last group
# (they belong to none)
PROBLEMS = {
    "E1": ([45], 0),
    "E4": ([0, 33, 64, 7], 0),
    "E70": ([0 if e % 4 == 1 else 1 + (e * 13) % 40 if e % 5 == 0 else 1 + e % 3 for e in range(70)], 0),
    "E3_tail": ([5, 0, 40], 6),
}


def assert_contract(actual: torch.Tensor, candidates: Iterable[torch.Tensor]) -> None:
    """actual equals the contract in one of its GEMM accumulation orders, in every element."""
    errors = []
    for expected in candidates:
        try:
            assert_bitwise_equal(actual, expected)
            return
        except AssertionError as err:
            errors.append(str(err).splitlines()[0])
    raise AssertionError(f"no accumulation order of the contract matches: {errors}")


def _differ(x: torch.Tensor, y: torch.Tensor) -> bool:
    return not torch.equal(x.view(torch.int16), y.view(torch.int16))


def _problem(name: str) -> tuple[torch.Tensor, int, int]:
    """(offs, end, M) of a named problem: `end` is offs[-1], M counts the rows past it too."""
    sizes, tail = PROBLEMS[name]
    offs = make_offs(sizes)
    end = int(offs[-1])
    return offs, end, end + tail


def _weight(E: int, layout: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(leaf parameter, b[E, K, N] as the op sees it): a transposed view of w[E, N, K] or a
    contiguous [E, K, N]."""
    if layout == "ENK":
        w_ENK = spread(E, N, K, gen=gen).requires_grad_()
        return w_ENK, w_ENK.transpose(-2, -1)
    w_EKN = spread(E, K, N, gen=gen).requires_grad_()
    return w_EKN, w_EKN


def _grouped_step(b_EKN: torch.Tensor, leaf: torch.Tensor, offs: torch.Tensor, M: int, gen: torch.Generator,
                  **options) -> tuple[torch.Tensor, ...]:
    """One forward and backward of mx.grouped_mm on fresh tokens: (a, dout, out, da, db[E, K, N])."""
    a_MK = spread(M, K, gen=gen).requires_grad_()
    dout_MN = spread(M, N, gen=gen)
    out_MN = mx.grouped_mm(a_MK, b_EKN, offs, **options)
    out_MN.backward(dout_MN)
    db = leaf.grad if leaf is b_EKN else leaf.grad.transpose(-2, -1)
    leaf.grad = None
    return a_MK.detach(), dout_MN, out_MN.detach(), a_MK.grad, db


def _check_grouped(a_MK: torch.Tensor, b_EKN: torch.Tensor, offs: torch.Tensor, dout_MN: torch.Tensor,
                   out_MN: torch.Tensor, da_MK: torch.Tensor, db_EKN: torch.Tensor, recipe: str, rounding: str,
                   wgrad: str, end: int, shared: bool = False) -> None:
    """out, da (rows up to the last group end: past it they are unspecified) and db vs the contract;
    `shared`: the weight reused (fp8_rowwise rounds it as one block per matrix)."""
    b_EKN = b_EKN.detach()
    fwd = contract.grouped_forward(a_MK, b_EKN, offs, recipe, rounding, shared)
    assert_contract(out_MN[:end], (c[:end] for c in fwd))
    dgrad = contract.grouped_dgrad(dout_MN, b_EKN, offs, recipe, rounding, shared)
    assert_contract(da_MK[:end], (c[:end] for c in dgrad))
    wrecipe = "bf16" if wgrad == "bf16" else recipe
    assert_contract(db_EKN, contract.grouped_wgrad(dout_MN, a_MK, offs, wrecipe, rounding))


# --------------------------------------------------------------------------------------------
# The contract's quantizer vs the public quantizers: scale bytes, data, special blocks


def _special_blocks(dtype: torch.dtype) -> torch.Tensor:
    """[rows, 64] with one special 32-block per row (left) beside a random one (right)."""
    gen = torch.Generator().manual_seed(1)
    big = torch.finfo(dtype).max
    rows = [
        torch.zeros(32),  # all zero: byte 0
        # bf16 subnormals k * 2^-133: byte 0, data x * 2^127 (exact only for k of <= 4 significant bits)
        torch.arange(32) * 2.0**-133,
        big * torch.tensor([1.0, -0.5] * 16, dtype=torch.float64),  # the dtype's limit: capped at 2^119, saturates
        torch.full((32,), 448.0 * 2**-20),  # amax exactly 448 * 2^s: RCEIL takes s itself
        torch.full((32,), 448.0 * 2**-20) * (1 + 2**-7),  # just above: RCEIL s + 1
        torch.full((32,), 2.0**30),  # a power of two: FLOOR's exact case
        torch.full((32,), 1.9 * 2**30),  # mantissa past 1.75: FLOOR saturates
        torch.full((32,), float("nan")),
        torch.tensor([float("inf")] + [1.0] * 31),
        torch.tensor([-float("inf")] + [1.0] * 31),
        torch.tensor([float("nan")] + [2.0**-130] * 31),
    ]
    left = torch.stack(rows)
    return torch.cat([left, torch.randn(len(rows), 32, generator=gen) * 2.0**40], 1).to(dtype)


@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_public_quantize_matches_contract_on_special_blocks(rounding, dtype):
    x = _special_blocks(dtype)
    data, scales = mx.quantize(x, -1, rounding)
    want_data, want_bytes = contract.mx_quantize(x, -1, rounding)
    assert_bitwise_equal(scales.view(torch.uint8), want_bytes)
    finite = want_bytes.repeat_interleave(32, 1) != 255  # a NaN/inf block's data is not part of the contract
    assert_bitwise_equal(data.view(torch.uint8)[finite], want_data.view(torch.uint8)[finite])
    assert_bitwise_equal(mx.dequantize(data, scales, -1), contract.round_along(x, 1, "mxfp8", rounding))
    # the documented special cases, stated directly
    assert want_bytes[0, 0] == 0 and want_bytes[1, 0] == 0 and want_bytes[2, 0] == 246
    assert (want_bytes[7:, 0] == 255).all()
    assert int(want_bytes[4, 0]) == int(want_bytes[3, 0]) + (rounding == "rceil")
    assert torch.isfinite(mx.dequantize(data, scales, -1)[2].float()).all()


@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
def test_public_quantize_groups_matches_contract(rounding):
    gen = torch.Generator().manual_seed(2)
    offs = make_offs([0, 33, 64, 7, 1])
    x_MK = spread(105, K, gen=gen)
    data, scales = mx.quantize_groups(x_MK, offs, rounding)
    want_data, want_bytes = contract.mx_quantize_tokens(x_MK, offs.tolist(), rounding)
    assert_bitwise_equal(data, want_data)
    scale_bytes = scales.view(torch.uint8)
    assert_bitwise_equal(scale_bytes[: len(want_bytes)], torch.stack(want_bytes))
    assert (scale_bytes[len(want_bytes):] == 0).all()


@pytest.mark.parametrize("dim", [0, 1])
def test_public_quantize_along_either_dim_matches_contract(dim):
    gen = torch.Generator().manual_seed(3)
    x = spread(64, 96, gen=gen)
    data, scales = mx.quantize(x, dim, "floor")
    want_data, want_bytes = contract.mx_quantize(x, dim, "floor")
    assert_bitwise_equal(data, want_data)
    assert_bitwise_equal(scales.view(torch.uint8), want_bytes)


# --------------------------------------------------------------------------------------------
# Eager grouped_mm and linear: outputs and gradients vs the contract


def _run_grouped(problem: str, recipe: str, rounding: str, wgrad: str, weight_cache: bool, layout: str) -> None:
    gen = torch.Generator().manual_seed(len(problem))
    offs, end, M = _problem(problem)
    leaf, b_EKN = _weight(offs.numel(), layout, gen)
    options = dict(recipe=recipe, rounding=rounding, wgrad=wgrad, weight_cache=weight_cache)
    # twice: with the cache, the second step takes the weight's rounding from it
    for _ in range(2 if weight_cache else 1):
        a_MK, dout_MN, out_MN, da_MK, db_EKN = _grouped_step(b_EKN, leaf, offs, M, gen, **options)
        _check_grouped(a_MK, b_EKN, offs, dout_MN, out_MN, da_MK, db_EKN, recipe, rounding, wgrad, end,
                       shared=weight_cache)


@pytest.mark.parametrize("layout", ["ENK", "EKN"])
@pytest.mark.parametrize("weight_cache", [True, False])
@pytest.mark.parametrize("wgrad", ["quantized", "bf16"])
@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
@pytest.mark.parametrize("recipe", contract.RECIPES)
@pytest.mark.parametrize("problem", ["E1", "E4", "E3_tail"])
def test_grouped_mm_matches_contract(problem, recipe, rounding, wgrad, weight_cache, layout):
    _run_grouped(problem, recipe, rounding, wgrad, weight_cache, layout)


@pytest.mark.parametrize(("recipe", "rounding", "wgrad", "weight_cache", "layout"), [
    ("mxfp8", "rceil", "quantized", True, "ENK"),
    ("mxfp8", "floor", "quantized", False, "EKN"),
    ("mxfp8", "floor", "bf16", True, "EKN"),
    ("fp8_rowwise", "rceil", "quantized", False, "ENK"),
    ("fp8_rowwise", "floor", "quantized", True, "EKN"),
    ("fp8_rowwise", "rceil", "bf16", False, "EKN"),
])
def test_grouped_mm_with_70_experts_matches_contract(recipe, rounding, wgrad, weight_cache, layout):
    _run_grouped("E70", recipe, rounding, wgrad, weight_cache, layout)


@pytest.mark.parametrize("M", [45, 64])
@pytest.mark.parametrize("weight_cache", [True, False])
@pytest.mark.parametrize("wgrad", ["quantized", "bf16"])
@pytest.mark.parametrize("rounding", contract.ROUNDINGS)
@pytest.mark.parametrize("recipe", contract.RECIPES)
def test_linear_matches_contract(recipe, rounding, wgrad, weight_cache, M):
    gen = torch.Generator().manual_seed(M)
    w_NK = spread(N, K, gen=gen).requires_grad_()
    x_MK = spread(M, K, gen=gen).requires_grad_()
    dout_MN = spread(M, N, gen=gen)
    out_MN = mx.linear(x_MK, w_NK, recipe=recipe, rounding=rounding, wgrad=wgrad, weight_cache=weight_cache)
    out_MN.backward(dout_MN)
    x, w = x_MK.detach(), w_NK.detach()
    assert_contract(out_MN.detach(), contract.linear_forward(x, w, recipe, rounding, shared=weight_cache))
    assert_contract(x_MK.grad, contract.linear_dgrad(dout_MN, w, recipe, rounding, shared=weight_cache))
    wrecipe = "bf16" if wgrad == "bf16" else recipe
    assert_contract(w_NK.grad, contract.linear_wgrad(dout_MN, x, wrecipe, rounding))


# --------------------------------------------------------------------------------------------
# Options reach the numerics (eager)


def _grouped_results(options: dict, data=spread) -> tuple[torch.Tensor, ...]:
    """(out, da, db) of one step of the E4 problem on fixed data made by `data`."""
    gen = torch.Generator().manual_seed(0)
    offs, end, M = _problem("E4")
    w_ENK = data(offs.numel(), N, K, gen=gen).requires_grad_()
    a_MK = data(M, K, gen=gen).requires_grad_()
    out_MN = mx.grouped_mm(a_MK, w_ENK.transpose(-2, -1), offs, **options)
    out_MN.backward(data(M, N, gen=gen))
    return out_MN.detach(), a_MK.grad, w_ENK.grad


def _mantissa_at_most_1_75(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """`spread` data with every |x| = m * 2^e cut to m <= 1.75 (bf16 rounding cannot pass 1.75,
    which it holds)."""
    mant, exp = torch.frexp(spread(*shape, gen=gen).float())  # |mant| in [0.5, 1)
    return torch.ldexp(mant.clamp(-0.875, 0.875), exp).bfloat16()


def test_floor_differs_from_rceil_exactly_where_a_block_max_passes_1_75():
    """amax = m * 2^e with m in [1, 2): RCEIL's exponent is e - 8 + (m > 1.75), FLOOR's e - 8. So
    the roundings differ on typical data and agree bit for bit where no block max passes 1.75."""
    rceil, floor = (_grouped_results(dict(rounding=r)) for r in contract.ROUNDINGS)
    assert all(_differ(r, f) for r, f in zip(rceil, floor))  # out, da and db
    for recipe in contract.RECIPES:
        rceil, floor = (_grouped_results(dict(recipe=recipe, rounding=r), data=_mantissa_at_most_1_75)
                        for r in contract.ROUNDINGS)
        for r, f in zip(rceil, floor):
            assert_bitwise_equal(r, f)


def test_wgrad_bf16_changes_only_the_weight_gradient():
    for recipe in contract.RECIPES:
        quantized = _grouped_results(dict(recipe=recipe, wgrad="quantized"))
        bf16 = _grouped_results(dict(recipe=recipe, wgrad="bf16"))
        assert_bitwise_equal(quantized[0], bf16[0])
        assert_bitwise_equal(quantized[1], bf16[1])
        assert _differ(quantized[2], bf16[2])


def test_recipes_differ_only_on_rows_spanning_magnitudes():
    """docs/design.md, "Numerics contract": with power-of-two scales the recipes round alike unless
    a row spans values far below its max (rowwise pushes them into e4m3 subnormals; MXFP8 scales
    each 32-block, blockwise each 128-block)."""
    results = {r: _grouped_results(dict(recipe=r)) for r in contract.RECIPES}
    assert all(_differ(m, r) for m, r in zip(results["mxfp8"], results["fp8_rowwise"]))
    # K = 64 and N = 96 fit one 128-block: blockwise differs from rowwise only in the weight,
    # rounded in one block per expert, not per row
    assert all(_differ(m, r) for m, r in zip(results["mxfp8"], results["fp8_blockwise"]))
    assert _differ(results["fp8_rowwise"][0], results["fp8_blockwise"][0])
    # magnitudes within 2^6 of each other everywhere, RCEIL: no subnormal, no saturation
    gen = torch.Generator().manual_seed(4)
    offs = make_offs([0, 33, 64, 7])
    M = int(offs[-1])

    def narrow(*shape: int) -> torch.Tensor:
        x = torch.randn(*shape, generator=gen)
        return (x.sign() * x.abs().clamp(2**-4, 4) * 2.0**-9).bfloat16()

    a_MK, b_EKN, dout_MN = narrow(M, K), narrow(4, K, N), narrow(M, N)
    ends = offs.tolist()
    for recipe in ("mxfp8", "fp8_blockwise"):
        for x, dim in ((a_MK, 1), (dout_MN, 1)):  # forward and input-gradient operands
            assert_bitwise_equal(contract.round_along(x, dim, "fp8_rowwise", "rceil"),
                                 contract.round_along(x, dim, recipe, "rceil"))
        for dim in (1, 2):  # the weight in both GEMMs
            assert_bitwise_equal(contract.round_weight(b_EKN, dim, "fp8_rowwise", "rceil"),
                                 contract.round_weight(b_EKN, dim, recipe, "rceil"))
        for x in (a_MK, dout_MN):  # weight-gradient operands
            assert_bitwise_equal(contract.round_tokens(x, ends, "fp8_rowwise", "rceil"),
                                 contract.round_tokens(x, ends, recipe, "rceil"))
    # so each recipe's op gives the next one's contract (the two may still sum in different orders)
    for recipe, other in zip(contract.RECIPES, contract.RECIPES[1:] + contract.RECIPES[:1]):
        a, b = a_MK.clone().requires_grad_(), b_EKN.clone().requires_grad_()
        out = mx.grouped_mm(a, b, offs, recipe=recipe)
        out.backward(dout_MN)
        _check_grouped(a_MK, b_EKN, offs, dout_MN, out.detach(), a.grad, b.grad, other, "rceil", "quantized", M)


def test_weight_cache_serves_each_rounding_and_recipe_its_own_and_follows_updates():
    """One weight through every recipe and rounding with the cache on, then changed in place:
    each step is the contract's for its own options and the weight's current values."""
    gen = torch.Generator().manual_seed(5)
    offs, end, M = _problem("E4")
    leaf, b_EKN = _weight(offs.numel(), "ENK", gen)
    steps = [(recipe, rounding) for recipe in contract.RECIPES for rounding in contract.ROUNDINGS]
    for i, (recipe, rounding) in enumerate(steps + steps[:1] + steps):
        if i == len(steps) + 1:
            with torch.no_grad():
                leaf.mul_(-2.0)  # bumps the version counter: the cache must not serve the old values
        step = _grouped_step(b_EKN, leaf, offs, M, gen, recipe=recipe, rounding=rounding)
        _check_grouped(step[0], b_EKN, offs, *step[1:], recipe, rounding, "quantized", end)


# --------------------------------------------------------------------------------------------
# Under the pass, compiled with Inductor: three compiles. Without emulate_precision_casts: no bf16
# pointwise chain feeds a quantizer here (the ops take graph inputs), so Inductor's rounding cannot
# differ from eager's, and the results are bit-exact as they are.


class _ExpertsAndDense(torch.nn.Module):
    """A routed-expert grouped GEMM (weight [E, N, K] used transposed, or [E, K, N] as it is) and
    a dense linear on independent inputs, written as model code writes them."""

    def __init__(self, w: torch.Tensor, w_NK: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.clone())
        self.transposed = w.shape[-2:] == (N, K)
        self.dense = torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16)
        self.dense.weight.data.copy_(w_NK)

    def forward(self, x_MK: torch.Tensor, offs: torch.Tensor, y_TK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b_EKN = self.w.transpose(-2, -1) if self.transposed else self.w
        return torch._grouped_mm(x_MK, b_EKN, offs=offs), self.dense(y_TK)


def _compiled_step(layout: str, **options) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One compiled forward and backward of `_ExpertsAndDense` on the E4 problem (data fixed per
    layout): (inputs, results)."""
    gen = torch.Generator().manual_seed(6)
    offs, end, M = _problem("E4")
    w = spread(offs.numel(), *((N, K) if layout == "ENK" else (K, N)), gen=gen)
    inputs = dict(offs=offs, x=spread(M, K, gen=gen), dout=spread(M, N, gen=gen), w_NK=spread(N, K, gen=gen),
                  y=spread(40, K, gen=gen), dz=spread(40, N, gen=gen))
    inputs["b"] = w.transpose(-2, -1) if layout == "ENK" else w
    model = _ExpertsAndDense(w, inputs["w_NK"])
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="mxfp8", options=dict(targets="all", dense_min_dim=0, **options))
    x, y = inputs["x"].clone().requires_grad_(), inputs["y"].clone().requires_grad_()
    out, z = compiled(x, offs, y)
    torch.autograd.backward([out, z], [inputs["dout"], inputs["dz"]])
    db = model.w.grad.transpose(-2, -1) if layout == "ENK" else model.w.grad
    return inputs, dict(out=out.detach(), da=x.grad, db=db, z=z.detach(), dy=y.grad, dw=model.dense.weight.grad)


def _check_compiled(inputs: dict, got: dict, recipe: str, rounding: str, wgrad: str) -> None:
    a_MK, b_EKN, offs, dout_MN = inputs["x"], inputs["b"], inputs["offs"], inputs["dout"]
    _check_grouped(a_MK, b_EKN, offs, dout_MN, got["out"], got["da"], got["db"], recipe, rounding, wgrad, a_MK.shape[0])
    y, w_NK, dz = inputs["y"], inputs["w_NK"], inputs["dz"]
    assert_contract(got["z"], contract.linear_forward(y, w_NK, recipe, rounding))
    assert_contract(got["dy"], contract.linear_dgrad(dz, w_NK, recipe, rounding))
    assert_contract(got["dw"], contract.linear_wgrad(dz, y, "bf16" if wgrad == "bf16" else recipe, rounding))


def test_compiled_rounding_reaches_the_numerics():
    """RCEIL and FLOOR under the pass: each is the contract's, and they differ in every output and
    gradient, of the experts and of the dense layer."""
    results = {}
    for rounding in contract.ROUNDINGS:
        inputs, results[rounding] = _compiled_step("ENK", rounding=rounding)
        _check_compiled(inputs, results[rounding], "mxfp8", rounding, "quantized")
    for name in results["rceil"]:
        assert _differ(results["rceil"][name], results["floor"][name]), name


def test_compiled_rowwise_with_bf16_weight_gradient():
    """fp8_rowwise, FLOOR, wgrad="bf16", no weight cache, a contiguous [E, K, N] weight: the
    contract's; the weight gradients are the plain bf16 GEMMs, the rest differs from MXFP8."""
    inputs, got = _compiled_step("EKN", recipe="fp8_rowwise", rounding="floor", wgrad="bf16", weight_cache=False)
    _check_compiled(inputs, got, "fp8_rowwise", "floor", "bf16")
    x, b, offs, dout = inputs["x"], inputs["b"], inputs["offs"], inputs["dout"]
    assert _differ(got["out"], next(contract.grouped_forward(x, b, offs, "mxfp8", "floor")))
    assert _differ(got["da"], next(contract.grouped_dgrad(dout, b, offs, "mxfp8", "floor")))
    assert_contract(got["db"], (torch._grouped_mm(x.t(), dout, offs), torch._grouped_mm(dout.t(), x, offs).mT))


def test_compiled_auto_gives_each_gemm_its_own_recipe(monkeypatch):
    """recipe="auto" with a calibration that picks a different recipe per role: each of the six
    GEMMs (experts and dense layer; forward, input and weight gradient) is the contract's for the
    recipe picked for it, so the per-GEMM choice reaches the numbers, not only the report."""
    from mxfp8_inductor.lowering import auto

    picks = {"grouped": ("fp8_rowwise", "mxfp8", "bf16"), "dense": ("mxfp8", "fp8_rowwise", "mxfp8")}
    table = {kind: [dict(K=K, N=N, role=role, recipe=recipe, tokens=[1, 64], ratio=[r, r])
                    for role, pick in zip(auto.ROLES, picks[kind]) for recipe in auto.FP8
                    for r in [0.5 if recipe == pick else 2.0]]
             for kind in picks}
    monkeypatch.setattr(auto, "table", lambda: table)
    inputs, got = _compiled_step("ENK", recipe="auto")
    x, b, offs, dout = inputs["x"], inputs["b"], inputs["offs"], inputs["dout"]
    assert_contract(got["out"], contract.grouped_forward(x, b, offs, "fp8_rowwise", "rceil"))
    assert_contract(got["da"], contract.grouped_dgrad(dout, b, offs, "mxfp8", "rceil"))
    assert_contract(got["db"], (torch._grouped_mm(x.t(), dout, offs), torch._grouped_mm(dout.t(), x, offs).mT))
    y, w_NK, dz = inputs["y"], inputs["w_NK"], inputs["dz"]
    assert_contract(got["z"], contract.linear_forward(y, w_NK, "mxfp8", "rceil"))
    assert_contract(got["dy"], contract.linear_dgrad(dz, w_NK, "fp8_rowwise", "rceil"))
    assert_contract(got["dw"], contract.linear_wgrad(dz, y, "mxfp8", "rceil"))
    assert _differ(got["out"], next(contract.grouped_forward(x, b, offs, "mxfp8", "rceil")))
    assert _differ(got["dy"], next(contract.linear_dgrad(dz, w_NK, "mxfp8", "rceil")))


def test_compiled_blockwise_with_weight_cache():
    """fp8_blockwise under the pass with the weight cache: the contract's for experts and dense
    layer; its weights, rounded one block per expert here (K and N within 128), differ from
    fp8_rowwise's, rounded per row."""
    inputs, got = _compiled_step("ENK", recipe="fp8_blockwise", weight_cache=True)
    _check_compiled(inputs, got, "fp8_blockwise", "rceil", "quantized")
    x, b, offs = inputs["x"], inputs["b"], inputs["offs"]
    assert _differ(got["out"], next(contract.grouped_forward(x, b, offs, "fp8_rowwise", "rceil")))


@pytest.mark.parametrize("layout", ["ENK", "EKN"])
def test_blockwise_across_tiles_matches_contract(layout):
    """Eager fp8_blockwise with K and N past one tile (not multiples of 128) and a group past one
    tile of tokens: every GEMM the contract's."""
    gen = torch.Generator().manual_seed(7)
    K_, N_, sizes = 272, 144, [0, 150, 7, 300]
    offs, M = make_offs(sizes), sum(sizes) + 3
    w = spread(len(sizes), *((N_, K_) if layout == "ENK" else (K_, N_)), gen=gen).requires_grad_()
    b_EKN = w.transpose(-2, -1) if layout == "ENK" else w
    a_MK, dout_MN = spread(M, K_, gen=gen).requires_grad_(), spread(M, N_, gen=gen)
    out = mx.grouped_mm(a_MK, b_EKN, offs, recipe="fp8_blockwise")
    out.backward(dout_MN)
    db = w.grad.transpose(-2, -1) if layout == "ENK" else w.grad
    _check_grouped(a_MK.detach(), b_EKN, offs, dout_MN, out.detach(), a_MK.grad, db, "fp8_blockwise", "rceil",
                   "quantized", int(offs[-1]))
