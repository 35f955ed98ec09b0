"""Reused weight quantizations (`weight_cache=True`): keyed on the parameter, never stale, never
another weight's, dropped with the parameter; off by default (docs/design.md, "Weight cache").

Every case runs with both recipes and both expert-weight layouts (a transposed [E, N, K]
parameter, as transformers' Mixtral and Qwen3-MoE and TorchTitan hold them, and a contiguous
[E, K, N] one), through the eager op and under the pass with Inductor, and compares with the
eager op without reuse on the current weights.
"""

import gc
import math
import threading
import warnings

import numpy
import pytest
import torch
from helpers import assert_bitwise_equal, make_offs

import mxfp8_inductor as mx
from mxfp8_inductor.kernels import reference, shared_weight
from mxfp8_inductor.kernels.blockwise import SCALE_TILE, tiles
from mxfp8_inductor.lowering import mxfp8
from mxfp8_inductor.lowering import weight_cache as weights

SIZES = [40, 0, 64, 17]
E, N, K = 4, 64, 96


def _weight(layout: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    w_ENK = torch.randn(E, N, K, generator=g) * 0.05
    return torch.nn.Parameter((w_ENK if layout == "transposed" else w_ENK.transpose(-2, -1).contiguous()).to(dtype))


def _operand(w: torch.Tensor, layout: str) -> torch.Tensor:
    """The [E, K, N] operand of `torch._grouped_mm` from the parameter."""
    return w.transpose(-2, -1) if layout == "transposed" else w


class Experts(torch.nn.Module):
    """One expert GEMM: the eager op, or with `pass_route` the plain call the pass rewrites."""

    def __init__(self, recipe: str, layout: str, pass_route: bool) -> None:
        super().__init__()
        self.recipe, self.layout, self.pass_route = recipe, layout, pass_route
        self.w = _weight(layout)

    def forward(self, x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        b_EKN = _operand(self.w, self.layout)
        if self.pass_route:
            return torch._grouped_mm(x_MK, b_EKN, offs=offs)
        return mx.grouped_mm(x_MK, b_EKN, offs, recipe=self.recipe, weight_cache=True)


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(SIZES), K, generator=g).bfloat16(), make_offs(SIZES)


def _step(run, w: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output, input gradient and weight gradient of one forward and backward."""
    x = x.detach().requires_grad_()
    out = run(x, offs)
    dx, dw = torch.autograd.grad(out.float().square().sum(), [x, w])
    return out.detach(), dx, dw


def _fresh(model: Experts, x: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What the model computes on its current weights, quantizing them anew: the eager op with
    reuse's numerics (fp8_rowwise: the shared form) on a new parameter, which no entry serves."""
    w = torch.nn.Parameter(model.w.detach().clone())
    return _step(lambda x, offs: mx.grouped_mm(x, _operand(w, model.layout), offs, recipe=model.recipe,
                                               weight_cache=True), w, x, offs)


@pytest.fixture(autouse=True)
def _empty_cache():
    weights.clear_weight_cache()
    yield
    weights.clear_weight_cache()


def _changes(model: Experts, run, x: torch.Tensor, offs: torch.Tensor):
    """Each way a training or evaluation loop changes a weight through its version counter, by
    name, to apply in turn (`run`: the model, eager or compiled)."""
    w = model.w

    @torch.no_grad()
    def negate():
        w.mul_(-1)

    def sgd_by_hand():
        grad = _step(run, w, x, offs)[2]
        with torch.no_grad():
            w.sub_(0.5 * grad)

    @torch.no_grad()
    def triple():
        w.copy_(w * 3)

    def optimizer():
        opt = torch.optim.SGD([w], lr=0.5)
        w.grad = torch.ones_like(w)
        opt.step()
        w.grad = None

    return [("mul_", negate), ("sgd by hand", sgd_by_hand),
            ("load_state_dict", lambda: model.load_state_dict({"w": _weight(model.layout, seed=7).detach()})),
            ("copy_", triple), ("optimizer step", optimizer)]


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "fp8_blockwise", "mxfp8"])
@pytest.mark.parametrize("route", ["eager", "pass"])
def test_every_change_to_a_weight_is_seen(recipe, layout, route):
    """The cache on, each change made after a step: the next step computes with the new weight,
    exactly as a run that quantizes it anew (in a compiled graph too, where the transposed
    operand is a reinterpreted view with a version counter of its own)."""
    model = Experts(recipe, layout, pass_route=route == "pass")
    run = model if route == "eager" else torch.compile(model, backend="mxfp8",
                                                       options={"recipe": recipe, "weight_cache": True})
    x, offs = _inputs()
    before = _step(run, model.w, x, offs)
    for a, b in zip(before, _fresh(model, x, offs)):
        assert_bitwise_equal(a, b)
    for name, change in _changes(model, run, x, offs):
        change()
        got = _step(run, model.w, x, offs)
        assert not torch.equal(got[0], before[0]), name  # the change is one the output shows
        for a, b in zip(got, _fresh(model, x, offs)):
            assert_bitwise_equal(a, b)
        before = got


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "fp8_blockwise"])
@pytest.mark.parametrize("route", ["eager", "pass"])
def test_reuse_holds_one_byte_per_weight_element(recipe, layout, route):
    """After a forward and backward, what the cache keeps until the next microbatch is one FP8
    form per weight, whatever its layout: 1 byte per element (the emulated fp8_blockwise route's
    padded to whole 128-tiles) and its scales: fp8_rowwise's one per expert, spread over each
    GEMM's output columns (fp32 [E, N] and [E, K]), fp8_blockwise's one fp32 per 128 x 128 block."""
    model = Experts(recipe, layout, pass_route=route == "pass")
    run = model if route == "eager" else torch.compile(model, backend="mxfp8",
                                                       options={"recipe": recipe, "weight_cache": True})
    x, offs = _inputs()
    _step(run, model.w, x, offs)
    if recipe == "fp8_rowwise":
        assert weights.cached_bytes() == E * N * K + E * (N + K) * 4
    else:
        elements = E * N * K if x.is_cuda else E * tiles(N) * tiles(K) * SCALE_TILE**2
        assert weights.cached_bytes() == elements + E * tiles(N) * tiles(K) * 4


