"""Bandwidth of every MXFP8 quantizer and of the fp8_rowwise weight-gradient quantizer, as a fraction
of a device-to-device copy measured in the same run; or, with --sweep / --sweep-rowwise, the same
per tile shape, which is how the kernels' tiles were chosen; or, with --rowwise-paths, the
fp8_rowwise weight-gradient quantizer's one-kernel (persistent, and a program per slab) and
two-kernel paths side by side, which is how `triton_rowwise.GROUPS_KERNEL_MIN_GROUPS` was chosen;
or, with --transpose, the FP8 byte transpose of each benchmark model's expert weights (the input
gradient's orientation of the weight cache's one form) by `triton_transpose.contiguous` beside
torch's `.contiguous()`.

    python benchmarks/bench_quantize.py [--out benchmarks/results/quantize_h200.json] [--quick]
    python benchmarks/bench_quantize.py --sweep | --sweep-rowwise
    python benchmarks/bench_quantize.py --rowwise-paths [--out benchmarks/results/rowwise_paths_h200.json]
    python benchmarks/bench_quantize.py --transpose [--out benchmarks/results/transpose_h200.json]

Bytes counted: each input element read once, each output element (data, scales) written once.
`do_bench` times the GPU, but a call whose host work outlasts its kernels shows the host.
"""

from __future__ import annotations

import argparse
import datetime
import json
from functools import partial

import torch
import triton
from shapes import MODEL_EXPERT_GEMMS, SHAPES, TOKENS, require_gpu, uneven_counts
from triton.testing import do_bench

from mxfp8_inductor.kernels import triton_mx as tri
from mxfp8_inductor.kernels import triton_rowwise, triton_transpose


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
    r = triton_rowwise.quantize_groups(x_MK, offs)
    yield "rowwise_group_amax", lambda: triton_rowwise.group_amax(x_MK, offs), nbytes(x_MK)
    yield "rowwise_groups_along_tokens", lambda: triton_rowwise.quantize_groups(x_MK, offs), nbytes(x_MK, *r[:2])
    yield "qdq_rows", lambda: tri.quantize_dequantize(x_MK, -1), 2 * nbytes(x_MK)
    yield "qdq_groups_along_tokens", lambda: tri.quantize_dequantize_groups(x_MK, offs), 2 * nbytes(x_MK)
    yield "qdq_weights_along_K", lambda: tri.quantize_dequantize(b_EKN, 1), 2 * nbytes(w_ENK)
    yield "qdq_weights_along_N", lambda: tri.quantize_dequantize(b_EKN, 2), 2 * nbytes(w_ENK)


