"""Train a small byte-level MoE language model on the Python standard library's source, in bf16
and with the routed-expert grouped GEMMs rewritten to MXFP8 / FP8 rowwise, and compare the losses.

    python examples/train_moe.py --recipe bf16,mxfp8,fp8_rowwise --steps 2000
    torchrun --nproc_per_node=2 examples/train_moe.py --fsdp --recipe mxfp8 --steps 200 \
        --fsdp-compare examples/results/convergence_h200_seed0.json

Every recipe starts from the same seed, initialisation and data order: the batch of step s is a
function of (seed, step) only. Each transformer block is compiled on its own (backend "mxfp8" with
the recipe, or plain torch.compile for bf16), then sharded with FSDP2 (on one rank without
torchrun): fp32 weights in the optimizer, bf16 compute through its MixedPrecisionPolicy. The
summary JSON (--out) is merged with an existing one of the same steps and config, so recipes can
also be run in separate invocations; examples/plot_convergence.py draws it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import pathlib
import re
import statistics
import sys
import sysconfig
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import tqdm
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_model import MoE  # noqa: E402

# "+all": targets="all", the blocks' dense linears too
RECIPES = ("bf16", "mxfp8", "fp8_rowwise", "mxfp8+all", "fp8_rowwise+all")
VOCAB = 256


# ---------------------------------------------------------------------------------------- data

@functools.cache
def stdlib_bytes() -> torch.Tensor:
    """Every *.py file of the standard library (site-packages excluded), sorted by path, joined by
    a newline, as a uint8 tensor [N]."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts and p.is_file())
    return torch.frombuffer(bytearray(b"\n".join(p.read_bytes() for p in files)), dtype=torch.uint8)


