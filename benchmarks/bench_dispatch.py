"""Host time of one call into an op with an empty body, by how the op is registered: why the
quantizer and FP8 GEMM ops use torch.library.define/impl rather than torch.library.custom_op.

    python benchmarks/bench_dispatch.py [--out benchmarks/results/dispatch_<host>.json]

Compiled graphs call these ops once per GEMM operand per step; on a small MoE block the calls,
not the kernels, set the step time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import torch


def _empty(x: torch.Tensor, dim: int, rounding: str) -> torch.Tensor:
    return x.new_empty(0)


def _register() -> dict[str, object]:
    torch.library.define("bench_dispatch::defined", "(Tensor x, int dim, str rounding) -> Tensor")
    torch.library.impl("bench_dispatch::defined", "default", _empty)
    custom = torch.library.custom_op("bench_dispatch::custom", mutates_args=())(_empty)
    return {"torch.library.define + impl": torch.ops.bench_dispatch.defined.default,
            "torch.library.custom_op": custom._opoverload, "plain Python call": _empty}


def us_per_call(fn, x: torch.Tensor, calls: int = 20000) -> float:
    for _ in range(1000):
        fn(x, -1, "rceil")
    start = time.perf_counter()
    for _ in range(calls):
        fn(x, -1, "rceil")
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON path (default: benchmarks/results/dispatch_<machine>.json)")
    args = p.parse_args()
    x = torch.empty(4096, 2048, dtype=torch.bfloat16)
    rows = [{"registration": name, "us_per_call": us_per_call(fn, x)} for name, fn in _register().items()]
    base = rows[0]["us_per_call"]
    print(f"{'registration':<30} {'us/call':>8} {'vs define':>9}")
    for r in rows:
        print(f"{r['registration']:<30} {r['us_per_call']:8.2f} {r['us_per_call'] / base:8.2f}x")
    host = platform.processor() or platform.machine()
    out = args.out or f"benchmarks/results/dispatch_{platform.node() or 'host'}.json"
    with open(out, "w") as f:
        json.dump({"host": host, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                   "rows": rows}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
