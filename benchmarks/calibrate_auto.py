"""Calibrate `recipe="auto"`: each GEMM role's time per recipe over bf16's, on this GPU.

    python benchmarks/calibrate_auto.py [--out mxfp8_inductor/lowering/auto_h200.json] [--quick] [--no-reuse]

Every role (forward, input gradient, weight gradient) of the grouped GEMM op and of the dense
linear op runs compiled (Inductor decomposes it as in a model; the activation is the graph's
input, so its quantization is a kernel of its own, where a model's fuses it into its producer)
at each calibrated (K, N) and token count, in bf16 and each recipe, the weight's
quantization reused (as with weight_cache=True, once per optimizer step; --no-reuse: every GEMM
quantizes its weight, the default of the ops). The JSON is the
cost model's data (mxfp8_inductor/lowering/auto.py): per (kind, K, N, role, recipe), the token
counts (tokens per group, or rows of a dense GEMM) and the time ratios to bf16.
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch

from mxfp8_inductor.lowering import ops
from mxfp8_inductor.lowering.auto import ROLES

ROUNDING = "rceil"
RECIPES = ("bf16", "fp8_rowwise", "mxfp8")
E = 8
# (K, N) of the routed experts' GEMMs of the benchmark models (w1/w3 fused as transformers does,
# then w2): Qwen3-30B-A3B, Mixtral-8x7B, gpt-oss-20b, DeepSeek-V3, Llama-4-Scout
GROUPED = [(2048, 1536), (768, 2048), (4096, 28672), (14336, 4096), (2880, 5760), (7168, 4096), (2048, 7168),
           (5120, 16384), (8192, 5120)]
TOKENS_PER_GROUP = [128, 256, 512, 1024, 2048, 4096, 8192]
# dense linears: attention projections and shared experts of those models, and small layers
DENSE = [(4096, 4096), (4096, 1024), (2048, 4096), (4096, 2048), (5120, 8192), (7168, 2048), (1024, 4096),
         (512, 2048), (2048, 512)]
ROWS = [1024, 4096, 16384, 65536]


def _time(fn, args, iters: int) -> float:
    for _ in range(3):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _role_fns(recipe: str, dense: bool):
    """Compiled callables per role, every size dynamic: one compile serves all shapes. `p` is the
    weight's parameter (its quantization reused) or None."""
    # the weight's quantization reused where `p` is given (a spec's reuse flag with no parameter reuses nothing)
    spec, weight_spec = f"{recipe}:{ROUNDING}+reuse_weight", f"{recipe}:{ROUNDING}"
    if dense:
        fns = {
            "forward": lambda x, w, p: ops.linear_op(x, w, spec, spec, weight_spec, p),
            "input-grad": lambda g, w, p: ops.linear_input_grad_op(g, w, spec, p),
            "weight-grad": lambda g, x: ops.linear_weight_grad_op(g, x, weight_spec),
        }
    else:
        fns = {
            "forward": lambda a, b, offs, p: ops.grouped_mm_op(a, b, offs, spec, spec, weight_spec, p),
            "input-grad": lambda g, b, offs, p: ops.grouped_mm_input_grad_op(g, b, offs, spec, p),
            # the call the op's backward makes for a weight stored [E, N, K] (lowering/autograd.py)
            "weight-grad": lambda a, g, offs: ops.grouped_mm_weight_grad_op(a, g, offs, weight_spec),
        }
    ops.register_decompositions()  # time the ops as Inductor compiles them in a model: decomposed
    return {role: torch.compile(fn, dynamic=True) for role, fn in fns.items()}  # one compile per role


def _args(role: str, dense: bool, tokens: int, K: int, N: int, w: torch.Tensor, reuse: bool):
    dev = w.device
    M = tokens if dense else tokens * E
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    g = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    p = w if reuse else None
    if dense:
        return {"forward": (x, w, p), "input-grad": (g, w, p), "weight-grad": (g, x)}[role]
    offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * tokens
    b_EKN = w.transpose(-2, -1)
    return {"forward": (x, b_EKN, offs, p), "input-grad": (g, b_EKN, offs, p), "weight-grad": (x, g, offs)}[role]


def calibrate(kind: str, shapes, tokens_grid, iters: int, reuse: bool) -> list[dict]:
    dense = kind == "dense"
    rows = []
    fns = {r: _role_fns(r, dense) for r in RECIPES}
    for K, N in shapes:
        w = torch.randn(*(() if dense else (E,)), N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        ms = {(role, r): [] for role in ROLES for r in RECIPES}
        for tokens in tokens_grid:
            for role in ROLES:
                args = _args(role, dense, tokens, K, N, w, reuse)
                for r in RECIPES:
                    ms[role, r].append(_time(fns[r][role], args, iters))
        for role in ROLES:
            for r in RECIPES[1:]:
                ratio = [t / b for t, b in zip(ms[role, r], ms[role, "bf16"])]
                rows.append(dict(K=K, N=N, role=role, recipe=r, tokens=list(tokens_grid), ratio=ratio,
                                 ms=ms[role, r], bf16_ms=ms[role, "bf16"]))
                print(f"{kind:7s} K={K:5d} N={N:5d} {role:11s} {r:11s} "
                      + " ".join(f"{t}:{1 / x:.2f}x" for t, x in zip(tokens_grid, ratio)), flush=True)
        del w
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="mxfp8_inductor/lowering/auto_h200.json")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="two shapes per kind, for a smoke run")
    p.add_argument("--no-reuse", action="store_true", help="every GEMM quantizes its weight")
    args = p.parse_args()
    grouped, dense = (GROUPED[:2], DENSE[:2]) if args.quick else (GROUPED, DENSE)
    torch._dynamo.config.cache_size_limit = 64
    out = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=str(datetime.date.today()),
               experts=E, weight_reuse=not args.no_reuse,
               grouped=calibrate("grouped", grouped, TOKENS_PER_GROUP, args.iters, not args.no_reuse),
               dense=calibrate("dense", dense, ROWS, args.iters, not args.no_reuse))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
