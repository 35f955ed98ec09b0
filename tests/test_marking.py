"""A mark survives what users do to models: deepcopy, pickling, load_state_dict(assign=True),
swapped tensors on dtype conversion, FSDP2, and subclasses of a decorated class."""

import copy
import io
import pickle

import pytest
import torch
from models import MoEModel

import mxfp8_inductor as mx
from mxfp8_inductor import marks


def _model(**options):
    torch.manual_seed(0)
    return mx.mxfp8(MoEModel(layers=2).bfloat16(), **options)


def _actions(model):
    report = mx.explain(model, torch.randn(1, 32, 64, dtype=torch.bfloat16))
    return {(s.weight_fqn, s.role): s.action for s in report.sites}


def _assert_marked(model, excluded_layer="1"):
    actions = _actions(model)
    assert len(actions) == 18, actions
    for (fqn, role), action in actions.items():
        assert action == ("excluded" if fqn.startswith(f"layers.{excluded_layer}.") else "rewritten"), (fqn, role)


def test_deepcopy_keeps_the_mark():
    model = _model(exclude=["layers.1"])
    _assert_marked(copy.deepcopy(model))


def test_pickle_and_torch_save_keep_the_mark():
    model = _model(exclude=["layers.1"])
    _assert_marked(pickle.loads(pickle.dumps(model)))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    _assert_marked(torch.load(buf, weights_only=False))


def test_load_state_dict_assign_keeps_the_mark():
    model = _model(exclude=["layers.1"])
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    _assert_marked(model)


def test_swapped_tensors_on_conversion_keep_the_mark():
    torch.manual_seed(0)
    model = mx.mxfp8(MoEModel(layers=2), exclude=["layers.1"])
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = model.bfloat16()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    _assert_marked(model)


def test_subclass_of_a_decorated_class_with_its_own_init_is_marked():
    @mx.mxfp8(exclude=["layers.0"])
    class Marked(MoEModel):
        pass

    class Deeper(Marked):
        def __init__(self):
            super().__init__(layers=2)
            self.extra = torch.nn.Linear(4, 4)

    torch.manual_seed(0)
    _assert_marked(Deeper().bfloat16(), excluded_layer="0")


def test_fsdp2_either_order_keeps_the_mark(tmp_path):
    """One-process gloo group: fully_shard replaces every parameter with a sharded one."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        before = _model(exclude=["layers.1"])
        for layer in before.layers:
            fully_shard(layer)
        _assert_marked(before)
        torch.manual_seed(0)
        after = MoEModel(layers=2).bfloat16()
        for layer in after.layers:
            fully_shard(layer)
        _assert_marked(mx.mxfp8(after, exclude=["layers.1"]))
    finally:
        dist.destroy_process_group()


def _at_this_line(caught) -> None:
    """Every warning points at this file (the user's code), not into torch or the package."""
    assert caught and {w.filename for w in caught} == {__file__}, [(w.filename, w.lineno) for w in caught]


def test_patterns_that_match_nothing_warn_with_the_closest_fqns():
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"exclude pattern 'layers.7.\*' matches no .*closest FQNs") as caught:
        mx.mxfp8(MoEModel(layers=2).bfloat16(), exclude=["layers.7.*"])
    _at_this_line(caught)
    block = MoEModel(layers=2).bfloat16().layers[0]
    unmatched = r"exclude pattern 'layers.0.\*' matches no .*relative to the compiled"
    with pytest.warns(UserWarning, match=unmatched) as caught:
        torch.compile(block, backend="mxfp8", options={"exclude": ["layers.0.*"]})(
            torch.randn(1, 32, 64, dtype=torch.bfloat16))
    _at_this_line([w for w in caught if issubclass(w.category, UserWarning)])


def test_a_model_with_nothing_to_rewrite_warns_at_the_users_line():
    dense = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=r"found no torch._grouped_mm in the graph compiled here") as caught:
        torch.compile(dense, backend="mxfp8")(torch.randn(8, 64))
    _at_this_line([w for w in caught if issubclass(w.category, UserWarning)])
    with pytest.warns(UserWarning, match=r"Sequential has no expert weights .*targets='all'") as caught:
        mx.mxfp8(dense)
    _at_this_line(caught)


def test_compiling_a_marked_model_with_other_options_warns():
    model = _model(exclude=["layers.1"])
    with pytest.warns(UserWarning, match="marked with mxfp8"):
        mx.explain(model, torch.randn(1, 32, 64, dtype=torch.bfloat16), options={"recipe": "fp8_rowwise"})


def test_filter_fn_keeps_the_modules_it_rejects_in_bf16():
    """torchao's convention: `filter_fn(module, fqn)` on each expert module with its global FQN."""
    seen = []

    def only_layer_0(module: torch.nn.Module, fqn: str) -> bool:
        seen.append((type(module).__name__, fqn))
        return fqn.startswith("layers.0.")

    torch.manual_seed(0)
    model = mx.mxfp8(MoEModel(layers=2).bfloat16(), filter_fn=only_layer_0)
    assert sorted(seen) == [("GroupedExperts", "layers.0.moe.experts"), ("GroupedExperts", "layers.1.moe.experts")]
    report = mx.explain(model, torch.randn(1, 8, 64, dtype=torch.bfloat16))
    actions = {(s.weight_fqn.split(".")[1], s.action, s.reason) for s in report.sites}
    assert {a for layer, a, _ in actions if layer == "0"} == {"rewritten"}
    assert {(a, r) for layer, a, r in actions if layer == "1"} == {("excluded", "excluded by filter_fn")}


