"""The MXFP8 quantizers and the rowwise weight-gradient quantizer of this tree
against those of another commit, timed side by side in one run (interleaved rounds, do_bench
medians) with outputs checked bit-equal.

    git show COMMIT:mxfp8_inductor/kernels/triton_mx.py > /tmp/base/triton_mx.py  # likewise
    #   reference.py, launch.py, rowwise.py, triton_rowwise.py, and an empty __init__.py
    python benchmarks/probe_baseline_kernels.py --baseline /tmp/base --out benchmarks/results/X.json
    python benchmarks/probe_baseline_kernels.py --baseline /tmp/base --host --out ...  (any machine)

A kernel change is kept on this probe's ratio, not on tables from different runs (--cudagraph
where a call's host work outlasts its kernels: replays then time the GPU alone). --host times
the host work of each call instead (our Python between the caller and the GPU, which sets the
step time of small, host-bound MoE blocks), on small inputs of the default device: on a GPU with
the launches (each tree's own `launch.py`), elsewhere with the launches stubbed out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import types

import torch
import triton
from triton.testing import do_bench

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_launch import us_per_call  # noqa: E402
from mxfp8_inductor.kernels import triton_mx, triton_rowwise  # noqa: E402
from shapes import SHAPES, TOKENS, uneven_counts  # noqa: E402


def load_baseline(path: pathlib.Path) -> types.SimpleNamespace:
    """`path`'s kernel modules imported as a package of their own (relative imports stay inside)."""
    spec = importlib.util.spec_from_file_location("baseline_kernels", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["baseline_kernels"] = pkg
    spec.loader.exec_module(pkg)
    return types.SimpleNamespace(mx=importlib.import_module("baseline_kernels.triton_mx"),
                                 rw=importlib.import_module("baseline_kernels.triton_rowwise"))


def cases() -> dict[str, tuple[torch.Tensor, object]]:
    out = {}
    problems = {"16384x16384": (16384, 16384, 1)}
    for shape in ("l4scout", "dsv3", "qwen3_30b", "fine64"):
        problems[f"{shape} tokens"] = (TOKENS, SHAPES[shape][1], SHAPES[shape][0])
    for name, (M, K, G) in problems.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        o = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)
        out[f"qdq_groups_along_tokens {name} G={G}"] = (x, lambda m, x=x, o=o: m.mx.quantize_dequantize_groups(x, o))
        out[f"rowwise_groups_along_tokens {name} G={G}"] = (x, lambda m, x=x, o=o: m.rw.quantize_groups(x, o))
        out[f"groups_along_tokens_blocked {name} G={G}"] = (x, lambda m, x=x, o=o: m.mx.quantize_groups_blocked(x, o))
    x = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    out["qdq_along_rows 16384x16384"] = (x, lambda m, x=x: m.mx.quantize_dequantize(x, 0))
    out["qdq_along_K 16384x16384"] = (x, lambda m, x=x: m.mx.quantize_dequantize(x, 1))
    for shape, (E, D, F) in SHAPES.items():  # w1's [E, F, D] as the [E, K, N] view the GEMM takes
        b_EKN = torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        out[f"qdq_weights_along_N {shape}"] = (b_EKN, lambda m, b=b_EKN: m.mx.quantize_dequantize(b, 2))
        out[f"weights_along_N_blocked {shape}"] = (b_EKN, lambda m, b=b_EKN: m.mx.quantize_weight_blocked(b))
    return out


def as_bytes(out) -> list[torch.Tensor]:
    """An output, or a tuple of them, as bytes: torch.equal then compares bits (NaN included)."""
    return [t.contiguous().view(torch.uint8) for t in (out if isinstance(out, tuple) else (out,))]