@pytest.mark.parametrize("recipe", ["fp8_rowwise", "fp8_blockwise", "mxfp8"])
def test_weights_computed_in_the_graph_are_never_reused(recipe):
    """fp32 master weights cast in the graph: the casts live in buffers Inductor reuses, with the
    same storage, pointer and version for w1's and w3's; each GEMM gets its own weight."""

    class Cast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w3 = _weight("transposed", 1, torch.float32), _weight("transposed", 3, torch.float32)

        def forward(self, x_MK, offs):
            return (torch._grouped_mm(x_MK, self.w1.bfloat16().transpose(-2, -1), offs=offs),
                    torch._grouped_mm(x_MK, self.w3.bfloat16().transpose(-2, -1), offs=offs))

    model, (x, offs) = Cast(), _inputs()
    # eager's rounding of the cast, which Inductor otherwise folds into the quantization's read
    inductor = {"emulate_precision_casts": True}
    compiled = torch.compile(model, backend="mxfp8", options={"recipe": recipe, "weight_cache": True,
                                                              "inductor": inductor})
    for _ in range(2):
        h1, h3 = compiled(x, offs)
        for got, w in ((h1, model.w1), (h3, model.w3)):
            assert_bitwise_equal(got, mx.grouped_mm(x, w.bfloat16().transpose(-2, -1), offs, recipe=recipe))
    assert weights.cached_bytes() == 0


@pytest.mark.parametrize("route", ["eager", "pass"])
def test_nothing_is_held_by_default(route):
    """Without `weight_cache=True` no quantized weight outlives its GEMM."""
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=route == "pass"), _inputs()
    if route == "eager":
        run = lambda x, offs: mx.grouped_mm(x, model.w.transpose(-2, -1), offs, recipe="fp8_rowwise")
    else:
        run = torch.compile(model, backend="mxfp8", options={"recipe": "fp8_rowwise"})
    for _ in range(2):
        _step(run, model.w, x, offs)
    assert weights.cached_bytes() == 0


