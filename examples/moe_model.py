"""A plain PyTorch MoE model in the TorchTitan / DeepSeek-V3 style, with no MXFP8 code in it:
top-k router, tokens sorted by expert, routed experts as `torch._grouped_mm` over [E, F, D]
weights passed as transposed views, an optional shared expert, RMSNorm, residuals."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class GroupedExperts(nn.Module):
    """SwiGLU experts: w1, w3 [E, F, D] and w2 [E, D, F], one grouped GEMM each."""

    def __init__(self, num_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.randn(num_experts, hidden, dim) * dim**-0.5)
        self.w3_EFD = nn.Parameter(torch.randn(num_experts, hidden, dim) * dim**-0.5)
        self.w2_EDF = nn.Parameter(torch.randn(num_experts, dim, hidden) * hidden**-0.5)

    def forward(self, x_RD: torch.Tensor, tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        offs_E = torch.cumsum(tokens_per_expert_E, dim=0, dtype=torch.int32)
        h_RF = F.silu(torch._grouped_mm(x_RD, self.w1_EFD.transpose(-2, -1), offs=offs_E))
        h_RF = h_RF * torch._grouped_mm(x_RD, self.w3_EFD.transpose(-2, -1), offs=offs_E)
        return torch._grouped_mm(h_RF, self.w2_EDF.transpose(-2, -1), offs=offs_E)


class MoE(nn.Module):
    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, shared_expert: bool = False) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = GroupedExperts(num_experts, dim, hidden)
        self.shared = nn.Sequential(nn.Linear(dim, hidden, bias=False), nn.SiLU(),
                                    nn.Linear(hidden, dim, bias=False)) if shared_expert else None

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        B, L, D = x_BLD.shape
        x_TD = x_BLD.reshape(-1, D)
        scores_TK, experts_TK = torch.topk(self.router(x_TD).float().softmax(-1), self.top_k)
        order_R = torch.argsort(experts_TK.view(-1), stable=True)
        counts_E = torch.zeros(self.num_experts, dtype=torch.int32, device=x_TD.device).scatter_add(
            0, experts_TK.view(-1).int(), torch.ones_like(experts_TK.view(-1), dtype=torch.int32))
        routed_RD = self.experts(x_TD[order_R // self.top_k], counts_E)
        out_RD = torch.empty_like(routed_RD).index_copy(0, order_R, routed_RD)
        out_TD = (out_RD.view(-1, self.top_k, D) * scores_TK.unsqueeze(-1).to(out_RD.dtype)).sum(1)
        if self.shared is not None:
            out_TD = out_TD + self.shared(x_TD)
        return out_TD.view(B, L, D)


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, shared_expert: bool = False) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.moe = MoE(dim, hidden, num_experts, top_k, shared_expert)

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        return x_BLD + self.moe(self.norm(x_BLD))


class MoEModel(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 96, num_experts: int = 4, top_k: int = 2,
                 layers: int = 2, shared_expert: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(dim, hidden, num_experts, top_k, shared_expert) for _ in range(layers)])

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BLD = layer(x_BLD)
        return x_BLD
