"""FSDP2 with expert weights all-gathered in FP8: `mxfp8(model, fsdp_fp8_all_gather=True)`.

A tiny MoE model (an RMSNorm, then two blocks of 8 routed SwiGLU experts, w1/w3 [8, 64, 64] and
w2, each a transposed view in `torch._grouped_mm`), marked, each block compiled, then FSDP2 per
block and at the root, on 2 and 4 gloo ranks on CPU. Two SGD steps of two microbatches each on
the same tokens on every rank. Per recipe, the run that all-gathers FP8 is compared with the same
marked model whose expert parameters were made plain (bf16 all-gathers, the same rounding in the
graph) and with one process running the marked model unsharded; tests/fsdp_worker.py runs them,
these tests assert on what it saw. The last test runs the same comparison on a one-rank group.
"""

import dataclasses
import json
import re

import fsdp_worker
import pytest
import torch
from helpers import assert_bitwise_equal

pytestmark = pytest.mark.slow  # compiled training runs, spawned ranks: 1-2 minutes in all on two cores

RECIPES = fsdp_worker.RECIPES
WORLDS = (2, 4)
EXPERT_GROUP = re.compile(r"blocks\.\d+")  # FSDP2 groups that own expert weights only
MAX_RATIO = 0.55


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"world{w}")
def runs(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    """(world size, every run's trace), from one spawn of that many ranks."""
    world = request.param
    return world, fsdp_worker.spawn(world, tmp_path_factory.mktemp(f"fsdp{world}"))


def _trace(traces: dict, name: str) -> dict:
    """A run's trace; fails the test with the run's traceback where it raised."""
    trace = traces[name]
    if "error" in trace:
        pytest.fail(f"run {name} raised:\n{trace['error']}", pytrace=False)
    return trace


def _assert_same_run(a: dict, b: dict) -> None:
    assert a["losses"] == b["losses"], (a["losses"], b["losses"])
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        assert_bitwise_equal(a["params"][name], b["params"][name])


def _expert_gathers(trace: dict) -> list[int]:
    return [n for group, n in trace["gathers"] if EXPERT_GROUP.fullmatch(group)]


def _variants(world: int) -> list[str]:
    return [name.removeprefix("fp8_") for name in fsdp_worker.variants(world) if name.startswith("fp8_")]


def test_fp8_all_gather_equals_bf16_all_gather(runs):
    """Losses of every microbatch and every final parameter, bit for bit, against the same marked
    model with plain expert parameters (bf16 all-gathers): the FP8 all-gather carries exactly the
    weight the graph rounds; also with float32 master weights and bf16 compute."""
    world, traces = runs
    for variant in _variants(world):
        fp8, bf16 = _trace(traces, f"fp8_{variant}"), _trace(traces, f"bf16_{variant}")
        assert all(torch.tensor(fp8["losses"]).isfinite()), (variant, fp8["losses"])
        assert fp8["moved"], f"{variant}: some expert weight did not change over the steps"
        _assert_same_run(fp8, bf16)


@pytest.mark.parametrize("recipe", RECIPES)
def test_sharded_run_equals_the_single_process_run(runs, recipe):
    """The FP8 all-gather run on 2 ranks against one process running the same marked model
    unsharded: the same losses and final parameters, bit for bit."""
    world, traces = runs
    if f"single_{recipe}" not in traces:
        pytest.skip(f"the single-process references run at world size 2, not {world}")
    _assert_same_run(_trace(traces, f"fp8_{recipe}"), _trace(traces, f"single_{recipe}"))


def test_pass_rewrites_the_expert_gemms(runs):
    """Each run compiled one block graph (both blocks share it) whose three expert GEMMs were
    rewritten, forward and both gradients."""
    _, traces = runs
    for name in traces:
        counts = _trace(traces, name)["rewritten"]
        assert [counts.get(f"mxfp8_{role}_rewritten", 0) for role in ("forward", "input_grad", "weight_grad")] == [
            3, 3, 3], (name, counts)


def test_expert_all_gathers_carry_fp8_bytes(runs):
    """Each expert all-gather's input on a rank: its shard of the three weights as float8 bytes
    plus the scales (mxfp8: one e8m0 byte per 32x32 tile; fp8_rowwise: one float32 per expert),
    as many all-gathers as the bf16 run, at most 0.55 of its bytes. Prints the ratios."""
    world, traces = runs
    local_E, numel = fsdp_worker.E // world, fsdp_worker.FF * fsdp_worker.D
    scale_bytes = {"mxfp8": numel // 32**2, "fp8_rowwise": 4}
    ratios = {}
    for variant in _variants(world):
        fp8_trace, bf16_trace = _trace(traces, f"fp8_{variant}"), _trace(traces, f"bf16_{variant}")
        fp8, bf16 = _expert_gathers(fp8_trace), _expert_gathers(bf16_trace)
        recipe = variant.removesuffix("_fp32_master")
        assert len(fp8) == len(bf16) > 0, (variant, fp8, bf16)
        assert set(bf16) == {3 * local_E * numel * 2}, (variant, bf16)
        assert set(fp8) == {3 * local_E * (numel + scale_bytes[recipe])}, (variant, fp8)
        ratios[variant] = round(sum(fp8) / sum(bf16), 4)
        assert ratios[variant] <= MAX_RATIO, (variant, ratios[variant])
    print(json.dumps({"world_size": world, "expert_all_gather_bytes_fp8_over_bf16": ratios}))


def test_ranks_hold_only_shards_between_microbatches(runs):
    """After each microbatch's backward a rank holds no unsharded parameter storage (FSDP2 freed
    the FP8 all-gather buffers and the dequantized weights, which it held while a block ran), no
    cached FP8 weights, and of FP8 forms exactly its shards' (what it sends: the FP8 size of its
    shard, half its bf16 bytes)."""
    world, traces = runs
    for variant in _variants(world):
        fp8 = _trace(traces, f"fp8_{variant}")
        shard_fp8 = sum(_expert_gathers(fp8)[:fsdp_worker.BLOCKS])  # one all-gather per block
        assert set(fp8["fp8_held"]) == {shard_fp8}, (variant, fp8["fp8_held"], shard_fp8)
        assert set(_trace(traces, f"bf16_{variant}")["fp8_held"]) == {0}
    for name in traces:
        trace = _trace(traces, name)
        assert not any(trace["cached_bytes"]), (name, trace["cached_bytes"])
        if name.startswith("single_"):
            continue
        assert not any(trace["held_bytes"]), (name, trace["held_bytes"])
        calls = fsdp_worker.STEPS * fsdp_worker.MICRO * fsdp_worker.BLOCKS
        assert len(trace["held_in_forward"]) == calls and min(trace["held_in_forward"]) >= (
            3 * fsdp_worker.E * fsdp_worker.FF * fsdp_worker.D * 2), (name, trace["held_in_forward"])


def test_one_rank_group_fp8_all_gather_equals_bf16_all_gather(tmp_path):
    """On a one-rank group (where FSDP2 copies each weight's all-gather input instead of gathering
    it): the FP8 all-gather run and the bf16 all-gather run give the same losses and final
    parameters, bit for bit, and the pass rewrote the expert GEMMs."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        fp8 = dataclasses.asdict(fsdp_worker.run("mxfp8"))
        bf16 = dataclasses.asdict(fsdp_worker.run("mxfp8", unwrap=True))
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    assert fp8["moved"] and fp8["rewritten"].get("mxfp8_forward_rewritten") == 3, fp8["rewritten"]
    _assert_same_run(fp8, bf16)