@pytest.fixture
def quantizations(monkeypatch):
    """Counts the fp8_rowwise weight quantizations the cache lets through."""
    calls = []
    quantize = shared_weight.quantize

    def counted(b, *args):
        calls.append(b.shape)
        return quantize(b, *args)

    monkeypatch.setattr(shared_weight, "quantize", counted)
    return calls


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
def test_one_quantization_serves_forward_backward_and_later_microbatches(quantizations, layout):
    """fp8_rowwise: one quantization makes the shared form, which serves every GEMM of the weight
    (the input gradient's through a byte transpose) until it changes: 1 byte per element and
    the scale per expert spread over each GEMM's output columns (fp32 [E, N] and [E, K])."""
    model, (x, offs) = Experts("fp8_rowwise", layout, pass_route=False), _inputs()
    for _ in range(3):
        got = _step(model, model.w, x, offs)
        made = len(quantizations)
        for g, ref in zip(got, _fresh(model, x, offs)):
            assert_bitwise_equal(g, ref)
        del quantizations[made:]  # the fresh parameter's own
    assert len(quantizations) == 1
    assert weights.cached_bytes() == E * N * K + E * (N + K) * 4


def test_native_mxfp8_operands_are_reused_under_the_parameter():
    """The native path's float8 weight operands (built here with the reference kernels) are made
    once per orientation and made anew after the parameter changes; a weight that is not a view
    of the parameter passed is never reused."""
    w = _weight("transposed")
    x, offs = _inputs()
    ptr = lambda t: t.untyped_storage().data_ptr()
    fwd = lambda b: mxfp8.native_forward_args(reference, x, b, offs, "rceil", w)[1]
    dgrad = lambda b: mxfp8.native_dgrad_args(reference, x[:, :N], b, offs, "rceil", w)[1]
    with torch.no_grad():  # as inside the op
        first_fwd, first_dgrad = fwd(w.transpose(-2, -1)), dgrad(w.transpose(-2, -1))
        assert ptr(fwd(w.transpose(-2, -1))) == ptr(first_fwd) and ptr(dgrad(w.transpose(-2, -1))) == ptr(first_dgrad)
        w.mul_(2)
        again = fwd(w.transpose(-2, -1))
        assert ptr(again) != ptr(first_fwd)
        assert_bitwise_equal(again.transpose(-2, -1), reference.quantize_weight_blocked(w, "rceil")[0])
        assert ptr(fwd(w.clone().transpose(-2, -1))) != ptr(again)  # not a view of w: made anew


def test_writes_that_bypass_the_version_counter_need_clear_weight_cache():
    """`.data` writes (as `param.data.copy_(ema)`, `vector_to_parameters` followed by in-place
    updates of its buffer, collectives) do not bump the version counter: the cache serves the old
    quantization until `clear_weight_cache()`, the documented remedy."""
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=False), _inputs()
    before = _step(model, model.w, x, offs)
    model.w.data.copy_(_weight("transposed", seed=5).data)
    assert_bitwise_equal(_step(model, model.w, x, offs)[0], before[0])  # stale, as documented
    mx.clear_weight_cache()
    for got, ref in zip(_step(model, model.w, x, offs), _fresh(model, x, offs)):
        assert_bitwise_equal(got, ref)


def test_entries_are_dropped_with_their_parameter():
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=False), _inputs()
    _step(model, model.w, x, offs)
    assert weights.cached_bytes() > 0
    del model
    gc.collect()
    assert weights.cached_bytes() == 0 and not weights._params


