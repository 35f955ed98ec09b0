"""What the benchmarks share: the four MoE shapes, the routed-expert block they time, and a small
MoE model for compile time.

A shape is (experts E, model dim D, expert hidden F). dsv3, l4scout and qwen3_30b take D and F
from DeepSeek-V3, Llama 4 Scout and Qwen3-30B-A3B; fine64 is a fine-grained layer of 64 small
experts. Each block gets TOKENS routed tokens in uneven groups.
"""

from __future__ import annotations

import re
import sys

import torch
import torch.nn as nn
import torch.nn.functional as fn

SHAPES = {"dsv3": (8, 7168, 2048), "l4scout": (4, 5120, 8192), "qwen3_30b": (16, 2048, 768), "fine64": (64, 2048, 1536)}
TOKENS = 32768

# The routed-expert GEMMs of bench_models.py's models: (experts E, routed token rows per
# microbatch (batch x sequence x top-k), (K, N) of w1/w3 fused as transformers stores them, (K, N)
# of w2); bench_models.py runs 4 microbatches per step. TorchTitan runs w1 and w3 as two GEMMs of
# half that N: the same FLOPs, counted here at the fused shape's rate
MODEL_EXPERT_GEMMS = {
    "qwen3_30b": (128, 4 * 2048 * 8, (2048, 1536), (768, 2048)),
    "titan_qwen3_30b": (128, 4 * 2048 * 8, (2048, 1536), (768, 2048)),
    "titan_dsv3_16b": (64, 4 * 2048 * 6, (2048, 2816), (1408, 2048)),
    "fine64_7b": (64, 4 * 2048 * 8, (2048, 2048), (1024, 2048)),
    "mixtral_8x7b": (8, 2 * 4096 * 2, (4096, 28672), (14336, 4096)),
    "gpt_oss_20b": (32, 4 * 2048 * 4, (2880, 5760), (2880, 2880)),
    "dsv3_ep8_slice": (32, 2 * 4096 * 8, (7168, 4096), (2048, 7168)),
    "l4scout_dims": (16, 4 * 4096 * 1, (5120, 16384), (8192, 5120)),
}
MICROBATCHES = 4


def require_gpu() -> None:
    """Exit with a message on a machine without a CUDA GPU (the timings are of GPU kernels)."""
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: needs a CUDA GPU")


def card(device: str = "cuda") -> str:
    """The GPU's model in lower case ("h100", "h200"), as result files are named; "cpu" off CUDA."""
    if device != "cuda":
        return "cpu"
    found = re.search(r"\b([A-Z]\d{2,4})\b", torch.cuda.get_device_name())
    return found.group(1).lower() if found else "gpu"


_gluon_available = None  # gluon_fp8_gemm.available as the package defines it


def use_kernels(name: str) -> None:
    """Route the package's FP8 grouped GEMMs to "gluon" (where it can run: the package's default)
    or to "tl" (`kernels/triton_fp8_gemm.py`, its fallback): the same ops, bit for bit."""
    global _gluon_available
    from mxfp8_inductor.kernels import gluon_fp8_gemm

    if name not in ("gluon", "tl"):
        raise ValueError(f"kernels are 'gluon' or 'tl', got {name!r}")
    if _gluon_available is None:
        _gluon_available = gluon_fp8_gemm.available
    gluon_fp8_gemm.available = _gluon_available if name == "gluon" else (lambda: False)


class GroupedExperts(nn.Module):
    """SwiGLU routed experts in TorchTitan's layout: w1, w3 [E, F, D] and w2 [E, D, F], each used
    through a `.transpose(-2, -1)` view in one `torch._grouped_mm`, the form the pass rewrites."""

    def __init__(self, E: int, D: int, F: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(E, F, D) * D**-0.5)
        self.w3 = nn.Parameter(torch.randn(E, F, D) * D**-0.5)
        self.w2 = nn.Parameter(torch.randn(E, D, F) * F**-0.5)

    def forward(self, x: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)

        def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)

        return mm(fn.silu(mm(x, self.w1)) * mm(x, self.w3), self.w2)


class MoELayer(nn.Module):
    """x + MoE(RMSNorm(x)): a top-k softmax router, tokens sorted by expert into `GroupedExperts`,
    outputs weighted by their router scores, plus an optional dense shared expert."""

    def __init__(self, D: int, F: int, E: int, top_k: int, shared_expert: bool) -> None:
        super().__init__()
        self.E, self.top_k = E, top_k
        self.norm = nn.RMSNorm(D)
        self.router = nn.Linear(D, E, bias=False)
        self.experts = GroupedExperts(E, D, F)
        self.shared = (nn.Sequential(nn.Linear(D, F, bias=False), nn.SiLU(), nn.Linear(F, D, bias=False))
                       if shared_expert else None)

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        D = x_BLD.shape[-1]
        x = self.norm(x_BLD).view(-1, D)
        scores, chosen = torch.topk(self.router(x).float().softmax(-1), self.top_k)
        chosen = chosen.view(-1)
        order = torch.argsort(chosen, stable=True)
        counts = torch.zeros(self.E, dtype=torch.int32, device=x.device).scatter_add(
            0, chosen.int(), torch.ones_like(chosen, dtype=torch.int32))  # static shape, unlike bincount
        routed = self.experts(x[order // self.top_k], counts)
        out = torch.empty_like(routed).index_copy(0, order, routed).view(-1, self.top_k, D)
        out = (out * scores.unsqueeze(-1).to(out.dtype)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x)
        return x_BLD + out.view_as(x_BLD)


def moe_model(layers: int, D: int, F: int, E: int, top_k: int, shared_expert: bool) -> nn.Module:
    return nn.Sequential(*(MoELayer(D, F, E, top_k, shared_expert) for _ in range(layers)))


def uneven_counts(E: int, M: int) -> torch.Tensor:
    """Tokens per expert on the GPU: uneven, fixed seed, summing to M."""
    g = torch.Generator().manual_seed(0)
    w = torch.rand(E, generator=g) + 0.2
    counts = (w / w.sum() * M).floor().int()
    counts[0] += M - counts.sum()
    return counts.cuda()


def block_and_inputs(shape: str):
    """The bf16 MoE block of `shape` on the GPU (seed 0), its routed tokens x [TOKENS, D] (requiring
    grad), the uneven tokens per expert and a gradient for its output."""
    E, D, F = SHAPES[shape]
    torch.manual_seed(0)
    block = GroupedExperts(E, D, F).cuda().bfloat16()
    x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    return block, x, uneven_counts(E, TOKENS), grad
