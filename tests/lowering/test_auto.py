"""recipe="auto": the cost model's choices, its data, and what the pass and explain() make of them."""

import json
import re

import pytest
import torch
from models import MoEModel

import mxfp8_inductor as mx
from mxfp8_inductor.lowering import auto


def _table(forward: float, dgrad: float, wgrad: float) -> dict:
    """A calibration where fp8_rowwise's ratio to bf16 is the given one per role at every size
    and mxfp8 is always slower."""
    rows = []
    for role, r in zip(auto.ROLES, (forward, dgrad, wgrad)):
        rows.append(dict(K=64, N=128, role=role, recipe="fp8_rowwise", tokens=[16, 64], ratio=[r, r]))
        rows.append(dict(K=64, N=128, role=role, recipe="mxfp8", tokens=[16, 64], ratio=[1.5, 1.5]))
    return {"grouped": rows, "dense": rows}


@pytest.fixture
def table(monkeypatch):
    def use(*ratios):
        monkeypatch.setattr(auto, "table", lambda: _table(*ratios))

    return use


def test_shipped_calibration_covers_every_role_and_recipe():
    data = auto.table()
    for kind in ("grouped", "dense"):
        keys = {(r["role"], r["recipe"]) for r in data[kind]}
        assert keys == {(role, recipe) for role in auto.ROLES for recipe in auto.FP8}
        for r in data[kind]:
            assert r["tokens"] == sorted(r["tokens"]) and len(r["tokens"]) == len(r["ratio"]) >= 2
            assert all(x > 0 for x in r["ratio"])


def test_interpolation_is_linear_in_log_tokens_and_flat_past_the_ends():
    xs, ys = [128, 512], [2.0, 1.0]
    assert auto._interp(xs, ys, 256) == pytest.approx(1.5)
    assert auto._interp(xs, ys, 8) == 2.0 and auto._interp(xs, ys, 10**6) == 1.0


def test_each_role_takes_fp8_only_where_it_is_faster_by_the_margin(table):
    table(0.5, 1 - auto.MARGIN / 2, 1.2)
    plan = auto.plan_for("auto", "quantized", M=256, K=64, N=128, E=8, dense=False)
    assert plan.recipes == ("fp8_rowwise", "bf16", "bf16")
    assert "2.00x bf16 at 32 tokens per group" in plan.reasons[0]
    assert "fp8_rowwise 1.02x" in plan.reasons[1] and "mxfp8 0.67x" in plan.reasons[1]
    assert auto.plan_for("auto", "bf16", M=256, K=64, N=128, E=8, dense=False).reasons[2] == "wgrad='bf16'"
    unknown = auto.plan_for("auto", "quantized", M=None, K=64, N=128, E=8, dense=False)
    assert unknown.recipes == ("auto",) * 3 and "chosen per call" in unknown.reasons[0]
    # mxfp8 needs K and N in blocks of 32: a K of 48 leaves fp8_rowwise only
    table(1.5, 1.5, 1.5)
    assert "mxfp8" not in auto.plan_for("auto", "quantized", M=256, K=48, N=128, E=8, dense=False).reasons[0]


def test_fixed_recipes_ignore_the_table(table):
    table(9.0, 9.0, 9.0)
    plan = auto.plan_for("mxfp8", "quantized", M=4, K=64, N=128, E=8, dense=False)
    assert plan.recipes == ("mxfp8",) * 3


def _explain_auto() -> tuple[mx.Report, str]:
    """The report of a one-layer MoE under recipe="auto" and its rewritten graphs' code."""
    torch.manual_seed(0)
    report = mx.explain(MoEModel(layers=1).bfloat16(), torch.randn(2, 8, 64, dtype=torch.bfloat16),
                        options={"recipe": "auto"})
    return report, "".join(report.graphs)


def test_pass_puts_each_roles_choice_in_the_op_and_the_report(table):
    table(0.5, 0.8, 1.3)
    report, code = _explain_auto()
    assert code.count("'fp8_rowwise', 'fp8_rowwise', 'bf16', 'rceil'") == 3
    actions = {(s.role, s.action) for s in report.sites}
    assert actions == {("forward", "rewritten"), ("input-grad", "rewritten"), ("weight-grad", "kept bf16")}
    assert all("at 8 tokens per group (H200 table)" in s.reason for s in report.sites)
    assert {(s.role, s.recipe) for s in report.sites} == {
        ("forward", "fp8_rowwise"), ("input-grad", "fp8_rowwise"), ("weight-grad", "bf16")}


def test_where_fp8_loses_everywhere_the_site_stays_untouched(table):
    table(1.1, 1.1, 1.1)
    report, code = _explain_auto()
    assert "mxfp8.grouped_mm" not in code and code.count("torch._grouped_mm(") == 3
    assert {s.action for s in report.sites} == {"kept bf16"}


