"""The MoE shapes of DESIGN §8 shared by the benchmarks: (experts E, model dim D, expert hidden F)."""

import torch

SHAPES = {"dsv3": (8, 7168, 2048), "l4scout": (4, 5120, 8192), "qwen3_30b": (16, 2048, 768), "fine64": (64, 2048, 1536)}
TOKENS = 32768


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
    from moe_model import GroupedExperts  # examples/ is on the path of every benchmark

    E, D, F = SHAPES[shape]
    torch.manual_seed(0)
    block = GroupedExperts(E, D, F).cuda().bfloat16()
    x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    return block, x, uneven_counts(E, TOKENS), grad
