"""recipe="auto": the cost model's choices, its data, and what the pass and explain() make of them."""

import json
import re

import pytest
import torch
from models import MoEModel

import mxfp8_inductor as mx
from mxfp8_inductor.lowering import auto, dispatch, measure
from mxfp8_inductor.spec import ROLES


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
    assert plan.impls == ("fp8_rowwise", "bf16", "bf16")
    assert "2.00x bf16 at 32 tokens per group" in plan.reasons[0]
    assert "fp8_rowwise 1.02x" in plan.reasons[1] and "mxfp8 0.67x" in plan.reasons[1]
    assert auto.plan_for("auto", "bf16", M=256, K=64, N=128, E=8, dense=False).reasons[2] == "wgrad='bf16'"
    unknown = auto.plan_for("auto", "quantized", M=None, K=64, N=128, E=8, dense=False)
    assert unknown.impls == ("per_call",) * 3 and "chosen per call" in unknown.reasons[0]
    # mxfp8 needs K and N in blocks of 32: a K of 48 leaves fp8_rowwise only
    table(1.5, 1.5, 1.5)
    assert "mxfp8" not in auto.plan_for("auto", "quantized", M=256, K=48, N=128, E=8, dense=False).reasons[0]


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("K, N", [(0, 128), (64, 0)])
def test_an_empty_k_or_n_is_bf16_with_nothing_to_multiply(timed, K, N, dense):
    """The cost model has no size 0 to look up and timing an empty GEMM would time nothing: an
    empty K or N keeps bf16 (the op returns zeros, lowering/ops.py), timed or not."""
    timed([])  # nothing may be timed
    for autotune in (False, True):
        plan = auto.plan_for("auto", "quantized", M=64, K=K, N=N, E=4, dense=dense, device=CPU, autotune=autotune)
        assert plan == auto.Plan(("bf16",) * 3, ("K or N is 0: nothing to multiply",) * 3)


def test_fixed_recipes_ignore_the_table(table):
    table(9.0, 9.0, 9.0)
    plan = auto.plan_for("mxfp8", "quantized", M=4, K=64, N=128, E=8, dense=False)
    assert plan.impls == ("mxfp8",) * 3


def _explain_auto() -> tuple[mx.Report, str]:
    """The report of a one-layer MoE under recipe="auto" and its rewritten graphs' code."""
    torch.manual_seed(0)
    report = mx.explain(MoEModel(layers=1).bfloat16(), torch.randn(2, 8, 64, dtype=torch.bfloat16),
                        options={"recipe": "auto"})
    return report, "".join(report.graphs)