@pytest.fixture
def calibration_file(monkeypatch, tmp_path):
    """Point `table()` at a temporary file, uncached before and after."""
    path = tmp_path / "auto_h200.json"
    monkeypatch.setattr(auto, "_DATA", path)
    auto.table.cache_clear()
    yield path
    auto.table.cache_clear()


@pytest.mark.parametrize("content, problem", [
    (None, "FileNotFoundError"),
    ("{not json", "JSONDecodeError"),
    ('{"grouped": []}', "'grouped' must be a non-empty list"),
    (json.dumps(_table(0.5, 0.5, 0.5) | {"dense": [{"K": 64, "N": 64}]}), r"dense\[0\] lacks \['ratio', 'recipe'"),
    (json.dumps({"grouped": [{**_table(1, 1, 1)["grouped"][0], "ratio": [1.0]}], "dense": []}),
     r"grouped\[0\]: tokens and ratio must be non-empty lists of equal length"),
])
def test_a_missing_or_malformed_calibration_names_the_file_and_the_fix(calibration_file, content, problem):
    if content is not None:
        calibration_file.write_text(content)
    with pytest.raises(RuntimeError, match=rf"{re.escape(str(calibration_file))} \(.*{problem}.*reinstall .*"
                                           r"python benchmarks/calibrate_auto\.py"):
        auto.table()


def test_a_valid_calibration_file_loads(calibration_file):
    calibration_file.write_text(json.dumps(_table(0.5, 0.5, 0.5)))
    assert auto.table() == _table(0.5, 0.5, 0.5)


@pytest.mark.parametrize("hip, capability, uses_table", [
    (None, (9, 0), True), ("6.4", (9, 4), False), (None, (8, 9), False), ("6.4", (10, 0), False),
])
def test_only_cuda_hopper_and_cpu_use_the_h200_table(table, monkeypatch, hip, capability, uses_table):
    """ROCm reports its gfx9 GPUs as capability 9.x but runs none of our FP8 GEMMs: bf16 there."""
    table(0.5, 0.5, 0.5)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    plan = auto.plan_for("auto", "quantized", M=256, K=64, N=128, E=8, dense=False, device=torch.device("cuda"))
    assert plan.recipes == (("fp8_rowwise",) * 3 if uses_table else ("bf16",) * 3), plan
    on_cpu = auto.plan_for("auto", "quantized", M=256, K=64, N=128, E=8, dense=False, device=torch.device("cpu"))
    assert on_cpu.recipes == ("fp8_rowwise",) * 3


class _Experts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 128, 64, dtype=torch.bfloat16))  # [E, N, K], used transposed

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs)


def test_a_dynamic_token_count_is_chosen_per_call(monkeypatch):
    """A 512-token batch compiles to fp8_rowwise; an 8-token batch then recompiles the graph with
    a dynamic token count, where the choice is the op's, per call: the next 512-token batch runs
    fp8_rowwise again (not the small batch's bf16), each call as the eager op computes it."""
    rows = [dict(K=64, N=128, role=role, recipe=recipe, tokens=[4, 64], ratio=[2.0, 0.5] if recipe == "fp8_rowwise"
                 else [2.0, 2.0]) for role in auto.ROLES for recipe in auto.FP8]
    monkeypatch.setattr(auto, "table", lambda: {"grouped": rows, "dense": rows})
    torch.manual_seed(0)
    model = _Experts()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="mxfp8", options={"recipe": "auto"})
    for M, recipe in ((512, "fp8_rowwise"), (8, "bf16"), (512, "fp8_rowwise")):
        x = torch.randn(M, 64, dtype=torch.bfloat16, requires_grad=True)
        offs = torch.arange(1, 5, dtype=torch.int32) * (M // 4)
        got = compiled(x, offs)
        got.float().square().sum().backward()
        got_grads = (x.grad, model.w.grad)
        x.grad = model.w.grad = None
        want = mx.grouped_mm(x, model.w.transpose(-2, -1), offs, recipe="auto")  # decides for this M
        want.float().square().sum().backward()
        for a, b in zip((got, *got_grads), (want, x.grad, model.w.grad)):
            assert torch.equal(a, b), (M, recipe)
        model.w.grad = None
        bf16 = torch._grouped_mm(x, model.w.transpose(-2, -1), offs=offs)
        assert torch.equal(got, bf16) == (recipe == "bf16"), (M, recipe)
    x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    report = mx.explain(model, x, torch.arange(1, 5, dtype=torch.int32) * 2, options={"recipe": "auto"})
    assert "'auto', 'auto', 'auto'" in "".join(report.graphs)
    assert {(s.recipe, s.action) for s in report.sites} == {("auto", "rewritten")}
    assert all("token count dynamic at compile time: chosen per call" in s.reason for s in report.sites)
