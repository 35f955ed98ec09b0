"""Two-rank expert-parallel training steps of a tiny TorchTitan DeepSeek-V3 on CPU (gloo), for
tests/test_expert_parallel.py.

`main` is the spawned worker. Both ranks apply TorchTitan's own expert parallelism (its
DeepSeek-V3 `parallelize_fn`: experts sharded over the "ep" mesh axis, the all-to-all token
dispatcher, FSDP2, per-block `torch.compile`; see `run_ep` for its default SPMD backend) and run
the same steps with each compile route; the single-process references run on one rank each,
unparallelized. Rank 0 compares the runs and saves the observations (losses, SQNRs, rewritten
sites, compile counters) as `RESULTS` in the output folder: the test process asserts on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import pathlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mxfp8_inductor.spec import GemmSpec, Role

WORLD = 2
STEPS = 3
BATCH, SEQ = 2, 16  # per rank
SEED = 0
LR = 0.5  # large enough that step 2 and 3 see weights the earlier steps moved
# never routed (router bias): the last local group of rank 0 and a middle one of rank 1 are empty
EMPTY_EXPERTS = (3, 5)
PAD = 32  # token-group multiple of the padded dispatcher
GRAPH = "aot_eager_decomp_partition"  # graph-level compile: the rewrite, AOTAutograd, decompositions
RESULTS = "results.pt"
SINGLE = "single_rank{}.pt"
RECIPES = ("mxfp8", "fp8_rowwise")


# ------------------------------------------------------------------------------------------
# The padded dispatcher


@functools.cache
def padded_dispatcher_config() -> type:
    """TorchTitan's all-to-all dispatcher with the grouped-GEMM input of its padded (TorchAO)
    variant, which needs torchao: each local expert's rows padded with zero rows to a multiple
    of PAD, a fixed worst-case row count, rows past offs[-1] gathered from a sentinel row. Here
    that sentinel is NaN, so a GEMM that reads past offs[-1] poisons the gradients, and empty
    groups stay empty."""
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    class PaddedAllToAllTokenDispatcher(AllToAllTokenDispatcher):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(AllToAllTokenDispatcher.Config):
            pass

        def _permute(self, routed_input_RD: torch.Tensor, tokens_per_expert_and_rank: torch.Tensor):
            _, _, order_R, sizes_e = super()._permute(routed_input_RD, tokens_per_expert_and_rank)
            R, D = routed_input_RD.shape
            e = sizes_e.shape[0]
            padded_e = (sizes_e + PAD - 1) // PAD * PAD
            pad_before_e = padded_e.cumsum(0) - padded_e - (sizes_e.cumsum(0) - sizes_e)
            expert_R = torch.repeat_interleave(torch.arange(e), sizes_e, output_size=R)
            rows = (R + e * PAD + PAD - 1) // PAD * PAD
            dest_R = torch.arange(R) + pad_before_e[expert_R]
            # R: the zero row that pads groups; R + 1: the NaN row past offs[-1]
            source = torch.where(torch.arange(rows) < padded_e.sum(), R, R + 1)
            source = source.scatter(0, dest_R, order_R)
            x_ext = torch.cat([routed_input_RD, routed_input_RD.new_zeros(1, D),
                               routed_input_RD.new_full((1, D), float("nan"))])
            return x_ext.shape, x_ext[source], source, padded_e

        def _unpermute(self, routed_output_RD: torch.Tensor, input_shape: torch.Size, permuted_indices: torch.Tensor):
            out = routed_output_RD.new_empty(input_shape)
            out[permuted_indices, :] = routed_output_RD
            return out[:-2]

    return PaddedAllToAllTokenDispatcher.Config


# ------------------------------------------------------------------------------------------
# Model, data, compile backends


def build_model(padded: bool = False) -> tuple[Any, torch.nn.Module]:
    """(model spec, model): the debug DeepSeek-V3's first MoE block alone, SDPA attention, EP
    sharding configs set; the same weights on every call."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.deepseek_v3 import model_registry
    from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config

    spec = model_registry("debugmodel")
    layer = next(c for c in spec.model.layers if c.moe is not None)  # the flavor's layer 0 is dense
    layer = dataclasses.replace(layer, attention=dataclasses.replace(
        layer.attention, inner_attention=ScaledDotProductAttention.Config()))
    if padded:
        dispatcher = layer.moe.routed_experts.token_dispatcher
        layer.moe.routed_experts = dataclasses.replace(layer.moe.routed_experts, token_dispatcher=(
            padded_dispatcher_config()(num_experts=dispatcher.num_experts, top_k=dispatcher.top_k)))
    spec.model = dataclasses.replace(spec.model, layers=[layer])
    # what Decoder.Config.update_from_config does for EP, without its import of the trainer
    # (which needs torchdata): the sharding configs of every submodule
    set_deepseek_v3_sharding_config(spec.model, enable_sp=True, enable_ep=True)
    torch.manual_seed(SEED)
    model = spec.model.build()
    model.init_states()
    with torch.no_grad():
        model.layers["0"].moe.expert_bias_E[list(EMPTY_EXPERTS)] = -1.0  # softmax scores are in [0, 1]
    return spec, model


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of every rank for a step, [WORLD * BATCH, SEQ] each: rank r's are rows
    r * BATCH to (r + 1) * BATCH."""
    g = torch.Generator().manual_seed(SEED + 1 + step)
    ids = torch.randint(0, 2048, (WORLD * BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


@dataclasses.dataclass
class Call:
    """One `mxfp8::grouped_mm` call in a rewritten Dynamo graph."""

    recipe: str
    a_rows: str  # the token count, symbolic under EP
    b_shape: tuple[int, ...]  # [E, K, N]: the local experts under EP


@dataclasses.dataclass
class Compiled:
    """What a compile route did, over its Dynamo graphs: the rewrite's forward rows and calls."""

    rows: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)  # (weight FQN, action)
    calls: list[Call] = dataclasses.field(default_factory=list)


