"""In which order should the quantizer programs walk their tiles? Fraction of copy bandwidth of
every `bench_quantize.py` case per program order of the MXFP8 quantizer: the 2-D grid (band 0: row strips fastest, so
the programs in flight read one column strip of many rows) or bands of 1, 2, 4 or 16 row strips
walked column strip by column strip (the programs in flight read whole rows); then, at the best
band, other tiles of the kernels that read across rows.

    python benchmarks/probe_band_order.py [--out benchmarks/results/band_order_h200.json]
"""

from __future__ import annotations

import argparse
import sys

from triton.testing import do_bench

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from bench_quantize import cases, copy_rate, problems, save  # noqa: E402
from mxfp8_inductor.kernels import triton_mx as tri  # noqa: E402

BANDS = (0, 1, 2, 4, 16)
OTHER_TILES = {"cols": [(2, 64, 1, 2), (1, 64, 1, 2), (2, 128, 1, 4), (4, 64, 1, 4), (1, 128, 2, 4)],
               "one_group": [(1, 128, 1, 2), (1, 64, 2, 2), (4, 64, 1, 4), (2, 128, 1, 4)],
               "groups": [(1, 64, 1, 2), (2, 64, 1, 2), (1, 128, 2, 4), (1, 64, 8, 2)]}


def set_band(band: int) -> None:
    for key, tile in tri.TILES.items():
        tri.TILES[key] = (*tile[:4], band)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/band_order_h200.json")
    p.add_argument("--shapes", default="16384x16384,dsv3,qwen3_30b,fine64")
    args = p.parse_args()
    copy_GBps = copy_rate()
    default = dict(tri.TILES)
    rows = []
    probs = problems(args.shapes.split(","))
    for band in BANDS:
        set_band(band)
        for shape, (x, offs, w) in probs.items():
            for kernel, fn, moved in cases(x, offs, w):
                ms = do_bench(fn, return_mode="median")
                frac = moved / ms / 1e6 / copy_GBps
                rows.append({"phase": "band", "band": band, "kernel": kernel, "shape": shape, "ms": ms,
                             "fraction_of_copy": frac})
                print(f"band={band:<3} {shape:>12} {kernel:<30} {ms:8.3f} ms {frac:6.2f}x copy", flush=True)
    # other tiles of the across-rows kernels, on the 2-D grid and in bands of 1 and 4 row strips
    for band in (0, 1, 4):
        for key, tiles in OTHER_TILES.items():
            for tile in tiles:
                tri.TILES.update(default)
                tri.TILES[key] = (*tile, band)
                for shape in ("16384x16384", "dsv3", "fine64"):
                    if shape not in probs:
                        continue
                    x, offs, w = probs[shape]
                    G = offs.numel()
                    if (key == "groups") != (G > 1):
                        continue
                    for kernel, fn, moved in cases(x, offs, w):
                        if key == "cols" and kernel not in ("qdq_weights_along_N", "weights_along_N_blocked"):
                            continue
                        if key != "cols" and kernel not in ("qdq_groups_along_tokens", "groups_along_tokens_blocked"):
                            continue
                        ms = do_bench(fn, return_mode="median")
                        frac = moved / ms / 1e6 / copy_GBps
                        rows.append({"phase": "tile", "band": band, "tile": tile, "kernel": kernel, "shape": shape,
                                     "ms": ms, "fraction_of_copy": frac})
                        print(f"tile={tile} band={band} {shape:>12} {kernel:<30} {frac:6.2f}x copy", flush=True)
    tri.TILES.update(default)
    print("\nfraction of copy per band (columns)")
    print(f"{'shape':>12} {'kernel':<30}" + "".join(f"{b:>7}" for b in BANDS))
    for shape in probs:
        for kernel, _, _ in cases(*probs[shape]):
            fr = {r["band"]: r["fraction_of_copy"] for r in rows
                  if r["phase"] == "band" and r["kernel"] == kernel and r["shape"] == shape}
            print(f"{shape:>12} {kernel:<30}" + "".join(f"{fr[b]:7.2f}" for b in BANDS))
    save(args.out, copy_GBps, rows)


if __name__ == "__main__":
    main()
