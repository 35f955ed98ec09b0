"""The pass on tiny MoE models, seen through `explain`: what is found, rewritten, excluded and
skipped, and the rewritten graphs (expecttest snapshots)."""

import re

import expecttest
import pytest
import torch
from models import EagerLoopMoe, HFSparseMoeBlock, MoEModel

import mxfp8_inductor as mx


def _ops(report: mx.Report) -> str:
    """The grouped-GEMM calls of the AOT forward/backward graphs, one per line, with their string
    arguments (the spec of each GEMM); tensor operands left out."""
    lines = []
    for graph in report.aot_graphs:
        for line in graph.splitlines():
            if line.startswith("#"):
                lines.append(line)
            m = re.search(r"= (torch\.ops\.(?:mxfp8|aten)\.\w*grouped_mm\w*\.default)\((.*)", line)
            if m:
                strings = re.findall(r"'([\w:+]+)'", m.group(2).split(";")[0])
                lines.append(" ".join(["   ", m.group(1).removeprefix("torch.ops."), *strings]))
    return "\n".join(lines)


def _actions(report: mx.Report) -> list[tuple]:
    return [(s.weight_fqn, s.role, s.action) for s in report.sites]


class TestTorchTitanStyle(expecttest.TestCase):
    def test_every_gemm_rewritten(self):
        torch.manual_seed(0)
        model = MoEModel(layers=1).bfloat16()
        report = mx.explain(model, torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True))
        self.assertEqual({s.action for s in report.sites}, {"rewritten"})
        self.assertEqual(len(report.sites), 9)
        self.assertExpectedInline(_ops(report), """\
# forward
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil mxfp8:rceil
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil mxfp8:rceil
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil mxfp8:rceil
# backward
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default mxfp8:rceil
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default mxfp8:rceil
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default mxfp8:rceil""")
        self.assertExpectedInline(str(report), """\
module                weight                       role         action     runs   reason                    
--------------------  ---------------------------  -----------  ---------  -----  --------------------------
layers.0.moe.experts  layers.0.moe.experts.w1_EFD  forward      rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w1_EFD  input-grad   rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w1_EFD  weight-grad  rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w3_EFD  forward      rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w3_EFD  input-grad   rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w3_EFD  weight-grad  rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w2_EDF  forward      rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w2_EDF  input-grad   rewritten  mxfp8  routed-expert grouped GEMM
layers.0.moe.experts  layers.0.moe.experts.w2_EDF  weight-grad  rewritten  mxfp8  routed-expert grouped GEMM
9 rewritten; 0 graph break(s)""")

    def test_rewritten_dynamo_graph(self):
        torch.manual_seed(0)
        report = mx.explain(MoEModel(layers=1).bfloat16(), torch.randn(2, 8, 64, dtype=torch.bfloat16))
        self.assertExpectedInline(report.graphs[0], """\
def forward(self, L_self_modules_layers_modules_0_modules_norm_parameters_weight_ : torch.nn.parameter.Parameter, L_x_BLD_ : torch.Tensor, L_self_modules_layers_modules_0_modules_moe_modules_router_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w1_EFD_ : torch.nn.parameter.Parameter, L_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w3_EFD_ : torch.nn.parameter.Parameter, L_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w2_EDF_ : torch.nn.parameter.Parameter):
    l_self_modules_layers_modules_0_modules_norm_parameters_weight_ = L_self_modules_layers_modules_0_modules_norm_parameters_weight_
    l_x_bld_ = L_x_BLD_
    l_self_modules_layers_modules_0_modules_moe_modules_router_parameters_weight_ = L_self_modules_layers_modules_0_modules_moe_modules_router_parameters_weight_
    l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w1_efd_ = L_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w1_EFD_
    l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w3_efd_ = L_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w3_EFD_
    l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w2_edf_ = L_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w2_EDF_
    rms_norm = torch.rms_norm(l_x_bld_, (64,), l_self_modules_layers_modules_0_modules_norm_parameters_weight_, None);  l_self_modules_layers_modules_0_modules_norm_parameters_weight_ = None
    x_TD = rms_norm.reshape(-1, 64);  rms_norm = None
    linear = torch._C._nn.linear(x_TD, l_self_modules_layers_modules_0_modules_moe_modules_router_parameters_weight_, None);  l_self_modules_layers_modules_0_modules_moe_modules_router_parameters_weight_ = None
    float_1 = linear.float();  linear = None
    softmax = float_1.softmax(-1);  float_1 = None
    topk = torch.topk(softmax, 2);  softmax = None
    scores_TK = topk[0]
    experts_TK = topk[1];  topk = None
    view = experts_TK.view(-1)
    order_R = torch.argsort(view, stable = True);  view = None
    zeros = torch.zeros(4, dtype = torch.int32, device = device(type='cpu'))
    view_1 = experts_TK.view(-1)
    int_1 = view_1.int();  view_1 = None
    view_2 = experts_TK.view(-1);  experts_TK = None
    ones_like = torch.ones_like(view_2, dtype = torch.int32);  view_2 = None
    counts_E = zeros.scatter_add(0, int_1, ones_like);  zeros = int_1 = ones_like = None
    floordiv = order_R // 2
    getitem_2 = x_TD[floordiv];  x_TD = floordiv = None
    offs_E = torch.cumsum(counts_E, dim = 0, dtype = torch.int32);  counts_E = None
    transpose = l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w1_efd_.transpose(-2, -1);  l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w1_efd_ = None
    grouped_mm_default = torch.ops.mxfp8.grouped_mm.default(getitem_2, transpose, offs_E, 'mxfp8:rceil', 'mxfp8:rceil', 'mxfp8:rceil', None);  transpose = None
    h_RF = torch.nn.functional.silu(grouped_mm_default);  grouped_mm_default = None
    transpose_1 = l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w3_efd_.transpose(-2, -1);  l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w3_efd_ = None
    grouped_mm_default_1 = torch.ops.mxfp8.grouped_mm.default(getitem_2, transpose_1, offs_E, 'mxfp8:rceil', 'mxfp8:rceil', 'mxfp8:rceil', None);  getitem_2 = transpose_1 = None
    h_RF_1 = h_RF * grouped_mm_default_1;  h_RF = grouped_mm_default_1 = None
    transpose_2 = l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w2_edf_.transpose(-2, -1);  l_self_modules_layers_modules_0_modules_moe_modules_experts_parameters_w2_edf_ = None
    grouped_mm_default_2 = torch.ops.mxfp8.grouped_mm.default(h_RF_1, transpose_2, offs_E, 'mxfp8:rceil', 'mxfp8:rceil', 'mxfp8:rceil', None);  h_RF_1 = transpose_2 = offs_E = None
    empty_like = torch.empty_like(grouped_mm_default_2)
    out_RD = empty_like.index_copy(0, order_R, grouped_mm_default_2);  empty_like = order_R = grouped_mm_default_2 = None
    view_3 = out_RD.view(-1, 2, 64);  out_RD = None
    unsqueeze = scores_TK.unsqueeze(-1);  scores_TK = None
    to = unsqueeze.to(torch.bfloat16);  unsqueeze = None
    mul_1 = view_3 * to;  view_3 = to = None
    out_TD = mul_1.sum(1);  mul_1 = None
    view_4 = out_TD.view(2, 8, 64);  out_TD = None
    x_BLD = l_x_bld_ + view_4;  l_x_bld_ = view_4 = None
    return (x_BLD,)""")

    def test_recipe_option_reaches_every_rewritten_gemm(self):
        torch.manual_seed(0)
        model = MoEModel(layers=2).bfloat16()
        report = mx.explain(model, torch.randn(2, 8, 64, dtype=torch.bfloat16),
                            options={"recipe": "fp8_rowwise", "exclude": ["layers.1.moe"]})
        code = "".join(report.graphs)
        self.assertEqual(code.count("mxfp8.grouped_mm.default("), 3)
        self.assertEqual(code.count("'fp8_rowwise:rceil', 'fp8_rowwise:rceil', 'fp8_rowwise:rceil', None)"), 3)
        self.assertEqual({a for w, r, a in _actions(report) if w.startswith("layers.1.")}, {"excluded"})

    def test_exclude_and_wgrad_options(self):
        torch.manual_seed(0)
        model = MoEModel(layers=2).bfloat16()
        report = mx.explain(model, torch.randn(2, 8, 64, dtype=torch.bfloat16),
                            options={"exclude": ["layers.1.moe"], "wgrad": "bf16"})
        rows = _actions(report)
        self.assertIn(("layers.0.moe.experts.w2_EDF", "weight-grad", "kept bf16"), rows)
        self.assertIn(("layers.0.moe.experts.w2_EDF", "input-grad", "rewritten"), rows)
        self.assertEqual({a for w, r, a in rows if w.startswith("layers.1.")}, {"excluded"})
        self.assertExpectedInline(_ops(report), """\
# forward
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil bf16:rceil
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil bf16:rceil
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil bf16:rceil
    aten._grouped_mm.default
    aten._grouped_mm.default
    aten._grouped_mm.default
# backward
    aten._grouped_mm.default
    aten._grouped_mm.default
    aten._grouped_mm.default
    aten._grouped_mm.default
    aten._grouped_mm.default
    aten._grouped_mm.default
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default bf16:rceil
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default bf16:rceil
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default bf16:rceil""")


