"""The MXFP8 quantize-dequantize kernels of this tree against those of another commit, timed side
by side in one run (interleaved rounds, do_bench medians) with outputs checked bit-equal.

    git show COMMIT:mxfp8_inductor/kernels/triton_mx.py > /tmp/base/triton_mx.py  # likewise
    #   reference.py and launch.py (where COMMIT has it), and an empty __init__.py
    python benchmarks/probe_baseline_kernels.py --baseline /tmp/base --out benchmarks/results/X.json

A kernel change is kept on this probe's ratio, not on tables from different runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pathlib
import statistics
import sys

import torch
import triton
from triton.testing import do_bench

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from mxfp8_inductor.kernels import triton_mx  # noqa: E402
from shapes import SHAPES, TOKENS, uneven_counts  # noqa: E402


def load_baseline(path: pathlib.Path):
    """`path`/triton_mx.py imported as a package of its own (its relative imports stay inside)."""
    spec = importlib.util.spec_from_file_location("baseline_kernels", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["baseline_kernels"] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module("baseline_kernels.triton_mx")


def cases() -> dict[str, tuple[torch.Tensor, object]]:
    out = {}
    problems = {"16384x16384": (16384, 16384, 1)}
    problems.update({f"{s} tokens": (TOKENS, SHAPES[s][1], SHAPES[s][0]) for s in ("l4scout", "dsv3", "fine64")})
    for name, (M, K, G) in problems.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)
        out[f"qdq_groups_along_tokens {name} G={G}"] = (x, lambda m, x=x, o=offs: m.quantize_dequantize_groups(x, o))
    x = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    out["qdq_along_rows 16384x16384"] = (x, lambda m, x=x: m.quantize_dequantize(x, 0))
    out["qdq_along_K 16384x16384"] = (x, lambda m, x=x: m.quantize_dequantize(x, 1))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", type=pathlib.Path, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    mods = {"baseline": load_baseline(args.baseline), "this tree": triton_mx}
    rows = []
    for name, (x, fn) in cases().items():
        outs = [fn(m).view(torch.uint8) for m in mods.values()]
        dst = torch.empty_like(x)
        copy_ms = do_bench(lambda: dst.copy_(x), return_mode="median")
        ms = {k: [] for k in mods}
        for _ in range(args.rounds):
            for k, m in mods.items():
                ms[k].append(do_bench(lambda: fn(m), return_mode="median"))
        row = {"case": name, "copy_ms": copy_ms, "bit_equal": torch.equal(*outs),
               **{f"{k} ms": statistics.median(v) for k, v in ms.items()}}
        row["this tree / baseline"] = row["this tree ms"] / row["baseline ms"]
        rows.append(row)
        print(f"{name:<44} copy {copy_ms:.3f}  baseline {row['baseline ms']:.3f}  this tree {row['this tree ms']:.3f} ms"
              f"  ratio {row['this tree / baseline']:.2f}  bit-equal {row['bit_equal']}", flush=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__, "date": datetime.date.today().isoformat(),
                                    "baseline": str(args.baseline), "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
