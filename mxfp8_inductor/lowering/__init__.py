"""torch.library custom ops (schemas, fake impls, autograd) and their device dispatch."""

from .ops import grouped_mm, gemm_path

__all__ = ["grouped_mm", "gemm_path"]
