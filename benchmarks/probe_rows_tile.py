"""MXFP8 quantizer tiles for blocks along the contiguous dim (`triton_mx.TILES["rows"]`) at the MoE
shapes, where the 16384x16384 sweep (`bench_quantize.py --sweep`) does not decide: fraction of
copy of the quantize-dequantize of tokens and weights along K and of the native rows quantizer.

    python benchmarks/probe_rows_tile.py
"""
import sys

import torch
from triton.testing import do_bench
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from mxfp8_inductor.kernels import triton_mx as tri  # noqa: E402
from shapes import SHAPES, TOKENS, uneven_counts  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
src = torch.empty(1 << 28, dtype=torch.bfloat16, device=dev)
dst = torch.empty_like(src)
copy = 2 * src.numel() * 2 / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6
probs = {}
for name, (E, D, F) in SHAPES.items():
    w = torch.randn(E, F, D, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
    x = torch.randn(TOKENS, D, device=dev, dtype=torch.bfloat16)
    offs = torch.cumsum(uneven_counts(E, TOKENS), 0, dtype=torch.int32)
    probs[f"{name} qdq w along K"] = (lambda w=w: tri.quantize_dequantize(w, 1), 4 * w.numel())
    probs[f"{name} qdq x along K"] = (lambda x=x: tri.quantize_dequantize(x, -1), 4 * x.numel())
    probs[f"{name} rows_1x32_blocked"] = (lambda x=x, o=offs: tri.quantize_rows_blocked(x, o), 3 * x.numel())
for tile in [(8, 16, 1, 4), (4, 32, 2, 4), (4, 32, 1, 4), (8, 16, 2, 4), (2, 32, 1, 4)]:
    tri.TILES["rows"] = (*tile, 0)
    line = f"rows tile={tile}:"
    for name, (fn, moved) in probs.items():
        ms = do_bench(fn, return_mode="median")
        line += f" {name} {moved / ms / 1e6 / copy:.2f}"
    print(line, flush=True)