def test_threads_share_the_cache_safely():
    """Four threads, each with fresh weights, some freed while others look up."""
    x, offs = _inputs()
    errors = []

    def work(seed: int) -> None:
        try:
            for i in range(6):
                w = _weight("transposed", seed=seed * 10 + i)
                got = mx.grouped_mm(x, w.transpose(-2, -1), offs, recipe="fp8_rowwise", weight_cache=True)
                want = mx.grouped_mm(x, w.transpose(-2, -1), offs, recipe="fp8_rowwise")
                assert torch.equal(got, want)
        except Exception as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_fsdp2_regathered_weights_follow_the_optimizer(tmp_path):
    """FSDP2 re-gathers a parameter with its version counter preserved: the cache must take the
    optimizer step's update, over steps of two microbatches each, exactly as the uncached run
    does."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        def train(cache: bool) -> list[torch.Tensor]:
            weights.clear_weight_cache()
            model = Experts("fp8_rowwise", "transposed", pass_route=False)
            model.forward = lambda x, offs: mx.grouped_mm(x, model.w.transpose(-2, -1), offs, recipe="fp8_rowwise",
                                                          weight_cache=cache)
            fully_shard(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            outs = []
            for step in range(3):
                for micro in range(2):
                    x, offs = _inputs(seed=10 * step + micro)
                    out = model(x, offs)
                    out.float().square().mean().backward()
                    outs.append(out.detach())
                opt.step()
                opt.zero_grad()
            return outs

        want = train(cache=False)
        for got, ref in zip(train(cache=True), want):
            assert_bitwise_equal(got, ref)
    finally:
        dist.destroy_process_group()


def test_a_refill_that_keeps_the_version_is_caught_by_the_next_optimizer_step():
    """What FSDP2's all-gather does to an unsharded weight, done by hand: new values in the same
    storage with the version counter preserved. The cache cannot see it, and any optimizer's step
    clears it."""
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=False), _inputs()
    before = _step(model, model.w, x, offs)
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(model.w):
        model.w.mul_(-2)
    assert_bitwise_equal(_step(model, model.w, x, offs)[0], before[0])  # stale: same storage and version
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]).step()  # an unrelated optimizer
    for got, ref in zip(_step(model, model.w, x, offs), _fresh(model, x, offs)):
        assert_bitwise_equal(got, ref)


def test_a_cache_past_its_share_of_device_memory_warns_once(monkeypatch):
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=False), _inputs()
    monkeypatch.setattr(weights, "_warned", False)
    monkeypatch.setattr(weights, "_capacity", lambda device: 10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(model, model.w, x, offs)  # a few KiB: no warning
    monkeypatch.setattr(weights, "_capacity", lambda device: weights.cached_bytes())
    weights.clear_weight_cache()
    with pytest.warns(UserWarning, match="weight_cache=False frees it"):
        _step(model, model.w, x, offs)
    weights.clear_weight_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(model, model.w, x, offs)  # once per process


def test_the_emulation_rounds_the_weight_slice_by_slice(monkeypatch):
    """The emulated MXFP8 weight exists one slice of the GEMM's output columns at a time, none
    over WEIGHT_SLICE_BYTES, with the same results as one whole rounding, eager and under
    Inductor (whose graph calls the rounding at run time, so it is counted there)."""
    E_, N_, K_ = 4, 384, 384
    g = torch.Generator().manual_seed(2)
    w = torch.nn.Parameter((torch.randn(E_, N_, K_, generator=g) * 0.05).bfloat16())
    x, offs = torch.randn(sum(SIZES), K_, generator=g).bfloat16(), make_offs(SIZES)
    rounded = []  # shapes of the weights (3-D; the tokens are 2-D) rounded on the CPU path
    quantize_dequantize = reference.quantize_dequantize

    def counted(x, *args):
        if x.dim() == 3:
            rounded.append(tuple(x.shape))
        return quantize_dequantize(x, *args)

    run = lambda x, offs: mx.grouped_mm(x, w.transpose(-2, -1), offs, recipe="mxfp8")
    monkeypatch.setattr(reference, "quantize_dequantize", counted)
    want = _step(run, w, x, offs)
    assert sorted(rounded) == [(E_, K_, N_)] * 2  # small enough for one slice per orientation
    budget = 2 * E_ * K_ * N_ // 3
    monkeypatch.setattr(mxfp8, "WEIGHT_SLICE_BYTES", budget)
    for step in (run, torch.compile(run, fullgraph=True)):
        del rounded[:]
        got = _step(step, w, x, offs)
        # forward: N in 3 slices of 128 columns; input gradient: K in 3
        assert sorted(rounded) == [(E_, 128, N_)] * 3 + [(E_, K_, 128)] * 3
        assert all(2 * math.prod(shape) <= budget for shape in rounded)
        for a, b in zip(got, want):
            assert_bitwise_equal(a, b)


def test_every_op_that_takes_the_parameter_runs_outside_cuda_graphs():
    """An op given a parameter reads or fills the weight cache in its Python body, which a CUDA
    graph's replay skips: each carries the tag by which Inductor leaves it out of its graphs, and
    no other op does (those stay inside)."""
    names = [n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("mxfp8::")]
    ops = {name: getattr(torch.ops.mxfp8, name).default for name in names}
    takes_param = {name for name, op in ops.items() if any(a.name == "param" for a in op._schema.arguments)}
    assert {"grouped_mm", "linear", "rowwise_cached_weight_gemm", "blockwise_cached_weight_gemm"} <= takes_param
    tagged = {name for name, op in ops.items() if torch.Tag.cudagraph_unsafe in op.tags}
    assert tagged == takes_param


def test_a_capture_into_a_cuda_graph_quantizes_the_weight_as_it_is(monkeypatch):
    """A GEMM captured into a CUDA graph (a user's `torch.cuda.graph` around the eager op) neither
    takes nor leaves a reused quantization: its replays repeat the capture's kernels, so the
    weight's quantization must be among them."""
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=False), _inputs()
    monkeypatch.setattr(weights, "_capturing", lambda w: True)
    for _ in range(2):
        for got, ref in zip(_step(model, model.w, x, offs), _fresh(model, x, offs)):
            assert_bitwise_equal(got, ref)
        assert weights.cached_bytes() == 0
        with torch.no_grad():
            model.w.data.mul_(-1)  # a write the version counter misses: a reuse would be stale


