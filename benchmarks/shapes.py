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
