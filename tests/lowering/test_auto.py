"""recipe="auto": the cost model's choices, its data, and what the pass and explain() make of them."""

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
    assert unknown.recipes == ("bf16",) * 3 and "unknown" in unknown.reasons[0]
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
    assert code.count("'fp8_rowwise', 'fp8_rowwise', 'bf16', 'rceil', True)") == 3
    actions = {(s.role, s.action) for s in report.sites}
    assert actions == {("forward", "rewritten"), ("input-grad", "rewritten"), ("weight-grad", "kept bf16")}
    assert all("at 8 tokens per group" in s.reason for s in report.sites)


def test_where_fp8_loses_everywhere_the_site_stays_untouched(table):
    table(1.1, 1.1, 1.1)
    report, code = _explain_auto()
    assert "mxfp8.grouped_mm" not in code and code.count("torch._grouped_mm(") == 3
    assert {s.action for s in report.sites} == {"kept bf16"}
