"""Host time per call of our Triton kernels: Triton's own launch path (`kernel[grid](...)`), the
cached launcher of `kernels/launch.py` (`launch`), the launch bound once per key (`launch_keyed`)
and, for the quantize-dequantize wrappers, their per-call plans on top of it (`triton_mx._plans`;
"planned"), measured side by side in one run. For the along-K quantize-dequantize also the
`torch.library.triton_op` route: the same kernel launched through `torch.library.wrap_triton` from
a triton_op body ("triton_op"), and `torch.compile(fullgraph=True)` of one call of the package's op
as the pass emits it ("compiled op": Inductor calls the op) and of the triton_op ("compiled
triton_op": Inductor launches the kernel from its generated code), each output checked bit for bit
against the op's ("bit_equal"; a route Inductor fails to build is recorded there with its error).
On Hopper also the package's FP8 grouped-GEMM op by kernel and launch ("gemms": `gemm_calls`).

    python benchmarks/bench_launch.py [--out benchmarks/results/launch_h100.json]

Small inputs, so the GPU never holds the host back: the time per call is what a compiled graph
spends on the host for each quantizer it calls (16 per MoE block and step); the compiled columns
are per call of the compiled callable, its guards included.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import time
from collections.abc import Callable

import torch
import triton
from shapes import card, require_gpu, use_kernels

from mxfp8_inductor.kernels import launch, triton_mx, triton_rowwise
from mxfp8_inductor.kernels import triton_common as tc
from mxfp8_inductor.kernels.triton_mx_quant import DEQUANTIZED
from mxfp8_inductor.lowering import mxfp8
from mxfp8_inductor.lowering.library import OUT_DTYPE

MODULES = (triton_mx, triton_rowwise)  # each imported `launch_keyed` by name (the GEMMs: `gemm_calls`)


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


ALONG_K = "op quantize_dequantize (rows)"  # the call the triton_op route is measured for


@torch.library.triton_op("bench_launch::qdq_k", mutates_args=())
def qdq_k(x: torch.Tensor) -> torch.Tensor:
    """The package op's along-K quantize-dequantize (`triton_mx.quantize_dequantize(x, -1, "rceil")`)
    as a triton_op body: the same `mx_quant_kernel` launch (`_quant_launch`), computed on every
    call and made through `wrap_triton`, which lets Inductor launch the kernel from its own code."""
    y = torch.empty_like(x, dtype=OUT_DTYPE)
    x3, y3 = triton_mx._view3(x, -1), triton_mx._view3(y, -1)
    tensors = (tc.as_bits(x), tc.as_bits(y), None, None, None, None)  # `_launch_quant`'s tensor order
    kernel, grid, args, kwargs = triton_mx._quant_launch(
        tensors, x3, y3, None, "rceil", DEQUANTIZED, 0, 0, triton_mx._tile(x3.strides[1], 0))
    torch.library.wrap_triton(kernel)[grid](*args, **kwargs)
    return y


def triton_op_calls(x: torch.Tensor) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, bool | str]]:
    """The along-K quantize-dequantize of `x` by column: the triton_op eager, and compiled graphs
    of one call of the op and of the triton_op (compiled here, by their first call); and per
    column whether that first output equals the op's bit for bit, or the error that stopped it
    (such a column is left out of the calls)."""
    op = torch.ops.bench_launch.qdq_k.default
    calls = {"triton_op": lambda: op(x)}
    for name, fn in {"compiled op": lambda t: mxfp8.quantize_dequantize_op(t, -1, "rceil"),
                     "compiled triton_op": lambda t: op(t)}.items():
        compiled = torch.compile(fn, fullgraph=True)
        calls[name] = lambda compiled=compiled: compiled(x)
    expected = mxfp8.quantize_dequantize_op(x, -1, "rceil").view(torch.int16)
    bit_equal: dict[str, bool | str] = {}
    for name, call in list(calls.items()):
        try:
            bit_equal[name] = torch.equal(call().view(torch.int16), expected)
        except Exception as e:  # Inductor building the triton_op's kernel from its source can fail
            bit_equal[name] = f"{type(e).__name__}: {e}"
            del calls[name]
    return calls, bit_equal


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


def cases(x: torch.Tensor, offs: torch.Tensor) -> dict[str, object]:
    return {
        ALONG_K: lambda: mxfp8.quantize_dequantize_op(x, -1, "rceil"),
        "op quantize_dequantize (cols)": lambda: mxfp8.quantize_dequantize_op(x, 0, "rceil"),
        "op quantize_dequantize_groups": lambda: mxfp8.quantize_dequantize_groups_op(x, offs, "rceil"),
        "triton_rowwise.quantize_groups": lambda: triton_rowwise.quantize_groups(x, offs, "rceil"),
    }


def gemm_calls() -> dict[str, Callable[[], torch.Tensor]]:
    """The package's FP8 grouped GEMM op (2d-3d, 4 groups of 128 tokens, K = N = 256) by kernel and
    launch: the Gluon kernel launched by Triton's own path on every call, the Gluon kernel bound
    once per key (the route the op takes on Hopper), the `tl` kernel (bound once per key), each
    output checked bit for bit against the first's; and the weight cache's op around it."""
    from mxfp8_inductor.kernels import gluon_fp8_gemm
    from mxfp8_inductor.lowering import rowwise
    from mxfp8_inductor.lowering.rowwise import fp8_grouped_mm_op

    if not gluon_fp8_gemm.available():
        return {}
    F8 = torch.float8_e4m3fn
    a = torch.randn(512, 256, device="cuda").to(F8)
    b = torch.randn(4, 256, 256, device="cuda").to(F8).transpose(-2, -1)
    sa, sb = torch.rand(512, device="cuda"), torch.rand(4, 256, device="cuda")
    offs = torch.tensor([128, 256, 384, 512], device="cuda", dtype=torch.int32)
    bound = gluon_fp8_gemm.launch_keyed

    def call(kernels: str, launch_keyed) -> Callable[[], torch.Tensor]:
        def fn() -> torch.Tensor:
            use_kernels(kernels)
            gluon_fp8_gemm.launch_keyed = launch_keyed
            try:
                return fp8_grouped_mm_op(a, b, sa, sb, offs)
            finally:
                use_kernels("gluon")
                gluon_fp8_gemm.launch_keyed = bound
        return fn

    calls = {"op fp8_grouped_mm, Gluon (triton)": call("gluon", _triton_route),
             "op fp8_grouped_mm, Gluon (bound)": call("gluon", bound),
             "op fp8_grouped_mm, tl (bound)": call("tl", bound)}
    expected = next(iter(calls.values()))()
    for name, fn in calls.items():
        if not torch.equal(fn().view(torch.int16), expected.view(torch.int16)):
            raise SystemExit(f"{name}: output differs from the Gluon kernel's")
    # the weight cache's op, its weight reused (a hit on every call after the first): the GEMM
    # above plus the cache's lookup and, for the input gradient, the byte transpose
    w_ENK = torch.randn(4, 256, 256, device="cuda", dtype=torch.bfloat16)
    x_fp8, x_scales = a, sa
    for dgrad in (False, True):
        role = "input-grad" if dgrad else "forward"
        calls[f"op rowwise_cached_weight_gemm, {role}"] = functools.partial(
            rowwise.cached_weight_gemm_op, x_fp8, x_scales, w_ENK.transpose(-2, -1), w_ENK, offs, "rceil", dgrad)
    return calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON path (default: benchmarks/results/launch_<gpu>.json)")
    args = p.parse_args()
    require_gpu()
    args.out = args.out or f"benchmarks/results/launch_{card()}.json"
    x = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([100, 100, 300, 512], device="cuda", dtype=torch.int32)
    triton_op, bit_equal = triton_op_calls(x)
    rows = []
    for name, fn in cases(x, offs).items():
        row = {"call": name}
        for _ in range(2):  # two turns each, the lower kept: a busy host only ever adds time
            for route in ROUTES:
                use_route(route)
                row[route] = min(row.get(route, float("inf")), us_per_call(fn))
            if name == ALONG_K:
                use_route("planned")  # the route the compiled op's calls take
                for col, call in triton_op.items():
                    row[col] = min(row.get(col, float("inf")), us_per_call(call))
        rows.append(row)
    use_route("planned")
    print(f"{'call':<32} {'triton us':>9} {'cached us':>9} {'bound us':>9} {'planned us':>10} {'triton/planned':>14}"
          + "".join(f" {col + ' us':>{len(col) + 3}}" for col in triton_op))
    for r in rows:
        print(f"{r['call']:<32} {r['triton']:9.1f} {r['cached']:9.1f} {r['bound']:9.1f} {r['planned']:10.1f}"
              f" {r['triton'] / r['planned']:13.2f}x"
              + "".join(f" {r[col]:{len(col) + 3}.1f}" if col in r else " " * (len(col) + 4) for col in triton_op))
    gemms = {}
    for name, fn in gemm_calls().items():
        gemms[name] = min(us_per_call(fn) for _ in range(2))
        print(f"{name:<40} {gemms[name]:9.1f} us")
    for col, equal in bit_equal.items():
        if isinstance(equal, bool):
            print(f"{col}: output {'equals' if equal else 'DIFFERS from'} the op's, bit for bit")
        else:
            print(f"{col}: not measured: {equal}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.date.today().isoformat(), "unit": "us of host time per call",
                   "rows": rows, "bit_equal": bit_equal, "gemms": gemms}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
