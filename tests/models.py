"""Tiny MoE models for the pass tests, written as their upstreams write them (no MXFP8 code)."""

import pathlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "examples"))
from moe_model import MoEModel  # noqa: E402,F401  (TorchTitan / DeepSeek-V3 style)


class HFExperts(nn.Module):
    """Hugging Face Mixtral / Qwen3-MoE `grouped_mm` style: gate_up [E, 2I, H] concatenated,
    down [E, H, I]; or, with `gpt_oss=True`, [E, K, N] weights used as they are plus a bias."""

    def __init__(self, E=4, H=64, I=32, gpt_oss=False):
        super().__init__()
        self.gpt_oss = gpt_oss
        if gpt_oss:
            self.gate_up_proj = nn.Parameter(torch.randn(E, H, 2 * I) * H**-0.5)
            self.gate_up_proj_bias = nn.Parameter(torch.zeros(E, 2 * I))
            self.down_proj = nn.Parameter(torch.randn(E, I, H) * I**-0.5)
        else:
            self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H) * H**-0.5)
            self.down_proj = nn.Parameter(torch.randn(E, H, I) * I**-0.5)

    def forward(self, x, top_k_index, top_k_weights):
        E = self.down_proj.shape[0]
        flat = top_k_index.reshape(-1)
        perm = torch.argsort(flat)
        x_g = x[perm // top_k_index.shape[-1]]
        counts = torch.histc(flat.float(), bins=E, min=0, max=E - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        if self.gpt_oss:
            out = F.grouped_mm(x_g, self.gate_up_proj, offs=offsets)
            out = out + self.gate_up_proj_bias[flat[perm]]
            h = F.silu(out[..., ::2]) * out[..., 1::2]
            y = F.grouped_mm(h, self.down_proj, offs=offsets)
        else:
            gate, up = F.grouped_mm(x_g, self.gate_up_proj.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
            y = F.grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)
        y = y * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(y.dtype)
        return torch.zeros_like(x).index_add(0, perm // top_k_index.shape[-1], y)


class HFSparseMoeBlock(nn.Module):
    def __init__(self, E=4, H=64, I=32, top_k=2, gpt_oss=False):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = HFExperts(E, H, I, gpt_oss)

    def forward(self, hidden_states):
        B, L, H = hidden_states.shape
        x = hidden_states.view(-1, H)
        weights, index = torch.topk(self.gate(x).softmax(-1, dtype=torch.float), self.top_k)
        return self.experts(x, index, weights).view(B, L, H)


class EagerLoopMoe(nn.Module):
    """HF 4.x Mixtral-style per-expert loop: `torch.where` per expert graph-breaks."""

    def __init__(self, E=4, H=64, I=32, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList(nn.Linear(H, H, bias=False) for _ in range(E))

    def forward(self, hidden_states):
        x = hidden_states.view(-1, hidden_states.shape[-1])
        weights, index = torch.topk(self.gate(x).softmax(-1), self.top_k)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(index == e)
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None].to(x.dtype))
        return out.view_as(hidden_states)
