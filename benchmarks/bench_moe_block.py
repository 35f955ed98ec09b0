"""MoE block forward+backward: bf16 compiled vs the same module compiled with backend="mxfp8",
once per recipe; or, with --gemms, the rate of each grouped GEMM of the block by kernel.

    python benchmarks/bench_moe_block.py [--out benchmarks/results/moe_block_h200.json]
        [--shapes dsv3,fine64] [--recipes mxfp8,fp8_rowwise] [--rounds 5]
    python benchmarks/bench_moe_block.py --gemms [--autotune qwen3_30b,fine64]
        [--out benchmarks/results/grouped_gemm_rates_h200.json]

Block = w1 and w3 grouped GEMMs, silu-mul, w2 grouped GEMM (`shapes.GroupedExperts`), 32768
routed tokens in uneven groups, measured side by side in one run on one GPU: the variants take
turns over --rounds rounds, and each speedup is the median of the per-round ratios (host-bound
shapes move by 0.1x and more between runs on a busy host).

--gemms times each GEMM alone on random operands (docs/performance.md, "FP8 grouped GEMM rates"):
the forward layout (2d-3d) in torch's bf16 `_grouped_mm`, torch's rowwise FP8 `_scaled_grouped_mm`
and our Triton FP8 grouped GEMM, and the weight-gradient layout (2d-2d) in torch's bf16 and FP8
kernels; for the shapes given to --autotune also Inductor's Triton template for
`_scaled_grouped_mm` under max-autotune (about two minutes of autotuning per GEMM). These rates
say which kernel each fp8_rowwise GEMM should take per tokens per group.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import time
from functools import partial

import torch
import triton
from shapes import SHAPES, TOKENS, block_and_inputs, require_gpu, uneven_counts
from triton.testing import do_bench

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed
from mxfp8_inductor.check import sqnr

F8 = torch.float8_e4m3fn


def measure(shape: str, recipes: list[str], rounds: int) -> list[dict]:
    """bf16 compiled and each recipe compiled, timed side by side on the same inputs."""
    block, x, counts, grad = block_and_inputs(shape)
    fns = {"bf16": (block, torch.compile(block))}
    for recipe in recipes:
        mod = copy.deepcopy(block)
        fns[recipe] = (mod, torch.compile(mod, backend=mxfp8_backend, options={"recipe": recipe}))
    results, steps = {}, {}
    for name, (mod, fn) in fns.items():
        step = fwd_bwd(mod, fn, x, counts, grad)
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


def fwd_bwd(mod: torch.nn.Module, fn, x: torch.Tensor, counts: torch.Tensor, grad: torch.Tensor):
    """One forward and backward of `fn` (the compiled `mod`) with the gradients cleared first."""
    def step():
        x.grad = None
        for p in mod.parameters():
            p.grad = None
        out = fn(x, counts)
        out.backward(grad)
        return out
    return step


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


def _template(*args) -> float:
    """ms of `_scaled_grouped_mm` on `args` as Inductor's max-autotune picks it."""
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, sa, sb, offs: torch._scaled_grouped_mm(a, b, sa, sb, offs=offs,
                                                                         out_dtype=torch.bfloat16),
                      mode="max-autotune-no-cudagraphs")
    f(*args)
    return do_bench(lambda: f(*args), return_mode="median")


