"""Wall time vs GPU kernel time per compiled MoE-block training step, and the top CUDA kernels.

    python benchmarks/profile_moe_block.py dsv3:bf16 dsv3:fp8_rowwise qwen3_30b:mxfp8 [--top 16]

Wall time well above kernel time means the step is bound by host work (Python, launches). The
step does not clear the parameters' .grad, so each profile includes the gradient-accumulation adds
(`CUDAFunctor_add`) that bench_moe_block.py does not run.
"""

from __future__ import annotations

import argparse
import time

import torch
from shapes import SHAPES, block_and_inputs, require_gpu
from torch.profiler import ProfilerActivity, profile

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed


def profile_block(shape: str, recipe: str, top: int) -> None:
    torch._dynamo.reset()
    block, x, counts, grad = block_and_inputs(shape)
    if recipe == "bf16":
        fn = torch.compile(block)
    else:
        fn = torch.compile(block, backend=mxfp8_backend, options={"recipe": recipe})

    def step():
        fn(x, counts).backward(grad)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / 10 * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(k.device_time_total for k in events) / 5 / 1e3
    print(f"==== {shape} {recipe}: wall {wall:.3f} ms/step, kernels {total:.3f} ms/step", flush=True)
    for k in sorted(events, key=lambda k: -k.device_time_total)[:top]:
        print(f"{k.device_time_total / 5 / 1e3:8.3f} ms {k.count // 5:3d}x {k.key[:110]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("blocks", nargs="+", metavar="SHAPE:RECIPE",
                   help=f"shape ({', '.join(SHAPES)}) and recipe (bf16, mxfp8, fp8_rowwise)")
    p.add_argument("--top", type=int, default=16, help="kernels listed per profile")
    args = p.parse_args()
    require_gpu()
    for arg in args.blocks:
        shape, recipe = arg.split(":")
        profile_block(shape, recipe, args.top)


if __name__ == "__main__":
    main()