def sweep() -> None:
    """Fraction of copy bandwidth per `tri.Tile` (blocks, columns, tiles, warps; the band of the
    default tile) of each `tri.TILES` case: blocks along the contiguous dim (qdq along K), across
    rows (qdq along the rows), across rows in one token group and in several (qdq per group along
    the tokens, at 1, 8, 16 and 64 groups), and across rows stored transposed (the native
    weight-gradient operand; at one group also the weights along N)."""
    probs = {"16384x16384 G=1": (16384, 16384, 1), "dsv3 x G=8": (TOKENS, 7168, 8),
             "qwen3_30b x G=16": (TOKENS, 2048, 16), "fine64 x G=64": (TOKENS, 2048, 64)}
    one_warp = [(2, 64, 1, 1), (1, 64, 1, 1), (1, 128, 1, 1), (2, 64, 2, 1)]
    configs = {
        "rows": [(8, 16, 1, 4), (4, 32, 2, 4), (4, 32, 1, 4), (4, 16, 1, 1), (8, 16, 1, 2), (2, 32, 1, 1)],
        "one_group": [(2, 64, 1, 2), (1, 128, 1, 2), (1, 64, 2, 2), (2, 64, 2, 2), (2, 128, 1, 4), (4, 64, 1, 4),
                      *one_warp],
        "cols": [(2, 64, 1, 2), (1, 64, 1, 2), (1, 64, 4, 2), (2, 128, 1, 4), (1, 128, 1, 2), (2, 64, 2, 2),
                 (4, 64, 1, 4), (2, 32, 1, 1), (1, 256, 1, 4), *one_warp],
        "groups": [(2, 64, 1, 2), (1, 64, 1, 2), (1, 64, 2, 2), (1, 64, 4, 2), (1, 64, 8, 2), (1, 32, 4, 1),
                   (1, 32, 1, 1), (1, 128, 1, 4), (1, 128, 2, 2), (1, 32, 8, 1), *one_warp, (1, 64, 4, 1)],
        "transposing": [(2, 64, 1, 1), (1, 64, 1, 1), (2, 64, 2, 1), (1, 128, 1, 2), (2, 64, 1, 2), (2, 32, 1, 1),
                        (4, 32, 1, 1), (2, 128, 1, 1)],
    }
    default = dict(tri.TILES)
    for name, (M, K, G) in probs.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)  # [M] for one group
        copy_ms = do_bench(partial(torch.empty_like(x).copy_, x), return_mode="median")
        qdq_groups = [("qdq", partial(tri.quantize_dequantize_groups, x, offs))]
        transposing = [("groups_along_tokens_blocked", partial(tri.quantize_groups_blocked, x, offs))]
        cases = {"groups": qdq_groups, "transposing": transposing}
        if G == 1:
            w_EKN = x.view(1, M, K).transpose(-2, -1)
            cases = {"rows": [("qdq", partial(tri.quantize_dequantize, x, -1))],
                     "cols": [("qdq", partial(tri.quantize_dequantize, x, 0))], "one_group": qdq_groups,
                     "transposing": [*transposing,
                                     ("weights_along_N_blocked", partial(tri.quantize_weight_blocked, w_EKN))]}
        for key, fns in cases.items():
            for cfg in configs[key]:
                tri.TILES[key] = tri.Tile(*cfg, band=default[key].band)
                for what, fn in fns:
                    ms = do_bench(fn, return_mode="median")
                    # per element a copy moves 2 + 2 bytes, a qdq as many, a quantizer 2 + 1 + 1/32
                    frac = copy_ms / ms * (1 if what == "qdq" else (2 + 1 + 1 / 32) / 4)
                    print(f"{name:<17} {key:<11} {what:<27} tile={cfg} {frac:5.2f}x copy", flush=True)
            tri.TILES[key] = default[key]


# (token rows M, features K, token groups G) of the weight-gradient operands (the layer input x
# and the SwiGLU output h) of one microbatch of bench_models.py's models, and of SHAPES
ROWWISE_PROBS = {
    "16384x16384 G=1": (16384, 16384, 1), "qwen3 x G=128": (65536, 2048, 128), "qwen3 h G=128": (65536, 768, 128),
    "titan_dsv3 x G=64": (49152, 2048, 64), "fine64 x G=64": (TOKENS, 2048, 64), "gpt_oss G=32": (32768, 2880, 32),
    "dsv3_slice G=32": (65536, 7168, 32), "dsv3_slice h G=32": (65536, 2048, 32), "l4scout x G=16": (16384, 5120, 16),
    "qwen3_30b x G=16": (TOKENS, 2048, 16), "dsv3 x G=8": (TOKENS, 7168, 8), "mixtral x G=8": (16384, 4096, 8),
    "mixtral h G=8": (16384, 14336, 8),
}


def rowwise_paths(out: str) -> None:
    """Per `ROWWISE_PROBS` shape, the fp8_rowwise weight-gradient quantizer with its one kernel
    (its persistent grid, and a program per slab), and with its two (amax, then cast), checked to
    give the same bytes."""
    copy_GBps, rows = copy_rate(), []
    default = triton_rowwise.GROUPS_KERNEL_MIN_GROUPS, triton_rowwise.GROUPS_PER_SM
    paths = (("one_kernel", 0, default[1]), ("program_per_slab", 0, 10**6), ("two_kernels", 10**9, default[1]))
    for name, (M, K, G) in ROWWISE_PROBS.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)
        ms, outs = {}, {}
        for path, min_groups, per_sm in paths:
            triton_rowwise.GROUPS_KERNEL_MIN_GROUPS, triton_rowwise.GROUPS_PER_SM = min_groups, per_sm
            outs[path] = [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
                          for t in triton_rowwise.quantize_groups(x, offs)]
            ms[path] = do_bench(partial(triton_rowwise.quantize_groups, x, offs), return_mode="median")
        same = all(torch.equal(a, b) for p, *_ in paths for a, b in zip(outs[p], outs["two_kernels"]))
        moved = nbytes(x) + M * K + G * K * 4  # bf16 in, float8 data and float32 scales out
        row = {"shape": name, "M": M, "K": K, "G": G, "same_bytes": same,
               **{f"{p}_ms": t for p, t in ms.items()},
               **{f"{p}_fraction_of_copy": moved / t / 1e6 / copy_GBps for p, t in ms.items()}}
        rows.append(row)
        print(f"{name:<18} same={same} " + "  ".join(
            f"{p} {ms[p]:.4f} ms ({row[p + '_fraction_of_copy']:.2f}x copy)" for p, *_ in paths), flush=True)
    triton_rowwise.GROUPS_KERNEL_MIN_GROUPS, triton_rowwise.GROUPS_PER_SM = default
    save(out, copy_GBps, rows)


