"""Expert parallelism: the pass under TorchTitan's EP on two gloo ranks on CPU.

TorchTitan's DeepSeek-V3 debug model (its first MoE block, 8 experts top-3, SDPA attention) is
parallelized by TorchTitan's own `parallelize_fn`: experts sharded over an "ep" mesh axis of 2,
the all-to-all token dispatcher, FSDP2, and a `torch.compile` of each block, here with a
graph-level compiler (the rewrite, AOTAutograd, the ops' decompositions, the partitioner; Inductor's
code generation would add ~30 s to each of the nine runs on CI's two cores). Up to three SGD
steps per run, each on new tokens; tests/ep_worker.py runs them, these tests assert on what it saw.
"""

from types import SimpleNamespace

import ep_worker
import pytest
import torch

pytest.importorskip("torchtitan.models.deepseek_v3")
pytestmark = pytest.mark.slow  # two spawned ranks and nine runs: minutes

RECIPES = ep_worker.RECIPES
BF16_DB = 40.0  # "agrees to bf16 rounding": one bf16 rounding of a Gaussian tensor is 56 dB
MX_DB = 20.0  # "agrees to MXFP8 rounding": one MXFP8 rounding is 31 dB, the recipes' gradients 23.5 dB here
LOSS_BF16, LOSS_MX = 1e-4, 1e-2  # relative loss differences for the same two bars
EXPERTS = [f"layers.0.moe.routed_experts.inner_experts.{w}" for w in ("w1_EFD", "w3_EFD", "w2_EDF")]  # global FQNs


@pytest.fixture(scope="module")
def ep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every run's observations (ep_worker.observe), from one spawn of the two ranks."""
    return ep_worker.spawn(tmp_path_factory.mktemp("ep"))


def _agrees(ep: dict, a: str, b: str, db: float, loss_rel: float) -> None:
    c = ep["compare"][a, b]
    assert c["grad_db"] >= db and c["loss_rel"] <= loss_rel, f"{a} vs {b}: {c}"


@pytest.mark.parametrize("recipe", ("bf16", *RECIPES))
def test_ep_run_matches_the_single_process_run(ep, recipe):
    """Losses and every parameter's gradient, step by step, against one process running every
    rank's tokens on the same weights, with the same compile route."""
    _agrees(ep, f"ep_{recipe}", f"single_{recipe}", BF16_DB, LOSS_BF16)


@pytest.mark.parametrize("recipe", RECIPES)
def test_pass_under_ep_adds_only_the_recipe_error(ep, recipe):
    """Against the same EP run without the pass: within MXFP8 rounding, and not within bf16
    rounding (the local grouped GEMMs really ran in the recipe)."""
    _agrees(ep, f"ep_{recipe}", "ep_bf16", MX_DB, LOSS_MX)
    assert ep["compare"][f"ep_{recipe}", "ep_bf16"]["grad_db"] < BF16_DB


@pytest.mark.parametrize("recipe", RECIPES)
def test_pass_rewrites_the_local_expert_gemms(ep, recipe):
    """Each rank's compiled block calls mxfp8::grouped_mm in the recipe for its three expert
    GEMMs (w1, w3, w2), on its own 4 of the 8 experts and a token count that only the all-to-all
    decides (symbolic)."""
    run = ep["runs"][f"ep_{recipe}"]
    assert [action for _, action in run["rows"]] == ["rewritten"] * 3, run["rows"]
    assert [(c.recipe, c.b_shape) for c in run["calls"]] == [(recipe, (4, 256, 256))] * 3, run["calls"]
    assert all(not c.a_rows.isdigit() for c in run["calls"]), run["calls"]
    assert not ep["runs"]["ep_bf16"]["calls"]


