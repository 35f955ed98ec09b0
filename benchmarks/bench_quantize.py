"""Bandwidth of every MXFP8 quantizer against a device-to-device copy measured in the same run.

    python benchmarks/bench_quantize.py [--out benchmarks/results/quantize_h200.json] [--quick]

Bytes counted: each input element read once, each output element (data, scales) written once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from mxfp8_inductor.kernels import triton_mx as tri  # noqa: E402
from shapes import SHAPES, TOKENS, uneven_counts  # noqa: E402

def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def cases(x_MK: torch.Tensor, offs: torch.Tensor, w_ENK: torch.Tensor):
    """(kernel name, callable, bytes moved) for one activation and one weight tensor."""
    b_EKN = w_ENK.transpose(-2, -1)
    q = tri.quantize_rows_blocked(x_MK, offs)
    g = tri.quantize_groups_blocked(x_MK, offs)
    wk = tri.quantize_weight_blocked(w_ENK)
    yield "rows_1x32_blocked", lambda: tri.quantize_rows_blocked(x_MK, offs), nbytes(x_MK, *q)
    yield "groups_along_tokens_blocked", lambda: tri.quantize_groups_blocked(x_MK, offs), nbytes(x_MK, *g[:2])
    yield "weights_along_K_blocked", lambda: tri.quantize_weight_blocked(w_ENK), nbytes(w_ENK, *wk)
    yield "weights_along_N_blocked", lambda: tri.quantize_weight_blocked(b_EKN), nbytes(w_ENK, *wk)
    yield "qdq_rows", lambda: tri.quantize_dequantize(x_MK, -1), 2 * nbytes(x_MK)
    yield "qdq_groups_along_tokens", lambda: tri.quantize_dequantize_groups(x_MK, offs), 2 * nbytes(x_MK)
    yield "qdq_weights_along_K", lambda: tri.quantize_dequantize(b_EKN, 1), 2 * nbytes(w_ENK)
    yield "qdq_weights_along_N", lambda: tri.quantize_dequantize(b_EKN, 2), 2 * nbytes(w_ENK)


def sweep() -> None:
    """Fraction of copy bandwidth per tile shape (blocks per program, columns, warps) for the
    contiguous-dim case (qdq along K) and the strided case (qdq along tokens per group)."""
    x = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([16384], dtype=torch.int32, device="cuda")
    dst = torch.empty_like(x)
    copy_ms = do_bench(lambda: dst.copy_(x), return_mode="median")
    cases = {True: lambda: tri.quantize_dequantize(x, -1), False: lambda: tri.quantize_dequantize_groups(x, offs)}
    configs = {True: [(2, 32, 4), (4, 32, 4), (4, 64, 8), (8, 16, 4), (8, 32, 8), (16, 16, 8)],
               False: [(1, 128, 4), (1, 256, 8), (2, 128, 8), (4, 64, 4), (1, 64, 1), (1, 128, 1),
                       (1, 64, 2), (1, 128, 2), (1, 256, 2), (2, 64, 2), (2, 128, 4), (1, 256, 4)]}
    default = dict(tri.TILES)
    for contiguous, fn in cases.items():
        for cfg in configs[contiguous]:
            tri.TILES[contiguous] = cfg
            ms = do_bench(fn, return_mode="median")
            print(f"contiguous={contiguous!s:<5} tile={cfg} {copy_ms / ms:5.2f}x copy", flush=True)
        tri.TILES[contiguous] = default[contiguous]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/quantize_h200.json")
    p.add_argument("--quick", action="store_true", help="16384x16384 only")
    p.add_argument("--sweep", action="store_true", help="time tile shapes of the quantize kernel, then exit")
    args = p.parse_args()
    if args.sweep:
        sweep()
        return
    src = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    copy_GBps = 2 * nbytes(src) / copy_ms / 1e6
    rows = []
    problems = {"16384x16384": (src, torch.tensor([16384], dtype=torch.int32, device="cuda"),
                                src.view(1, 16384, 16384))}
    if not args.quick:
        for name, (E, D, F) in SHAPES.items():
            offs = torch.cumsum(uneven_counts(E, TOKENS), 0, dtype=torch.int32)
            problems[name] = (torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16), offs,
                              torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16))
    for shape, (x, offs, w) in problems.items():
        for kernel, fn, moved in cases(x, offs, w):
            ms = do_bench(fn, return_mode="median")
            GBps = moved / ms / 1e6
            rows.append({"kernel": kernel, "shape": shape, "ms": ms, "GBps": GBps, "fraction_of_copy": GBps / copy_GBps})
            print(f"{shape:>12} {kernel:<30} {ms:8.3f} ms {GBps:8.0f} GB/s {GBps / copy_GBps:6.2f}x copy", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "copy_GBps": copy_GBps, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"copy {copy_GBps:.0f} GB/s; wrote {args.out}")


if __name__ == "__main__":
    main()