class TestHFStyle(expecttest.TestCase):
    def test_mixtral_and_gpt_oss_layouts(self):
        torch.manual_seed(0)
        x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
        for gpt_oss in (False, True):
            report = mx.explain(HFSparseMoeBlock(gpt_oss=gpt_oss).bfloat16(), x)
            self.assertEqual({s.action for s in report.sites}, {"rewritten"})
            self.assertEqual([s.weight_fqn for s in report.sites[::3]], ["experts.gate_up_proj", "experts.down_proj"])
        self.assertExpectedInline(_ops(report), """\
# forward
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil mxfp8:rceil
    mxfp8.grouped_mm.default mxfp8:rceil mxfp8:rceil mxfp8:rceil
# backward
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default mxfp8:rceil
    mxfp8.grouped_mm_input_grad.default mxfp8:rceil
    mxfp8.grouped_mm_weight_grad.default mxfp8:rceil""")


def test_gemms_without_gradient_are_reported_as_not_computed():
    """Tokens that need no gradient (no learnable op before the experts) have no input-grad GEMM."""
    torch.manual_seed(0)
    report = mx.explain(HFSparseMoeBlock().bfloat16(), torch.randn(2, 8, 64, dtype=torch.bfloat16))
    rows = {(s.weight_fqn, s.role): s.action for s in report.sites}
    assert rows[("experts.gate_up_proj", "input-grad")] == "not computed"
    assert rows[("experts.down_proj", "input-grad")] == "rewritten"
    assert "mxfp8.grouped_mm_input_grad" in report.aot_graphs[-1]


