"""How the package's per-step ops are defined: the `mxfp8` op library and its output dtype; and
the FP8 byte transpose their eager bodies share."""

from __future__ import annotations

from collections.abc import Callable

import torch

LIB = "mxfp8"
OUT_DTYPE = torch.bfloat16
# on an op whose Python body reads or fills the weight cache: a CUDA graph replays the kernels a
# capture launched, never the body, so a replay would read a quantization the cache has since
# dropped; Inductor runs such an op outside its CUDA graphs (docs/design.md, "Weight cache")
STATEFUL = (torch.Tag.cudagraph_unsafe,)


def define(name: str, schema: str, impl: Callable, fake: Callable, tags: tuple = ()) -> torch._ops.OpOverload:
    """An op without autograd that compiled graphs call once per GEMM operand per step.

    Defined with torch.library.define/impl rather than torch.library.custom_op: custom_op wraps
    every call in a Python autograd layer, several times the dispatch cost per call
    (benchmarks/bench_dispatch.py), and an MoE block calls a dozen such ops per step.
    """
    qualname = f"{LIB}::{name}"
    torch.library.define(qualname, schema, tags=tags)
    torch.library.impl(qualname, "default", impl)
    torch.library.register_fake(qualname, fake)
    return getattr(getattr(torch.ops, LIB), name).default


def like(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y laid out as torch.empty_like(x) (what the fake impls promise)."""
    if y.stride() == x.stride() and x.is_contiguous(memory_format=torch.contiguous_format):
        return y  # the common case, decided without allocating
    out = torch.empty_like(x, dtype=y.dtype)
    return y if out.stride() == y.stride() else out.copy_(y)


def define_fp8_grouped_mm(name: str, kernel: str) -> torch._ops.OpOverload:
    """An op `name(a, b, scale_a, scale_b, offs)` running one of our FP8 grouped GEMMs, `kernel`
    of `kernels.gluon_fp8_gemm` on a Hopper GPU (faster than the `tl` kernel in every layout and
    mode: docs/performance.md, "Gluon FP8 grouped GEMM"), of `kernels.triton_fp8_gemm` elsewhere,
    bit for bit the same: 2d-3d -> [M, N], 2d-2d -> [G, K, N], bf16."""

    def impl(a, b, scale_a, scale_b, offs):
        from ..kernels import gluon_fp8_gemm, triton_fp8_gemm  # imported lazily: triton is optional off Linux

        kernels = gluon_fp8_gemm if a.is_cuda and gluon_fp8_gemm.available() else triton_fp8_gemm
        return getattr(kernels, kernel)(a, b, scale_a, scale_b, offs)

    def fake(a, b, scale_a, scale_b, offs):
        if b.dim() == 3:
            return a.new_empty(a.shape[0], b.shape[-1], dtype=OUT_DTYPE)
        return a.new_empty(offs.shape[0], a.shape[0], b.shape[1], dtype=OUT_DTYPE)

    return define(name, "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs) -> Tensor", impl, fake)


def define_cached_weight_gemm(name: str, impl: Callable) -> torch._ops.OpOverload:
    """An op `name(x_fp8, x_scales, b, param, offs, rounding, dgrad)` -> [M, N] (N: b's K with
    dgrad): x times the weight's FP8 operand, reused under `param`'s version counter
    (lowering/weight_cache.py). Opaque, and given the parameter itself: the operand b it sees under
    Inductor is a reinterpreted view with a version counter of its own, and a reused operand
    returned from an op would be a buffer Inductor may reuse for another output, writing over it."""

    def fake(x_fp8, x_scales, b_EKN, param, offs, rounding, dgrad):
        return x_fp8.new_empty(x_fp8.shape[0], b_EKN.shape[-2 if dgrad else -1], dtype=OUT_DTYPE)

    schema = "(Tensor x_fp8, Tensor x_scales, Tensor b, Tensor param, Tensor? offs, str rounding, bool dgrad) -> Tensor"
    return define(name, schema, impl, fake, tags=STATEFUL)


def contiguous(x: torch.Tensor, decomposing: bool) -> torch.Tensor:
    """`x.contiguous()`: in an eager call on a GPU by our tiled byte transpose where x is a
    transposed FP8 view (`kernels/triton_transpose.py`), torch's strided copy being slow at 1-byte
    elements; where Inductor lowers the graph (`decomposing`), its own."""
    if decomposing or not x.is_cuda:
        return x.contiguous()
    from ..kernels import triton_transpose  # imported lazily: triton is optional off Linux

    return triton_transpose.contiguous(x)
