"""Compile time of backend="mxfp8" vs plain torch.compile on the same model (fwd+bwd, cold caches).

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TRITON_CACHE_DIR=$(mktemp -d) \
        python benchmarks/bench_compile_time.py [--out benchmarks/results/compile_time_h200.json] [--rounds 3]

Inductor's caches are off, so every compile builds its kernels. Our quantizer kernels are built by
Triton once per process, on their first launch, and read from Triton's cache on disk when an
earlier process built them (a fresh TRITON_CACHE_DIR makes that first build cold). So the first
mxfp8 step, after a plain one that warms the process, is timed apart (it includes that build);
then plain and mxfp8 compiles take turns over --rounds rounds and the overhead is the ratio of
their medians (compile times move by 20% between runs on one machine).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import time

import torch
import triton
from shapes import moe_model

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed
from mxfp8_inductor.kernels import triton_mx_quant


def first_step_s(model: torch.nn.Module, backend: str, x: torch.Tensor) -> float:
    backend = mxfp8_backend if backend == "mxfp8" else backend
    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend)
    start = time.perf_counter()
    fn(x).float().sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/compile_time_h200.json")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = moe_model(layers=4, D=2048, F=768, E=16, top_k=2, shared_expert=True).to(dev, torch.bfloat16)
    x = torch.randn(1, 4096, 2048, device=dev, dtype=torch.bfloat16)
    first_step_s(copy.deepcopy(model), "inductor", x)  # warm the process (imports, Triton)
    mx_first = first_step_s(copy.deepcopy(model), "mxfp8", x)
    built = sum(len(cache[0]) for cache in triton_mx_quant.mx_quant_kernel.device_caches.values())
    rounds = {"inductor": [], "mxfp8": []}
    for _ in range(args.rounds):
        for backend, times in rounds.items():
            times.append(first_step_s(copy.deepcopy(model), backend, x))
    plain, mx = statistics.median(rounds["inductor"]), statistics.median(rounds["mxfp8"])
    row = {"model": "MoEModel 4 layers, 16 experts, dim 2048, hidden 768, shared expert, 4096 tokens",
           "plain_s": plain, "mxfp8_s": mx, "overhead": mx / plain - 1,
           "plain_rounds_s": rounds["inductor"], "mxfp8_rounds_s": rounds["mxfp8"],
           "mxfp8_first_s": mx_first, "quantizer_kernels_built": built, "first_build_s": mx_first - mx,
           "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", "default")}
    print(f"first step (compile), medians of {args.rounds}: plain {plain:.2f} s, mxfp8 {mx:.2f} s, overhead "
          f"{row['overhead']:+.1%}; the process's first mxfp8 step {mx_first:.2f} s ({built} quantizer kernels "
          f"built: +{row['first_build_s']:.2f} s)")
    result = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
              "triton": triton.__version__, "date": datetime.date.today().isoformat(), "rows": [row]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
