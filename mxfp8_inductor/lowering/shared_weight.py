"""`mxfp8::round_weight`: an expert weight rounded once for both of its GEMMs, in the graph
(docs/design.md, "Shared weight scales"). Its gradient passes through unchanged, as every
quantization's does here; Inductor decomposes it into `kernels/shared_weight.py`'s pure-torch
rounding and fuses that into one pass over the weight."""

from __future__ import annotations

import torch

from ..kernels import shared_weight
from .library import LIB


@torch.library.custom_op(f"{LIB}::round_weight", mutates_args=())
def round_weight_op(w: torch.Tensor, recipe: str, rounding: str) -> torch.Tensor:
    return shared_weight.quantize_dequantize(w, recipe, rounding)


@round_weight_op.register_fake
def _(w, recipe, rounding):
    return torch.empty_like(w)


def _backward(ctx, grad):
    return grad, None, None


round_weight_op.register_autograd(_backward)
