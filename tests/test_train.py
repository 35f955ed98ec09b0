"""examples/train_moe.py on a tiny config on the CPU: the loss falls through the mxfp8 pass, the
summary and log have their documented form, and FSDP2 over two gloo ranks follows the
single-process losses."""

import json
import math
import os
import pathlib
import statistics
import subprocess
import sys

import pytest
import torch

import mxfp8_inductor as mx
from mxfp8_inductor import backend

EXAMPLES = pathlib.Path(__file__).parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import train_moe  # noqa: E402

STEPS = 30
TINY = ["--layers", "2", "--dim", "64", "--heads", "4", "--experts", "4", "--top-k", "2", "--hidden", "64",
        "--seq", "32", "--batch", "4", "--lr", "3e-3", "--steps", str(STEPS), "--device", "cpu"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One 30-step mxfp8 run (two per-block compiles), with the rows the backend's pass reported."""
    out = tmp_path_factory.mktemp("train") / "single.json"
    rows = []

    def recording_rewrite(gm, config):
        rows.extend(result := rewrite(gm, config))
        return result

    rewrite = backend.rewrite
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend, "rewrite", recording_rewrite)
        args = [*TINY, "--recipe", "mxfp8", "--out", str(out), "--log", str(out.with_suffix(".jsonl"))]
        summary = train_moe.train(train_moe.parse_args(args))
    return summary, out, rows


@pytest.mark.slow
def test_loss_falls_through_the_pass(single):
    summary, _, rows = single
    losses = summary["recipes"]["mxfp8"]["loss"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    # byte-level: ln(256) = 5.55 at the start; seen 4.81 -> 3.16
    first, last = statistics.fmean(losses[:5]), statistics.fmean(losses[-5:])
    assert last < first - 0.8, (first, last)
    # every compiled block's expert GEMMs went through the pass: 3 weights x fwd/dgrad/wgrad
    assert rows and {r.action for r in rows} == {"rewritten"} and len(rows) % 9 == 0


@pytest.mark.slow
def test_summary_and_log_format(single):
    summary, out, _ = single
    assert set(summary) == {"gpu", "torch", "date", "steps", "config", "recipes"}
    assert summary["gpu"] == "cpu" and summary["torch"] == torch.__version__ and summary["steps"] == STEPS
    assert summary["config"] == {"layers": 2, "dim": 64, "heads": 4, "experts": 4, "top_k": 2, "hidden": 64,
                                 "seq": 32, "batch": 4, "lr": 3e-3, "seed": 0, "ac": False, "world_size": 1}
    assert set(summary["recipes"]) == {"mxfp8"} and set(summary["recipes"]["mxfp8"]) == {"loss", "step_ms"}
    assert summary["recipes"]["mxfp8"]["step_ms"] > 0
    assert json.loads(out.read_text()) == summary
    log = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(STEPS))
    assert all(set(r) == {"recipe", "step", "loss", "step_ms"} and r["recipe"] == "mxfp8" for r in log)
    assert [r["loss"] for r in log] == summary["recipes"]["mxfp8"]["loss"]