def host_cases() -> dict[str, object]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(512, 512, device=device, dtype=torch.bfloat16)
    offs = {G: torch.cumsum(torch.full((G,), 512 // G), 0, dtype=torch.int32).to(device) for G in (1, 8, 64)}
    out = {"quantize_dequantize along K": lambda m: m.mx.quantize_dequantize(x, 1),
           "quantize_dequantize across rows": lambda m: m.mx.quantize_dequantize(x, 0)}
    out.update({f"quantize_dequantize_groups G={G}": (lambda m, o=o: m.mx.quantize_dequantize_groups(x, o))
                for G, o in offs.items()})
    out["rowwise quantize_groups G=8"] = lambda m: m.rw.quantize_groups(x, offs[8])
    out["quantize_rows_blocked G=8"] = lambda m: m.mx.quantize_rows_blocked(x, offs[8])
    out["quantize_groups_blocked G=8"] = lambda m: m.mx.quantize_groups_blocked(x, offs[8])
    return out


def host(mods: dict, rounds: int) -> list[dict]:
    if not torch.cuda.is_available():  # the interpreter would time the kernels
        for m in mods.values():
            m.mx.launch = m.rw.launch = lambda kernel, grid, *args, **kwargs: None
    rows = []
    for name, fn in host_cases().items():
        us = {k: [] for k in mods}
        for _ in range(rounds):
            for k, m in mods.items():
                us[k].append(us_per_call(lambda: fn(m), calls=20000, warmup=1000))
        row = {"case": name, **{f"{k} us": min(v) for k, v in us.items()}}  # a busy host only adds time
        row["this tree / baseline"] = row["this tree us"] / row["baseline us"]
        rows.append(row)
        print(f"{name:<36} baseline {row['baseline us']:6.2f}  this tree {row['this tree us']:6.2f} us"
              f"  ratio {row['this tree / baseline']:.2f}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", type=pathlib.Path, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--host", action="store_true", help="host time per call (launches stubbed out without a GPU)")
    p.add_argument("--cudagraph", action="store_true",
                   help="time CUDA-graph replays: GPU time alone, for calls whose host work outlasts their kernels")
    p.add_argument("--only", default="", help="run the cases whose name this regular expression matches")
    args = p.parse_args()
    mods = {"baseline": load_baseline(args.baseline),
            "this tree": types.SimpleNamespace(mx=triton_mx, rw=triton_rowwise)}
    if args.host:
        rows = host(mods, args.rounds)
        machine = f"{platform.machine()} CPU, {os.cpu_count()} cores" + (
            f", {torch.cuda.get_device_name()} (launches timed)" if torch.cuda.is_available() else ", launches stubbed")
        args.out.write_text(json.dumps({"machine": machine, "torch": torch.__version__, "triton": triton.__version__,
                                        "date": datetime.date.today().isoformat(), "unit": "us of host time per call",
                                        "baseline": str(args.baseline), "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
        return
    rows = []
    bench = triton.testing.do_bench_cudagraph if args.cudagraph else do_bench
    for name, (x, fn) in cases().items():
        if not re.search(args.only, name):
            continue
        outs = [as_bytes(fn(m)) for m in mods.values()]
        dst = torch.empty_like(x)
        copy_ms = do_bench(lambda: dst.copy_(x), return_mode="median")
        ms = {k: [] for k in mods}
        for _ in range(args.rounds):
            for k, m in mods.items():
                ms[k].append(bench(lambda: fn(m), return_mode="median"))
        row = {"case": name, "copy_ms": copy_ms, "bit_equal": all(map(torch.equal, *outs)),
               **{f"{k} ms": statistics.median(v) for k, v in ms.items()}}
        row["this tree / baseline"] = row["this tree ms"] / row["baseline ms"]
        rows.append(row)
        print(f"{name:<44} copy {copy_ms:.3f}  baseline {row['baseline ms']:.3f}"
              f"  this tree {row['this tree ms']:.3f} ms  ratio {row['this tree / baseline']:.2f}"
              f"  bit-equal {row['bit_equal']}", flush=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__, "date": datetime.date.today().isoformat(),
                                    "baseline": str(args.baseline), "timer": bench.__name__, "rows": rows},
                                   indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
