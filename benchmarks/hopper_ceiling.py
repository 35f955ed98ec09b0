"""The most an FP8 recipe can gain per layer on this GPU, from measured GEMM rates and layer times.

    python benchmarks/hopper_ceiling.py [--rates benchmarks/results/grouped_gemm_rates_h200.json]
        [--models benchmarks/results/models_h200.json] [--copy-tbps 4.15]

For each benchmark model whose expert GEMMs the rate table covers, per layer and training step
(`bench_models.py`: its microbatches, forward and backward): the bf16 layer time measured in the
models file; the expert GEMMs' time in bf16 and in FP8 at the table's rates (the faster of the two
FP8 kernels per GEMM); the quantization's bytes at the copy rate, with each activation operand read
once and written once in FP8 (rows for the forward and input gradient, token groups for the weight
gradient, plus a read for the groups' amax) and each expert weight read once and written once
per step in its one FP8 form, then byte-transposed for the input gradient in every microbatch
(the weight cache), or read and written once per microbatch for each orientation (without
it). Ceilings: bf16 layer time over the layer with FP8 GEMMs and that quantization;
"producers" with every activation operand written in FP8 by the kernel that produces it (one
byte per element for its rows and one for its token groups, nothing read back: scales local to
a tile, `docs/design.md`, "Where the operands are quantized") and the weights cached; "free"
with no quantization at all. Then each measured auto and fp8_rowwise row (experts only: no
"+all") against them.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from shapes import MICROBATCHES as mb
from shapes import MODEL_EXPERT_GEMMS


def _rate(rates: list[dict], role: str, rows: int, K: int, N: int) -> tuple[float, float]:
    """(bf16, best FP8) TFLOP/s of one GEMM, measured at the nearest rows per group at or below
    `rows` (fewer rows per group run no faster)."""
    hits = [r for r in rates if r["role"] == role and (r["K"], r["N"]) == (K, N) and r["rows_per_group"] <= rows]
    if not hits:
        raise KeyError((role, K, N))
    r = max(hits, key=lambda r: r["rows_per_group"])
    return r["bf16_tflops"], max(v for k, v in r.items() if k.startswith("fp8_"))


def ceiling(model: str, rates: list[dict], layer_ms: float, copy_tbps: float) -> dict:
    E, M, w13, w2 = MODEL_EXPERT_GEMMS[model]
    bf16_ms = fp8_ms = 0.0
    act_elems = weight_elems = 0
    for K, N in (w13, w2):
        flops = 2 * M * K * N * mb
        # forward (K, N), input gradient (N, K), weight gradient (K, N), as the rate table lists them
        for role, k, n in (("forward", K, N), ("dgrad", N, K), ("wgrad", K, N)):
            bf16, fp8 = _rate(rates, role, M // E, k, n)
            bf16_ms += flops / bf16 / 1e9
            fp8_ms += flops / fp8 / 1e9
        # the GEMM's input (M x K) and output gradient (M x N)
        act_elems += M * (K + N) * mb
        weight_elems += E * K * N
    # bytes per activation element: as passes, rows 3 (read, write) and token groups 5 (read,
    # write, amax read); written by their producers, 1 each
    act_bytes, act_producers_bytes = act_elems * (3 + 5), act_elems * (1 + 1)
    # a cached weight: bf16 read and FP8 written once per step, the FP8 form read and its
    # transpose written once per microbatch
    cached_weight_bytes = weight_elems * (3 + 2 * mb)
    quant_cached_ms = (act_bytes + cached_weight_bytes) / copy_tbps / 1e9
    quant_producers_ms = (act_producers_bytes + cached_weight_bytes) / copy_tbps / 1e9
    quant_uncached_ms = (act_bytes + weight_elems * 6 * mb) / copy_tbps / 1e9
    rest = layer_ms - bf16_ms
    return dict(model=model, layer_ms=layer_ms, bf16_gemm_ms=bf16_ms, fp8_gemm_ms=fp8_ms,
                quant_cached_ms=quant_cached_ms, quant_uncached_ms=quant_uncached_ms,
                quant_producers_ms=quant_producers_ms, ceiling_free=layer_ms / (rest + fp8_ms),
                ceiling_producers=layer_ms / (rest + fp8_ms + quant_producers_ms),
                ceiling_cached=layer_ms / (rest + fp8_ms + quant_cached_ms),
                ceiling_uncached=layer_ms / (rest + fp8_ms + quant_uncached_ms))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    results = pathlib.Path("benchmarks/results")
    p.add_argument("--rates", type=pathlib.Path, default=results / "grouped_gemm_rates_h200.json")
    p.add_argument("--models", type=pathlib.Path, default=results / "models_h200.json")
    p.add_argument("--copy-tbps", type=float, default=4.15, help="the GPU's copy rate, TB/s")
    args = p.parse_args()
    rates = json.loads(args.rates.read_text())["rows"]
    rows = json.loads(args.models.read_text())["rows"]
    layers = {r["model"]: r["layer_ms"] for r in rows if r["variant"] == "bf16"}
    ceilings = {}
    for model in MODEL_EXPERT_GEMMS:
        if model not in layers:
            continue
        try:
            ceilings[model] = ceiling(model, rates, layers[model], args.copy_tbps)
        except KeyError:  # an expert GEMM the rate table does not hold
            continue
    print("| model | bf16 layer ms | expert GEMMs bf16 / FP8 ms | quantization ms, producers / cache / none | "
          "ceiling: free / producers / cache / none |")
    print("|---|---|---|---|---|")
    for model, c in ceilings.items():
        print(f"| {model} | {c['layer_ms']:.1f} | {c['bf16_gemm_ms']:.1f} / {c['fp8_gemm_ms']:.1f} | "
              f"{c['quant_producers_ms']:.1f} / {c['quant_cached_ms']:.1f} / {c['quant_uncached_ms']:.1f} | "
              f"{c['ceiling_free']:.3f}x / {c['ceiling_producers']:.3f}x / {c['ceiling_cached']:.3f}x / "
              f"{c['ceiling_uncached']:.3f}x |")
    # the measured per-layer ratios of the recipes that can be held to these ceilings: FP8 experts,
    # dense linears in bf16 (no "+all")
    print()
    print("| model | variant | measured per layer | of free ceiling | of its own ceiling (cache / none) |")
    print("|---|---|---|---|---|")
    for r in rows:
        c = ceilings.get(r["model"])
        if c is None or "+all" in r["variant"] or r["variant"].split("+")[0] not in ("auto", "fp8_rowwise"):
            continue
        own = c["ceiling_cached" if r["variant"].endswith("+cache") else "ceiling_uncached"]
        print(f"| {r['model']} | {r['variant']} | {r['speedup']:.3f}x | {r['speedup'] / c['ceiling_free']:.0%} | "
              f"{r['speedup'] / own:.0%} |")


if __name__ == "__main__":
    main()