def _backend(route: str, recipe: str | None, seen: Compiled) -> Callable:
    """The graph-level compiler behind a route: "bf16" (no pass), "options" (the pass with
    explicit options, as backend="mxfp8" applies it), "marked" (the pass `mxfp8()` installs for
    marked models, as Inductor's pre-grad hook applies it)."""
    from mxfp8_inductor import MXFP8Config
    from mxfp8_inductor.patterns.rewrite import rewrite

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        rows = []
        if route == "options":
            rows = rewrite(gm, MXFP8Config(recipe=recipe))
        elif route == "marked":
            pass_ = torch._inductor.config.pre_grad_custom_pass
            pass_(gm.graph)
            rows = pass_.last_rows
        seen.rows += [(r.weight_fqn, r.action) for r in rows if r.role == "forward"]
        seen.calls += [Call(GemmSpec.decode(n.args[3], Role.FORWARD, dense=False).impl.value,
                            str(n.args[0].meta["example_value"].shape[0]),
                            tuple(n.args[1].meta["example_value"].shape))
                       for n in gm.graph.nodes if n.target is torch.ops.mxfp8.grouped_mm.default]
        return torch._dynamo.lookup_backend(GRAPH)(gm, example_inputs)

    return backend


_NAMES = iter(range(1 << 30))


def _register(backend: Callable) -> str:
    """A name for TorchTitan's CompileConfig, which takes the backend by name."""
    name = f"ep_test_{next(_NAMES)}"
    torch._dynamo.register_backend(name=name)(backend)
    return name


# ------------------------------------------------------------------------------------------
# Runs


@dataclasses.dataclass
class Trace:
    """Per step: global loss, full gradients, tokens routed to each expert; and the compile."""

    losses: list[float]
    grads: list[dict[str, torch.Tensor]]
    tokens: list[list[int]]
    graphs: list[int]  # Dynamo's unique graphs after each step
    compiled: Compiled


def _gathered(p: torch.nn.Parameter) -> torch.Tensor:
    """The full gradient of a parameter of the "spmd_types" EP model, which holds plain local
    tensors and no FSDP2 to reduce them: expert weights sharded along the experts, the rest
    replicated with this rank's share of the gradient."""
    grad = p.grad.detach().float()
    if p.dim() == 3:
        shards = [torch.empty_like(grad) for _ in range(WORLD)]
        dist.all_gather(shards, grad.contiguous())
        return torch.cat(shards)
    grad = grad.clone()
    dist.all_reduce(grad)
    return grad