@pytest.mark.gpu
def test_a_captured_gemm_replays_with_the_current_weight():
    """The eager op with the cache captured by `torch.cuda.graph`: after an in-place weight update
    outside the graph, a replay computes with the new weight."""
    model = Experts("fp8_rowwise", "transposed", pass_route=False).cuda()
    x, offs = (t.cuda() for t in _inputs())
    with torch.no_grad():
        model(x, offs)  # warm-up outside the capture: kernels compiled and autotuned
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(x, offs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(x, offs)
        for scale in (2.0, -0.5):
            model.w.mul_(scale)
            graph.replay()
            weights.clear_weight_cache()
            assert_bitwise_equal(out, mx.grouped_mm(x, model.w.transpose(-2, -1), offs, recipe="fp8_rowwise",
                                                    weight_cache=True))


@pytest.mark.parametrize("partition", [True, False])
def test_cuda_graphs_turned_off_by_reuse_warn_once(monkeypatch, partition):
    """CUDA graphs without graph partition: a graph holding an op that reuses a weight runs
    without them (Inductor only logs it), which the pass says once per process."""
    from torch._inductor import config as inductor

    from mxfp8_inductor.patterns import rewrite

    monkeypatch.setattr(rewrite, "_warned_graphs", False)
    x, offs = _inputs()
    options = {"recipe": "fp8_rowwise", "weight_cache": True, "inductor": {"triton.cudagraphs": True}}
    counts = []
    with inductor.patch(graph_partition=partition), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for cache in (False, True, True):  # without reuse nothing to say; with it, said once
            torch._dynamo.reset()
            model = Experts("fp8_rowwise", "transposed", pass_route=True)
            torch.compile(model, backend="mxfp8", options={**options, "weight_cache": cache})(x, offs)
            counts.append(sum("CUDA graphs" in str(w.message) for w in caught))
    assert counts == ([0, 0, 0] if partition else [0, 1, 1])
    assert partition or any("graph_partition=True" in str(w.message) for w in caught)
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "fp8_blockwise", "mxfp8"])
def test_cuda_graphs_see_every_change_to_a_weight(recipe):
    """Compiled with Inductor's CUDA graphs (what `mode="reduce-overhead"` turns on) and the
    cache, each change to the weight reaches the next step, bit for bit as without CUDA graphs:
    a replay that skipped the cache's lookup would read a dropped quantization."""
    runs = []
    for cudagraphs in (True, False):
        model = Experts(recipe, "transposed", pass_route=True).cuda()
        options = {"recipe": recipe, "weight_cache": True, "inductor": {"triton.cudagraphs": cudagraphs}}
        runs.append((model, torch.compile(model, backend="mxfp8", options=options)))
    x, offs = (t.cuda() for t in _inputs())

    def step(model, run):  # cloned: a CUDA graph's next replay writes over its outputs
        return [t.clone() for t in _step(run, model.w, x, offs)]

    before = step(*runs[0])
    for (name, change), (_, change_b) in zip(*(_changes(model, run, x, offs) for model, run in runs)):
        change(), change_b()
        got, expected = step(*runs[0]), step(*runs[1])
        assert not torch.equal(got[0], before[0]), name
        for a, b in zip(got, expected):
            assert_bitwise_equal(a, b)
        before = got


