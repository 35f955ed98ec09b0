"""Does it pay for compiled graphs to launch our quantizer kernels themselves? The MoE block
forward+backward, bf16 compiled vs backend="mxfp8" with the kernels traced into the graph
(`ops.kernels_in_graph`, the default on CUDA) vs called through the quantize-dequantize ops.

    python benchmarks/probe_kernels_in_graph.py [--shapes qwen3_30b,fine64,dsv3] [--rounds 3]
        [--out benchmarks/results/kernels_in_graph_h200.json]

Also checks that both give bit-identical outputs and gradients, and counts copies in the
generated code around the traced kernels (there should be none).
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
from torch._inductor.utils import run_and_get_code

ROOT = pathlib.Path(__file__).parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "benchmarks")]
import mxfp8_inductor  # noqa: E402,F401  (registers backend="mxfp8")
from bench_moe_block import interleaved  # noqa: E402
from moe_model import GroupedExperts  # noqa: E402
from mxfp8_inductor.lowering import ops  # noqa: E402
from shapes import SHAPES, TOKENS, uneven_counts  # noqa: E402

VARIANTS = {"bf16": None, "mxfp8 via ops": False, "mxfp8 kernels in graph": True}


def measure(shape: str, rounds: int) -> dict:
    E, D, F = SHAPES[shape]
    torch.manual_seed(0)
    block = GroupedExperts(E, D, F).cuda().bfloat16()
    x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    counts = uneven_counts(E, TOKENS)
    grad = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    in_graph = ops.kernels_in_graph
    steps, results, copies = {}, {}, {}
    for name, traced in VARIANTS.items():
        mod = copy.deepcopy(block)
        fn = torch.compile(mod) if traced is None else torch.compile(mod, backend="mxfp8")

        def step(mod=mod, fn=fn):
            x.grad = None
            for p in mod.parameters():
                p.grad = None
            out = fn(x, counts)
            out.backward(grad)
            return out

        ops.kernels_in_graph = in_graph if traced else (lambda device: False)
        try:  # the choice is made when the graph is traced: on the first call
            out, code = run_and_get_code(step)
        finally:
            ops.kernels_in_graph = in_graph
        src = "\n".join(code)
        copies[name] = src.count("clone") + src.count("copy_")
        results[name] = [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
        steps[name] = step
    ms = interleaved(steps, rounds)
    base = ms["bf16"]
    return {"shape": shape, "ms": {k: statistics.median(v) for k, v in ms.items()},
            "speedup": {k: statistics.median([b / t for b, t in zip(base, v)]) for k, v in ms.items() if k != "bf16"},
            "ms_rounds": ms, "copies_in_code": copies,
            "bitwise_same": all(torch.equal(a, b) for a, b in zip(*(results[k] for k in VARIANTS if k != "bf16")))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="qwen3_30b,fine64,dsv3")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/kernels_in_graph_h200.json")
    args = p.parse_args()
    # every variant compiles for itself: a cached graph of another variant would be served
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    rows = [measure(s, args.rounds) for s in args.shapes.split(",")]
    print(f"{'shape':<10} {'variant':<24} {'ms':>7} {'bf16/variant':>12} copies bitwise")
    for r in rows:
        for k, v in r["ms"].items():
            ratio = f"{r['speedup'][k]:.3f}x" if k in r["speedup"] else ""
            print(f"{r['shape']:<10} {k:<24} {v:7.3f} {ratio:>12} {r['copies_in_code'][k]:6d} {r['bitwise_same']}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.date.today().isoformat(), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