def _full(p: torch.nn.Parameter) -> torch.Tensor:
    """The full gradient of a parameter of the single-process or the DTensor EP model."""
    from torch.distributed.tensor import DTensor

    return (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().float().clone()


def _steps(model: torch.nn.Module, rows: slice, steps: int, compiled: Compiled,
           full: Callable[[torch.nn.Parameter], torch.Tensor], context: Callable = contextlib.nullcontext) -> Trace:
    from torch._dynamo.utils import counters

    counters.clear()
    moe = model.layers["0"].moe
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trace = Trace([], [], [], [], compiled)
    for step in range(steps):
        inputs, labels = batch(step)
        before_E = moe.tokens_per_expert_E.clone()
        with context():
            logits = model(inputs[rows])
            # each rank's sum over the global token count: the ranks' losses add up to the global mean
            loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels[rows].flatten(), reduction="sum")
            loss = loss_sum / labels.numel()
            loss.backward()
        total, tokens_E = loss.detach().clone(), moe.tokens_per_expert_E - before_E
        if dist.is_initialized() and rows != slice(None):
            dist.all_reduce(total)
            dist.all_reduce(tokens_E)
        trace.losses.append(total.item())
        trace.tokens.append(tokens_E.int().tolist())
        trace.grads.append({n: full(p) for n, p in model.named_parameters()})
        trace.graphs.append(counters["stats"]["unique_graphs"])
        opt.step()
        opt.zero_grad()
    return trace


def _compile_config(route: str, recipe: str | None, compiled: Compiled) -> Any:
    from torchtitan.config import CompileConfig

    backend = _register(_backend(route, recipe, compiled))
    return CompileConfig(enable=True, components=["model"], backend=backend)


def run_single(route: str, recipe: str | None) -> Trace:
    """STEPS steps on every rank's data in this process alone: no mesh, the local dispatcher."""
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.compile import apply_compile

    torch._dynamo.reset()
    _, model = build_model()
    compiled = Compiled()
    apply_compile(model, compile_config=_compile_config(route, recipe, compiled),
                  parallel_dims=ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1))
    return _steps(model, slice(None), STEPS, compiled, _full)


def run_ep(route: str, recipe: str | None, steps: int = STEPS, padded: bool = False, fsdp: bool = True) -> Trace:
    """`steps` steps on this rank's rows under TorchTitan's EP with a per-block compile; the model
    is marked before parallelizing in the marked route.

    With `fsdp`, DTensor EP ("partial_dtensor") through DeepSeek-V3's `parallelize_fn`, FSDP2
    included. Without, TorchTitan's default "spmd_types" EP (plain local tensors), whose FSDP2
    step torch 2.13's `fully_shard` refuses ("When dp_mesh_dims is provided, all parameters must
    be DTensors"): the steps of `parallelize_fn` before it, `parallelize` and `apply_compile`.
    """
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import parallel_dims as titan_parallel_dims
    from torchtitan.distributed import utils as titan_dist
    from torchtitan.distributed.compile import apply_compile

    import mxfp8_inductor

    torch._dynamo.reset()
    spec, model = build_model(padded)
    if route == "marked":
        mxfp8_inductor.mxfp8(model, recipe=recipe)
    spmd_backend = "partial_dtensor" if fsdp else "spmd_types"
    parallelism = ParallelismConfig(expert_parallel_degree=WORLD, spmd_backend=spmd_backend)
    titan_dist.set_spmd_backend(parallelism.spmd_backend)
    titan_parallel_dims.device_type = "cpu"  # TorchTitan falls back to "cuda" without an accelerator
    parallel_dims = ParallelDims.from_config(parallelism, WORLD)
    parallel_dims.build_mesh()
    context = titan_dist.get_spmd_context(parallel_dims=parallel_dims)
    compiled = Compiled()
    if fsdp:
        model = spec.parallelize_fn(
            model, parallel_dims=parallel_dims, parallelism=parallelism, ac_config=None, dump_folder="",
            # fp32 parameters: the expert GEMMs still run in bf16 (GroupedExperts casts), and
            # attention and the router agree with the single-process run to fp32 rounding
            training=TrainingConfig(mixed_precision_param="float32"),
            compile_config=_compile_config(route, recipe, compiled))
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # gloo has no PREMUL_SUM, which FSDP2 reduces with when a divide factor is set
                # (TorchTitan sets 1.0); the force-sum mode reduces with SUM, same values
                module.set_force_sum_reduction_for_comms(True)
    else:
        with context():
            model.parallelize(parallel_dims)
        apply_compile(model, compile_config=_compile_config(route, recipe, compiled), parallel_dims=parallel_dims)
    rank = dist.get_rank()
    return _steps(model, slice(rank * BATCH, (rank + 1) * BATCH), steps, compiled, _full if fsdp else _gathered,
                  context)


