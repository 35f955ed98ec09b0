"""MoE block forward+backward: bf16 compiled vs the same module compiled with backend="mxfp8",
once per recipe.

    python benchmarks/bench_moe_block.py [--out benchmarks/results/moe_block_h200.json]
        [--shapes dsv3,fine64] [--recipes mxfp8,fp8_rowwise]

Block = w1 and w3 grouped GEMMs, silu-mul, w2 grouped GEMM (examples/moe_model.GroupedExperts),
32768 routed tokens in uneven groups, measured side by side in one run on one GPU: the variants
take turns over --rounds rounds, and each speedup is the median of the per-round ratios
(host-bound shapes move by 0.1x and more between runs on a busy host).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import pathlib
import statistics
import sys

import torch
import triton
from triton.testing import do_bench

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import mxfp8_inductor  # noqa: E402,F401  (registers backend="mxfp8")
from shapes import SHAPES, block_and_inputs  # noqa: E402

def sqnr(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.double(), x.double()
    return (20 * torch.log10(ref.norm() / (ref - x).norm())).item()


def measure(shape: str, recipes: list[str], rounds: int) -> list[dict]:
    """bf16 compiled and each recipe compiled, timed side by side on the same inputs."""
    block, x, counts, grad = block_and_inputs(shape)
    fns = {"bf16": (block, torch.compile(block))}
    for recipe in recipes:
        mod = copy.deepcopy(block)
        fns[recipe] = (mod, torch.compile(mod, backend="mxfp8", options={"recipe": recipe}))
    results, steps = {}, {}
    for name, (mod, fn) in fns.items():
        def step(mod=mod, fn=fn):
            x.grad = None
            for p in mod.parameters():
                p.grad = None
            out = fn(x, counts)
            out.backward(grad)
            return out
        out = step()
        results[name] = [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
        steps[name] = step
    ms = interleaved(steps, rounds)
    ref = results["bf16"]
    rows = []
    for r in recipes:
        ratios = [b / t for b, t in zip(ms["bf16"], ms[r])]
        rows.append({"shape": shape, "recipe": r, "bf16_ms": statistics.median(ms["bf16"]),
                     "ms": statistics.median(ms[r]), "speedup": statistics.median(ratios),
                     "speedup_rounds": ratios, "sqnr_out": sqnr(ref[0], results[r][0]),
                     "sqnr_grads_min": min(sqnr(a, b) for a, b in zip(ref[1:], results[r][1:]))})
    return rows


def interleaved(steps: dict, rounds: int, bench=None) -> dict[str, list[float]]:
    """Median ms of each step per round, the steps taking turns round after round: a slow spell of
    the host then hits every variant alike instead of whichever was being timed."""
    bench = bench or (lambda fn: do_bench(fn, warmup=10, rep=100, return_mode="median"))
    for fn in steps.values():  # warm-up: autotuning and allocator growth out of the timed rounds
        bench(fn)
    ms = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            ms[name].append(bench(fn))
    return ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/moe_block_h200.json")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--recipes", default="mxfp8,fp8_rowwise")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per variant")
    args = p.parse_args()
    rows = []
    print(f"{'shape':<10} {'recipe':<12} {'bf16 ms':>8} {'ms':>8} {'bf16/recipe':>11} {'SQNR out':>8} {'grads min':>9}")
    for shape in args.shapes.split(","):
        torch._dynamo.reset()
        for row in measure(shape, args.recipes.split(","), args.rounds):
            rows.append(row)
            print(f"{shape:<10} {row['recipe']:<12} {row['bf16_ms']:8.3f} {row['ms']:8.3f} {row['speedup']:10.2f}x"
                  f" {row['sqnr_out']:8.1f} {row['sqnr_grads_min']:9.1f}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