def gemm_rates(shape: str, autotune: bool) -> list[dict]:
    """TFLOP/s of the block's w1/w3 and w2 GEMMs per kernel, forward and weight-gradient layouts."""
    from mxfp8_inductor.kernels import launch, triton_fp8_gemm

    E, D, F = SHAPES[shape]
    counts = uneven_counts(E, TOKENS)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    # torch's 2d-2d FP8 kernel takes token groups in multiples of 16 only (the weight-gradient
    # quantizer pads them so), so the weight-gradient layout is timed on groups rounded to 16
    padded = counts // 16 * 16
    padded[0] += TOKENS - padded.sum()
    offs_w = torch.cumsum(padded, 0, dtype=torch.int32)
    rows = []
    for gemm, (K, N) in {"w13": (D, F), "w2": (F, D)}.items():
        x = torch.randn(TOKENS, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn(TOKENS, N, device="cuda", dtype=torch.bfloat16)
        xq, wq = x.to(F8), w.to(F8)
        sx, sw = torch.rand(TOKENS, device="cuda"), torch.rand(E, N, device="cuda")
        gq, xq_t = dout.t().contiguous().to(F8), x.t().contiguous().to(F8)  # [N, M], [K, M]: K-major
        sg, sxw = torch.rand(E * N, device="cuda"), torch.rand(E * K, device="cuda")
        fwd = (xq, wq.transpose(-2, -1), sx, sw, offs)
        wgrad = (gq, xq_t.t(), sg, sxw, offs_w)
        scaled = partial(torch._scaled_grouped_mm, out_dtype=torch.bfloat16)
        kernels = {
            "fwd_bf16": partial(torch._grouped_mm, x, w.transpose(-2, -1), offs=offs),
            "fwd_fp8_torch": partial(scaled, *fwd[:4], offs=offs),
            "fwd_fp8_ours": partial(triton_fp8_gemm.scaled_grouped_mm, *fwd),
            "wgrad_bf16": partial(torch._grouped_mm, dout.t(), x, offs=offs_w),
            "wgrad_fp8_torch": partial(scaled, *wgrad[:4], offs=offs_w),
        }
        row = {"shape": shape, "gemm": gemm, "M": TOKENS, "K": K, "N": N, "E": E}
        for name, fn in kernels.items():
            fn()  # our GEMM autotunes on its first call
            row[f"{name}_ms"] = do_bench(fn, return_mode="median")
        row["fwd_fp8_ours_config"] = str(launch._picked.get((triton_fp8_gemm._gemm_2d3d_tuned, (N, K))))
        if autotune:
            start = time.perf_counter()
            row["fwd_fp8_template_ms"] = _template(*fwd)
            row["wgrad_fp8_template_ms"] = _template(*wgrad)
            row["autotune_s"] = time.perf_counter() - start
        flop = 2 * TOKENS * K * N
        for key in [k for k in row if k.endswith("_ms")]:
            row[key.removesuffix("_ms") + "_tflops"] = flop / row[key] / 1e9
        print(f"{shape:<10} {gemm:<4} " + " ".join(f"{k.removesuffix('_tflops')} {v:5.0f}"
                                                   for k, v in row.items() if k.endswith("_tflops")), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON path (default: benchmarks/results/moe_block_h200.json, or "
                                 "grouped_gemm_rates_h200.json with --gemms)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--recipes", default="mxfp8,fp8_rowwise")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per variant")
    p.add_argument("--gemms", action="store_true", help="time each grouped GEMM of the block by kernel instead")
    p.add_argument("--autotune", default="", help="with --gemms: shapes to time Inductor's max-autotune template at")
    args = p.parse_args()
    require_gpu()
    rows = []
    if args.gemms:
        out = args.out or "benchmarks/results/grouped_gemm_rates_h200.json"
        for shape in args.shapes.split(","):
            rows += gemm_rates(shape, shape in args.autotune.split(","))
    else:
        out = args.out or "benchmarks/results/moe_block_h200.json"
        print(f"{'shape':<10} {'recipe':<12} {'bf16 ms':>8} {'ms':>8} {'bf16/recipe':>11} {'SQNR out':>8} "
              f"{'grads min':>9}")
        for shape in args.shapes.split(","):
            torch._dynamo.reset()
            for row in measure(shape, args.recipes.split(","), args.rounds):
                rows.append(row)
                print(f"{shape:<10} {row['recipe']:<12} {row['bf16_ms']:8.3f} {row['ms']:8.3f} {row['speedup']:10.2f}x"
                      f" {row['sqnr_out']:8.1f} {row['sqnr_grads_min']:9.1f}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "rows": rows}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