def test_no_grad_reports_no_backward_gemms():
    """Under no_grad there is no backward graph: the gradient GEMMs are not computed, not rewritten."""
    torch.manual_seed(0)
    with torch.no_grad():
        report = mx.explain(MoEModel().bfloat16(), torch.randn(2, 32, 64, dtype=torch.bfloat16))
    assert {(s.role, s.action) for s in report.sites} == {
        ("forward", "rewritten"), ("input-grad", "not computed"), ("weight-grad", "not computed")}
    assert all("grad mode off" in s.reason for s in report.sites if s.role != "forward")


def test_include_patterns_select_sites():
    torch.manual_seed(0)
    report = mx.explain(MoEModel(layers=2).bfloat16(), torch.randn(1, 8, 64, dtype=torch.bfloat16),
                        options={"include": ["*.w1_EFD", "layers.1"]})
    rewritten = {s.weight_fqn for s in report.sites if s.action == "rewritten"}
    assert rewritten == {"layers.0.moe.experts.w1_EFD", "layers.1.moe.experts.w1_EFD",
                         "layers.1.moe.experts.w3_EFD", "layers.1.moe.experts.w2_EDF"}
    skipped = [s for s in report.sites if s.action == "excluded"]
    assert skipped and all("matches no include pattern" in s.reason for s in skipped)


def test_unsupported_site_is_skipped_with_reason():
    """D=48 is not a multiple of 32 (MXFP8 blocks): the site keeps torch._grouped_mm and the report says why."""
    model = MoEModel(dim=48, hidden=64, layers=1).bfloat16()
    report = mx.explain(model, torch.randn(1, 8, 48, dtype=torch.bfloat16))
    assert {s.action for s in report.sites} == {"skipped"}
    assert all("multiples of 32" in s.reason for s in report.sites)
    assert "mxfp8" not in "\n".join(report.aot_graphs)