@pytest.mark.parametrize("route", ["eager", "pass"])
def test_a_new_storage_at_the_old_address_is_quantized_anew(route):
    """Two `.data` swaps with no GEMM between, the second to a new storage at the address of the
    one the quantization was made from (`torch.from_numpy` over one buffer makes a new storage
    there each time): the version counter and the data pointer are those of the entry, the
    storage is not, and the GEMM computes with the new values."""
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=route == "pass"), _inputs()
    run = model if route == "eager" else torch.compile(model, backend="mxfp8",
                                                       options={"recipe": "fp8_rowwise", "weight_cache": True})
    buffer = numpy.empty(E * N * K, dtype=numpy.uint16)

    def at_buffer(values: torch.Tensor) -> torch.Tensor:
        buffer[:] = values.detach().view(torch.uint16).flatten().numpy()
        return torch.from_numpy(buffer).view(torch.bfloat16).view(values.shape)

    model.w.data = at_buffer(model.w)
    before = _step(run, model.w, x, offs)
    made_under = (model.w._version, model.w.data_ptr())
    model.w.data = _weight("transposed", seed=5).detach()
    model.w.data = at_buffer(_weight("transposed", seed=6))
    assert (model.w._version, model.w.data_ptr()) == made_under
    got = _step(run, model.w, x, offs)
    assert not torch.equal(got[0], before[0])
    for a, b in zip(got, _fresh(model, x, offs)):
        assert_bitwise_equal(a, b)


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo process group (FSDP2 still shards, and all-gathers by copying)."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield tmp_path
    dist.destroy_process_group()


def _sharded_experts():
    """An Experts block (the eager op with the cache, transposed weight) sharded by FSDP2 under a
    sharded root, so that it reshards after each forward and writes between forwards reach its
    sharded parameter."""
    from torch.distributed.fsdp import fully_shard

    root = torch.nn.Module()
    root.experts = fully_shard(Experts("fp8_rowwise", "transposed", pass_route=False))
    root.forward = lambda x, offs: root.experts(x, offs)
    return fully_shard(root)


FSDP2_ROUTES = ["state_dict", "dcp_load", "dcp_load_held", "load_state_dict", "copy_"]


