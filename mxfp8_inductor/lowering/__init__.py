"""The custom ops the pass rewrites to (schemas, fakes, autograd), one module per recipe, and how
they decompose for Inductor."""

from .ops import grouped_mm, register_decompositions

__all__ = ["grouped_mm", "register_decompositions"]
