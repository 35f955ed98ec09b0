"""FSDP2 training steps of a tiny MoE model on CPU (gloo), with expert weights all-gathered in FP8
(`mxfp8(model, fsdp_fp8_all_gather=True)`) or in bf16, for tests/test_fsdp_all_gather.py.

`main` is the spawned worker. Every rank runs every variant on the same tokens (so FSDP2's
averaged gradient is each rank's own and the sharded runs can be compared bit for bit with one
process running unsharded); the single-process references run on one rank each. Rank 0 saves
the observations (losses, final parameters, all-gather bytes per FSDP2 group, what a rank holds
between microbatches, rewritten sites) as `RESULTS` in the output folder: the test process
asserts on them. `run` is also what the test's world-size-1 group calls in-process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import pathlib
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

E, D, FF = 8, 64, 64  # experts (a multiple of every world size), model dim, expert hidden dim
BLOCKS = 2
TOKENS = 96  # routed rows of a microbatch
STEPS, MICRO = 2, 2  # optimizer steps, microbatches each
LR = 0.5
SEED = 0
RECIPES = ("mxfp8", "fp8_rowwise")
RESULTS = "results_world{}.pt"
SINGLE = "single_rank{}.pt"


# ------------------------------------------------------------------------------------------
# Model and data


class ExpertBlock(nn.Module):
    """One residual block of routed SwiGLU experts in the TorchTitan / HF layout: w1, w3
    [E, F, D] and w2 [E, D, F], each used as a transposed view in `torch._grouped_mm`. It owns
    nothing but expert weights, so its FSDP2 group all-gathers only them."""

    def __init__(self) -> None:
        super().__init__()
        # w1's columns span 16 binades within each 32-column tile, so that its shared rounding
        # differs from any other (a gather of the wrong FP8 form changes the results)
        spread_D = 2.0 ** ((torch.arange(D) % 32) // 2 - 20)
        self.w1_EFD = nn.Parameter(torch.randn(E, FF, D) * spread_D)
        self.w3_EFD = nn.Parameter(torch.randn(E, FF, D) * D**-0.5)
        self.w2_EDF = nn.Parameter(torch.randn(E, D, FF) * FF**-0.5)

    def forward(self, x_MD: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
        h_MF = F.silu(torch._grouped_mm(x_MD, self.w1_EFD.transpose(-2, -1), offs=offs_E))
        h_MF = h_MF * torch._grouped_mm(x_MD, self.w3_EFD.transpose(-2, -1), offs=offs_E)
        return x_MD + torch._grouped_mm(h_MF, self.w2_EDF.transpose(-2, -1), offs=offs_E)


class TinyMoE(nn.Module):
    """An input RMSNorm (the root's own parameter) and BLOCKS expert blocks over rows already
    sorted by expert (`offs_E`: each expert's end row)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.blocks = nn.ModuleList(ExpertBlock() for _ in range(BLOCKS))

    def forward(self, x_MD: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
        x_MD = self.norm(x_MD)
        for block in self.blocks:
            x_MD = block(x_MD, offs_E)
        return x_MD


def microbatch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_MD bf16, offs_E int32, target_MD float32), the same on every rank: rows per expert drawn
    at random, expert 3 empty in every microbatch, rows past offs_E[-1] none."""
    g = torch.Generator().manual_seed(SEED + 1 + MICRO * step + micro)
    counts_E = torch.multinomial(torch.ones(E), TOKENS, replacement=True, generator=g).bincount(minlength=E)
    counts_E[0] += counts_E[3]
    counts_E[3] = 0
    offs_E = counts_E.cumsum(0).to(torch.int32)
    x_MD = torch.randn(TOKENS, D, generator=g).to(torch.bfloat16)
    target_MD = torch.randn(TOKENS, D, generator=g)
    return x_MD, offs_E, target_MD


def build(recipe: str, unwrap: bool, master: torch.dtype) -> TinyMoE:
    """The model with the same initial weights on every call and rank, marked with
    `fsdp_fp8_all_gather=True`; with `unwrap`, its expert parameters plain again (bf16
    all-gathers, same in-graph rounding). `master`: the parameters' dtype."""
    import mxfp8_inductor
    from mxfp8_inductor import fsdp

    torch.manual_seed(SEED)
    model = TinyMoE().to(torch.bfloat16).to(master)  # bf16 initial values, whatever the master dtype
    mxfp8_inductor.mxfp8(model, recipe=recipe, fsdp_fp8_all_gather=True)
    if unwrap:
        fsdp.unwrap(model)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block)
    return model


# ------------------------------------------------------------------------------------------
# Measurements


class GatherMeter:
    """Bytes each FSDP2 group all-gathers, per call: `torch.distributed.all_gather_single` (what
    FSDP2 calls) and `all_gather_into_tensor` patched to count the input, labelled with the FQN of
    the group whose `unshard` issued the call (prefetches included)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._group: str | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[GatherMeter]:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        patched = {(dist, "all_gather_single"): self._counting(dist.all_gather_single),
                   (dist, "all_gather_into_tensor"): self._counting(dist.all_gather_into_tensor),
                   (FSDPParamGroup, "unshard"): self._labelling(FSDPParamGroup.unshard)}
        saved = {key: getattr(*key) for key in patched}
        for (owner, name), fn in patched.items():
            setattr(owner, name, fn)
        try:
            yield self
        finally:
            for (owner, name), fn in saved.items():
                setattr(owner, name, fn)

    def _counting(self, fn):
        @functools.wraps(fn)
        def counted(output_tensor, input_tensor, *args, **kwargs):
            self.calls.append((self._group or "", input_tensor.numel() * input_tensor.element_size()))
            return fn(output_tensor, input_tensor, *args, **kwargs)
        return counted

    def _labelling(self, fn):
        meter = self

        @functools.wraps(fn)
        def labelled(group, *args, **kwargs):
            outer, meter._group = meter._group, group._module_fqn
            try:
                return fn(group, *args, **kwargs)
            finally:
                meter._group = outer
        return labelled


def unsharded_bytes(model: nn.Module) -> int:
    """Bytes of storage FSDP2 holds for the unsharded parameters of `model`'s groups: all-gather
    outputs, the tensors `fsdp_post_all_gather` built from them, the unsharded parameters (each
    storage once)."""
    from torch.distributed.fsdp import FSDPModule

    storages = {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        for fsdp_param in group.fsdp_params if group is not None else ():
            tensors = [*fsdp_param.all_gather_outputs, *fsdp_param._unsharded_inner_tensors]
            if hasattr(fsdp_param, "_unsharded_param"):
                tensors.append(fsdp_param._unsharded_param)
            for t in tensors:
                storage = t.untyped_storage()
                storages[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
    return sum(storages.values())


def fp8_held_bytes(model: nn.Module) -> int:
    """Bytes of the FP8 forms (data and scales) the rank's expert shards keep between all-gathers."""
    from mxfp8_inductor.fsdp import FP8AllGatherWeight

    total = 0
    for p in model.parameters():
        local = getattr(p, "_local_tensor", p.data)
        if isinstance(local, FP8AllGatherWeight) and local._fp8 is not None:
            total += sum(t.numel() * t.element_size() for t in local._fp8[1])
    return total


@dataclasses.dataclass
class Trace:
    losses: list[float]  # per microbatch
    params: dict[str, torch.Tensor]  # full final values (rank 0 of a sharded run)
    moved: bool  # every expert weight changed from its initial value
    gathers: list[tuple[str, int]]  # (group FQN, input bytes) per all-gather call
    cached_bytes: list[int]  # mxfp8_inductor's weight cache after each microbatch
    held_bytes: list[int]  # FSDP2's unsharded storage after each microbatch's backward
    held_in_forward: list[int]  # a block's unsharded storage as its forward starts, per block call
    fp8_held: list[int]  # the FP8 forms the rank's shards keep for their next all-gather, per microbatch
    rewritten: dict[str, int]  # the pass's counters


def _full(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()


def run(recipe: str, *, unwrap: bool = False, sharded: bool = True, master: torch.dtype = torch.bfloat16) -> Trace:
    """STEPS SGD steps of MICRO microbatches each; `sharded`: FSDP2 per block, then the root, over
    the default group (gradients reduced in float32, which keeps the world's mean of identical
    gradients exact), parameters in bf16 for compute whatever `master`."""
    from torch._dynamo.utils import counters
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from mxfp8_inductor.lowering import weight_cache as weights

    torch._dynamo.reset()
    counters.clear()
    model = build(recipe, unwrap, master)
    initial = {n: _full(p).float() for n, p in model.named_parameters() if p.dim() == 3}
    if sharded:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if master != torch.bfloat16 else None,
                                  reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        for module in model.modules():
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)  # gloo has no AVG: SUM, then a divide
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trace = Trace([], {}, False, [], [], [], [], [], {})
    if sharded:  # after FSDP2's own pre-forward hook, which unshards the block
        for block in model.blocks:
            block.register_forward_pre_hook(lambda module, args: trace.held_in_forward.append(unsharded_bytes(module)))
    with GatherMeter().installed() as meter:
        for step in range(STEPS):
            for micro in range(MICRO):
                x_MD, offs_E, target_MD = microbatch(step, micro)
                loss = F.mse_loss(model(x_MD, offs_E).float(), target_MD)
                loss.backward()
                trace.losses.append(loss.item())
                trace.cached_bytes.append(weights.cached_bytes())
                trace.held_bytes.append(unsharded_bytes(model) if sharded else 0)
                trace.fp8_held.append(fp8_held_bytes(model))
            opt.step()
            opt.zero_grad()
    trace.gathers = meter.calls
    trace.params = {n: _full(p) for n, p in model.named_parameters()}
    trace.moved = all(not torch.equal(trace.params[n].float(), w) for n, w in initial.items())
    if sharded and dist.get_rank() != 0:
        trace.params = {}  # rank 0 reports the sharded runs
    trace.rewritten = {k: v for k, v in counters["inductor"].items() if k.startswith("mxfp8_")}
    return trace


# ------------------------------------------------------------------------------------------
# The spawned ranks


def variants(world: int) -> dict[str, dict[str, Any]]:
    """The sharded runs of a world size: name -> `run` keywords."""
    out: dict[str, dict[str, Any]] = {}
    for recipe in RECIPES:
        out[f"fp8_{recipe}"] = {"recipe": recipe}
        out[f"bf16_{recipe}"] = {"recipe": recipe, "unwrap": True}
    if world == 2:  # float32 master weights, bf16 compute through the MixedPrecisionPolicy
        out["fp8_mxfp8_fp32_master"] = {"recipe": "mxfp8", "master": torch.float32}
        out["bf16_mxfp8_fp32_master"] = {"recipe": "mxfp8", "unwrap": True, "master": torch.float32}
    return out


def attempt(**kwargs: Any) -> dict[str, Any]:
    """`run(**kwargs)` as a dict, or {"error": its traceback}: every rank runs the same steps on
    the same tokens, so all of them raise at the same collective and can go on to the next run."""
    try:
        return dataclasses.asdict(run(**kwargs))
    except Exception:  # noqa: BLE001  (reported by the test that reads this run)
        return {"error": traceback.format_exc()}


def main(rank: int, world: int, store: str, out_dir: str) -> None:
    """Spawned worker `rank` of `world`; `store` is a file for the rendezvous. At world size 2
    each rank also runs one recipe's single-process reference."""
    torch.set_num_threads(1)  # one core per rank
    torch._inductor.config.compile_threads = 1
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    out = pathlib.Path(out_dir)
    try:
        traces = {name: attempt(**kwargs) for name, kwargs in variants(world).items()}
        if world == 2:
            recipe = RECIPES[rank]
            single = {f"single_{recipe}": attempt(recipe=recipe, sharded=False)}
            if rank == 1:
                torch.save(single, out / SINGLE.format(rank))
            dist.barrier()
            if rank == 0:
                traces.update(single, **torch.load(out / SINGLE.format(1), weights_only=False))
        if rank == 0:
            torch.save(traces, out / RESULTS.format(world))
    finally:
        dist.destroy_process_group()


def spawn(world: int, out_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Run `world` workers; rank 0's traces, as dicts (see `attempt`)."""
    import torch.multiprocessing as mp

    mp.spawn(main, args=(world, str(out_dir / "store"), str(out_dir)), nprocs=world)
    return torch.load(out_dir / RESULTS.format(world), weights_only=False)
