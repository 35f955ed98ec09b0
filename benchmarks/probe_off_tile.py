"""Every recipe at K and N off 128 on a GPU: compiled and eager, each against bf16 (issue 58).

    python benchmarks/probe_off_tile.py [--tokens-per-group 128] [--experts 4] [--shapes 2880x2880,128x144]

For each recipe and (K, N) the recipe takes: one routed-expert GEMM (weight [E, N, K] used
transposed) on uneven token groups, forward and backward, run three ways: torch._grouped_mm in
bf16, the eager op `mx.grouped_mm`, and the module compiled with backend="mxfp8" after a Dynamo
reset. Prints the SQNR (dB) against bf16 of the output, the input gradient and the weight
gradient of the compiled and of the eager run (inf: bit-identical to bf16, the GEMM not
quantized), the SQNR of compiled against eager, and what `mx.explain` reports per role.

Then "recompiled": one function taking the weight as an input, compiled once and called at every
shape in turn, as a probe looping over shapes does. Dynamo compiles the second shape with K and N
dynamic; a row at inf dB against bf16 is a GEMM that ran in bf16.
"""

from __future__ import annotations

import argparse
import math

import torch

import mxfp8_inductor as mx
from mxfp8_inductor.check import sqnr
from mxfp8_inductor.eligibility import MULTIPLE_OF

SHAPES = [(2880, 2880), (128, 144), (2048, 1408), (144, 128), (160, 144), (128, 272)]  # (K, N)
RECIPES = ("mxfp8", "fp8_rowwise", "fp8_blockwise")


class Experts(torch.nn.Module):
    def __init__(self, w_ENK: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w_ENK.clone())

    def forward(self, x_MK: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x_MK, self.w.transpose(-2, -1), offs=offs)


def problem(K: int, N: int, E: int, per_group: int, device: str) -> dict[str, torch.Tensor]:
    """Tokens, weight, output gradient and group ends (uneven groups, one empty)."""
    g = torch.Generator().manual_seed(K * 7 + N)
    sizes = [per_group * 2, 0] + [per_group] * (E - 2) if E > 2 else [per_group] * E
    M = sum(sizes)
    p = dict(x=torch.randn(M, K, generator=g).bfloat16(), w=(torch.randn(E, N, K, generator=g) * K**-0.5).bfloat16(),
             dout=torch.randn(M, N, generator=g).bfloat16(), offs=torch.tensor(sizes).cumsum(0).to(torch.int32))
    return {k: v.to(device) for k, v in p.items()}


def step(fn, p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, dx, dw) of fn(x, w_ENK, offs)."""
    x, w = p["x"].clone().requires_grad_(), p["w"].clone().requires_grad_()
    out = fn(x, w, p["offs"])
    out.backward(p["dout"])
    return out.detach(), x.grad, w.grad


def compiled(model: torch.nn.Module, recipe: str):
    return torch.compile(model, backend="mxfp8", dynamic=False, options={"recipe": recipe})


def dbs(ref: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...], rows: int) -> str:
    """SQNR of out, dx (rows up to the last group end) and dw."""
    vals = [sqnr(ref[0][:rows], got[0][:rows]), sqnr(ref[1][:rows], got[1][:rows]), sqnr(ref[2], got[2])]
    return " ".join("   inf" if math.isinf(v) else f"{v:6.1f}" for v in vals)


def run_module(recipe: str, p: dict[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], list]:
    """(out, dx, dw) of the compiled module, and explain()'s rows for it."""
    model = Experts(p["w"])
    torch._dynamo.reset()
    x = p["x"].clone().requires_grad_()
    out = compiled(model, recipe)(x, p["offs"])
    out.backward(p["dout"])
    got = (out.detach(), x.grad, model.w.grad)
    report = mx.explain(Experts(p["w"]), p["x"].clone().requires_grad_(), p["offs"], options={"recipe": recipe})
    return got, report.sites


def references(recipe: str, p: dict) -> tuple:
    """bf16's step and the eager op's in `recipe` on problem `p`."""
    bf16 = step(lambda x, w, offs: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), p)
    eager = step(lambda x, w, offs: mx.grouped_mm(x, w.transpose(-2, -1), offs, recipe=recipe), p)
    return bf16, eager


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens-per-group", type=int, default=128)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--device", default="cuda", help="cpu for a dry run (the emulation)")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN,KxN,...")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    where = (f"{torch.cuda.get_device_name()} (compute capability {torch.cuda.get_device_capability()})"
             if args.device == "cuda" else args.device)
    print(f"{where}, torch {torch.__version__}, {args.experts} experts x {args.tokens_per_group} tokens per group")
    print("SQNR (dB) of out, dx, dw against bf16; compiled against eager; explain() per role")
    for recipe in RECIPES:
        for K, N in shapes:
            if K % MULTIPLE_OF[recipe] or N % MULTIPLE_OF[recipe]:
                continue
            p = problem(K, N, args.experts, args.tokens_per_group, args.device)
            rows, (bf16, eager) = int(p["offs"][-1]), references(recipe, p)
            got, sites = run_module(recipe, p)
            actions = ", ".join(f"{s.role} {s.action} {s.impl}" for s in sites)
            print(f"{recipe:13s} K={K:5d} N={N:5d}  compiled {dbs(bf16, got, rows)}  eager {dbs(bf16, eager, rows)}"
                  f"  compiled-eager {dbs(eager, got, rows)}  [{actions}]")
    print("recompiled: one compiled function (the weight an input), called at every shape in turn")
    for recipe in RECIPES:
        torch._dynamo.reset()
        fn = torch.compile(lambda x, w, offs: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), backend="mxfp8",
                           options={"recipe": recipe})
        for K, N in shapes:
            if K % MULTIPLE_OF[recipe] or N % MULTIPLE_OF[recipe]:
                continue
            p = problem(K, N, args.experts, args.tokens_per_group, args.device)
            rows, (bf16, eager) = int(p["offs"][-1]), references(recipe, p)
            got = step(fn, p)
            print(f"{recipe:13s} K={K:5d} N={N:5d}  compiled {dbs(bf16, got, rows)}  eager {dbs(bf16, eager, rows)}")


if __name__ == "__main__":
    main()
