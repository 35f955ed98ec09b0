"""MoE block forward+backward under Inductor max-autotune: does leaving fp8_rowwise's FP8 grouped
GEMMs visible to Inductor (`aten._scaled_grouped_mm`, tuned against Inductor's Triton template)
beat bf16 tuned the same way?

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) \
        python benchmarks/bench_template_route.py --shape fine64 \
        [--out benchmarks/results/template_route_h200.json] [--rounds 5]

One process per shape; four variants of the same block (`shapes.block_and_inputs`), compiled in
this order and then timed side by side as `bench_moe_block.interleaved` does:
  bf16_autotune  torch.compile with the max-autotune patches (PATCHES)
  fp8_autotune   backend=mxfp8_backend, recipe fp8_rowwise, same patches, compiled with the
                 "template route": the grouped GEMMs emitted as
                 `aten._scaled_grouped_mm` at every group size instead of our opaque Triton GEMM
                 (`routes.TORCH_FP8_MIN_TOKENS_PER_GROUP` and `TORCH_FP8_MIN_DIM` 0 while
                 Inductor decomposes the block), so that max-autotune sees and tunes them
  fp8_default    backend=mxfp8_backend, recipe fp8_rowwise, no patches
  bf16_default   torch.compile, no patches
Speedups are medians of per-round ratios: bf16_autotune / fp8_autotune and bf16_default /
fp8_default (time over time, so > 1 means FP8 is faster). Compile seconds are the wall time of
each variant's first forward+backward (cold caches when the cache directories are fresh; our own
Triton kernels are built by whichever FP8 variant runs them first). The picked choice per
autotuned GEMM is in Inductor's AUTOTUNE tables on stderr. Partial results are written after
each step, so a run stopped by a time limit still leaves its compile times. Use fresh cache
directories: the route is a module constant, not in the compile caches' keys, so a reused cache
can serve fp8_autotune a graph compiled without it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import statistics
import time

import torch
import triton
from bench_moe_block import fwd_bwd, interleaved
from shapes import SHAPES, TOKENS, block_and_inputs, require_gpu

from mxfp8_inductor import mxfp8_backend, routes  # also where the package is on PYTHONPATH, not installed
from mxfp8_inductor.check import sqnr

# Inductor config patches of the autotuned variants: GEMM templates against ATen (no CUTLASS or
# CK), no CUDA graphs (the default variants have none either)
PATCHES = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON,ATEN", "triton.cudagraphs": False}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s {datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


@contextlib.contextmanager
def template_route(on: bool):
    """While on, fp8_rowwise's 2d-3d GEMMs decompose to `aten._scaled_grouped_mm` at any group size
    (the decomposition runs during the first forward, which traces the backward too)."""
    saved = routes.TORCH_FP8_MIN_TOKENS_PER_GROUP, routes.TORCH_FP8_MIN_DIM
    if on:
        routes.TORCH_FP8_MIN_TOKENS_PER_GROUP = routes.TORCH_FP8_MIN_DIM = 0
    try:
        yield
    finally:
        routes.TORCH_FP8_MIN_TOKENS_PER_GROUP, routes.TORCH_FP8_MIN_DIM = saved


def compiled(name: str, mod: torch.nn.Module):
    fp8, tuned = name.startswith("fp8"), name.endswith("autotune")
    inductor = dict(PATCHES) if tuned else {}
    if fp8:
        return torch.compile(mod, backend=mxfp8_backend, options={"recipe": "fp8_rowwise", "inductor": inductor})
    return torch.compile(mod, options=inductor) if inductor else torch.compile(mod)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="fine64", choices=list(SHAPES))
    p.add_argument("--variants", default="bf16_autotune,fp8_autotune,fp8_default,bf16_default")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/template_route_h200.json")
    args = p.parse_args()
    require_gpu()
    from torch._dynamo.utils import counters
    from torch._inductor.kernel import mm_grouped

    E, D, F = SHAPES[args.shape]
    flop = 3 * 3 * 2 * TOKENS * D * F  # three GEMMs, each forward, input and weight gradient
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "shape": args.shape, "E": E, "D": D, "F": F,
              "tokens": TOKENS, "tokens_per_group": TOKENS / E, "block_flop": flop, "patches": PATCHES,
              "grouped_mm_template_configs": len(mm_grouped.grouped_mm_configs()),
              "compile_threads": torch._inductor.config.compile_threads,
              "cache_dirs": {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")},
              "compile_s": {}, "grouped_mm_lowerings": {}, "rows": {}}
    log(" ".join(f"{k}={result[k]}" for k in ("gpu", "torch", "triton", "shape", "tokens_per_group",
                                                "grouped_mm_template_configs", "compile_threads")))

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    block, x, counts, grad = block_and_inputs(args.shape)
    steps, outs = {}, {}
    for name in args.variants.split(","):
        mod = copy.deepcopy(block)
        step = fwd_bwd(mod, compiled(name, mod), x, counts, grad)

        log(f"compiling {name}")
        seen = dict(counters["aten_mm_info"])
        start = time.perf_counter()
        with template_route(name == "fp8_autotune"):
            out = step()
            torch.cuda.synchronize()
        result["compile_s"][name] = time.perf_counter() - start
        # Inductor lowerings of aten grouped GEMMs in this variant's graphs (opaque ops not counted)
        result["grouped_mm_lowerings"][name] = {k: v - seen.get(k, 0) for k, v in counters["aten_mm_info"].items()
                                                if "grouped_mm" in k and v - seen.get(k, 0)}
        log(f"compiled {name} in {result['compile_s'][name]:.1f} s; lowered {result['grouped_mm_lowerings'][name]}")
        outs[name] = [out.detach().float(), x.grad.float()] + [prm.grad.float() for prm in mod.parameters()]
        steps[name] = step
        save()

    ms = interleaved(steps, args.rounds)
    ref = outs.get("bf16_default") or outs[next(iter(outs))]
    for name, times in ms.items():
        result["rows"][name] = {"ms": statistics.median(times), "ms_rounds": times,
                                "tflops": flop / statistics.median(times) / 1e9,
                                "sqnr_out": sqnr(ref[0], outs[name][0]),
                                "sqnr_grads_min": min(sqnr(a, b) for a, b in zip(ref[1:], outs[name][1:]))}
    pairs = {"autotune_bf16_over_fp8": ("bf16_autotune", "fp8_autotune"),
             "default_bf16_over_fp8": ("bf16_default", "fp8_default"),
             "fp8_autotune_over_default": ("fp8_default", "fp8_autotune"),
             "bf16_autotune_over_default": ("bf16_default", "bf16_autotune")}
    result["speedups"] = {}
    for key, (base, new) in pairs.items():
        if base in ms and new in ms:
            ratios = [b / t for b, t in zip(ms[base], ms[new])]
            result["speedups"][key] = {"median": statistics.median(ratios), "rounds": ratios}
    save()
    print(f"\n{args.shape}: {'variant':<14} {'compile s':>9} {'ms':>8} {'TFLOP/s':>8} {'SQNR out':>8} {'grads min':>9}")
    for name, row in result["rows"].items():
        print(f"{args.shape}: {name:<14} {result['compile_s'][name]:9.1f} {row['ms']:8.3f} {row['tflops']:8.0f} "
              f"{row['sqnr_out']:8.1f} {row['sqnr_grads_min']:9.1f}")
    for key, s in result["speedups"].items():
        print(f"{args.shape}: {key:<28} {s['median']:.3f}x  rounds " + " ".join(f"{r:.3f}" for r in s["rounds"]))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
