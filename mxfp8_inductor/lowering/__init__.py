"""The custom ops the pass rewrites to (ops.py: schemas and fakes; autograd.py; dispatch.py: one
GEMM as its spec says), one module per implementation (impls.py), the eager API (eager.py), and
how they decompose for Inductor."""

from .eager import grouped_mm, linear
from .ops import register_decompositions
from .weight_cache import clear_weight_cache

__all__ = ["clear_weight_cache", "grouped_mm", "linear", "register_decompositions"]