def test_pass_puts_each_roles_choice_in_the_op_and_the_report(table):
    table(0.5, 0.8, 1.3)
    report, code = _explain_auto()
    assert code.count("'fp8_rowwise:rceil', 'fp8_rowwise:rceil', 'bf16:rceil'") == 3
    actions = {(s.role, s.action) for s in report.sites}
    assert actions == {("forward", "rewritten"), ("input-grad", "rewritten"), ("weight-grad", "kept bf16")}
    assert all("at 8 tokens per group (H200 table)" in s.reason for s in report.sites)
    assert {(s.role, s.impl) for s in report.sites} == {
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
    assert plan.impls == (("fp8_rowwise",) * 3 if uses_table else ("bf16",) * 3), plan
    on_cpu = auto.plan_for("auto", "quantized", M=256, K=64, N=128, E=8, dense=False, device=torch.device("cpu"))
    assert on_cpu.impls == ("fp8_rowwise",) * 3


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
    assert "'per_call:rceil', 'per_call:rceil', 'per_call:rceil'" in "".join(report.graphs)
    assert {(s.impl, s.action) for s in report.sites} == {("per_call", "rewritten")}
    assert all("token count dynamic at compile time: chosen per call" in s.reason for s in report.sites)


class _Bench:
    """A stand-in for `measure._bench`: runs the timed call once on CPU, records its output's shape
    and returns the next of the given times (an error once they run out: nothing more may be timed)."""

    def __init__(self, ms: list[float]) -> None:
        self.ms, self.shapes, self.host = list(ms), [], []

    def __call__(self, fn, host_fn=None, host=True) -> float:
        self.shapes.append(tuple(fn().shape))
        self.host.append(host)
        assert self.ms, "timed a GEMM the measurements on disk should have answered"
        return self.ms.pop(0)


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """Measurement on CPU: bf16 and fp8_rowwise timed by a `_Bench` of the given times, their
    disk cache in tmp_path, nothing kept from other tests."""
    from mxfp8_inductor.lowering import measure

    monkeypatch.setattr(measure, "measurable", lambda device: device is not None)
    monkeypatch.setattr(measure, "candidates", lambda device, K, N, tokens: ["bf16", "fp8_rowwise"])
    monkeypatch.setattr(measure, "_path", lambda: tmp_path / "gemm_times.json")
    monkeypatch.setattr(measure, "_times", None)
    monkeypatch.setattr(dispatch, "_CHOICES", {})

    def use(ms: list[float]) -> _Bench:
        bench = _Bench(ms)
        monkeypatch.setattr(measure, "_bench", bench)
        return bench

    return use


CPU = torch.device("cpu")


def test_autotune_times_each_role_and_takes_fp8_where_faster_by_the_margin(timed):
    """Each role's candidates run at the GEMM's shape (forward out [M, N], input gradient [M, K],
    weight gradient [E, N, K] as for a weight stored [E, N, K]); FP8 only where >= MARGIN faster."""
    bench = timed([1.0, 0.5, 1.0, 1 - auto.MARGIN / 2, 1.0, 1.2])
    kw = dict(M=64, K=64, N=128, E=4, dense=False, device=CPU, autotune=True)
    plan = auto.plan_for("auto", "quantized", **kw)
    assert plan.impls == ("fp8_rowwise", "bf16", "bf16")
    assert plan.reasons[0] == ("fp8_rowwise 2.00x bf16 (bf16 1.000 ms, fp8_rowwise 0.500 ms) at 16 tokens per "
                               "group, timed on cpu")
    assert plan.reasons[2].startswith("bf16: bf16 1.000 ms, fp8_rowwise 1.200 ms")
    assert bench.shapes == [(64, 128)] * 2 + [(64, 64)] * 2 + [(4, 128, 64)] * 2
    dense = timed([1.0, 2.0] * 3)
    auto.plan_for("auto", "quantized", **kw | dict(M=32, E=1, dense=True))
    assert dense.shapes == [(32, 128)] * 2 + [(32, 64)] * 2 + [(128, 64)] * 2
    assert auto.plan_for("auto", "quantized", **kw | dict(autotune=False)).reasons[0].endswith("(H200 table)")


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("cached", [False, True])
def test_compiled_roles_time_fp8_rowwise_with_its_activation_quantized_by_the_producer(timed, monkeypatch, cached,
                                                                                       dense):
    """As the pass plans (compiled), fp8_rowwise's forward and input gradient are timed with their
    activation already in FP8 rows (Inductor fuses that quantization into its producer), the
    weight's quantization still inside the timed call where it is not reused; the eager op's
    plan (compiled=False) times the activation's quantization too, under keys of its own."""
    from mxfp8_inductor.lowering import rowwise

    real, quantized = rowwise.quantize_rows, []
    monkeypatch.setattr(rowwise, "quantize_rows", lambda x, *a, **k: quantized.append(x.dim()) or real(x, *a, **k))
    inside = []

    def bench(fn, host_fn=None, host=True):
        quantized.clear()
        out = fn()
        inside.append((tuple(out.shape), sorted(quantized)))
        if host_fn is not None:  # its host time is of the same call, the producer's stand-in left out
            quantized.clear()
            assert tuple(host_fn().shape) == inside[-1][0] and sorted(quantized) == inside[-1][1]
        return 1.0

    monkeypatch.setattr(measure, "_bench", bench)
    M, K, N, E = 64, 64, 128, 4
    kw = dict(M=M, K=K, N=N, E=1 if dense else E, dense=dense, device=CPU, autotune=True, cached=cached)
    weight = [] if cached else [3]  # the weight's rows (a dense one as [1, K, N]), quantized per call unless reused
    for compiled in (True, False):
        inside.clear()
        auto.plan_for("auto", "quantized", **kw, compiled=compiled)
        activation = [] if compiled else [2]
        assert inside[0] == ((M, N), []) and inside[2] == ((M, K), [])  # bf16
        assert inside[1] == ((M, N), sorted(activation + weight)), compiled
        assert inside[3] == ((M, K), sorted(activation + weight)), compiled
        assert len(inside) == 6  # the weight gradient as eagerly: its token groups have no producer to fuse into


def test_measured_times_are_kept_on_disk_per_gemm_and_weight_cache(timed, tmp_path):
    from mxfp8_inductor.lowering import measure

    timed([1.0, 0.5] * 3)
    kw = dict(M=64, K=64, N=128, E=4, dense=False, device=CPU, autotune=True)
    plan = auto.plan_for("auto", "quantized", **kw)
    measure._times = None  # as in a new process: the file answers, nothing is timed
    timed([])
    assert auto.plan_for("auto", "quantized", **kw) == plan
    with pytest.raises(AssertionError, match="timed a GEMM"):  # reused weights time differently
        auto.plan_for("auto", "quantized", **kw, cached=True)
    (tmp_path / "gemm_times.json").write_text("{torn")  # another process's torn write: timed again
    measure._times = None
    bench = timed([1.0, 2.0] * 3)
    assert auto.plan_for("auto", "quantized", **kw).impls == ("bf16",) * 3 and len(bench.shapes) == 6


def test_times_on_disk_that_are_not_finite_positive_numbers_are_timed_again(timed, tmp_path):
    """An entry of NaN, infinity, zero, a negative time, true or a string (an edited or damaged
    file) never answers for a GEMM: each is timed again, and the new time replaces it on disk."""
    from mxfp8_inductor.lowering import measure

    timed([1.0, 0.5] * 3)
    kw = dict(M=64, K=64, N=128, E=4, dense=False, device=CPU, autotune=True)
    auto.plan_for("auto", "quantized", **kw)
    path = tmp_path / "gemm_times.json"
    keys = sorted(json.loads(path.read_text()))
    bad = [float("nan"), float("inf"), 0, -0.5, True, "0.5"]
    assert len(keys) == len(bad)
    path.write_text(json.dumps(dict(zip(keys, bad))))
    measure._times = None
    bench = timed([1.0, 2.0] * 3)
    assert auto.plan_for("auto", "quantized", **kw).impls == ("bf16",) * 3 and len(bench.shapes) == 6
    assert sorted(json.loads(path.read_text()).values()) == [1.0] * 3 + [2.0] * 3


def test_autotune_reports_times_in_explain_and_defers_a_dynamic_token_count(timed):
    """The report shows the measured times; a dynamic token count leaves the choice to the op, which
    times the call's tokens per group rounded to a power of two once per bucket."""
    timed([1.0, 0.5, 1.0, 2.0, 1.0, 2.0] * 3)  # per distinct GEMM shape
    report, code = _explain_auto()
    assert code.count("'fp8_rowwise:rceil', 'bf16:rceil', 'bf16:rceil'") == 3
    rewritten = [s for s in report.sites if s.action == "rewritten"]
    assert rewritten and all("ms) at 8 tokens per group, timed on cpu" in s.reason for s in rewritten)
    model = _Experts()
    x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    report = mx.explain(model, x, torch.arange(1, 5, dtype=torch.int32) * 2, options={"recipe": "auto"})
    assert "'per_call_timed:rceil', 'per_call_timed:rceil', 'per_call_timed:rceil'" in "".join(report.graphs)
    bench = timed([1.0, 0.5, 1.0, 2.0, 1.0, 2.0])
    w = model.w.detach()
    for M in (96, 100):  # 24 and 25 tokens per group: both timed at 32, once
        x = torch.randn(M, 64, dtype=torch.bfloat16)
        offs = torch.tensor([M // 4, M // 2, 3 * M // 4, M], dtype=torch.int32)
        got = torch.ops.mxfp8.grouped_mm(x, w.transpose(-2, -1), offs, *("per_call_timed:rceil",) * 3, None)
        want = mx.grouped_mm(x, w.transpose(-2, -1), offs, recipe="fp8_rowwise")
        assert torch.equal(got, want)
    assert bench.shapes[:2] == [(128, 128)] * 2 and len(bench.shapes) == 6


@pytest.mark.parametrize("partition", [True, False])
@pytest.mark.parametrize("cached", [False, True])
def test_under_cuda_graphs_only_calls_between_graphs_pay_host_time(timed, cached, partition):
    """Compiled for CUDA graphs (the backend's Inductor patches; `mode="reduce-overhead"`), a call
    a replay repeats costs no host time: each role is timed on the GPU alone, except an FP8 call
    that reuses a weight, which runs between the graphs. Without graph partition such a call
    keeps the whole graph out of CUDA graphs: every call pays its host time again."""
    from torch._inductor import config as inductor

    x, offs = torch.randn(8, 64, dtype=torch.bfloat16), torch.arange(1, 5, dtype=torch.int32) * 2
    options = {"recipe": "auto", "weight_cache": cached}
    graphs = partition or not cached
    # (bf16, fp8_rowwise) per role: forward, input gradient, weight gradient
    under_graphs = [False, cached] * 2 + [False, False] if graphs else [True] * 6
    # then without CUDA graphs: each GEMM timed on the GPU alone is timed again with its host time
    outside = [True] * under_graphs.count(False)
    with inductor.patch(graph_partition=partition):
        for patches, host in (({"triton.cudagraphs": True}, under_graphs), ({}, outside)):
            bench = timed([1.0, 0.5] * 3)
            torch._dynamo.reset()
            torch.compile(_Experts(), backend="mxfp8", options={**options, "inductor": patches})(x, offs)
            assert bench.host == host
    torch._dynamo.reset()


@pytest.mark.parametrize("cached", [False, True])
def test_under_cuda_graphs_native_mxfp8s_opaque_ops_pay_host_time(timed, cached):
    """Native MXFP8's forward and input-gradient ops stay opaque, and run between the graphs with
    or without the weight cache: their calls keep their host time; its weight gradient's op
    (which takes no parameter) and bf16's calls are replayed."""
    bench = timed([1.0] * 6)
    for role in ROLES:
        measure.times(["bf16", "mxfp8"], role, 64, 64, 128, 4, dense=False, rounding="rceil", cached=cached,
                      compiled=True, device=CPU, graphs=True)
    assert bench.host == [False, True, False, True, False, False]


def test_explain_plans_with_the_backends_inductor_patches(timed):
    """explain() takes the backend's options, "inductor" included: its report gives the times the
    compiled model's pass compares under CUDA graphs."""
    bench = timed([1.0, 0.5] * 3)
    x, offs = torch.randn(8, 64, dtype=torch.bfloat16), torch.arange(1, 5, dtype=torch.int32) * 2
    report = mx.explain(_Experts(), x, offs, options={"recipe": "auto", "inductor": {"triton.cudagraphs": True}})
    assert bench.host == [False] * 6
    reasons = [s.reason for s in report.sites if s.action == "rewritten"]
    assert len(reasons) == 2 and all(r.endswith("timed on cpu for CUDA graphs") for r in reasons)


@pytest.mark.parametrize("major, timed", [(9, ["bf16", "fp8_rowwise"]), (10, ["bf16", "mxfp8"]), (8, ["bf16"])])
def test_only_recipes_that_multiply_in_fp8_are_timed(monkeypatch, major, timed):
    """An emulated recipe multiplies in bf16 after rounding: it cannot win, so it is not timed."""
    from mxfp8_inductor import routes
    from mxfp8_inductor.lowering import measure

    monkeypatch.setattr(routes, "_cuda_major", lambda device: major if device.type == "cuda" else None)
    assert measure.candidates(torch.device("cuda"), 2048, 2048, 512.0) == timed
    assert measure.candidates(CPU, 2048, 2048, 512.0) == ["bf16"]


def test_an_op_given_an_unknown_gemm_implementation_names_the_valid_ones():
    """The user's recipe "auto" is not something one GEMM runs: the op refuses it, naming what it takes."""
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(4, 128, 64, dtype=torch.bfloat16)
    offs = torch.arange(1, 5, dtype=torch.int32) * 2
    with pytest.raises(ValueError, match=r"unknown GEMM implementation 'auto': expected one of \['bf16', 'mxfp8', "
                                         r"'fp8_rowwise', 'fp8_blockwise', 'per_call', 'per_call_timed'\]"):
        torch.ops.mxfp8.grouped_mm(x, w.transpose(-2, -1), offs, "auto:rceil", "bf16:rceil", "bf16:rceil", None)


def test_timing_out_of_gpu_memory_warns_and_chooses_from_the_cost_model(timed, table, monkeypatch):
    from mxfp8_inductor.lowering import measure

    table(0.5, 0.5, 2.0)

    def oom(fn, host_fn=None, host=True):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(measure, "_bench", oom)
    with pytest.warns(UserWarning, match=r"could not time a GEMM of 64 x 64 x 128 on cpu: out of GPU memory; "
                                         r"chose from the H200 cost model \(autotune=False"):
        plan = auto.plan_for("auto", "quantized", M=64, K=64, N=128, E=4, dense=False, device=CPU, autotune=True)
    assert plan.impls == ("fp8_rowwise", "fp8_rowwise", "bf16") and plan.reasons[0].endswith("(H200 table)")


def test_each_gpu_keeps_its_own_times(timed, monkeypatch):
    """Times measured on one GPU model never answer for another (an H100 and an H200 each time)."""
    from mxfp8_inductor.lowering import measure

    kw = dict(M=64, K=64, N=128, E=4, dense=False, device=CPU, autotune=True)
    for name, ms in (("GPU A", [1.0, 0.5] * 3), ("GPU B", [1.0, 2.0] * 3), ("GPU A", [])):
        monkeypatch.setattr(measure, "device_name", lambda device, name=name: name)
        measure._device_key.cache_clear()
        bench = timed(ms)
        plan = auto.plan_for("auto", "quantized", **kw)
        assert plan.impls == (("fp8_rowwise",) * 3 if name == "GPU A" else ("bf16",) * 3)
        assert len(bench.shapes) == len(ms) and plan.reasons[0].endswith(f"timed on {name}")
    measure._device_key.cache_clear()


@pytest.mark.parametrize("gpu_ms,host_sleep_ms,low,high", [(2.0, 0.0, 2.0, 3.0), (0.5, 20.0, 20.5, 60.0)])
def test_a_call_costs_its_gpu_time_and_its_host_time(monkeypatch, gpu_ms, host_sleep_ms, low, high):
    """A step of calls whose host work outlasts their kernels runs at the host's pace: the timing
    adds the host's time per call to do_bench's GPU time."""
    import time

    import triton.testing

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: gpu_ms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    assert low <= measure._bench(lambda: time.sleep(host_sleep_ms / 1e3)) <= high