@pytest.mark.parametrize("route", ["backend", "inductor_options", "explain"])
def test_filter_fn_needs_the_marking_route(route):
    options = {"filter_fn": lambda module, fqn: True}
    model = MoEModel(layers=1).bfloat16()
    # (the backend's error reaches the caller as torch's BackendCompilerFailed, caused by it)
    with pytest.raises((ValueError, torch._dynamo.exc.BackendCompilerFailed), match=r"mxfp8\(model, filter_fn"):
        if route == "backend":
            torch.compile(model, backend="mxfp8", options=options)(torch.randn(1, 8, 64, dtype=torch.bfloat16))
        elif route == "inductor_options":
            mx.inductor_options(**options)
        else:
            mx.explain(model, torch.randn(1, 8, 64, dtype=torch.bfloat16), options=options)


def test_instances_marked_with_other_options_compile_their_own_graphs(monkeypatch):
    """Two instances of one class, marked with other recipes: Dynamo must not serve the second
    the graph (and so the options) of the first."""
    import mxfp8_inductor.backend as backend
    from mxfp8_inductor.explain import graph_code

    graphs, original = [], backend.rewrite

    def recording(gm, config):
        rows = original(gm, config)
        graphs.append(graph_code(gm))
        return rows

    monkeypatch.setattr(backend, "rewrite", recording)
    torch.manual_seed(0)
    a = mx.mxfp8(MoEModel(layers=1).bfloat16(), recipe="mxfp8")
    b = mx.mxfp8(MoEModel(layers=1).bfloat16(), recipe="fp8_rowwise", weight_cache=False)
    x = torch.randn(1, 8, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(a)(x)
            torch.compile(b)(x)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 2, "the second instance reused the first one's graph"
    assert graphs[0].count("'mxfp8:rceil', 'mxfp8:rceil', 'mxfp8:rceil'") == 3 and "fp8_rowwise" not in graphs[0]
    assert graphs[1].count("'fp8_rowwise:rceil', 'fp8_rowwise:rceil', 'fp8_rowwise:rceil'") == 3


def test_guard_class_copies_keep_their_options():
    """Copies rebuild the guard class of their own options, not of the kept parameters alone."""
    torch.manual_seed(0)
    a = mx.mxfp8(MoEModel(layers=1).bfloat16(), recipe="mxfp8")
    b = mx.mxfp8(MoEModel(layers=1).bfloat16(), recipe="fp8_rowwise")
    experts = [m.layers[0].moe.experts for m in (a, b)]
    assert type(experts[0]) is not type(experts[1])
    for e in experts:
        assert type(copy.deepcopy(e)) is type(e) and type(pickle.loads(pickle.dumps(e))) is type(e)


def _marks(model):
    return [(type(m), marks.ATTR in m.__dict__) for m in model.modules()]


def test_filter_fn_must_return_a_bool():
    torch.manual_seed(0)
    model = MoEModel(layers=2).bfloat16()
    before = _marks(model)

    def forgot_return(module, fqn):
        fqn.startswith("layers.0.")

    with pytest.raises(ValueError, match=r"filter_fn must return a bool.*got None for layers\.0\.moe\.experts"):
        mx.mxfp8(model, filter_fn=forgot_return)
    assert _marks(model) == before


def test_a_filter_fn_that_raises_leaves_the_model_unmarked():
    torch.manual_seed(0)
    model = MoEModel(layers=2).bfloat16()
    before = _marks(model)
    assert not any(marked for _, marked in before)

    def fails_on_layer_1(module, fqn):
        if fqn.startswith("layers.1."):
            raise KeyError(fqn)
        return True

    with pytest.raises(KeyError, match="layers.1.moe.experts"):
        mx.mxfp8(model, filter_fn=fails_on_layer_1)
    assert _marks(model) == before


def test_marking_again_with_other_options_warns_and_the_new_ones_apply():
    model = _model(exclude=["layers.1"])
    with pytest.warns(UserWarning, match=r"marked before with other options .*layers\.1.*the new ones now apply"):
        mx.mxfp8(model, exclude=["layers.0"])
    _assert_marked(model, excluded_layer="0")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mx.mxfp8(model, exclude=["layers.0"])  # the same options again: nothing to say


def test_a_marked_model_run_outside_compile_warns_and_a_compiled_one_does_not():
    import warnings

    model = _model()
    x = torch.randn(1, 32, 64, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x)
    assert any("ran its experts outside torch.compile" in str(w.message) for w in caught)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(model, backend="aot_eager")(x)
    assert not any("outside torch.compile" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert len(pickle.loads(pickle.dumps(model)).layers) == 2  # the hook pickles with the model