def transpose(out: str) -> None:
    """Per expert weight of `MODEL_EXPERT_GEMMS` ([E, N, K] float8, transposed to [E, K, N]
    contiguous), our byte transpose and torch's strided copy, checked to give the same bytes."""
    copy_GBps, rows = copy_rate(), []
    for model, (E, _, *gemms) in MODEL_EXPERT_GEMMS.items():
        for K, N in gemms:
            w_ENK = torch.randint(0, 256, (E, N, K), device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
            view_EKN = w_ENK.transpose(-2, -1)
            same = torch.equal(triton_transpose.contiguous(view_EKN).view(torch.uint8),
                               view_EKN.contiguous().view(torch.uint8))
            ms = {"ours": do_bench(partial(triton_transpose.contiguous, view_EKN), return_mode="median"),
                  "torch": do_bench(view_EKN.contiguous, return_mode="median")}
            row = {"model": model, "E": E, "K": K, "N": N, "same_bytes": same, **{f"{k}_ms": v for k, v in ms.items()},
                   **{f"{k}_fraction_of_copy": 2 * w_ENK.numel() / v / 1e6 / copy_GBps for k, v in ms.items()}}
            rows.append(row)
            print(f"{model:<16} {E}x{K}x{N} same={same} ours {ms['ours']:.4f} ms "
                  f"({row['ours_fraction_of_copy']:.2f}x copy)  torch {ms['torch']:.4f} ms "
                  f"({row['torch_fraction_of_copy']:.2f}x copy)", flush=True)
    save(out, copy_GBps, rows)


def sweep_rowwise() -> None:
    """Fraction of copy bandwidth per tile of the fp8_rowwise weight-gradient quantizer's paths:
    at many token groups (those of bench_moe_block.py's fine-grained models) its one kernel per
    `triton_rowwise.GROUPS_TILE` (rows per load, features per program, warps, stages) and
    `GROUPS_PER_SM` (programs per SM); at few its amax kernel (rows per program, rows per load,
    columns, warps) and cast kernel (features per block, blocks per program, warps)."""
    many = {k: ROWWISE_PROBS[k] for k in ("qwen3 x G=128", "qwen3 h G=128", "gpt_oss G=32", "dsv3_slice G=32")}
    few = {k: ROWWISE_PROBS[k] for k in ("16384x16384 G=1", "dsv3 x G=8", "mixtral x G=8")}
    tiles = [(64, 64, 2, 4), (128, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (64, 32, 4, 4), (32, 64, 2, 3),
             (64, 32, 2, 4), (64, 64, 2, 3), (64, 64, 1, 4), (32, 64, 1, 4), (128, 64, 2, 4), (64, 128, 2, 4)]
    amax_tiles = [(256, 64, 64, 4), (256, 32, 128, 4), (512, 64, 64, 4), (256, 64, 128, 8), (128, 64, 64, 4),
                  (512, 32, 128, 8), (1024, 64, 64, 4)]
    cast_tiles = [(128, 8, 4), (128, 4, 4), (64, 8, 4), (64, 16, 4), (256, 4, 4), (256, 4, 8), (128, 16, 4),
                  (128, 8, 8)]
    default = list(triton_rowwise.GROUPS_TILE), list(triton_rowwise.AMAX_TILE), list(triton_rowwise.CAST_TILE)
    default_per_sm = triton_rowwise.GROUPS_PER_SM
    for name, (M, K, G) in {**many, **few}.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(uneven_counts(G, M), 0, dtype=torch.int32)
        copy_ms = do_bench(partial(torch.empty_like(x).copy_, x), return_mode="median")
        quantize = partial(triton_rowwise.quantize_groups, x, offs)
        if name in many:
            for tile in tiles:
                triton_rowwise.GROUPS_TILE[:] = tile
                for per_sm in (1, 2, 4, 8):
                    triton_rowwise.GROUPS_PER_SM = per_sm
                    ms = do_bench(quantize, return_mode="median")
                    # per element a copy moves 2 + 2 bytes, the quantizer 2 + 1
                    print(f"{name:<16} tile={tile} per_sm={per_sm} {ms:7.3f} ms {copy_ms * 0.75 / ms:5.2f}x copy",
                          flush=True)
            triton_rowwise.GROUPS_PER_SM = default_per_sm
            continue
        amax = partial(triton_rowwise.group_amax, x, offs)
        for tile in amax_tiles:
            triton_rowwise.AMAX_TILE[:] = tile
            ms = do_bench(amax, return_mode="median")
            print(f"{name:<16} amax tile={tile} {ms:7.3f} ms {copy_ms / 2 / ms:5.2f}x copy", flush=True)
        triton_rowwise.AMAX_TILE[:] = default[1]
        amax_ms = do_bench(amax, return_mode="median")
        for tile in cast_tiles:  # this path runs the amax kernel, then the cast
            triton_rowwise.CAST_TILE[:] = tile
            ms = do_bench(quantize, return_mode="median") - amax_ms
            print(f"{name:<16} cast tile={tile} {ms:7.3f} ms {copy_ms * 0.75 / ms:5.2f}x copy", flush=True)
        triton_rowwise.CAST_TILE[:] = default[2]
    triton_rowwise.GROUPS_TILE[:] = default[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="result file (default benchmarks/results/quantize_h200.json, with "
                   "--rowwise-paths benchmarks/results/rowwise_paths_h200.json)")
    p.add_argument("--quick", action="store_true", help="16384x16384 only")
    p.add_argument("--sweep", action="store_true", help="time tile shapes of the quantize kernel, then exit")
    p.add_argument("--sweep-rowwise", action="store_true", help="the same for the rowwise weight-gradient quantizer")
    p.add_argument("--rowwise-paths", action="store_true",
                   help="its one-kernel (both grids) and two-kernel paths side by side")
    p.add_argument("--transpose", action="store_true", help="the FP8 weights' byte transpose, ours and torch's")
    args = p.parse_args()
    require_gpu()
    if args.sweep or args.sweep_rowwise:
        sweep() if args.sweep else sweep_rowwise()
        return
    if args.rowwise_paths:
        rowwise_paths(args.out or "benchmarks/results/rowwise_paths_h200.json")
        return
    if args.transpose:
        transpose(args.out or "benchmarks/results/transpose_h200.json")
        return
    copy_GBps = copy_rate()
    rows = []
    for shape, (x, offs, w) in problems(["16384x16384"] + ([] if args.quick else list(SHAPES))).items():
        for kernel, fn, moved in cases(x, offs, w):
            ms = do_bench(fn, return_mode="median")
            GBps = moved / ms / 1e6
            rows.append({"kernel": kernel, "shape": shape, "ms": ms, "GBps": GBps,
                         "fraction_of_copy": GBps / copy_GBps})
            print(f"{shape:>12} {kernel:<30} {ms:8.3f} ms {GBps:8.0f} GB/s {GBps / copy_GBps:6.2f}x copy", flush=True)
    save(args.out or "benchmarks/results/quantize_h200.json", copy_GBps, rows)


def copy_rate() -> float:
    """GB/s (bytes read + written) of a device-to-device copy of a 16384x16384 bf16 tensor."""
    src = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * nbytes(src) / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6


def problems(names: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(tokens x, group ends, weights w) per name: "16384x16384" (one group; w is x as one
    [1, 16384, 16384] expert) or a MoE shape of `SHAPES` (uneven groups of TOKENS tokens)."""
    out = {}
    for name in names:
        if name == "16384x16384":
            x = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
            out[name] = (x, torch.tensor([16384], dtype=torch.int32, device="cuda"), x.view(1, 16384, 16384))
        else:
            E, D, F = SHAPES[name]
            out[name] = (torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16),
                         torch.cumsum(uneven_counts(E, TOKENS), 0, dtype=torch.int32),
                         torch.randn(E, F, D, device="cuda", dtype=torch.bfloat16))
    return out


def save(path: str, copy_GBps: float, rows: list[dict]) -> None:
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "copy_GBps": copy_GBps, "rows": rows}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"copy {copy_GBps:.0f} GB/s; wrote {path}")


if __name__ == "__main__":
    main()