def test_changing_token_counts_do_not_recompile(ep):
    """Step 2 sends each rank another number of tokens than step 1 (each step routes other
    counts to each expert); every run compiles its block once."""
    tokens = ep["runs"]["ep_bf16"]["tokens"]
    local = len(tokens[0]) // ep_worker.WORLD
    received = [[sum(t[r * local:(r + 1) * local]) for r in range(ep_worker.WORLD)] for t in tokens]
    assert all(a != b for a, b in zip(received[0], received[1])), received
    assert len({tuple(t) for t in tokens}) == ep_worker.STEPS, tokens
    for name, run in ep["runs"].items():
        assert run["graphs"] == [1] * len(run["losses"]), (name, run["graphs"])


def test_empty_expert_groups(ep):
    """Experts 3 and 5 get no token (the last local group of rank 0, a middle one of rank 1): their
    gradients are exactly zero and every gradient is finite, with and without the pass."""
    for name, run in ep["runs"].items():
        assert all(t[e] == 0 for t in run["tokens"] for e in ep_worker.EMPTY_EXPERTS), (name, run["tokens"])
        assert run["empty_expert_grads_zero"] and run["finite"], name


def test_padding_and_rows_past_the_last_group(ep):
    """With groups padded to 32 rows and rows past offs[-1] (the layout of TorchTitan's padded
    dispatcher, its sentinel row made NaN), the mxfp8 run gives the unpadded run's losses and
    gradients exactly."""
    padded = ep["runs"]["ep_mxfp8_padded"]
    assert padded["finite"] and [a for _, a in padded["rows"]] == ["rewritten"] * 3, padded
    assert padded["calls"][0].a_rows != ep["runs"]["ep_mxfp8"]["calls"][0].a_rows
    _agrees(ep, "ep_mxfp8_padded", "ep_mxfp8", float("inf"), 0.0)
    _agrees(ep, "ep_mxfp8_padded", "single_mxfp8", BF16_DB, LOSS_BF16)


def test_padded_dispatcher_layout():
    """The test dispatcher itself: rank 0 sends 3 tokens and rank 1 40 to local expert 0, none to
    local expert 1. Its GEMM input holds the 43 tokens, 21 zero rows to 64, then NaN rows up to
    the worst case; offs [64, 64] leaves the last group empty; unpermuting gives the tokens back."""
    dispatcher = ep_worker.padded_dispatcher_config()(num_experts=4, top_k=1).build()
    dispatcher.ep_mesh = SimpleNamespace(size=lambda: 2)  # _permute reads only the EP degree
    x_RD = torch.arange(43 * 32, dtype=torch.float32).reshape(43, 32) + 1
    shape, x_MD, source_M, sizes_e = dispatcher._permute(x_RD, torch.tensor([3, 0, 40, 0]))
    assert sizes_e.tolist() == [64, 0]
    assert x_MD.shape == (128, 32)  # 43 tokens + 2 experts x 32, rounded up to 32
    assert torch.equal(x_MD[:43], x_RD) and not x_MD[43:64].any() and x_MD[64:].isnan().all()
    assert torch.equal(dispatcher._unpermute(x_MD, shape, source_M), x_RD)


def test_model_marked_before_parallelizing_spmd_types(ep):
    """`mxfp8(model)` before TorchTitan's default ("spmd_types") EP, which keeps plain local
    expert weights: the local expert GEMMs are rewritten under their global FQNs, and the step
    equals the DTensor + FSDP2 run with explicit options (FSDP2 itself does not compose with this
    backend on torch 2.13, see ep_worker.run_ep)."""
    rows = ep["runs"]["ep_mxfp8_marked_spmd"]["rows"]
    assert rows == [(fqn, "rewritten") for fqn in EXPERTS], rows
    _agrees(ep, "ep_mxfp8_marked_spmd", "ep_mxfp8", BF16_DB, LOSS_BF16)


def test_model_marked_before_parallelizing_dtensor_fsdp2(ep):
    """`mxfp8(model)` before TorchTitan's DTensor EP + FSDP2: the same rewrite, and the same
    numbers as the explicit-options route."""
    rows = ep["runs"]["ep_mxfp8_marked"]["rows"]
    assert rows == [(fqn, "rewritten") for fqn in EXPERTS], rows
    _agrees(ep, "ep_mxfp8_marked", "ep_mxfp8", float("inf"), 0.0)