# ------------------------------------------------------------------------------------------
# Comparisons (rank 0)


def compare(a: Trace, b: Trace, steps: int = STEPS) -> dict[str, Any]:
    """The worst agreement of two runs over `steps` steps: largest relative loss difference and
    smallest gradient SQNR (dB) with the tensor it belongs to."""
    from mxfp8_inductor.check import sqnr

    loss_rel = max(abs(a.losses[s] - b.losses[s]) / abs(b.losses[s]) for s in range(steps))
    db, name = min((sqnr(b.grads[s][n], a.grads[s][n]), f"step {s + 1} {n}")
                   for s in range(steps) for n in b.grads[s])
    return {"loss_rel": loss_rel, "grad_db": db, "worst": name}


def observe(traces: dict[str, Trace]) -> dict[str, Any]:
    """What the tests assert on, from every run."""
    expert_params = [n for n in traces["ep_bf16"].grads[0] if "inner_experts" in n]
    out: dict[str, Any] = {"compare": {}, "runs": {}}
    pairs = [("ep_bf16", "single_bf16")]
    for recipe in RECIPES:
        pairs += [(f"ep_{recipe}", f"single_{recipe}"), (f"ep_{recipe}", "ep_bf16")]
    pairs += [("ep_mxfp8_padded", "single_mxfp8"), ("ep_mxfp8_padded", "ep_mxfp8")]
    for a, b in pairs:
        out["compare"][a, b] = compare(traces[a], traces[b])
    for marked in ("ep_mxfp8_marked", "ep_mxfp8_marked_spmd"):
        out["compare"][marked, "ep_mxfp8"] = compare(traces[marked], traces["ep_mxfp8"], steps=1)
    for name, t in traces.items():
        out["runs"][name] = {
            "losses": t.losses,
            "tokens": t.tokens,
            "graphs": t.graphs,
            "rows": t.compiled.rows,
            "calls": t.compiled.calls,
            "finite": all(bool(g.isfinite().all()) for step in t.grads for g in step.values()),
            "empty_expert_grads_zero": all(bool((step[n][list(EMPTY_EXPERTS)] == 0).all())
                                           for step in t.grads for n in expert_params),
        }
    return out


def main(rank: int, store: str, out_dir: str) -> None:
    """Spawned worker `rank` of WORLD; `store` is a file for the rendezvous."""
    torch.set_num_threads(1)  # one core per rank
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    out = pathlib.Path(out_dir)
    try:
        # the single-process references, split so that both ranks reach the EP runs together
        # (a rank's first compile takes longest: it imports and warms up the compile stack)
        mine = {0: [("bf16", None), ("options", "mxfp8")], 1: [("options", "fp8_rowwise")]}[rank]
        single = {f"single_{recipe or route}": run_single(route, recipe) for route, recipe in mine}
        ep = {"ep_bf16": run_ep("bf16", None)}
        for recipe in RECIPES:
            ep[f"ep_{recipe}"] = run_ep("options", recipe)
        ep["ep_mxfp8_padded"] = run_ep("options", "mxfp8", padded=True)
        ep["ep_mxfp8_marked"] = run_ep("marked", "mxfp8", steps=1)
        # one step: without FSDP2 nothing reduces the replicated parameters' gradients for SGD
        ep["ep_mxfp8_marked_spmd"] = run_ep("marked", "mxfp8", steps=1, fsdp=False)
        if rank == 1:
            torch.save(single, out / SINGLE.format(rank))
        dist.barrier()
        if rank == 0:
            single.update(torch.load(out / SINGLE.format(1), weights_only=False))
            torch.save(observe({**single, **ep}), out / RESULTS)
    finally:
        dist.destroy_process_group()


def spawn(out_dir: pathlib.Path) -> dict[str, Any]:
    """Run the workers; rank 0's observations."""
    import torch.multiprocessing as mp

    mp.spawn(main, args=(str(out_dir / "store"), str(out_dir)), nprocs=WORLD)
    return torch.load(out_dir / RESULTS, weights_only=False)
