"""Model-level equivalence: the pass adds no error beyond MXFP8's own (`mxfp8_inductor.check`).

For the output and every parameter gradient, SQNR(bf16 compiled, pass) >= SQNR(bf16 eager, op) - 2 dB,
where "op" is the eager model with the grouped matmuls the pass rewrites replaced by
`mxfp8_inductor.grouped_mm` at the same call sites. Tiny random-init models, both recipes.
"""

import dataclasses
import json
import sys

import pytest
import torch

from mxfp8_inductor import MXFP8Config, check
from mxfp8_inductor.check import __main__ as check_cli
from mxfp8_inductor.lowering import ops

transformers = pytest.importorskip("transformers")

# families the pass is documented to handle: these must build tiny and pass, never skip
NAMED = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3", "gpt_oss", "olmoe",
         "granitemoe", "glm4_moe")


# graph level: the rewrite, AOTAutograd, the ops' Inductor decompositions and the partitioner,
# without Inductor's code generation (seconds instead of a minute per model on CI's CPUs)
GRAPH = "aot_eager_decomp_partition"


def _assert_equivalent(model, inputs, **options):
    for result in check.compare(model.bfloat16(), inputs, **options):
        assert result.op_calls > 0 and result.passed, str(result)


def _reason(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _tiny(model_type, seed=0, layers=2):
    torch.manual_seed(seed)
    try:
        return check.transformers_model(model_type, layers=layers)
    except Exception as e:  # noqa: BLE001  (any failure of the library's own constructors is the reason)
        if model_type in NAMED:
            raise
        pytest.skip(f"{model_type} does not build tiny: {_reason(e)}")


@pytest.mark.slow
@pytest.mark.parametrize("model_type, recipe", [("gpt_oss", "fp8_rowwise"), ("qwen3_moe", "mxfp8")])
def test_two_layer_models_of_the_report(model_type, recipe):
    """2 layers, 8 experts top-2, 2 x 16 tokens: both GEMMs of layer 0 rewritten feed layer 1's
    router. Compiled by Inductor, as users run it (a recipe per model: an Inductor compile takes
    about a minute on CI's CPUs)."""
    model, inputs = _tiny(model_type, seed=1)
    _assert_equivalent(model, inputs, recipes=(recipe,))


@pytest.mark.slow
def test_gpt_oss_with_excluded_and_fp32_experts():
    """An exclusion leaves that site bf16 in both runs; fp32 experts take transformers'
    grouped_mm_fallback op under compile and F.grouped_mm in eager: both rewritten."""
    model, inputs = _tiny("gpt_oss")
    _assert_equivalent(model, inputs, recipes=("mxfp8",), compiler=GRAPH, exclude=["*.layers.0.mlp.experts.down_proj"])
    model = model.bfloat16()
    for name, p in model.named_parameters():
        if "experts" in name:
            p.data = p.data.float()
    for result in check.compare(model, inputs, recipes=("mxfp8",), compiler=GRAPH):
        assert result.sites_rewritten == 4 and result.passed, str(result)


@pytest.mark.slow
@pytest.mark.interpreter
def test_fused_path_adds_no_error(monkeypatch):
    """The pass on the fused MXFP8 GEMMs (Triton interpreter) against the op at the same sites,
    one layer deep (the interpreter runs each GEMM's programs one by one)."""
    from mxfp8_inductor.kernels import triton_mx_gemm
    from mxfp8_inductor.lowering import mxfp8 as mx_lowering
    from mxfp8_inductor.routes import Route

    monkeypatch.setattr(mx_lowering, "gemm_path", lambda device, K, N, fused=False: Route.MXFP8_FUSED)
    calls = []
    for name in ("grouped_mm", "grouped_mm_wgrad"):
        kernel = getattr(triton_mx_gemm, name)
        monkeypatch.setattr(triton_mx_gemm, name, lambda *a, kernel=kernel, **k: calls.append(1) or kernel(*a, **k))
    model, inputs = _tiny("qwen3_moe", layers=1)
    (result,) = check.compare(model.bfloat16(), inputs, recipes=("mxfp8",), compiler=GRAPH)
    assert result.op_calls > 0 and result.passed, str(result)
    assert len(calls) == 2 * 3 * result.op_calls  # three GEMMs per site, in the op run and the pass's


def test_a_pass_that_adds_error_fails_the_bar(monkeypatch):
    """The bar catches a pass whose compiled GEMMs differ from the op: here the Inductor
    decomposition of the forward GEMM is off by a factor 1 + 2^-4 (the eager op is not)."""
    from torch._inductor import decomposition

    ops.register_decompositions()  # as any entry point does first: this test may run first in its process
    op = ops.grouped_mm_op._opoverload
    right = decomposition.decompositions[op]
    monkeypatch.setitem(decomposition.decompositions, op, lambda *a, **k: right(*a, **k) * (1 + 2**-4))
    decomposition.fast_random_decomps.cache_clear()
    try:
        model, inputs = _tiny("qwen3_moe", layers=1)
        (result,) = check.compare(model.bfloat16(), inputs, recipes=("mxfp8",), compiler=GRAPH)
    finally:
        decomposition.fast_random_decomps.cache_clear()
    assert result.op_calls > 0 and not result.passed, str(result)


FAMILIES = check.transformers_families()
RECIPES = ("mxfp8", "fp8_rowwise")
ROTATION = (*RECIPES, "fp8_blockwise")  # the recipes the unnamed families take in turn


def _family_model(model_type):
    """The family's tiny model one layer deep where that layer calls the experts' grouped mm in
    bf16, else two deep (dense first layers); a skip where neither builds, runs and calls it.
    Hybrid stacks that list their layers' kinds take full attention in every layer: tracing a
    linear-attention layer's reference implementation takes minutes, and the sweep is about the
    experts."""
    for layers in (1, 2):
        try:
            torch.manual_seed(0)
            model, inputs = check.transformers_model(model_type, layers=layers, full_attention=True)
            probe = check.OpAtSites(MXFP8Config(), model)
            with probe, torch.no_grad():
                model.bfloat16()(*inputs)
        except Exception as e:  # noqa: BLE001  (the library's own constructors or forward fail on the tiny config)
            if layers == 1:
                continue
            if model_type in NAMED:
                raise
            pytest.skip(f"{model_type} does not build or run tiny in bf16: {_reason(e)}")
        if probe.calls:
            return model, inputs
    assert model_type not in NAMED
    pytest.skip(f"{model_type}: the tiny config has no grouped-mm expert call in its first 2 layers")


def test_full_attention_replaces_listed_linear_attention_only():
    """The sweep's hybrid stacks: a listed linear-attention layer becomes full attention (its
    module too); a stack whose config derives the list (Jamba's Mamba layers) is built as it is."""
    model, _ = check.transformers_model("qwen3_next", layers=2, full_attention=True)
    assert model.config.layer_types == ["full_attention", "full_attention"]
    assert all(hasattr(layer, "self_attn") and not hasattr(layer, "linear_attn") for layer in model.model.layers)
    model, _ = check.transformers_model("qwen3_next", layers=2)
    assert model.config.layer_types == ["linear_attention", "linear_attention"]
    jamba, _ = check.transformers_model("jamba", layers=2, full_attention=True)
    assert jamba.config.layer_types == ["linear_attention", "linear_attention"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_transformers_grouped_mm_family(model_type):
    """One layer deep where that layer calls the experts, else two (hybrid stacks). mxfp8 and
    fp8_rowwise on the named families; on the others one recipe each of `ROTATION`, in turn along
    the sorted list (finding and rewriting the sites does not depend on the recipe): the depth
    and fewer compiles per family keep the sweep within CI's time."""
    model, inputs = _family_model(model_type)
    recipes = RECIPES if model_type in NAMED else (ROTATION[FAMILIES.index(model_type) % len(ROTATION)],)
    _assert_equivalent(model, inputs, recipes=recipes, compiler=GRAPH)


def _torchtitan(module, flavor):
    """The layers up to the first MoE one; causal SDPA attention, since FlexAttention has no
    backward on CPU."""
    registry = pytest.importorskip(f"torchtitan.models.{module}").model_registry
    from torchtitan.models.common.attention import ScaledDotProductAttention

    config = registry(flavor).model
    depth = next(i for i, layer in enumerate(config.layers) if getattr(layer, "moe", None)) + 1
    layers = [dataclasses.replace(layer, attention=dataclasses.replace(
        layer.attention, inner_attention=ScaledDotProductAttention.Config())) for layer in config.layers[:depth]]
    torch.manual_seed(0)
    model = dataclasses.replace(config, layers=layers).build()
    model.init_states()
    return model, (torch.randint(0, config.vocab_size, (2, 16)),)


@pytest.mark.slow
@pytest.mark.parametrize("module, flavor", [("deepseek_v3", "debugmodel"), ("qwen3", "debugmodel_moe"),
                                            ("gpt_oss", "debugmodel")])
def test_torchtitan_models(module, flavor):
    """TorchTitan's own MoE models from their registered configs, up to their first MoE layer."""
    model, inputs = _torchtitan(module, flavor)
    _assert_equivalent(model, inputs, compiler=GRAPH)


# ---- python -m mxfp8_inductor.check: each mistake ends in one line with exit status 2 (the CLI's
# other mistakes: tests/test_check_cli.py)

_BUILDERS = '''
import torch

def not_a_pair():
    return torch.nn.Linear(2, 2)

def tensor_inputs():
    return torch.nn.Linear(2, 2), torch.randn(2, 2)

def no_module():
    return "model", (torch.randn(2, 2),)

build_model = None
'''


@pytest.fixture
def builders(tmp_path, monkeypatch):
    """A module `mxfp8_cli_builders` of builders that break the (model, inputs) contract, and a
    config folder per mistake."""
    (tmp_path / "mxfp8_cli_builders.py").write_text(_BUILDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mxfp8_cli_builders", raising=False)
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"model_type": "no_such_type"}))
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["{tmp}/missing"], "no folder '{tmp}/missing' (a Hub id is namespace/name)"),
    (["{tmp}/unknown"], "cannot load '{tmp}/unknown': The checkpoint you are trying to load has model type "
                        "`no_such_type` but Transformers does not recognize this architecture."),
    (["mxfp8_cli_builders:missing_fn"], "module 'mxfp8_cli_builders' has no function 'missing_fn' returning "
                                        "(model, inputs)"),
    (["mxfp8_cli_builders:build_model"], "module 'mxfp8_cli_builders' has no function 'build_model'"),
    (["mxfp8_cli_builders:not_a_pair"], "mxfp8_cli_builders:not_a_pair must return a pair (model, inputs), "
                                        "got Linear"),
    (["mxfp8_cli_builders:no_module"], "mxfp8_cli_builders:no_module must return (model, inputs) with a "
                                       "torch.nn.Module model, got str"),
    (["mxfp8_cli_builders:tensor_inputs"], "mxfp8_cli_builders:tensor_inputs must return (model, inputs) with "
                                           "inputs a tuple or list of the forward's arguments, got Tensor "
                                           "(one tensor x: return (model, (x,)))"),
])
def test_cli_mistakes_end_in_one_line_with_status_2(builders, argv, message, capsys):
    """A folder that does not exist, a config of an unknown model_type, a builder that is not
    there or does not return (model, inputs): argparse's one error line, no traceback."""
    with pytest.raises(SystemExit) as exit_:
        check_cli.main([a.format(tmp=builders) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"python -m mxfp8_inductor.check: error: "
                                                   f"{message.format(tmp=builders)}")
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["mixtral", "--exclude", "layers.[0"], "malformed FQN pattern 'layers.[0'"),
    (["mixtral", "--include", ""], "include/exclude patterns must be non-empty strings, got ''"),
])
def test_cli_checks_patterns_before_building_the_model(monkeypatch, argv, message, capsys):
    """A malformed --exclude or --include is refused before the model is built (minutes at full
    size), with the message the compile would give."""
    def build(*args, **kwargs):
        raise AssertionError("built a model before checking the patterns")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", build)
    monkeypatch.setattr(transformers.AutoModel, "from_config", build)
    with pytest.raises(SystemExit) as exit_:
        check_cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"python -m mxfp8_inductor.check: error: {message}")
    assert "Traceback" not in err and "building" not in err
