"""Demo: an MoE expert block (w1, w3, silu-mul, w2) with MXFP8 grouped GEMMs vs bf16.

Runs on the GPU when there is one, else on the CPU. Prints the accuracy of the output and of
every gradient against the same block in bf16 (SQNR, dB) and, on a GPU, the step times.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import mxfp8_inductor as mx


def moe_block(x_MD, w1_EFD, w3_EFD, w2_EDF, offs, gemm):
    h = F.silu(gemm(x_MD, w1_EFD.transpose(-2, -1), offs)) * gemm(x_MD, w3_EFD.transpose(-2, -1), offs)
    return gemm(h, w2_EDF.transpose(-2, -1), offs)


def sqnr(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.double(), x.double()
    return (20 * torch.log10(ref.norm() / (ref - x).norm())).item()


def main() -> None:
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    E, D, F_, M = (16, 2048, 768, 32768) if cuda else (8, 256, 128, 2048)
    torch.manual_seed(0)
    sizes = torch.distributions.Dirichlet(torch.ones(E)).sample() * M
    sizes = sizes.floor().long()
    sizes[0] += M - sizes.sum()
    offs = sizes.cumsum(0).to(torch.int32).to(dev)
    x = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
    params = [torch.randn(E, F_, D), torch.randn(E, F_, D), torch.randn(E, D, F_)]
    params = [(p * p.shape[-1] ** -0.5).to(dev, torch.bfloat16) for p in params]
    grad = torch.randn(M, D, device=dev, dtype=torch.bfloat16)

    def step(gemm):
        xs = x.clone().requires_grad_()
        ps = [p.clone().requires_grad_() for p in params]
        out = moe_block(xs, *ps, offs, gemm)
        out.backward(grad)
        return [out, xs.grad] + [p.grad for p in ps]

    print(f"MoE block: E={E} D={D} F={F_} tokens={M} on {torch.cuda.get_device_name() if cuda else 'CPU'}")
    print(f"group sizes: {sizes.tolist()}")
    ref = step(torch._grouped_mm)
    got = step(mx.grouped_mm)
    for name, r, g in zip(["out", "d_x", "d_w1", "d_w3", "d_w2"], ref, got):
        print(f"  {name:<5} SQNR vs bf16: {sqnr(r, g):5.1f} dB")
    if cuda:
        for name, gemm in [("bf16", torch._grouped_mm), ("mxfp8", mx.grouped_mm)]:
            for _ in range(3):
                step(gemm)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(10):
                step(gemm)
            torch.cuda.synchronize()
            print(f"  {name:<5} fwd+bwd step: {(time.perf_counter() - t) * 100:.2f} ms (eager)")


if __name__ == "__main__":
    main()
