"""The TorchTitan converter: TorchTitan's own MoE models, built from their registered debug
configs with the converter in `model_registry(..., converters=[...])` (where TorchTitan's
config functions apply converters), come out marked with the converter's options."""

import dataclasses
import importlib
import subprocess
import sys

import pytest
import torch

import mxfp8_inductor as mx

pytest.importorskip("torchtitan")

from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402

from mxfp8_inductor.torchtitan import MXFP8InductorConverter  # noqa: E402


def _spec(module: str, flavor: str, **options):
    registry = importlib.import_module(f"torchtitan.models.{module}").model_registry
    return registry(flavor, converters=[MXFP8InductorConverter.Config(model_compile_enabled=True, **options)])


def _build(config, layers: int) -> torch.nn.Module:
    """As TorchTitan's trainer builds a model (on the meta device, then materialized and
    initialized), from the first `layers` layers with causal SDPA attention: FlexAttention has no
    backward on CPU. The trainer's update_from_config step is left out: it imports
    torchtitan.trainer, whose dependencies (torchdata, tensorboard) the test install omits."""
    config.layers = [dataclasses.replace(layer, attention=dataclasses.replace(
        layer.attention, inner_attention=ScaledDotProductAttention.Config())) for layer in config.layers[:layers]]
    with torch.device("meta"):
        model = config.build()
    model.verify_module_protocol()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    return model


# DeepSeek-V3's layer 0 is dense; TorchTitan 0.3.0 ships no Llama 4, Qwen3-MoE stands in for it
@pytest.mark.parametrize("module, flavor, layers", [("deepseek_v3", "debugmodel", 3), ("qwen3", "debugmodel_moe", 2)])
def test_converter_marks_the_model_with_its_options(module, flavor, layers):
    config = _spec(module, flavor, exclude=["layers.1.*"], recipe="fp8_rowwise", rounding="floor").model
    model = _build(config, layers)
    report = mx.explain(model, torch.randint(0, config.vocab_size, (2, 16)))
    actions = {(s.weight_fqn, s.role): (s.action, s.reason) for s in report.sites}
    excluded = {k for k in actions if k[0].startswith("layers.1.")}
    rewritten = set(actions) - excluded
    # three expert weights, each with its forward, input-gradient and weight-gradient GEMM
    assert len(rewritten) == len(excluded) == 9 and len(actions) == 18, report
    assert {actions[k] for k in excluded} == {("excluded", "excluded by 'layers.1.*'")}, report
    assert {actions[k][0] for k in rewritten} == {"rewritten"}, report
    assert {role for _, role in rewritten} == {"forward", "input-grad", "weight-grad"}
    # the recipe and rounding reach the rewritten ops' arguments
    graphs = "\n".join(report.graphs)
    assert "'fp8_rowwise:floor'" in graphs, graphs


@pytest.mark.parametrize("options, message", [
    ({"recipe": "mxfp9"}, "unknown recipe 'mxfp9'"),
    ({"rounding": "nearest"}, "unknown rounding 'nearest'"),
    ({"wgrad": "fp32"}, "unknown wgrad 'fp32'"),
    ({"exclude": ["layers 1"]}, "malformed FQN pattern 'layers 1'"),
])
def test_bad_option_values_raise_when_torchtitan_builds_the_converter(options, message):
    with pytest.raises(ValueError, match=message):
        _spec("deepseek_v3", "debugmodel", **options)


def test_converter_listed_twice_raises():
    converter = MXFP8InductorConverter.Config(model_compile_enabled=True)
    with pytest.raises(ValueError, match="listed twice"):
        importlib.import_module("torchtitan.models.deepseek_v3").model_registry("debugmodel",
                                                                                converters=[converter, converter])


def test_importing_the_package_does_not_import_torchtitan():
    code = "import sys, mxfp8_inductor; assert 'torchtitan' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_converter_option_fsdp_fp8_all_gather_survives_the_meta_build():
    """The converter's fsdp_fp8_all_gather reaches the model TorchTitan builds on the meta device
    and materializes: its expert weights are FP8AllGatherWeight parameters holding initialized
    values, and the pass gives each expert GEMM the shared weight rounding."""
    from mxfp8_inductor.fsdp import FP8AllGatherWeight

    config = _spec("qwen3", "debugmodel_moe", recipe="mxfp8", fsdp_fp8_all_gather=True).model
    model = _build(config, layers=1)
    experts = {n: p for n, p in model.named_parameters() if p.dim() == 3}
    assert experts and all(isinstance(p.data, FP8AllGatherWeight) for p in experts.values()), experts.keys()
    assert all(p.data._tensor.device.type == "cpu" and p.data._tensor.abs().sum() > 0 for p in experts.values())
    report = mx.explain(model, torch.randint(0, config.vocab_size, (2, 16)))
    assert {s.action for s in report.sites} == {"rewritten"}, report
    ops = [line for g in report.graphs for line in g.splitlines() if "torch.ops.mxfp8.grouped_mm.default(" in line]
    shared = "'mxfp8:rceil+shared_weight', 'mxfp8:rceil+shared_weight', 'mxfp8:rceil', None)"
    assert len(ops) == 3 and all(shared in line for line in ops), ops