def test_explain_block_rewritten():
    args = train_moe.parse_args(TINY)
    block = train_moe.build_model(args).blocks[0]
    x_BLD = torch.randn(4, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    report = mx.explain(block, x_BLD, options={"recipe": "mxfp8"})
    assert {s.action for s in report.sites} == {"rewritten"} and len(report.sites) == 9, str(report)
    assert not report.graph_breaks


def test_all_recipes_take_every_linear_of_a_block_but_the_router(monkeypatch):
    """--recipe R+all compiles each block with targets="all" and no size floor, so the tiny
    model's attention projections are rewritten too (the 1000-step +all runs rely on it)."""
    calls = []
    monkeypatch.setattr(train_moe.torch, "compile", lambda module, **kw: calls.append(kw) or module)
    args = train_moe.parse_args([*TINY, "--recipe", "bf16,fp8_rowwise+all"])
    model = train_moe.build_model(args)
    train_moe.compile_blocks(model, "fp8_rowwise+all")
    monkeypatch.undo()  # explain compiles
    options = {"recipe": "fp8_rowwise", "targets": "all", "dense_min_dim": 0}
    assert calls == [{"backend": mx.mxfp8_backend, "options": options}] * args.layers
    x_BLD = torch.randn(4, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    report = mx.explain(model.blocks[0], x_BLD, options=options)
    actions = {(s.weight_fqn, s.action) for s in report.sites if s.role == "forward"}
    assert {w for w, a in actions if a == "rewritten"} >= {"attn.qkv.weight", "attn.proj.weight"}, str(report)
    assert ("moe.router.weight", "rewritten") not in actions, str(report)


def test_batches_depend_on_seed_and_step_only():
    data_N = torch.arange(10_000, dtype=torch.int32).to(torch.uint8)
    a = train_moe.get_batch(data_N, 0, 7, 4, 32)
    assert all(torch.equal(u, v) for u, v in zip(a, train_moe.get_batch(data_N, 0, 7, 4, 32)))
    assert not torch.equal(a[0], train_moe.get_batch(data_N, 0, 8, 4, 32)[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])


def test_init_noise_nudges_every_weight_and_is_recorded():
    def weights(*extra):
        args = train_moe.parse_args(TINY + list(extra))
        return [p.float() for p in train_moe.build_model(args).parameters()], train_moe.config_of(args, 1)

    base, config = weights()
    same, _ = weights("--init-noise", "0")
    nudged, noisy_config = weights("--init-noise", "1e-2")
    assert all(torch.equal(a, b) for a, b in zip(base, same))
    rel = [((a - b).norm() / b.norm()).item() for a, b in zip(nudged, base) if b.norm() > 0]
    assert all(2e-3 < r < 5e-2 for r in rel), rel
    assert "init_noise" not in config and noisy_config["init_noise"] == 1e-2


@pytest.mark.slow
def test_fsdp2_two_gloo_ranks_follow_single_process(single, tmp_path):
    """torchrun, two CPU ranks (gloo), FSDP2 per block and root, each block compiled with the pass
    and activation-checkpointed; the first 12 steps of the same schedule and global batch follow
    the single-process run to bf16 rounding."""
    summary, single_out, _ = single
    out = tmp_path / "fsdp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(EXAMPLES / "train_moe.py"), "--fsdp", *TINY, "--recipe", "mxfp8", "--out", str(out),
           "--ac", "--stop-after", "12", "--fsdp-compare", str(single_out)]
    proc = subprocess.run(cmd, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fsdp = json.loads(out.read_text())
    assert fsdp["config"] == {**summary["config"], "world_size": 2, "ac": True}
    cmp = fsdp["fsdp_vs_single"]["mxfp8"]
    assert cmp["same_config"] and cmp["k"] == 12
    torch.testing.assert_close(fsdp["recipes"]["mxfp8"]["loss"], summary["recipes"]["mxfp8"]["loss"][:12],
                               rtol=2e-2, atol=0)
    assert cmp["max_rel"] < 2e-2


def test_seed_summary_pairs_each_recipe_with_bf16_of_its_seed(tmp_path):
    """Only 1000-step one-GPU runs count, a nudged-bf16 run is the noise floor (never bf16 itself),
    a recipe in a file of its own is compared with the bf16 of its seed, a small gap of one sign on
    every seed is outside noise by the paired t-test, and one seed gets no test."""
    import seed_summary

    def write(name, seed, recipes, steps=1000, **cfg):
        data = {"steps": steps, "config": {"seed": seed, "world_size": 1, **cfg},
                "recipes": {r: {"loss": [loss] * steps} for r, loss in recipes.items()}}
        (tmp_path / f"{name}.json").write_text(json.dumps(data))

    for seed in range(4):
        write(f"s{seed}", seed, {"bf16": 2.0, "mxfp8": 2.0 + 0.001 * (seed + 1)})
        write(f"s{seed}_noise", seed, {"bf16": 2.0 + 0.004 * (-1) ** seed}, init_noise=1e-3)
    write("rowwise", 0, {"fp8_rowwise": 1.99})
    write("fsdp", 1, {"bf16": 9.0}, world_size=2)
    write("short", 2, {"bf16": 1.0, "mxfp8": 9.0}, steps=20)
    out = tmp_path / "summary.json"
    seed_summary.main(["--results", str(tmp_path), "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["final_loss"]["0"] == {"bf16": 2.0, "mxfp8": 2.001, "fp8_rowwise": 1.99, seed_summary.NOISE: 2.004}
    mx = got["recipes"]["mxfp8"]
    # loss gaps 0.001 to 0.004: t = 0.0025 / (0.00129 / 2) = 3.87 on 3 degrees of freedom
    assert mx["mean_gap"] == pytest.approx(0.00125) and mx["t"] == pytest.approx(3.873, abs=1e-3)
    assert mx["p"] == pytest.approx(0.0305, abs=1e-3) and not mx["within_noise"]
    assert mx["ci95"][0] > 0
    noise = got["recipes"][seed_summary.NOISE]
    assert noise["mean_gap"] == pytest.approx(0.0) and noise["p"] == pytest.approx(1.0) and noise["within_noise"]
    rowwise = got["recipes"]["fp8_rowwise"]
    assert rowwise["gap_by_seed"] == {"0": pytest.approx(-0.005)} and rowwise["within_noise"] is None
