"""The fused MXFP8 grouped GEMMs (`kernels/triton_mx_gemm.py`) on this GPU: exactness, then each
GEMM role against torch's bf16 `_grouped_mm` and the separate quantize-dequantize path, then the
MoE block forward+backward compiled with either path.

    python benchmarks/bench_fused_gemm.py [--shapes dsv3,qwen3_30b] [--rounds 3]
        [--out benchmarks/results/fused_gemm_h200.json]

Exactness: the in-register rounding is compared bit for bit with the quantizer kernel
(`triton_mx.quantize_dequantize*`, itself bit-exact with the reference) through identity operands:
a GEMM with an identity operand returns the other operand's MXFP8 values exactly. Specials (NaN,
inf) are checked against the separate path's NaN pattern instead, since NaN * 0 spreads them.

Per role (forward, input gradient, weight gradient) of the block's w1/w3 and w2 GEMMs, side by
side: torch bf16, the separate path (quantize-dequantize kernels + torch bf16), and our kernel
rounding both operands (fused), one of them, or neither (Triton bf16: the kernel's own rate
against torch's). Then the block (shapes.GroupedExperts, 32768 routed tokens) in bf16 and mxfp8
by either path, taking turns over --rounds rounds.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
from functools import partial

import torch
import triton
from bench_moe_block import interleaved
from shapes import SHAPES, TOKENS, block_and_inputs, require_gpu, uneven_counts
from triton.testing import do_bench

from mxfp8_inductor import mxfp8_backend  # also where the package is on PYTHONPATH, not installed
from mxfp8_inductor.check import sqnr
from mxfp8_inductor.kernels import launch, triton_mx, triton_mx_gemm
from mxfp8_inductor.lowering import mxfp8 as mx_lowering

ROUNDINGS = ("rceil", "floor")


def _wide(shape, seed: int) -> torch.Tensor:
    """bf16 values over many binades, with zeros and bf16 subnormals."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda") * torch.exp2(
        torch.randint(-60, 60, shape, generator=g, device="cuda").float())
    flat = x.view(-1)
    flat[::97] = 0.0
    flat[5::101] = 2.0**-130
    return x.bfloat16()


def check_exact() -> dict:
    """Bit-exactness of every operand's rounding, and NaN/inf patterns, on this GPU."""
    E, B = 3, 128
    offs = torch.tensor([B, B, 2 * B], dtype=torch.int32, device="cuda")  # an empty group
    M = 3 * B  # the last B rows lie past the last group end
    eye = torch.eye(B, device="cuda", dtype=torch.bfloat16)
    eyes_EKN = eye.expand(E, B, B).contiguous()
    rows_eye = torch.cat([eye, eye, eye])  # each group's rows an identity
    valid = torch.arange(M, device="cuda") < 2 * B
    out = {}
    for rounding in ROUNDINGS:
        a = _wide((M, B), 1)
        want = torch.where(valid[:, None], triton_mx.quantize_dequantize(a, -1, rounding), 0)
        out[f"rows_a_{rounding}"] = torch.equal(triton_mx_gemm.grouped_mm(a, eyes_EKN, offs, rounding).float(),
                                                want.float())
        w = _wide((E, B, B), 2)  # [E, N, K]: the forward's transposed view, the input gradient's plain one
        offs_i = torch.tensor([B, 2 * B, 3 * B], dtype=torch.int32, device="cuda")
        for name, b in (("rows_b_transposed", w.transpose(-2, -1)), ("rows_b_plain", w)):
            got = triton_mx_gemm.grouped_mm(rows_eye, b, offs_i, rounding).view(E, B, B)
            out[f"{name}_{rounding}"] = torch.equal(got.float(),
                                                    triton_mx.quantize_dequantize(b, 1, rounding).float())
        x = _wide((M, B), 3)
        want = triton_mx.quantize_dequantize_groups(x, offs_i, rounding).view(E, B, B)
        out[f"groups_g_{rounding}"] = torch.equal(
            triton_mx_gemm.grouped_mm_wgrad(rows_eye, x, offs_i, rounding).float(), want.float())
        out[f"groups_a_{rounding}"] = torch.equal(
            triton_mx_gemm.grouped_mm_wgrad(x, rows_eye, offs_i, rounding).float(), want.transpose(-2, -1).float())
        # specials: NaN and inf where the separate path has them
        a = _wide((M, 256), 4)
        a[7, 40], a[100, 3], a[200, 9] = float("nan"), float("inf"), -float("inf")
        b = _wide((E, 256, 192), 5)
        b[1, 17, 5] = float("nan")
        sep = torch._grouped_mm(triton_mx.quantize_dequantize(a, -1, rounding),
                                triton_mx.quantize_dequantize(b, 1, rounding), offs)
        got = triton_mx_gemm.grouped_mm(a, b, offs, rounding)
        rows = valid[:, None].expand_as(got)
        out[f"specials_{rounding}"] = torch.equal(torch.isnan(got[rows]), torch.isnan(sep[rows])) and bool(
            (got[~rows] == 0).all())
    return out


