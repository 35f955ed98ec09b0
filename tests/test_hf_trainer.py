"""examples/hf_trainer.py's route on the CPU: transformers.Trainer compiles a tiny Qwen3-MoE marked
with `mxfp8()` through the default backend, the pass rewrites its experts in the graph Trainer
trains, and the losses and weight updates follow a bf16 Trainer run from the same weights and data."""

import copy
import math
import pathlib
import sys
import types

import pytest
import torch
import transformers
from helpers import sqnr

import mxfp8_inductor as mx
from mxfp8_inductor import backend
from mxfp8_inductor.patterns.sites import GROUPED_MM_FUNCTIONS

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "examples"))
import hf_trainer  # noqa: E402

pytestmark = pytest.mark.slow  # trains through Trainer with torch.compile: a minute

STEPS, BATCH, SEQ, LR = 6, 4, 32, 3e-3
LAYERS = 2  # hf_trainer's tiny config
EXPERT_WEIGHTS = {f"model.layers.{i}.mlp.experts.{w}" for i in range(LAYERS) for w in ("gate_up_proj", "down_proj")}


@pytest.fixture(scope="module")
def runs():
    """The marked model trained by Trainer with torch_compile=True (the one compile of this file),
    recording for each graph the marked-model pass rewrote its rows and how many calls of our op and of
    torch's grouped matmul it holds after the rewrite; and a copy trained eagerly in bf16."""
    transformers.set_seed(0)
    model = hf_trainer.build_model("qwen3_moe")
    reference = copy.deepcopy(model)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    data = hf_trainer.stdlib_windows(STEPS * BATCH, SEQ)
    mx.mxfp8(model, recipe="mxfp8")
    graphs = []

    def recording_rewrite(gm, config):
        rows = rewrite(gm, config)
        targets = [n.target for n in gm.graph.nodes]
        graphs.append((rows, targets.count(torch.ops.mxfp8.grouped_mm.default),
                       sum(t in GROUPED_MM_FUNCTIONS for t in targets)))
        return rows

    rewrite = backend.rewrite
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend, "rewrite", recording_rewrite)
        losses = hf_trainer.train(model, data, STEPS, BATCH, LR)
    bf16 = hf_trainer.train(reference, data, STEPS, BATCH, LR, torch_compile=False)
    return types.SimpleNamespace(model=model, reference=reference, start=start, graphs=graphs, losses=losses,
                                 bf16=bf16)


def test_trainer_compile_rewrites_every_expert_gemm(runs):
    # one Dynamo graph for the whole model: no graph break and no recompile across the steps
    assert len(runs.graphs) == 1, [counts for _, *counts in runs.graphs]
    rows, ours, torchs = runs.graphs[0]
    assert {(r.weight_fqn, r.role) for r in rows} == {(w, role) for w in EXPERT_WEIGHTS
                                                      for role in ("forward", "input-grad", "weight-grad")}
    assert {r.action for r in rows} == {"rewritten"}
    # the graph Trainer runs calls our op once per expert weight, and torch's grouped matmul nowhere
    assert (ours, torchs) == (len(EXPERT_WEIGHTS), 0)


def test_losses_are_finite_fall_and_follow_bf16(runs):
    assert len(runs.losses) == len(runs.bf16) == STEPS
    assert all(math.isfinite(x) for x in runs.losses)
    # byte-level: ln(256) = 5.55 at the start; seen 5.53 -> 4.83 in both runs
    assert runs.losses[-1] < runs.losses[0] - 0.3, runs.losses
    # seen at most 1.2e-3 apart; a weak bound on a tiny random-init model, whose loss moves by under 0.01
    # over these steps even with the experts' output zeroed: the update test below is the sharp one
    assert max(abs(a - b) for a, b in zip(runs.losses, runs.bf16)) < 0.05, (runs.losses, runs.bf16)


def test_every_parameter_was_updated(runs):
    unchanged = [name for name, p in runs.model.named_parameters() if torch.equal(p.detach(), runs.start[name])]
    assert not unchanged


def test_expert_updates_follow_bf16(runs):
    """The weight gradients through our op move the experts the way bf16 does: total update of each
    expert weight against the eager bf16 run's, 12-14 dB seen (compiled bf16: 17-21 dB); a wrong or
    missing weight gradient gives 0 dB or less."""
    trained, reference = dict(runs.model.named_parameters()), dict(runs.reference.named_parameters())
    for name in EXPERT_WEIGHTS:
        start = runs.start[name]
        db = sqnr(reference[name].detach() - start, trained[name].detach() - start)
        assert db > 6, (name, db)


def test_trainer_rejects_the_backend_by_name(tmp_path):
    """Why the example marks the model: accelerate turns torch_compile_backend into its DynamoBackend
    enum of built-in names, so backend="mxfp8" never reaches torch.compile."""
    args = transformers.TrainingArguments(tmp_path, torch_compile_backend="mxfp8", report_to="none")
    with pytest.raises(ValueError, match="not a valid DynamoBackend"):
        transformers.Trainer(model=hf_trainer.build_model("qwen3_moe"), args=args)