def split_data(data_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Train bytes and the held-out last 5% (validation)."""
    n_val = len(data_N) // 20
    return data_N[:-n_val], data_N[-n_val:]


def get_batch(data_N: torch.Tensor, seed: int, step: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets [batch, seq] of `step`: random windows drawn from a generator seeded by
    (seed, step) alone, so every recipe, run and world size sees the same global batch."""
    g = torch.Generator().manual_seed((seed << 32) + step)
    offs_B = torch.randint(0, len(data_N) - seq - 1, (batch,), generator=g)
    chunk_BL = data_N[offs_B[:, None] + torch.arange(seq + 1)].long()
    return chunk_BL[:, :-1], chunk_BL[:, 1:]


# --------------------------------------------------------------------------------------- model

class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        B, L, D = x_BLD.shape
        qkv_3BHLd = self.qkv(x_BLD).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        o_BHLd = F.scaled_dot_product_attention(*qkv_3BHLd.unbind(0), is_causal=True)
        return self.proj(o_BHLd.transpose(1, 2).reshape(B, L, D))


class TransformerBlock(nn.Module):
    """Pre-norm attention and MoE (16 routed SwiGLU experts, top-2 by default), each residual."""

    def __init__(self, dim: int, heads: int, hidden: int, experts: int, top_k: int, ac: bool = False) -> None:
        super().__init__()
        self.ac = ac
        self.attn_norm = nn.RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.moe_norm = nn.RMSNorm(dim)
        self.moe = MoE(dim, hidden, experts, top_k)

    def _forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        x_BLD = x_BLD + self.attn(self.attn_norm(x_BLD))
        return x_BLD + self.moe(self.moe_norm(x_BLD))

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        # inside the compiled module, so the pass also rewrites the recomputed forward
        if self.ac and torch.is_grad_enabled():
            return checkpoint(self._forward, x_BLD, use_reentrant=False)
        return self._forward(x_BLD)


class ByteMoELM(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, hidden: int, experts: int, top_k: int, seq: int,
                 ac: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos_LD = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList([TransformerBlock(dim, heads, hidden, experts, top_k, ac) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens_BL: torch.Tensor) -> torch.Tensor:
        x_BLD = self.embed(tokens_BL) + self.pos_LD[: tokens_BL.shape[1]]
        for block in self.blocks:
            x_BLD = block(x_BLD)
        return self.head(self.norm(x_BLD))


def build_model(args: argparse.Namespace, device: torch.device | str = "cpu") -> ByteMoELM:
    """The bf16 model of `args`, initialised on the CPU from `args.seed` (same weights on any device)."""
    torch.manual_seed(args.seed)
    model = ByteMoELM(args.layers, args.dim, args.heads, args.hidden, args.experts, args.top_k, args.seq, args.ac)
    if args.init_noise:  # the run-to-run spread of a recipe: same data, weights nudged
        g = torch.Generator().manual_seed(args.seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + args.init_noise * torch.randn(p.shape, generator=g))
    return model.to(device=device, dtype=torch.bfloat16)


def compile_blocks(model: ByteMoELM, recipe: str) -> None:
    """Compile each transformer block on its own, in place in `model.blocks`."""
    name, _, scope = recipe.partition("+")
    options = {"recipe": name}
    if scope == "all":
        # every linear but the routers: this model's (768-2304 wide) are all under the default
        # dense_min_dim, a speed threshold, and this run is about numerics
        options.update(targets="all", dense_min_dim=0)
    for i, block in enumerate(model.blocks):
        if recipe == "bf16":
            model.blocks[i] = torch.compile(block)
        else:
            model.blocks[i] = torch.compile(block, backend=mxfp8_backend, options=options)


# ------------------------------------------------------------------------------------ training

def lr_schedule(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup over min(100, 5%) of the steps, then cosine to 10% of the base rate."""
    warmup = max(1, min(100, steps // 20))
    lrs = torch.optim.lr_scheduler
    base = opt.param_groups[0]["lr"]
    return lrs.SequentialLR(opt, [lrs.LinearLR(opt, 1 / warmup, 1.0, total_iters=max(1, warmup - 1)),
                                  lrs.CosineAnnealingLR(opt, max(1, steps - warmup), eta_min=0.1 * base)],
                            milestones=[warmup])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tail_mean(losses: list[float]) -> float:
    """Mean of the last 100 losses, or of the last 10% when there are fewer than 1000 steps."""
    n = 100 if len(losses) >= 1000 else max(1, len(losses) // 10)
    return statistics.fmean(losses[-n:])


def _median_ms(step_ms: list[float]) -> float:
    return statistics.median(step_ms[10:] or step_ms)  # the first 10 steps include the compiles


def train_recipe(args: argparse.Namespace, recipe: str, device: torch.device, data_N: torch.Tensor,
                 log: Any = None) -> dict[str, Any]:
    """Train a freshly initialised model with `recipe`; returns {"loss": [per step], "step_ms": median}."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    train_N, val_N = split_data(data_N)
    # fp32 weights in the optimizer (bf16 weights alone round away AdamW updates smaller than
    # their ulp; the bf16 initialisation is kept), bf16 compute through FSDP2's mixed precision,
    # FSDP2 per block and root on however many ranks there are (one without torchrun)
    model = build_model(args, device).float()
    compile_blocks(model, recipe)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), foreach=False)
    schedule = lr_schedule(opt, args.steps)
    local = args.batch // world
    losses: list[float] = []
    step_ms: list[float] = []
    val: list[list[float]] = []
    bar = tqdm.tqdm(total=args.stop_after or args.steps, desc=recipe, disable=rank != 0, file=sys.stderr)
    for step in range(args.stop_after or args.steps):
        inputs_BL, targets_BL = get_batch(train_N, args.seed, step, args.batch, args.seq)
        inputs_BL = inputs_BL[rank * local:(rank + 1) * local].to(device, non_blocking=True)
        targets_BL = targets_BL[rank * local:(rank + 1) * local].to(device, non_blocking=True)
        _sync(device)
        t0 = time.perf_counter()
        logits_BLV = model(inputs_BL)
        loss = F.cross_entropy(logits_BLV.float().view(-1, VOCAB), targets_BL.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        schedule.step()
        loss = loss.detach()
        dist.all_reduce(loss)  # gloo has no ReduceOp.AVG
        loss = loss / world
        loss_f = loss.item()
        _sync(device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss_f)
        record = {"recipe": recipe, "step": step, "loss": loss_f, "step_ms": step_ms[-1]}
        if args.eval_every and (step + 1) % args.eval_every == 0:
            record["val_loss"] = evaluate(model, val_N, args, device, rank, world)
            val.append([step, record["val_loss"]])
        if rank == 0 and log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()
        bar.set_postfix(loss=f"{loss_f:.4f}", ms_per_step=f"{step_ms[-1]:.1f}")
        bar.update()
    bar.close()
    out: dict[str, Any] = {"loss": losses, "step_ms": _median_ms(step_ms)}
    if val:
        out["val_loss"] = val
    return out


@torch.no_grad()
def evaluate(model: nn.Module, val_N: torch.Tensor, args: argparse.Namespace, device: torch.device,
             rank: int, world: int, batches: int = 4) -> float:
    """Mean loss over a few fixed held-out batches (the same for every step and recipe)."""
    local = args.batch // world
    total = torch.zeros((), device=device)
    for i in range(batches):
        inputs_BL, targets_BL = get_batch(val_N, args.seed + 1, i, args.batch, args.seq)
        logits_BLV = model(inputs_BL[rank * local:(rank + 1) * local].to(device))
        total += F.cross_entropy(logits_BLV.float().view(-1, VOCAB), targets_BL[rank * local:(rank + 1) * local]
                                 .to(device).reshape(-1))
    if world > 1:
        dist.all_reduce(total)
    return total.item() / (batches * world)


# ----------------------------------------------------------------------------- summary and CLI

def config_of(args: argparse.Namespace, world: int) -> dict[str, Any]:
    keys = ("layers", "dim", "heads", "experts", "top_k", "hidden", "seq", "batch", "lr", "seed", "ac")
    noise = {"init_noise": args.init_noise} if args.init_noise else {}
    return {**{k: getattr(args, k) for k in keys}, **noise, "world_size": world}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def default_out(device: torch.device, world: int) -> pathlib.Path:
    """convergence_<gpu or cpu>[_fsdp<N>].json in the system's temporary folder (the committed
    results under examples/results/ are written only when --out names them)."""
    slug = re.sub(r"[^a-z0-9]+", "_", _device_name(device).lower().removeprefix("nvidia ")).strip("_")
    return pathlib.Path(tempfile.gettempdir()) / f"convergence_{slug}{f'_fsdp{world}' if world > 1 else ''}.json"


def compare(losses: list[float], ref: list[float], k: int = 20) -> dict[str, float]:
    """Max absolute and relative difference of the first min(k, ...) losses against `ref`."""
    k = min(k, len(losses), len(ref))
    abs_ = [abs(a - b) for a, b in zip(losses[:k], ref[:k])]
    return {"k": k, "max_abs": max(abs_), "max_rel": max(d / abs(b) for d, b in zip(abs_, ref[:k]))}


def print_table(recipes: dict[str, dict[str, Any]]) -> None:
    ref = recipes.get("bf16")
    print(f"\n{'recipe':<12} {'final loss':>10} {'vs bf16':>9} {'ms/step':>9} {'bf16/recipe':>12}")
    for name, r in recipes.items():
        loss = _tail_mean(r["loss"])
        rel = f"{(loss - _tail_mean(ref['loss'])) / _tail_mean(ref['loss']):+.2%}" if ref else "-"
        ratio = f"{ref['step_ms'] / r['step_ms']:.3f}" if ref else "-"
        print(f"{name:<12} {loss:>10.4f} {rel:>9} {r['step_ms']:>9.1f} {ratio:>12}")
    print("(final loss: mean of the last 100 steps, or of the last 10% of them)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="bf16,mxfp8,fp8_rowwise",
                   help=f"one of {', '.join(RECIPES)} (+all: the attention projections too), or a comma "
                        "list run in turn (default: the first three)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=384, help="expert hidden size (a multiple of 32)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences per step)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-noise", type=float, default=0.0, metavar="EPS",
                   help="scale every initial weight by 1 + EPS * N(0, 1): a second run of a recipe, to "
                        "measure how far runs spread")
    p.add_argument("--stop-after", type=int, default=0,
                   help="stop after N steps of the --steps schedule (to compare first steps with a full run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ac", action="store_true", help="activation checkpointing of each block")
    p.add_argument("--eval-every", type=int, default=0, help="held-out loss every N steps (0: never)")
    p.add_argument("--log", type=pathlib.Path, help="per-step JSON-lines log (appended to)")
    p.add_argument("--out", type=pathlib.Path,
                   help="summary JSON (default: convergence_<gpu>.json in the temporary folder)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 over the ranks of torchrun")
    p.add_argument("--fsdp-compare", type=pathlib.Path, metavar="PATH",
                   help="single-process summary JSON to compare the first 20 losses with")
    args = p.parse_args(argv)
    args.recipes = [r.strip() for r in args.recipe.split(",") if r.strip()]
    for r in args.recipes:
        if r not in RECIPES:
            p.error(f"unknown recipe {r!r}: expected some of {RECIPES}")
    if args.hidden % 32 or args.dim % args.heads:
        p.error("--hidden must be a multiple of 32 and --dim a multiple of --heads")
    return args


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run every recipe of `args.recipes`; returns the summary (rank 0 also writes it to --out)."""
    device = torch.device(args.device)
    if args.fsdp and device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    own_group = not dist.is_initialized()
    if own_group:  # torchrun's ranks with --fsdp, else a group of this process alone
        extra = {} if args.fsdp else {"store": dist.HashStore(), "rank": 0, "world_size": 1}
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **extra)
    try:
        return _train(args, device)
    finally:
        if own_group:
            dist.destroy_process_group()


def _train(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    world, rank = dist.get_world_size(), dist.get_rank()
    if args.batch % world:
        raise ValueError(f"--batch {args.batch} is not divisible by the world size {world}")
    data_N = stdlib_bytes()
    if rank == 0:
        n_params = sum(p.numel() for p in build_model(args).parameters())
        print(f"{n_params / 1e6:.1f}M parameters; {len(data_N) / 1e6:.1f}M bytes of stdlib source (5% held out); "
              f"{args.batch * args.seq} tokens/step on {_device_name(device)} x{world}", flush=True)
    summary: dict[str, Any] = {"gpu": _device_name(device), "torch": torch.__version__,
                               "date": datetime.date.today().isoformat(), "steps": args.stop_after or args.steps,
                               "config": config_of(args, world), "recipes": {}}
    if args.log and rank == 0:
        args.log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "a") if args.log and rank == 0 else contextlib.nullcontext() as log:
        for recipe in args.recipes:
            summary["recipes"][recipe] = train_recipe(args, recipe, device, data_N, log)
    if args.fsdp_compare and rank == 0:
        single = json.loads(args.fsdp_compare.read_text())
        # the learning-rate schedule depends on --steps: other steps or config, other losses
        # (activation checkpointing recomputes the same values, so it may differ)
        same = single["steps"] == args.steps and all(
            single["config"].get(k) == v for k, v in summary["config"].items() if k not in ("world_size", "ac"))
        if not same:
            print(f"warning: {args.fsdp_compare} has other steps or config than this run", file=sys.stderr)
        summary["fsdp_vs_single"] = {r: {**compare(summary["recipes"][r]["loss"], single["recipes"][r]["loss"]),
                                         "same_config": same}
                                     for r in summary["recipes"] if r in single["recipes"]}
        for r, d in summary["fsdp_vs_single"].items():
            print(f"fsdp vs single {r}: first {d['k']} losses, max abs diff {d['max_abs']:.3e}, "
                  f"max rel diff {d['max_rel']:.3e}")
    if rank == 0:
        out = args.out or default_out(device, world)
        if out.exists():
            old = json.loads(out.read_text())
            if old.get("steps") == summary["steps"] and old.get("config") == summary["config"]:
                summary["recipes"] = {**old["recipes"], **summary["recipes"]}
                if "fsdp_vs_single" in old:
                    summary["fsdp_vs_single"] = {**old["fsdp_vs_single"], **summary.get("fsdp_vs_single", {})}
            else:
                print(f"{out}: different steps or config, overwritten", file=sys.stderr)
        print_table(summary["recipes"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary) + "\n")
        print(f"wrote {out}")
    return summary


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
