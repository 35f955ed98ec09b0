"""The pass on the real TorchTitan and Hugging Face transformers MoE classes at random init,
unmodified: every forward, input-grad and weight-grad GEMM of every routed-expert site is rewritten."""

import re

import pytest
import torch

import mxfp8_inductor as mx


def _count(report: mx.Report, op: str) -> int:
    return sum(len(re.findall(rf"torch\.ops\.{op}\.default\(", g)) for g in report.aot_graphs)


def _assert_all_rewritten(report: mx.Report, sites: int, dgrads: int | None = None) -> None:
    assert len(report.sites) == 3 * sites, str(report)
    assert {s.action for s in report.sites} == {"rewritten"}, str(report)
    assert _count(report, "aten._grouped_mm") == 0
    assert _count(report, "mxfp8.grouped_mm_weight_grad") == sites
    assert _count(report, "mxfp8.grouped_mm_input_grad") == (sites if dgrads is None else dgrads)


def test_torchtitan_moe():
    moe = pytest.importorskip("torchtitan.models.common.moe")
    E, D, F = 4, 64, 96
    cfg = moe.MoE.Config(
        num_experts=E,
        routed_experts=moe.RoutedExperts.Config(
            inner_experts=moe.GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E),
            token_dispatcher=moe.LocalTokenDispatcher.Config(num_experts=E, top_k=2)),
        router=moe.TokenChoiceTopKRouter.Config(
            num_experts=E, gate=moe.Linear.Config(in_features=D, out_features=E), top_k=2),
    )
    torch.manual_seed(0)
    model = cfg.build()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(2, 16, D, dtype=torch.bfloat16, requires_grad=True)
    report = mx.explain(model.bfloat16(), x)
    _assert_all_rewritten(report, 3)
    assert [s.weight_fqn for s in report.sites[::3]] == [
        f"routed_experts.inner_experts.{w}" for w in ("w1_EFD", "w3_EFD", "w2_EDF")]


def _hf(name):
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    if name == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                          num_experts_per_tok=2, **small)
        return transformers.Qwen3MoeForCausalLM(cfg), "model.layers.0.mlp.experts"
    if name == "gpt_oss":
        cfg = transformers.GptOssConfig(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, **small)
        return transformers.GptOssForCausalLM(cfg), "model.layers.0.mlp.experts"
    cfg = transformers.DeepseekV3Config(intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                                        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
                                        q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                        v_head_dim=16, **{**small, "num_key_value_heads": 4})
    return transformers.DeepseekV3ForCausalLM(cfg), "model.layers.0.mlp.experts"


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_transformers_moe_bf16(name):
    torch.manual_seed(0)
    model, experts = _hf(name)
    report = mx.explain(model.bfloat16(), torch.randint(0, 128, (2, 8)))
    _assert_all_rewritten(report, 2)
    assert [s.weight_fqn for s in report.sites[::3]] == [f"{experts}.gate_up_proj", f"{experts}.down_proj"]


def test_transformers_fp32_weights_use_the_fallback_op():
    """With fp32 experts transformers calls transformers::grouped_mm_fallback: rewritten too."""
    torch.manual_seed(0)
    model, _ = _hf("qwen3_moe")
    report = mx.explain(model, torch.randint(0, 128, (2, 8)))
    assert {s.action for s in report.sites} == {"rewritten"} and len(report.sites) == 6
    assert "grouped_mm_fallback" not in "\n".join(report.aot_graphs)
