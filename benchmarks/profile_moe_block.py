"""Wall time vs GPU kernel time per compiled MoE-block training step, the kernel time by kind
(GEMMs, quantization, the rest) and the top CUDA kernels.

    python benchmarks/profile_moe_block.py dsv3:bf16 dsv3:fp8_rowwise qwen3_30b:mxfp8 [--top 16]
        [--out benchmarks/results/profile_moe_block_h200.json]
    python benchmarks/profile_moe_block.py --table benchmarks/results/profile_moe_block_h200.json

Wall time well above kernel time means the step is bound by host work (Python, launches). The
step does not clear the parameters' .grad, so each profile includes the gradient-accumulation adds
(`CUDAFunctor_add`) that bench_moe_block.py does not run. Quantization is every kernel of the
package that quantizes or dequantizes, and every kernel Inductor generated that writes float8
(a quantization fused into its producer): Inductor's kernels are told apart by their source, so
the script points Inductor's cache at a fresh directory. `--table` prints a saved file's
quantization by where it runs: Inductor's kernels fused from a `transpose` quantize an expert
weight (each enters its GEMM as a `.transpose(-2, -1)` view), its others the activations' rows
(fused into the SwiGLU's kernels, or a kernel of their own for the block's inputs); the
package's kernels quantize the weight gradient's token groups.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import tempfile
import time

import torch
import triton
from shapes import SHAPES, block_and_inputs, require_gpu
from torch.profiler import ProfilerActivity, profile

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="profile_moe_block_")  # read at each compile


# the package's kernels that quantize or dequantize (kernels/triton_mx_quant.py, triton_rowwise.py,
# triton_mx_scale_layout.py)
QUANTIZERS = {"mx_quant_kernel", "dequant_kernel", "_to_blocked_kernel", "_quantize_groups_kernel",
              "_group_amax_kernel", "_cast_groups_t_kernel", "_weight_amax_kernel", "_weight_cast_kernel",
              "_quantize_rows_kernel"}
GEMM = re.compile(r"gemm|cutlass|nvjet|xmma|^_rows_kernel$|^_groups_kernel$", re.IGNORECASE)  # last two: fused MXFP8
KERNEL_SOURCE = re.compile(r"async_compile\.triton\('(\w+)', '''(.*?)'''", re.DOTALL)
FP8_OUTPUT = re.compile(r"'(in_)?out_ptr\d+': '\*fp8")


def inductor_fp8_writers() -> set[str]:
    """Names of the Triton kernels Inductor generated in this process that store float8."""
    names = set()
    for path in pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.py"):
        # each kernel's source is one string in its graph's module; its signature gives each
        # argument's type, and only the outputs (out_ptr, in_out_ptr) are written
        for name, source in KERNEL_SOURCE.findall(path.read_text(errors="replace")):
            if FP8_OUTPUT.search(source):
                names.add(name)
    return names


def kind(name: str, fp8_writers: set[str]) -> str:
    if name in QUANTIZERS or name in fp8_writers:
        return "quantization"
    return "gemm" if GEMM.search(name) else "other"


def profile_block(shape: str, recipe: str, top: int) -> dict:
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
    events = [k for k in prof.key_averages() if k.device_time_total > 0]
    fp8_writers = inductor_fp8_writers()
    kernels = [{"name": k.key, "kind": kind(k.key, fp8_writers), "calls": k.count // 5,
                "ms": k.device_time_total / 5 / 1e3} for k in sorted(events, key=lambda k: -k.device_time_total)]
    by_kind = {c: sum(k["ms"] for k in kernels if k["kind"] == c) for c in ("gemm", "quantization", "other")}
    total = sum(by_kind.values())
    print(f"==== {shape} {recipe}: wall {wall:.3f} ms/step, kernels {total:.3f} ms/step ("
          + ", ".join(f"{c} {ms:.3f}" for c, ms in by_kind.items()) + ")", flush=True)
    for k in kernels[:top]:
        print(f"{k['ms']:8.3f} ms {k['calls']:3d}x {k['kind'][:5]:5s} {k['name'][:100]}")
    return {"shape": shape, "recipe": recipe, "wall_ms": wall, "kernel_ms": total,
            **{f"{c}_ms": ms for c, ms in by_kind.items()}, "kernels": kernels}


def table(path: str) -> None:
    """Markdown rows: per shape, bf16's kernel time and GEMMs beside each recipe's, with the
    recipe's quantization split as the module docstring says."""
    profiles = json.loads(pathlib.Path(path).read_text())["profiles"]
    bf16 = {p["shape"]: p for p in profiles if p["recipe"] == "bf16"}
    print("| shape | recipe | kernels ms (bf16) | GEMMs ms (bf16) | quantization ms: weights / activation rows / "
          "token groups | other ms (bf16) |")
    print("|---|---|---|---|---|---|")
    for p in profiles:
        base = bf16.get(p["shape"])
        if p["recipe"] == "bf16" or base is None:
            continue
        quant = [k for k in p["kernels"] if k["kind"] == "quantization"]
        weights = sum(k["ms"] for k in quant if k["name"] not in QUANTIZERS and "transpose" in k["name"])
        groups = sum(k["ms"] for k in quant if k["name"] in QUANTIZERS)
        rows = p["quantization_ms"] - weights - groups
        print(f"| {p['shape']} | {p['recipe']} | {p['kernel_ms']:.2f} ({base['kernel_ms']:.2f}) | "
              f"{p['gemm_ms']:.2f} ({base['gemm_ms']:.2f}) | {p['quantization_ms']:.2f}: {weights:.2f} / {rows:.2f} / "
              f"{groups:.2f} | {p['other_ms']:.2f} ({base['other_ms']:.2f}) |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("blocks", nargs="*", metavar="SHAPE:RECIPE",
                   help=f"shape ({', '.join(SHAPES)}) and recipe (bf16, mxfp8, fp8_rowwise)")
    p.add_argument("--top", type=int, default=16, help="kernels listed per profile")
    p.add_argument("--out", help="also write every profile's kernels to this JSON file")
    p.add_argument("--table", metavar="JSON", help="print the quantization table of a saved file (no GPU)")
    args = p.parse_args()
    if args.table:
        table(args.table)
        return
    if not args.blocks:
        p.error("give SHAPE:RECIPE blocks to profile, or --table JSON")
    require_gpu()
    rows = [profile_block(*arg.split(":"), args.top) for arg in args.blocks]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "date": datetime.date.today().isoformat(), "profiles": rows}, f, indent=1)


if __name__ == "__main__":
    main()
