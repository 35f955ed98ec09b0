"""What one GEMM of a rewritten site runs: `GemmSpec`, built once by the pass (or the eager op)
and carried unchanged to the kernel call (docs/design.md, "The path of a GEMM's spec"). A leaf:
it imports only `options`, the home of the allowed roundings.

A site has three GEMMs, one per `Role`; each runs an `Impl`. The custom ops take the three specs
as strings (`encode`), so that they are literals in the graph and in every compile cache key, and
each op decodes its own (`decode`) with the facts that its position gives: the role, and whether
the site is a dense linear.
"""

from __future__ import annotations

import dataclasses
import enum

from .options import check_choice


class Role(str, enum.Enum):
    """Which GEMM of a site: the forward, the input gradient or the weight gradient."""

    FORWARD = "forward"
    INPUT_GRAD = "input-grad"
    WEIGHT_GRAD = "weight-grad"

    def __str__(self) -> str:
        return self.value


ROLES = tuple(Role)


class Impl(str, enum.Enum):
    """What a GEMM computes: bf16, a recipe's numerics, or a choice left to each call (a site
    compiled with a dynamic token count under the user's recipe "auto")."""

    BF16 = "bf16"
    MXFP8 = "mxfp8"
    FP8_ROWWISE = "fp8_rowwise"
    FP8_BLOCKWISE = "fp8_blockwise"
    PER_CALL = "per_call"  # chosen per call from the H200 cost model (lowering/auto.py)
    PER_CALL_TIMED = "per_call_timed"  # chosen per call by timing on the GPU (lowering/measure.py)

    def __str__(self) -> str:
        return self.value

    @property
    def deferred(self) -> bool:
        """Whether the choice is left to each call."""
        return self in (Impl.PER_CALL, Impl.PER_CALL_TIMED)

    @classmethod
    def _missing_(cls, value: object) -> None:
        raise ValueError(f"unknown GEMM implementation {value!r}: expected one of {[i.value for i in cls]}")


# the flags a spec's text may carry after its implementation and rounding
_FLAGS = ("reuse_weight", "shared_weight", "fused")


@dataclasses.dataclass(frozen=True)
class GemmSpec:
    """One GEMM of one site.

    role: which GEMM. impl: what it computes. rounding: the scale exponent rule ("rceil" or
    "floor"). reuse_weight: the weight's quantization is reused under the parameter the op is
    given (`weight_cache`; never for the weight gradient, which has no weight operand).
    shared_weight: the weight is rounded once for both of its GEMMs (`fsdp_fp8_all_gather`).
    fused: mxfp8 runs in the GEMMs that quantize as they load (`mxfp8_fused`). dense: a linear,
    not a grouped GEMM.
    """

    role: Role
    impl: Impl
    rounding: str = "rceil"
    reuse_weight: bool = False
    shared_weight: bool = False
    fused: bool = False
    dense: bool = False

    def encode(self) -> str:
        """The op argument: "<impl>:<rounding>" and the flags that are set, e.g.
        "fp8_rowwise:rceil+reuse_weight"."""
        flags = "".join(f"+{name}" for name in _FLAGS if getattr(self, name))
        return f"{self.impl.value}:{self.rounding}{flags}"

    @classmethod
    def decode(cls, text: str, role: Role, dense: bool) -> GemmSpec:
        """The spec `encode` wrote, for the GEMM of `role` in a grouped GEMM or a dense linear op."""
        head, *flags = text.split("+")
        impl, sep, rounding = head.partition(":")
        unknown = set(flags) - set(_FLAGS)
        if not sep or unknown:
            raise ValueError(f"malformed GEMM spec {text!r}: expected '<impl>:<rounding>[+flag...]' with flags "
                             f"from {_FLAGS}")
        check_choice("rounding", rounding)
        return cls(role, Impl(impl), rounding, **{name: name in flags for name in _FLAGS}, dense=dense)

    def with_impl(self, impl: Impl) -> GemmSpec:
        """This GEMM running `impl` (a choice made per call)."""
        return dataclasses.replace(self, impl=impl)


def site_specs(impls: tuple[Impl, Impl, Impl], *, rounding: str, reuse_weight: bool = False,
               shared_weight: bool = False, fused: bool = False, dense: bool = False) -> tuple[GemmSpec, ...]:
    """The three GEMMs of one site, in `ROLES` order, running `impls`; the weight's flags on the two
    GEMMs that have a weight operand."""
    return tuple(GemmSpec(role, impl, rounding, reuse_weight and role is not Role.WEIGHT_GRAD,
                          shared_weight and role is not Role.WEIGHT_GRAD, fused, dense)
                 for role, impl in zip(ROLES, impls))


def op_args(specs: tuple[GemmSpec, ...]) -> tuple[str, ...]:
    """A site's specs as the forward op takes them (its forward, input-grad and weight-grad args)."""
    return tuple(s.encode() for s in specs)
