"""Wall time vs GPU kernel time per compiled MoE-block training step, the kernel time by kind
(GEMMs, quantization, the rest), the top CUDA kernels and the host time of the package's ops.

    python benchmarks/profile_moe_block.py dsv3:bf16 dsv3:fp8_rowwise qwen3_30b:mxfp8 [--top 16]
        [--train-step 4] [--kernels gluon,tl] [--python 30] [--cudagraphs]
        [--out benchmarks/results/profile_moe_block_h200.json]
    python benchmarks/profile_moe_block.py --table benchmarks/results/profile_moe_block_h200.json
    python benchmarks/profile_moe_block.py --floor benchmarks/results/profile_moe_block_train_h100.json

A block is SHAPE:VARIANT, VARIANT bf16 or bench_moe_block.py's RECIPE[+cache]. Wall time well above
kernel time means the step is bound by host work (Python, launches), as does the host's own time to
issue a step near the wall time (`host_and_wall`); --python N lists the N Python functions with the
most host time per step (cProfile). Each op of the package
("mxfp8::...") is listed with its host time per step (its CPU time, the kernels it launches
included), and the GPU's idle time per step with the host calls it fell in. A step is one forward
and backward that does not clear the parameters' .grad (so each profile includes the gradient-
accumulation adds, `CUDAFunctor_add`, that bench_moe_block.py does not run), or with --train-step N
bench_moe_block.py's training step: N microbatches and an optimizer step, after which the weight
cache quantizes each weight again.
--kernels profiles each compiled block once per FP8 grouped-GEMM kernel: "gluon" (the default on
Hopper) and "tl" (`kernels/triton_fp8_gemm.py`, the fallback), the same compiled graph.
--cudagraphs compiles every block with Inductor's CUDA graphs (as bench_moe_block.py --cudagraphs).
Quantization is every kernel of the package that quantizes or dequantizes, and every kernel
Inductor generated that writes float8 (a quantization fused into its producer): Inductor's
kernels are told apart by their source, so the script points Inductor's cache at a fresh
directory. `--table` prints a saved file's
quantization by where it runs: Inductor's kernels fused from a `transpose` quantize an expert
weight (each enters its GEMM as a `.transpose(-2, -1)` view), its others the activations' rows
(fused into the SwiGLU's kernels, or a kernel of their own for the block's inputs); the
package's kernels quantize the weight gradient's token groups.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import datetime
import json
import os
import pathlib
import pstats
import re
import statistics
import tempfile
import time

import torch
import triton
from bench_moe_block import options_of, train_step
from shapes import SHAPES, TOKENS, block_and_inputs, require_gpu, use_kernels
from torch.profiler import ProfilerActivity, profile

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="profile_moe_block_")  # read at each compile


# the package's kernels that quantize or dequantize (kernels/triton_mx_quant.py, triton_rowwise.py,
# triton_mx_scale_layout.py), a weight's shared form among them, and the byte transpose of a cached
# weight (triton_transpose.py)
QUANTIZERS = {"mx_quant_kernel", "dequant_kernel", "_to_blocked_kernel", "_quantize_groups_kernel",
              "_group_amax_kernel", "_cast_groups_t_kernel", "_weight_amax_kernel", "_weight_cast_kernel",
              "_quantize_rows_kernel", "_matrix_amax_kernel", "_matrix_cast_kernel", "_transpose_kernel"}
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


def compiled_step(shape: str, variant: str, train: int, cudagraphs: bool = False):
    """The compiled block's step (see the module docstring)."""
    torch._dynamo.reset()
    block, x, counts, grad = block_and_inputs(shape)
    inductor = {"triton.cudagraphs": True} if cudagraphs else {}
    if variant == "bf16":
        fn = torch.compile(block, options=inductor)
    else:
        fn = torch.compile(block, backend=mxfp8_backend, options={**options_of(variant), "inductor": inductor})
    if train:
        return train_step(block, fn, x, counts, grad, train, cudagraphs)
    return lambda: fn(x, counts).backward(grad)


