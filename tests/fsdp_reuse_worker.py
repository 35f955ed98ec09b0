"""Writes into FSDP2-sharded expert weights between forwards, by each route a training or
evaluation loop takes, while a quantization of the weights is reused across all-gathers, for
tests/test_fsdp_reuse.py.

Two modes of reuse: `fsdp_fp8_all_gather=True` (each rank's shard keeps its FP8 form for the next
all-gathers) and `weight_cache=True` (the unsharded weight's quantization is kept for the next
GEMMs). `main` is the spawned worker: the tiny MoE model of tests/fsdp_worker.py (transposed
expert weights in `torch._grouped_mm`), marked with fp8_rowwise, each block compiled, FSDP2 per
block and at the root. Each route flips the sign of every expert weight, TRIALS times in a row
with a forward between (every forward gathers the weights anew), so that a forward computing
with anything but the current weights shows; rank 0 saves, per mode and route, whether each
forward equalled the model's output for the current sign, and how many weight quantizations ran.
"""

from __future__ import annotations

import datetime
import pathlib
import traceback
from collections.abc import Callable
from typing import Any

import fsdp_worker
import torch
import torch.distributed as dist
import torch.nn as nn

MODES = ("fp8_all_gather", "weight_cache")
ROUTES = ("state_dict", "dcp_load", "dcp_load_held", "load_state_dict", "copy_", "optimizer")
TRIALS = 20
REUSED_FORWARDS = 3  # forwards without a write, over which each weight is quantized once
RESULTS = "reuse_results.pt"


def build(mode: str) -> nn.Module:
    """The model marked for `mode`, blocks compiled, sharded by FSDP2 per block and at the root."""
    from torch.distributed.fsdp import fully_shard

    import mxfp8_inductor as mx

    torch._dynamo.reset()
    torch.manual_seed(fsdp_worker.SEED)
    model = fsdp_worker.TinyMoE().to(torch.bfloat16)
    options = {"fsdp_fp8_all_gather": True} if mode == "fp8_all_gather" else {"weight_cache": True}
    mx.mxfp8(model, recipe="fp8_rowwise", **options)
    for block in model.blocks:
        block.compile()
        fully_shard(block)
    return fully_shard(model)


def _experts(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.dim() == 3]


def routes(model: nn.Module, checkpoints: dict[int, str]) -> dict[str, Callable[[int], None]]:
    """Route name -> a function that makes the expert weights `sign` times the initial ones, from
    the opposite sign. `checkpoints`: a DCP checkpoint folder of the model's state per sign."""
    import torch.distributed.checkpoint as dcp

    experts = _experts(model)
    plus = {k: v.detach().clone() for k, v in model.state_dict().items()}
    states = {1: plus, -1: {k: -v if v.dim() == 3 else v for k, v in plus.items()}}
    held = {}  # a state dict taken at the first call and loaded into in place at every call

    @torch.no_grad()
    def state_dict(sign: int) -> None:
        for value in model.state_dict().values():
            if value.dim() == 3:
                value.mul_(-1)

    def dcp_load(sign: int) -> None:
        dcp.load(model.state_dict(), checkpoint_id=checkpoints[sign])

    def dcp_load_held(sign: int) -> None:
        state = held.setdefault("state", model.state_dict())
        dcp.load(state, checkpoint_id=checkpoints[sign])

    @torch.no_grad()
    def copy_(sign: int) -> None:
        for p in experts:
            p.copy_(-p)

    def optimizer(sign: int) -> None:
        # a gradient of twice the weight at learning rate 1: the step negates the weight exactly
        opt = torch.optim.SGD(experts, lr=1.0)
        for p in experts:
            p.grad = 2 * p.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"state_dict": state_dict, "dcp_load": dcp_load, "dcp_load_held": dcp_load_held,
            "load_state_dict": lambda sign: model.load_state_dict(states[sign]), "copy_": copy_,
            "optimizer": optimizer}


class QuantizationCounter:
    """Counts the weight quantizations of `mode`'s reuse: a shard's FP8 form made for an
    all-gather, or an unsharded weight's fp8_rowwise quantization made for a GEMM."""

    def __init__(self, mode: str) -> None:
        from mxfp8_inductor import fsdp
        from mxfp8_inductor.kernels import shared_weight

        self.calls = 0
        # both make the shared form: the all-gather's of a shard, the weight cache's of a weight
        self.owner, self.name = shared_weight, "quantize"
        self.original = getattr(self.owner, self.name)
        assert fsdp.shared_weight is shared_weight  # the module fsdp.py calls it through

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(self.owner, self.name, counted)

    def remove(self) -> None:
        setattr(self.owner, self.name, self.original)


def run(mode: str, folder: pathlib.Path) -> dict[str, Any]:
    """{"quantizations": per forward without writes, route: [output equals the current sign's, per trial]}."""
    import torch.distributed.checkpoint as dcp

    import mxfp8_inductor as mx

    model = build(mode)
    x_MD, offs_E, _ = fsdp_worker.microbatch(0, 0)

    @torch.no_grad()
    def forward() -> torch.Tensor:
        return model(x_MD, offs_E)

    counter = QuantizationCounter(mode)
    try:
        counts = []
        for _ in range(REUSED_FORWARDS):
            before = counter.calls
            forward()
            counts.append(counter.calls - before)
        # the expected outputs, with the weights quantized anew: a write through the parameters
        # drops the reused FP8 forms, clear_weight_cache() the weight cache
        checkpoints = {1: str(folder / "plus"), -1: str(folder / "minus")}
        expected = {}
        for sign in (1, -1):
            dcp.save(model.state_dict(), checkpoint_id=checkpoints[sign])
            expected[sign] = forward()
            with torch.no_grad():
                for p in _experts(model):
                    p.copy_(-p)
            mx.clear_weight_cache()
        assert not torch.equal(expected[1], expected[-1])
        out: dict[str, Any] = {"quantizations": counts}
        for name, flip in routes(model, checkpoints).items():
            sign, seen = 1, []
            forward()  # quantized for the current weights, to be reused unless a write is seen
            for _ in range(TRIALS):  # an even number: the weights end as they started
                sign = -sign
                flip(sign)
                seen.append(torch.equal(forward(), expected[sign]))
            out[name] = seen
        return out
    finally:
        counter.remove()


def main(rank: int, world: int, store: str, out_dir: str) -> None:
    """Spawned worker `rank` of `world`; `store` is a file for the rendezvous."""
    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    out = pathlib.Path(out_dir)
    try:
        results = {}
        for mode in MODES:
            try:
                results[mode] = run(mode, out / mode)
            except Exception:  # noqa: BLE001  (reported by the test that reads this mode)
                results[mode] = {"error": traceback.format_exc()}
        if rank == 0:
            torch.save(results, out / RESULTS)
    finally:
        dist.destroy_process_group()


def spawn(world: int, out_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Run `world` workers; rank 0's results per mode."""
    import torch.multiprocessing as mp

    mp.spawn(main, args=(world, str(out_dir / "store"), str(out_dir)), nprocs=world)
    return torch.load(out_dir / RESULTS, weights_only=False)

