"""Sites the pass must recognise by what they are: output projections (tied, untied, nested) stay
bf16 under targets="all"; grouped matmuls fed by grouped matmuls (chained sites) rewrite."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_bitwise_equal, make_offs

import mxfp8_inductor as mx

V, H = 96, 64
ALL = {"targets": "all", "dense_min_dim": 0}


class TinyLM(torch.nn.Module):
    """Embedding, one hidden linear, an output projection under `head_name`, optionally tied."""

    def __init__(self, tied: bool, head_name: str) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.mid = torch.nn.Linear(H, H, bias=False)
        head = torch.nn.Linear(H, V, bias=False)
        if tied:
            head.weight = self.embed.weight
        self.body = torch.nn.Module()
        setattr(self.body, head_name, head)
        self.head_name = head_name

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.body, self.head_name)(torch.relu(self.mid(self.embed(ids))))


def _actions(report: mx.Report) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in report.sites:
        out.setdefault(s.weight_fqn.rsplit(".", 1)[0], set()).add(s.action)
    return out


@pytest.mark.parametrize("tied, head_name", [(True, "lm_head"), (False, "lm_head"), (False, "proj"),
                                             (True, "proj")])
def test_output_projection_stays_bf16_whatever_its_name(tied, head_name):
    torch.manual_seed(0)
    model = TinyLM(tied, head_name).bfloat16()
    report = mx.explain(model, torch.randint(0, V, (2, 32)), options=ALL)
    actions = _actions(report)
    assert actions["mid"] <= {"rewritten", "not computed"} and "rewritten" in actions["mid"], str(report)
    head = [s for s in report.sites if s.weight_fqn not in ("mid.weight",)]
    assert head and all(s.action == "excluded" and "output projection" in s.reason for s in head), str(report)
    # an include pattern naming it rewrites it
    named = "embed" if tied else f"body.{head_name}"
    report = mx.explain(model, torch.randint(0, V, (2, 32)), options={**ALL, "include": ["mid", named]})
    assert any(s.action == "rewritten" and s.weight_fqn.startswith(named) for s in report.sites), str(report)


def test_tied_output_projection_of_a_transformers_moe_stays_bf16():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Ernie4_5_MoeConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, moe_intermediate_size=32, moe_num_experts=4, moe_k=2, moe_layer_start_index=0,
        max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Ernie4_5_MoeForCausalLM(cfg).bfloat16()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    report = mx.explain(model, torch.randint(0, 128, (2, 16)), options=ALL)
    head = [s for s in report.sites if "embed_tokens" in (s.weight_fqn or "") or "lm_head" in (s.weight_fqn or "")]
    assert head and {s.action for s in head} == {"excluded"}, str(report)
    assert any(s.action == "rewritten" and s.weight_fqn.endswith("q_proj.weight") for s in report.sites)


class Chained(torch.nn.Module):
    """A grouped matmul fed straight into another, and a linear into a linear."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter((torch.randn(4, 64, 64, generator=g) * 0.1).bfloat16())
        self.w2 = torch.nn.Parameter((torch.randn(4, 64, 64, generator=g) * 0.1).bfloat16())
        self.d1 = torch.nn.Parameter((torch.randn(64, 64, generator=g) * 0.1).bfloat16())
        self.d2 = torch.nn.Parameter((torch.randn(64, 64, generator=g) * 0.1).bfloat16())

    def forward(self, x, offs):
        h = torch._grouped_mm(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs), self.w2, offs=offs)
        return F.linear(F.linear(h, self.d1), self.d2)


def test_chained_sites_compile_and_match_the_eager_op():
    model = Chained()
    x, offs = torch.randn(64, 64).bfloat16(), make_offs([16, 0, 30, 18])
    compiled = torch.compile(model, backend="mxfp8", options=ALL)
    got = compiled(x, offs)
    h = mx.grouped_mm(mx.grouped_mm(x, model.w1.transpose(-2, -1), offs), model.w2, offs)
    assert_bitwise_equal(got, mx.linear(mx.linear(h, model.d1), model.d2))