def gpu_idle(prof, steps: int, top: int) -> tuple[float, list[dict]]:
    """The GPU's idle ms per step between its first and last kernel in the profile, and where the
    host was meanwhile: per host op or call name, the idle ms per step that fell while it ran
    (nested calls each counted), the `top` largest."""
    events = prof.events()
    on_gpu = sorted((e.time_range.start, e.time_range.end) for e in events
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps, busy_until = [], on_gpu[0][1]
    for start, end in on_gpu[1:]:
        if start > busy_until:
            gaps.append((busy_until, start))
        busy_until = max(busy_until, end)
    gap_starts = [g[0] for g in gaps]
    overlap: dict[str, float] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU:
            continue
        start, end = e.time_range.start, e.time_range.end
        i = max(bisect.bisect_right(gap_starts, start) - 1, 0)
        while i < len(gaps) and gaps[i][0] < end:
            covered = min(end, gaps[i][1]) - max(start, gaps[i][0])
            if covered > 0:
                overlap[e.name] = overlap.get(e.name, 0.0) + covered
            i += 1
    ranked = sorted(overlap.items(), key=lambda kv: -kv[1])[:top]
    return (sum(b - a for a, b in gaps) / steps / 1e3,
            [{"name": name, "idle_ms": us / steps / 1e3} for name, us in ranked])


def host_and_wall(step, steps: int = 10) -> tuple[float, float]:
    """Median ms per step of the host issuing it (from an idle GPU to the step's return, unwaited)
    and of the whole step (to the GPU's end). Host near wall: the host bounds the step (or the
    step waits on the GPU inside); host well below wall: the GPU does."""
    host, wall = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        host.append(issued - start)
        wall.append(time.perf_counter() - start)
    return statistics.median(host) * 1e3, statistics.median(wall) * 1e3


def host_functions(step, top: int, steps: int = 5) -> list[dict]:
    """The `top` Python functions by their own host time per step under cProfile (which slows
    each call, so read these as shares, not times): calls, own and cumulative ms per step."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)}
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{pathlib.Path(file).name}:{line}({name})", "calls": calls // steps,
             "own_ms": own / steps * 1e3, "cumulative_ms": cum / steps * 1e3}
            for (file, line, name), (_, calls, own, cum, _) in ranked]


def profile_step(step, shape: str, variant: str, kernels: str, top: int, python_top: int) -> dict:
    use_kernels(kernels)
    for _ in range(3):
        step()
    host, wall = host_and_wall(step)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    events = [k for k in averages if k.device_type == torch.autograd.DeviceType.CUDA and k.device_time_total > 0]
    fp8_writers = inductor_fp8_writers()
    kernels_run = [{"name": k.key, "kind": kind(k.key, fp8_writers), "calls": k.count // 5,
                    "ms": k.device_time_total / 5 / 1e3} for k in sorted(events, key=lambda k: -k.device_time_total)]
    by_kind = {c: sum(k["ms"] for k in kernels_run if k["kind"] == c) for c in ("gemm", "quantization", "other")}
    ops = [{"name": k.key, "calls": k.count // 5, "host_ms": k.cpu_time_total / 5 / 1e3}
           for k in sorted(averages, key=lambda k: -k.cpu_time_total) if k.key.startswith("mxfp8::")]
    idle_ms, idle_in = gpu_idle(prof, 5, top)
    total = sum(by_kind.values())
    label = variant if variant == "bf16" else f"{variant} ({kernels})"
    python = host_functions(step, python_top) if python_top else []
    print(f"==== {shape} {label}: wall {wall:.3f} ms/step, host {host:.3f} ms/step, kernels {total:.3f} ms/step ("
          + ", ".join(f"{c} {ms:.3f}" for c, ms in by_kind.items()) + f"), GPU idle {idle_ms:.3f} ms/step",
          flush=True)
    for k in kernels_run[:top]:
        print(f"{k['ms']:8.3f} ms {k['calls']:3d}x {k['kind'][:5]:5s} {k['name'][:100]}")
    for op in ops:
        print(f"{op['host_ms']:8.3f} ms {op['calls']:3d}x host  {op['name']}")
    for op in idle_in:
        print(f"{op['idle_ms']:8.3f} ms GPU idle in {op['name'][:100]}")
    for f in python:
        print(f"{f['own_ms']:8.3f} ms own ({f['cumulative_ms']:.3f} with callees) {f['calls']:4d}x {f['function']}")
    return {"shape": shape, "recipe": variant, "kernels_used": kernels, "wall_ms": wall, "host_ms": host,
            "kernel_ms": total, "python": python,
            **{f"{c}_ms": ms for c, ms in by_kind.items()}, "gpu_idle_ms": idle_ms, "kernels": kernels_run,
            "ops": ops, "gpu_idle_in": idle_in}


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


def floor_bytes(shape: str, microbatches: int) -> float:
    """Bytes per step that fp8_rowwise's quantization must move at the least, each operand
    quantized once where it is produced: every FP8 form written once (rows and token-group
    columns of x, h, dy and the gate's and up's gradients: 2 T (2D + 3F) bytes per microbatch),
    the block's bf16 inputs x and dy read once (their producers are outside the block), and each
    weight read in bf16 and written in FP8 once per step (the input gradient reading that one form
    in place)."""
    E, D, F = SHAPES[shape]
    per_microbatch = 2 * TOKENS * (2 * D + 3 * F) + 2 * 2 * TOKENS * D
    return microbatches * per_microbatch + 3 * E * D * F * (2 + 1)


def floor(path: str, copy_gbs: float) -> None:
    """Markdown rows: per FP8 profile of a training step, its kernel time by kind beside bf16's,
    the quantization's floor (`floor_bytes` at `copy_gbs`, bytes read and written per second) and
    the ratio to bf16 the block could reach with its GEMMs and other kernels as measured, that
    floor, and no host time left over."""
    data = json.loads(pathlib.Path(path).read_text())
    steps = data["train_step"]
    bf16 = {p["shape"]: p for p in data["profiles"] if p["recipe"] == "bf16"}
    print("| shape | variant (kernel) | bf16 kernels ms | GEMMs ms | other ms | quantization ms | floor ms | "
          "ceiling x bf16 |")
    print("|---|---|---|---|---|---|---|---|")
    for p in data["profiles"]:
        base = bf16.get(p["shape"])
        if p["recipe"] == "bf16" or base is None:
            continue
        # kinds as this script classes them now (a file may predate a kernel's entry in QUANTIZERS)
        other = sum(k["ms"] for k in p["kernels"] if k["kind"] == "other" and k["name"] not in QUANTIZERS)
        quantization = p["kernel_ms"] - p["gemm_ms"] - other
        floor_ms = floor_bytes(p["shape"], steps) / copy_gbs / 1e6
        ceiling = base["kernel_ms"] / (p["gemm_ms"] + other + floor_ms)
        print(f"| {p['shape']} | {p['recipe']} ({p['kernels_used']}) | {base['kernel_ms']:.2f} | {p['gemm_ms']:.2f} | "
              f"{other:.2f} | {quantization:.2f} | {floor_ms:.2f} | {ceiling:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("blocks", nargs="*", metavar="SHAPE:VARIANT",
                   help=f"shape ({', '.join(SHAPES)}) and variant (bf16, or RECIPE[+cache])")
    p.add_argument("--top", type=int, default=16, help="kernels listed per profile")
    p.add_argument("--train-step", type=int, default=0, metavar="N",
                   help="profile bench_moe_block.py's training step of N microbatches instead")
    p.add_argument("--kernels", default="gluon", help="FP8 grouped-GEMM kernels to profile each block with: "
                                                      "gluon, tl, or both comma-separated")
    p.add_argument("--python", type=int, default=0, metavar="N",
                   help="also list the N Python functions with the most host time per step (cProfile)")
    p.add_argument("--cudagraphs", action="store_true", help="compile every block with Inductor's CUDA graphs")
    p.add_argument("--out", help="also write every profile's kernels to this JSON file")
    p.add_argument("--table", metavar="JSON", help="print the quantization table of a saved file (no GPU)")
    p.add_argument("--floor", metavar="JSON", help="print the quantization floor and ceiling of a saved "
                                                  "--train-step file (no GPU)")
    p.add_argument("--copy-gbs", type=float, default=2964.0,
                   help="with --floor: the device's copy rate, GB/s read and written (bench_quantize.py)")
    args = p.parse_args()
    if args.table:
        table(args.table)
        return
    if args.floor:
        floor(args.floor, args.copy_gbs)
        return
    if not args.blocks:
        p.error("give SHAPE:VARIANT blocks to profile, or --table JSON")
    require_gpu()
    rows = []
    for arg in args.blocks:
        shape, variant = arg.split(":")
        step = compiled_step(shape, variant, args.train_step, args.cudagraphs)
        for kernels in ["gluon"] if variant == "bf16" else args.kernels.split(","):
            rows.append(profile_step(step, shape, variant, kernels, args.top, args.python))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "date": datetime.date.today().isoformat(), "train_step": args.train_step,
                       "cudagraphs": args.cudagraphs,
                       "profiles": rows}, f, indent=1)


if __name__ == "__main__":
    main()
