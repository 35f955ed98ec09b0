"""Kernel time of the per-group MXFP8 quantize-dequantize (blocks across rows) per tile, and with
its column-tile loop unrolled (tl.static_range) or not, timed on CUDA graph replays: no host
time, which at the MoE shapes is longer than the kernels. Also the along-K rounding of the same
tensor and a device copy for scale.

    python benchmarks/probe_quantizer_tiles.py [--out benchmarks/results/quantizer_tiles_h200.json]

The unrolled variant is the module's source with its loop replaced, loaded as a second module,
so both compile and run side by side in one process.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pathlib
import sys
import tempfile

import torch
import triton

ROOT = pathlib.Path(__file__).parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from mxfp8_inductor.kernels import triton_mx as looped  # noqa: E402
from shapes import TOKENS, uneven_counts  # noqa: E402

PROBLEMS = {"16384x16384 G=1": (16384, 16384, 1), "qwen3_30b x G=16": (TOKENS, 2048, 16),
            "qwen3_30b h G=16": (TOKENS, 768, 16), "dsv3 x G=8": (TOKENS, 7168, 8), "fine64 x G=64": (TOKENS, 2048, 64)}
TILES = [None, (1, 64, 8, 2), (1, 64, 4, 4), (1, 128, 4, 4), (1, 128, 2, 4), (2, 64, 4, 4)]  # None: the default


def unrolled_module():
    src = pathlib.Path(looped.__file__).read_text()
    src = src.replace("for t in range(CITERS)", "for t in tl.static_range(CITERS)")
    src = src.replace("from . import reference as ref", "from mxfp8_inductor.kernels import reference as ref")
    path = pathlib.Path(tempfile.mkdtemp()) / "triton_mx_unrolled.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("triton_mx_unrolled", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/quantizer_tiles_h200.json")
    args = p.parse_args()
    bench = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=50)  # noqa: E731
    default = dict(looped.TILES)
    rows = []
    for name, (M, K, G) in PROBLEMS.items():
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)
        key = "many groups" if G > looped.MANY_GROUPS else "cols"
        want = looped.quantize_dequantize_groups(x, offs)
        copy_ms = bench(lambda: x.clone())
        line = f"{name:<17} copy {copy_ms:.4f} ms"
        for loop, mod in (("range", looped), ("static_range", unrolled_module())):
            along_k = bench(lambda: mod.quantize_dequantize(x, -1))
            line += f" | {loop}: along K {copy_ms / along_k:.2f}, per group"
            for tile in TILES:
                mod.TILES[key] = tile or default[key]
                assert torch.equal(mod.quantize_dequantize_groups(x, offs), want)
                ms = bench(lambda: mod.quantize_dequantize_groups(x, offs))
                rows.append({"problem": name, "loop": loop, "tile": mod.TILES[key], "default": tile is None,
                             "ms": ms, "copy_ms": copy_ms, "along_k_ms": along_k})
                line += f" {tile or 'default'} {copy_ms / ms:.2f}"
            mod.TILES.update(default)
        print(line, flush=True)
    print("(fractions of the copy's time; a copy reads and writes the tensor once, as these kernels do)")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.date.today().isoformat(), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