def _roles(E: int, K: int, N: int, counts: torch.Tensor) -> dict:
    """The three GEMMs of a layer with weight w [E, N, K] used as w.transpose(-2, -1), each as
    callables by variant: torch bf16, the separate path, our kernel rounding both operands, only
    the first (tokens or output gradient), only the second, or neither (Triton bf16)."""
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    a = torch.randn(TOKENS, K, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(TOKENS, N, device="cuda", dtype=torch.bfloat16)
    b_EKN = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
    quants = {"fused": (True, True), "fused_first_only": (True, False), "fused_second_only": (False, True),
              "triton_bf16": (False, False)}
    forms = {  # role: (torch bf16, separate path, our kernel, its two operands)
        "forward": (partial(torch._grouped_mm, a, b_EKN, offs),
                    partial(mx_lowering.forward, a, b_EKN, offs, "rceil", False, False),
                    triton_mx_gemm.grouped_mm, (a, b_EKN)),
        "input-grad": (partial(torch._grouped_mm, g, b_EKN.transpose(-2, -1), offs),
                       partial(mx_lowering.dgrad, g, b_EKN, offs, "rceil", False, False),
                       triton_mx_gemm.grouped_mm, (g, b_EKN.transpose(-2, -1))),
        "weight-grad": (partial(torch._grouped_mm, a.t(), g, offs),
                        partial(mx_lowering.wgrad, g, a, offs, "rceil", False, False),
                        triton_mx_gemm.grouped_mm_wgrad, (a, g)),
    }
    return {role: {"torch_bf16": bf16, "separate": separate,
                   **{name: partial(ours, *operands, offs, "rceil", q) for name, q in quants.items()}}
            for role, (bf16, separate, ours, operands) in forms.items()}


def gemm_rows(shape: str) -> list[dict]:
    E, D, F = SHAPES[shape]
    counts = uneven_counts(E, TOKENS)
    rows = []
    for gemm, (K, N) in {"w13": (D, F), "w2": (F, D)}.items():
        for role, fns in _roles(E, K, N, counts).items():
            ms, configs = {}, {}
            for name, fn in fns.items():
                known = len(launch._picked)
                fn()  # autotuning: the config picked is the newest entry
                if len(launch._picked) > known:
                    configs[name] = str(list(launch._picked.values())[-1])
                ms[name] = do_bench(fn, return_mode="median")
            row = {"shape": shape, "gemm": gemm, "role": role, "E": E, "K": K, "N": N, "M": TOKENS,
                   **{f"{k}_ms": v for k, v in ms.items()},
                   **{f"{k}_vs_bf16": ms["torch_bf16"] / v for k, v in ms.items() if k != "torch_bf16"},
                   "sqnr_fused_vs_separate": sqnr(fns["separate"]().float(), fns["fused"]().float()),
                   "configs": configs}
            rows.append(row)
            print(f"{shape:<10} {gemm:<4} {role:<12} bf16 {ms['torch_bf16']:.3f} ms | " + " | ".join(
                f"{k} {row[f'{k}_vs_bf16']:.2f}x" for k in ms if k != "torch_bf16")
                + f" | SQNR fused/separate {row['sqnr_fused_vs_separate']:.0f} dB", flush=True)
    return rows


def block_rows(shape: str, rounds: int) -> list[dict]:
    """The block forward+backward compiled: bf16, mxfp8 separate, mxfp8 fused."""
    block, x, counts, grad = block_and_inputs(shape)
    torch._dynamo.reset()
    steps, outs = {}, {}
    for name in ("bf16", "mxfp8_separate", "mxfp8_fused"):
        mod = copy.deepcopy(block)
        # a class per variant: each gets its own compiled frame
        mod.__class__ = type(f"{type(block).__name__}_{name}", (type(block),), {})
        options = {"recipe": "mxfp8", "mxfp8_fused": name == "mxfp8_fused"}
        fn = torch.compile(mod) if name == "bf16" else torch.compile(mod, backend=mxfp8_backend, options=options)

        def step(mod=mod, fn=fn):
            x.grad = None
            for p in mod.parameters():
                p.grad = None
            fn(x, counts).backward(grad)

        step()
        outs[name] = [x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
        steps[name] = step
    ms = interleaved(steps, rounds)
    rows = []
    for name in ("mxfp8_separate", "mxfp8_fused"):
        ratios = [b / t for b, t in zip(ms["bf16"], ms[name])]
        rows.append({"shape": shape, "variant": name, "bf16_ms": statistics.median(ms["bf16"]),
                     "ms": statistics.median(ms[name]), "speedup": statistics.median(ratios),
                     "speedup_rounds": ratios,
                     "sqnr_grads_vs_bf16_min": min(sqnr(a, b) for a, b in zip(outs["bf16"], outs[name]))})
        print(f"block {shape:<10} {name:<15} {rows[-1]['speedup']:.3f}x bf16 ({rows[-1]['ms']:.3f} ms), "
              f"grads SQNR min {rows[-1]['sqnr_grads_vs_bf16_min']:.1f} dB", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/fused_gemm_h200.json")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-block", action="store_true", help="skip the compiled block")
    args = p.parse_args()
    require_gpu()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat()}
    result["exact"] = check_exact()
    print("exact:", result["exact"], flush=True)
    result["gemms"], result["blocks"] = [], []
    for shape in args.shapes.split(","):
        result["gemms"] += gemm_rows(shape)
        if not args.no_block:
            result["blocks"] += block_rows(shape, args.rounds)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
