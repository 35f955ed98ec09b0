"""Runs one GEMM as its `GemmSpec` says: an empty K or N, the choice a spec leaves to each call
(made here from the call's shapes, every other field of the spec kept), then the
implementation's method (lowering/impls.py)."""

from __future__ import annotations

import math

import torch

from ..spec import ROLES, GemmSpec, Impl, Role
from . import auto, measure
from .impls import method

# choices made per call, per (M, K, N, E, dense, device, timed, rounding, reuse), with the
# calibration they were read from (a test may swap it): a plan costs tens of microseconds, a
# lookup well under one
_CHOICES: dict[tuple, tuple[dict, tuple[Impl, Impl, Impl]]] = {}
_MAX_CHOICES = 4096  # token counts vary per step under expert parallelism: start over past this


def _timed_rows(M: int, E: int) -> int:
    """The token count a choice timed per call times for M rows in E groups: tokens per group
    rounded to a power of two, so that each bucket is timed once however the count varies."""
    per_group = max(M / max(E, 1), 1.0)
    return max(E, 1) << round(math.log2(per_group))


def choose(spec: GemmSpec, M: int, K: int, N: int, E: int, device: torch.device) -> GemmSpec:
    """`spec` with the choice it left to run time made for this call's shapes, as the eager op
    makes it: from the cost model (PER_CALL), or timed on the device (PER_CALL_TIMED)."""
    timed = spec.impl is Impl.PER_CALL_TIMED and measure.measurable(device)
    if timed:
        M = _timed_rows(M, E)
    key = (M, K, N, E, spec.dense, device, timed, spec.rounding, spec.reuse_weight)
    calibration = auto.table()
    hit = _CHOICES.get(key)
    if hit is None or hit[0] is not calibration:
        if len(_CHOICES) >= _MAX_CHOICES:
            _CHOICES.clear()
        plan = auto.plan_for("auto", "quantized", M=M, K=K, N=N, E=E, dense=spec.dense, device=device,
                             autotune=timed, rounding=spec.rounding, cached=spec.reuse_weight)
        hit = _CHOICES[key] = (calibration, plan.impls)
    return spec.with_impl(hit[1][ROLES.index(spec.role)])


def _out_shape(spec: GemmSpec, M: int, K: int, N: int, E: int) -> tuple[int, ...]:
    if spec.role is Role.FORWARD:
        return M, N
    if spec.role is Role.INPUT_GRAD:
        return M, K
    return (N, K) if spec.dense else (E, K, N)


def run(spec: GemmSpec, like: torch.Tensor, MKNE: tuple[int, int, int, int], *operands: torch.Tensor,
        param: torch.Tensor | None = None, decomposing: bool = False):
    """The GEMM of `spec` on `operands` (a weight's GEMMs: the tokens or gradient, then the weight)
    in `like`'s dtype, for sizes M, K, N, E; NotImplemented where it must stay an opaque op while
    Inductor decomposes (a choice left to each call, the native path)."""
    M, K, N, E = MKNE
    if K == 0 or N == 0:
        # nothing to multiply: the exact result is zeros (empty where N or K is the output's), as
        # torch._grouped_mm gives where it runs; the quantizers and torch's GEMMs refuse the
        # unaligned strides of an empty dimension, and "auto" has no cost for it
        return like.new_zeros(_out_shape(spec, M, K, N, E))
    if spec.impl.deferred:
        if decomposing:
            return NotImplemented
        spec = choose(spec, M, K, N, E, like.device)
    weight = ()
    if spec.role is not Role.WEIGHT_GRAD:
        weight = (param if spec.reuse_weight else None,)
    out = method(spec)(*operands, spec, *weight, decomposing)
    return out if out is NotImplemented else out.to(like.dtype)