def test_eager_loop_reports_nothing_capturable():
    report = mx.explain(EagerLoopMoe().bfloat16(), torch.randn(1, 8, 64, dtype=torch.bfloat16))
    assert report.sites == []
    assert report.graph_breaks
    assert "no grouped matmul was captured" in str(report)


@pytest.mark.parametrize(
    "options, match",
    [({"recipe": "fp4"}, "unknown recipe"), ({"exclude": ["layers.*.moe experts"]}, "malformed"),
     ({"exclude": [""]}, "non-empty"), ({"rounding": "nearest"}, "unknown rounding"), ({"bogus": 1}, "unknown mxfp8 option")],
)
def test_bad_options_raise_clear_errors(options, match):
    with pytest.raises(ValueError, match=match):
        mx.explain(MoEModel(layers=1).bfloat16(), torch.randn(1, 8, 64, dtype=torch.bfloat16), options=options)
    with pytest.raises(ValueError, match=match):
        mx.inductor_options(**options)
    with pytest.raises(ValueError, match=match):
        mx.mxfp8(MoEModel(layers=1), **options)


def test_class_decorator_marks_every_instance_with_its_options():
    @mx.mxfp8(exclude=["layers.1"], wgrad="bf16", recipe="fp8_rowwise")
    class MarkedMoE(MoEModel):
        pass

    torch.manual_seed(0)
    model = MarkedMoE(layers=2).bfloat16()
    report = mx.explain(model, torch.randn(1, 8, 64, dtype=torch.bfloat16))
    code = "".join(report.graphs)
    assert code.count("'fp8_rowwise:rceil', 'fp8_rowwise:rceil', 'bf16:rceil', None)") == 3 and "'mxfp8" not in code
    by_layer = {(s.weight_fqn.split(".")[1], s.role): s.action for s in report.sites}
    assert by_layer[("0", "forward")] == "rewritten" and by_layer[("0", "weight-grad")] == "kept bf16"
    assert by_layer[("1", "forward")] == "excluded"
    # expert modules get a guard-visible subclass per decision, so per-block graphs are not shared
    assert type(model.layers[0].moe.experts) is not type(model.layers[1].moe.experts)
    assert isinstance(model.layers[1].moe.experts, type(MoEModel().layers[0].moe.experts))


class TestSharedWeights(expecttest.TestCase):
    def test_ops_round_the_weight_once_for_both_gemms(self):
        """fsdp_fp8_all_gather: each expert op takes shared_weight=True (the last argument); the
        report says how the weight is rounded, for the GEMMs that take it."""
        torch.manual_seed(0)
        model = mx.mxfp8(MoEModel(layers=1).bfloat16(), recipe="fp8_rowwise", fsdp_fp8_all_gather=True)
        report = mx.explain(model, torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True))
        calls = [re.sub(r"^.*= torch\.ops\.mxfp8\.(\w+)\.default\((.*?)\);.*$", r"\1(\2)", line).strip()
                 for graph in report.graphs for line in graph.splitlines() if "torch.ops.mxfp8." in line]
        self.assertExpectedInline("\n".join(calls), """\
grouped_mm(getitem_2, transpose, offs_E, 'fp8_rowwise:rceil+shared_weight', 'fp8_rowwise:rceil+shared_weight', 'fp8_rowwise:rceil', None)
grouped_mm(getitem_2, transpose_1, offs_E, 'fp8_rowwise:rceil+shared_weight', 'fp8_rowwise:rceil+shared_weight', 'fp8_rowwise:rceil', None)
grouped_mm(h_RF_1, transpose_2, offs_E, 'fp8_rowwise:rceil+shared_weight', 'fp8_rowwise:rceil+shared_weight', 'fp8_rowwise:rceil', None)""")
        reasons = {(s.weight_fqn, s.role): s.reason for s in report.sites}
        fqn = "layers.0.moe.experts.w1_EFD"
        assert "one scale per expert, fsdp_fp8_all_gather" in reasons[(fqn, "forward")], reasons
        assert "fsdp_fp8_all_gather" not in reasons[(fqn, "weight-grad")]  # it takes no weight