@pytest.mark.parametrize("route", FSDP2_ROUTES)
def test_fsdp2_writes_into_the_sharded_weight_are_seen_by_every_route(one_rank, quantizations, route):
    """FSDP2 gathers the unsharded weight into one storage (resized to nothing between forwards)
    with its version counter preserved, so the cache follows the sharded weight FSDP2 keeps for
    it: each write into that between two forwards, with no optimizer step, is seen by the second,
    whatever its route (in place into a state dict's tensor, a checkpoint loaded in place into a
    fresh state dict or into one held across loads, `load_state_dict`, `copy_`); forwards
    without a write reuse the quantization."""
    import torch.distributed.checkpoint as dcp

    model, (x, offs) = _sharded_experts(), _inputs()
    forward = torch.no_grad()(lambda: model(x, offs))
    quantized_by_forward = [len(quantizations)]
    for _ in range(3):
        forward()
        quantized_by_forward.append(len(quantizations))
    assert numpy.diff(quantized_by_forward).tolist() == [1, 0, 0]
    expected, checkpoints = {}, {1: str(one_rank / "plus"), -1: str(one_rank / "minus")}
    for sign in (1, -1):
        dcp.save(model.state_dict(), checkpoint_id=checkpoints[sign])
        expected[sign] = forward()
        with torch.no_grad():
            model.experts.w.mul_(-1)
        weights.clear_weight_cache()
    assert not torch.equal(expected[1], expected[-1])
    plus = {k: v.detach().clone() for k, v in model.state_dict().items()}
    states = {1: plus, -1: {k: -v for k, v in plus.items()}}
    held = {}

    @torch.no_grad()
    def write(sign: int) -> None:
        if route == "state_dict":
            model.state_dict()["experts.w"].mul_(-1)
        elif route == "dcp_load":
            dcp.load(model.state_dict(), checkpoint_id=checkpoints[sign])
        elif route == "dcp_load_held":  # a state dict taken after the first forward, loaded into again
            dcp.load(held.setdefault("state", model.state_dict()), checkpoint_id=checkpoints[sign])
        elif route == "load_state_dict":
            model.load_state_dict(states[sign])
        else:
            model.experts.w.copy_(states[sign]["experts.w"])

    forward()
    for sign in (-1, 1, -1, 1):
        write(sign)
        assert_bitwise_equal(forward(), expected[sign])



def test_a_marked_model_sees_a_load_into_a_state_dict_taken_before_its_first_forward(one_rank, quantizations):
    """Marking with weight_cache watches the expert module's state dicts from then on, so a
    checkpoint loaded in place into one taken before any forward (when the cache had not yet met
    the parameter) is seen by the next forward."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    experts = Experts("fp8_rowwise", "transposed", pass_route=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the marked module runs eagerly here: the eager op's cache is the subject
        mx.mxfp8(experts, recipe="fp8_rowwise", weight_cache=True)
        root = torch.nn.Module()
        root.experts = fully_shard(experts)
        root.forward = lambda x, offs: root.experts(x, offs)
        model = fully_shard(root)
        held = model.state_dict()
        checkpoint = str(one_rank / "checkpoint")
        dcp.save(held, checkpoint_id=checkpoint)
        x, offs = _inputs()
        forward = torch.no_grad()(lambda: model(x, offs))
        saved = forward()
        with torch.no_grad():
            model.experts.w.mul_(-1)
        assert not torch.equal(forward(), saved)
        dcp.load(held, checkpoint_id=checkpoint)
        assert_bitwise_equal(forward(), saved)

def test_fsdp2_unsharded_parameters_are_found_behind_their_sharded_ones(one_rank):
    """The FSDP2 internals the cache reads (torch 2.11 to 2.13) are where it looks: each unsharded
    parameter leads to its FSDPParam, and a parameter FSDP2 does not manage to none."""
    model, (x, offs) = _sharded_experts(), _inputs()
    model(x, offs)  # the first all-gather makes the unsharded parameters
    (fsdp_param,) = model.experts._get_fsdp_state()._fsdp_param_group.fsdp_params
    assert weights._fsdp_param_of(fsdp_param._unsharded_param) is fsdp_param
    assert weights._fsdp_param_of(_weight("transposed")) is None


def test_without_the_fsdp2_internals_nothing_is_reused_and_it_warns_once(monkeypatch, quantizations):
    """Where FSDP2 is in use and its internals are not found (another torch), the cache cannot
    tell an unsharded parameter from a plain one: it quantizes at every GEMM and says so once."""
    monkeypatch.setattr(weights, "_fsdp_param_of", lambda param: weights._UNKNOWN)
    monkeypatch.setattr(weights, "_warned_unknown", False)
    model, (x, offs) = Experts("fp8_rowwise", "transposed", pass_route=False), _inputs()
    with pytest.warns(UserWarning, match="does not reuse weights under FSDP2"):
        first = _step(model, model.w, x, offs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = _step(model, model.w, x, offs)
    assert len(quantizations) == 4  # forward and input gradient, twice
    for a, b, want in zip(first, second, _fresh(model, x, offs)):
        assert_bitwise_equal(a, want)
        assert_bitwise_equal(b, want)
    assert weights.cached_bytes() == 0
