"""The warp-specialized Gluon FP8 grouped GEMM (`kernels/gluon_fp8_gemm.py`) against torch's bf16
`_grouped_mm`, our `tl` kernel and, in the rowwise mode, torch's FP8 grouped GEMM
(`torch._scaled_grouped_mm`), side by side on this GPU, per role and mode.

    PYTHONPATH=. python benchmarks/bench_gluon_gemm.py [--shapes 128x512x2048x1536,...]
        [--roles forward,dgrad,wgrad] [--modes rowwise,blockwise] [--variants 0,1] [--rounds 3]
        [--out benchmarks/results/gluon_gemm_h100.json]

Shapes are EXRXKXN (experts, rows per group, K, N) of the forward GEMM, uniform groups, the roles
as `bench_moe_block.py --gemms` times them: the forward (x_MK @ w_EKN) and the input gradient (the
forward with K and N swapped) are M-grouped 2d-3d GEMMs; the weight gradient (grad_NM @ x_MK per
group, out [E, N, K]) is the K-grouped 2d-2d one. Modes: rowwise scales (fp8_rowwise) and
blockwise ones (fp8_blockwise: per 128 along the contraction), bf16 the baseline of both. The
default shapes are the fine-grained ones of issue 60. Per row, each Gluon variant
(`gluon_fp8_gemm.VARIANTS`), and torch's kernel, is first checked bit for bit against the `tl`
kernel on the same operands; then every kernel is timed by `triton.testing.do_bench` (median), taking turns over
--rounds rounds (`bench_moe_block.interleaved`), each call on the next of --sets operand sets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import torch
import triton
from bench_moe_block import interleaved
from shapes import card, require_gpu

from mxfp8_inductor.kernels import gluon_fp8_gemm, triton_fp8_gemm
from mxfp8_inductor.kernels.blockwise import SCALE_TILE, tiles

F8 = torch.float8_e4m3fn
FINE_SHAPES = "128x512x2048x1536,128x512x768x2048,64x512x2048x1536,64x512x1536x2048,64x1024x2048x1536,16x2048x2048x768"
ROLES = ("forward", "dgrad", "wgrad")
MODES = ("rowwise", "blockwise")


def _p2(*shape: int) -> torch.Tensor:
    """Power-of-two scales, as the recipes make them."""
    return torch.exp2(torch.randint(-4, 4, shape, device="cuda").float())


def operand_sets(role: str, mode: str, experts: int, rows: int, K: int, N: int, sets: int) -> list[dict]:
    """`sets` independent operand sets of one role: bf16 operands (randn) as torch's `_grouped_mm`
    takes them, their float8 casts as our kernels take them (b a transposed view) and scales."""
    M = experts * rows
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * rows
    blockwise = mode == "blockwise"
    out = []
    for _ in range(sets):
        if role == "wgrad":  # out [E, N, K] = grad_NM @ x_MK per group of M
            grad_NM = torch.randn(N, M, device="cuda", dtype=torch.bfloat16)
            x_MK = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            tiles_T = M // SCALE_TILE
            scales = (_p2(tiles_T, N), _p2(tiles_T, K)) if blockwise else (_p2(experts * N), _p2(experts * K))
            bf16 = (grad_NM, x_MK)
            fp8 = (grad_NM.to(F8), x_MK.t().contiguous().to(F8).t(), *scales, offs)
        else:
            k, n = (K, N) if role == "forward" else (N, K)
            x_MK = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
            w_ENK = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
            scales = (_p2(M, tiles(k)), _p2(experts, tiles(k), tiles(n))) if blockwise else (_p2(M), _p2(experts, n))
            bf16 = (x_MK, w_ENK.transpose(-2, -1))
            fp8 = (x_MK.to(F8), w_ENK.to(F8).transpose(-2, -1), *scales, offs)
        out.append({"bf16": bf16, "fp8": fp8, "offs": offs})
    return out


def rotating(fn, sets: list[dict]):
    """fn on the next operand set at every call: consecutive calls share no operand in L2."""
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(sets)
        return fn(sets[state["i"]])

    return call


def measure(role: str, mode: str, experts: int, rows: int, K: int, N: int, variants: list, rounds: int,
            sets: int) -> dict:
    ops = operand_sets(role, mode, experts, rows, K, N, sets)
    blockwise = mode == "blockwise"
    tl_mm = triton_fp8_gemm.blockwise_grouped_mm if blockwise else triton_fp8_gemm.scaled_grouped_mm
    kernels = {
        "bf16": lambda s: torch._grouped_mm(*s["bf16"], offs=s["offs"]),
        "tl": lambda s: tl_mm(*s["fp8"]),
    }
    if not blockwise:  # torch's rowwise FP8 grouped GEMM (CUTLASS), which `routes` takes for large groups
        kernels["torch"] = lambda s: torch._scaled_grouped_mm(*s["fp8"][:4], offs=s["offs"], out_dtype=torch.bfloat16)
    for i, cfg in variants:
        kernels[f"gluon{i}"] = lambda s, cfg=cfg: gluon_fp8_gemm._grouped_mm(*s["fp8"], cfg, blockwise=blockwise)
    row = {"role": role, "mode": mode, "experts": experts, "rows_per_group": rows, "K": K, "N": N}
    want = kernels["tl"](ops[0]).view(torch.int16)  # every row is in a group: all are compared
    for name in [f"gluon{i}" for i, _ in variants] + ["torch"] * (not blockwise):
        got = kernels[name](ops[0]).view(torch.int16)
        row[f"{name}_differing"] = int((got != want).sum())
    ms = interleaved({name: rotating(fn, ops) for name, fn in kernels.items()}, rounds)
    flop = 2 * experts * rows * K * N
    for name, times in ms.items():
        row[f"{name}_ms"] = statistics.median(times)
        row[f"{name}_tflops"] = round(flop / row[f"{name}_ms"] / 1e9, 1)
        if name != "bf16":  # median of the per-round ratios: a slow spell hits both sides alike
            row[f"{name}_vs_bf16"] = round(statistics.median(b / t for b, t in zip(ms["bf16"], times)), 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=FINE_SHAPES, help="EXRXKXN of the forward, comma-separated")
    p.add_argument("--roles", default=",".join(ROLES), help=f"comma-separated, of {ROLES}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {MODES}")
    p.add_argument("--variants", help="indices into gluon_fp8_gemm.VARIANTS (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sets", type=int, default=2, help="operand sets the calls rotate over")
    p.add_argument("--out", help="JSON path (default: benchmarks/results/gluon_gemm_<card>.json)")
    args = p.parse_args()
    require_gpu()
    if not gluon_fp8_gemm.available():
        sys.exit(f"{sys.argv[0]}: Gluon FP8 GEMM unavailable here (needs a 9.x GPU and triton's Gluon)")
    roles, modes = args.roles.split(","), args.modes.split(",")
    if not set(roles) <= set(ROLES) or not set(modes) <= set(MODES):
        sys.exit(f"{sys.argv[0]}: roles must be of {ROLES}, modes of {MODES}")
    out = args.out or f"benchmarks/results/gluon_gemm_{card()}.json"
    picked = [int(i) for i in args.variants.split(",")] if args.variants else range(len(gluon_fp8_gemm.VARIANTS))
    variants = [(i, gluon_fp8_gemm.VARIANTS[i]) for i in picked]
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "variants": {f"gluon{i}": str(cfg) for i, cfg in variants}, "rows": []}
    for i, cfg in variants:
        print(f"gluon{i}: {cfg}", flush=True)
    for shape in args.shapes.split(","):
        for mode in modes:
            for role in roles:
                row = measure(role, mode, *(int(d) for d in shape.split("x")), variants, args.rounds, args.sets)
                result["rows"].append(row)
                with open(out, "w") as f:  # after every row: a run cut short keeps what it measured
                    json.dump(result, f, indent=1)
                print(" ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    names = ["tl"] + [f"gluon{i}" for i, _ in variants] + ["torch"]
    print(f"\n{result['gpu']}, torch {torch.__version__}, triton {triton.__version__}: TFLOP/s (x bf16)")
    print(f"{'role':<8} {'mode':<9} {'E x rows x K x N':<20} {'bf16':>7} " + " ".join(f"{n:>15}" for n in names)
          + "  bit-equal")
    for r in result["rows"]:
        cells = " ".join(f"{r[f'{n}_tflops']:>7} ({r[f'{n}_vs_bf16']:.2f}x)" if f"{n}_tflops" in r else f"{'-':>15}"
                         for n in names)
        equal = all(v == 0 for k, v in r.items() if k.endswith("_differing"))
        shape = "x".join(str(r[k]) for k in ("experts", "rows_per_group", "K", "N"))
        print(f"{r['role']:<8} {r['mode']:<9} {shape:<20} {r['bf16_tflops']:>7} {cells}  {equal}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
