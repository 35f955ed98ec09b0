"""Demo: compile an unmodified MoE model with backend="mxfp8" and compare it with bf16.

Shows what the pass rewrote (the explain table), then the loss and every gradient of the
model compiled with backend="mxfp8" against the same model compiled in bf16 (SQNR, dB), and on
a GPU the training-step time of both. Runs on the GPU when there is one, else on the CPU.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys
import time

import torch

import mxfp8_inductor as mx
from mxfp8_inductor.check import sqnr
from mxfp8_inductor.options import RECIPES

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from moe_model import MoEModel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description="Compile an unmodified MoE model with the pass and compare with bf16.")
    parser.add_argument("--recipe", default="mxfp8", choices=RECIPES, help="auto: per GEMM the fastest on this GPU")
    recipe = parser.parse_args().recipe
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    # GPU: a Qwen3-30B-like layer shape; CPU: tiny, so the two compiles take seconds
    dim, hidden, experts, tokens, layers = (2048, 768, 16, 16384, 2) if cuda else (128, 96, 8, 512, 2)
    torch.manual_seed(0)
    model = MoEModel(dim, hidden, experts, top_k=2, layers=layers, shared_expert=True).to(dev, torch.bfloat16)
    mx_model = copy.deepcopy(model)
    x = torch.randn(1, tokens, dim, device=dev, dtype=torch.bfloat16)
    target = torch.randn_like(x)
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"MoE model: {layers} layers, {experts} experts top-2, dim {dim}, hidden {hidden}, {tokens} tokens, "
          f"on {where}\n")

    print(mx.explain(mx_model, x, options={"recipe": recipe}), "\n")

    def step(m, compiled):
        out = compiled(x)
        loss = (out.float() - target.float()).pow(2).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        m.zero_grad(set_to_none=True)
        return loss.item(), grads

    bf16_fn = torch.compile(model)
    mx_fn = torch.compile(mx_model, backend="mxfp8", options={"recipe": recipe})
    (loss_ref, g_ref), (loss_mx, g_mx) = step(model, bf16_fn), step(mx_model, mx_fn)
    rel = abs(loss_mx - loss_ref) / loss_ref
    print(f"loss: bf16 {loss_ref:.6f}  {recipe} {loss_mx:.6f}  (relative difference {rel:.2e})")
    print("gradient SQNR vs bf16 (dB):")
    for name in g_ref:
        print(f"  {name:<36} {sqnr(g_ref[name], g_mx[name]):6.1f}")

    if cuda:
        times = {}
        for label, m, fn in (("bf16", model, bf16_fn), (recipe, mx_model, mx_fn)):
            for _ in range(3):
                step(m, fn)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(10):
                step(m, fn)
            torch.cuda.synchronize()
            times[label] = (time.perf_counter() - t) * 100
        print(f"\ntraining step: bf16 {times['bf16']:.2f} ms, {recipe} {times[recipe]:.2f} ms "
              f"(bf16 time / {recipe} time = {times['bf16'] / times[recipe]:.2f}x; on Hopper mxfp8 emulates "
              "MXFP8 numerics, its FP8 speedup needs compute capability 10.x)")


if __name__ == "__main__":
    main()
