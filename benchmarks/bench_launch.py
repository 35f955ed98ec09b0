"""Host time per call of our Triton kernels: Triton's own launch path (`kernel[grid](...)`), the
cached launcher of `kernels/launch.py` (`launch`), the launch bound once per key (`launch_keyed`)
and, for the quantize-dequantize wrappers, their per-call plans on top of it (`triton_mx._plans`;
"planned"), measured side by side in one run.

    python benchmarks/bench_launch.py [--out benchmarks/results/launch_h200.json]

Small inputs, so the GPU never holds the host back: the time per call is what a compiled graph
spends on the host for each quantizer it calls (16 per MoE block and step).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import triton
from shapes import require_gpu

from mxfp8_inductor.kernels import launch, triton_fp8_gemm, triton_mx, triton_rowwise
from mxfp8_inductor.lowering import mxfp8

MODULES = (triton_mx, triton_rowwise, triton_fp8_gemm)  # each imported `launch_keyed` by name


def _triton_route(key, tensors, prepare) -> None:
    """Every call computes its arguments and launches through Triton's own path."""
    kernel, grid, args, kwargs = prepare()
    kernel[grid](*args, **kwargs)


def _cached_route(key, tensors, prepare) -> None:
    """Every call computes its arguments; `launch.launch` keys the compiled kernel on them."""
    kernel, grid, args, kwargs = prepare()
    launch.launch(kernel, grid, *args, **kwargs)


# the ways a per-step kernel can launch, each skipping more host work than the one before: Triton's
# own path, its compiled kernel cached by us, the launch bound once per key, and that reached
# through the quantize-dequantize wrappers' plans (the route the ops take)
ROUTES = {"triton": _triton_route, "cached": _cached_route, "bound": launch.launch_keyed,
          "planned": launch.launch_keyed}
_planned = triton_mx._planned


def use_route(name: str) -> None:
    for mod in MODULES:
        mod.launch_keyed = ROUTES[name]
    triton_mx._plans.clear()
    triton_mx._planned = _planned if name == "planned" else (lambda key, x, offs: None)


def us_per_call(fn, calls: int = 3000, warmup: int = 200) -> float:
    """Host microseconds per call of `fn` (work it queues on a GPU is waited for outside the timing)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - start) / calls * 1e6
    sync()
    return us


def cases() -> dict[str, object]:
    x = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([100, 100, 300, 512], device="cuda", dtype=torch.int32)
    return {
        "op quantize_dequantize (rows)": lambda: mxfp8.quantize_dequantize_op(x, -1, "rceil"),
        "op quantize_dequantize (cols)": lambda: mxfp8.quantize_dequantize_op(x, 0, "rceil"),
        "op quantize_dequantize_groups": lambda: mxfp8.quantize_dequantize_groups_op(x, offs, "rceil"),
        "triton_rowwise.quantize_groups": lambda: triton_rowwise.quantize_groups(x, offs, "rceil"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/launch_h200.json")
    args = p.parse_args()
    require_gpu()
    rows = []
    for name, fn in cases().items():
        row = {"call": name}
        for _ in range(2):  # two turns each, the lower kept: a busy host only ever adds time
            for route in ROUTES:
                use_route(route)
                row[route] = min(row.get(route, float("inf")), us_per_call(fn))
        rows.append(row)
    use_route("planned")
    print(f"{'call':<32} {'triton us':>9} {'cached us':>9} {'bound us':>9} {'planned us':>10} {'triton/planned':>14}")
    for r in rows:
        print(f"{r['call']:<32} {r['triton']:9.1f} {r['cached']:9.1f} {r['bound']:9.1f} {r['planned']:10.1f}"
              f" {r['triton'] / r['planned']:13.2f}x")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.date.today().isoformat(), "unit": "us of host time per call",
                   "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
