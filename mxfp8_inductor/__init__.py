"""mxfp8-inductor: MXFP8 training for Mixture-of-Experts grouped GEMMs through torch.compile."""

from .kernels.reference import (
    dequantize,
    dequantize_groups,
    quantize,
    quantize_groups,
    to_blocked,
    to_blocked_groups,
)
from .lowering import grouped_mm

__all__ = [
    "dequantize",
    "dequantize_groups",
    "grouped_mm",
    "quantize",
    "quantize_groups",
    "to_blocked",
    "to_blocked_groups",
]
