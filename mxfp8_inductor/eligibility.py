"""Which grouped matmuls the ops can run: one rule set for the compiler pass (a site it cannot
rewrite is reported and left alone), the equivalence check, and `grouped_mm`'s argument errors."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_int

from .options import check_choice, check_flag

# K and N must be multiples of this: MXFP8 blocks of 32 along both contractions; FP8 rows of
# 16-byte aligned strides for torch's FP8 grouped GEMM
MULTIPLE_OF = {"mxfp8": 32, "fp8_rowwise": 16, "fp8_blockwise": 16, "auto": 16}
_WHY = {"mxfp8": "MXFP8 blocks", "fp8_rowwise": "16-byte aligned FP8 rows", "fp8_blockwise": "16-byte aligned FP8 rows",
        "auto": "FP8 rows"}


def static_dim(n: int | torch.SymInt) -> int:
    """A weight's K or N as an int. Dynamo makes a dim symbolic once a function is called again at
    another size (automatic dynamic shapes); the recipes' blocks, kernels and plans need it known,
    so the graph is specialized to it (a guard: another size compiles its own graph) rather than
    left in bf16."""
    return guard_int(n) if isinstance(n, torch.SymInt) else n


def _operand_problem(a: Any, b: Any, recipe: str) -> str | None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return "operand shapes unknown (no example value in the graph)"
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in (torch.bfloat16, torch.float32):
            return f"{name} must be bf16 or fp32, got {t.dtype}"
    if a.dtype != b.dtype:
        return f"a and b must share a dtype, got {a.dtype} and {b.dtype}"
    if a.dim() != 2 or b.dim() != 3:
        return f"need tokens a[M, K] and weights b[E, K, N], got {a.dim()}-D x {b.dim()}-D"
    K, N = (static_dim(n) for n in b.shape[-2:])
    multiple = MULTIPLE_OF[recipe]
    if K % multiple or N % multiple:
        return f"K={K} and N={N} must be multiples of {multiple} for {_WHY[recipe]}"
    return None


def _offs_problem(offs: Any) -> str | None:
    if isinstance(offs, torch.Tensor) and (offs.dtype != torch.int32 or offs.dim() != 1):
        return f"offs must be a 1-D int32 tensor, got {offs.dtype} with shape {tuple(offs.shape)}"
    return None


def site_problem(
    a: Any, b: Any, offs: Any, bias: Any = None, out_dtype: Any = None, recipe: str = "mxfp8"
) -> str | None:
    """Why `grouped_mm(a, b, offs, bias=bias, out_dtype=out_dtype)` cannot be rewritten, or None.

    Takes real or fake tensors (the example values of a traced graph); reads no values of `offs`.
    """
    if offs is None:
        return "no offs: a dense or 3-D x 3-D batched matmul, not routed experts"
    if bias is not None:
        return "has a bias operand"
    if out_dtype is not None and isinstance(a, torch.Tensor) and out_dtype != a.dtype:
        return f"out_dtype {out_dtype} differs from the input dtype {a.dtype}"
    return _operand_problem(a, b, recipe) or _offs_problem(offs)


def dense_problem(x: Any, w: Any, bias: Any, recipe: str, min_dim: int) -> str | None:
    """Why `F.linear(x, w, bias)` cannot be rewritten, or None (real or fake tensors)."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return "operand shapes unknown (no example value in the graph)"
    if w.dim() != 2 or x.dim() < 1:
        return f"need x[..., K] and a weight[N, K], got {x.dim()}-D x {w.dim()}-D"
    for name, t in (("x", x), ("weight", w)):
        if t.dtype not in (torch.bfloat16, torch.float32):
            return f"{name} must be bf16 or fp32, got {t.dtype}"
    if x.dtype != w.dtype:
        return f"x and weight must share a dtype, got {x.dtype} and {w.dtype}"
    if isinstance(bias, torch.Tensor) and bias.dtype != w.dtype:
        return f"bias must have the weight's dtype {w.dtype}, got {bias.dtype}"
    N, K = (static_dim(n) for n in w.shape)
    multiple = MULTIPLE_OF[recipe]
    if K % multiple or N % multiple:
        return f"K={K} and N={N} must be multiples of {multiple} for {_WHY[recipe]}"
    if min(K, N) < min_dim:
        return f"K={K} or N={N} is below dense_min_dim={min_dim}: too small for FP8 to gain"
    return None


def _check_options(recipe: str, rounding: str, wgrad: str, weight_cache: bool, autotune: bool) -> None:
    """The eager ops' options, by the rules `MXFP8Config` checks them with."""
    for name, value in (("recipe", recipe), ("rounding", rounding), ("wgrad", wgrad)):
        check_choice(name, value)
    for name, value in (("weight_cache", weight_cache), ("autotune", autotune)):
        check_flag(name, value)


def check_linear_args(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, recipe: str, rounding: str,
                      wgrad: str, weight_cache: bool, autotune: bool) -> None:
    """Raise ValueError naming the requirement a `linear` call breaks."""
    _check_options(recipe, rounding, wgrad, weight_cache, autotune)
    problem = dense_problem(x, w, bias, recipe, 0)
    if problem:
        raise ValueError(problem)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"contraction dims differ: x[..., {x.shape[-1]}] vs weight[N, {w.shape[1]}]")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias must have shape ({w.shape[0]},), got {tuple(bias.shape)}")


def check_grouped_mm_args(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, recipe: str, rounding: str,
                          wgrad: str, weight_cache: bool, autotune: bool) -> None:
    """Raise ValueError naming the requirement a `grouped_mm` call breaks (offs values too, in eager)."""
    _check_options(recipe, rounding, wgrad, weight_cache, autotune)
    if not isinstance(offs, torch.Tensor):
        raise ValueError(f"offs must be a 1-D int32 tensor, got {type(offs).__name__}")
    problem = _operand_problem(a, b, recipe) or _offs_problem(offs)
    if problem:
        raise ValueError(problem)
    E, K, N = b.shape
    if a.shape[1] != K:
        raise ValueError(f"contraction dims differ: a[M, {a.shape[1]}] vs b[E, {K}, N]")
    if offs.numel() != E:
        raise ValueError(f"offs has {offs.numel()} group ends but b has E={E} experts")
    if a.device != b.device or a.device != offs.device:
        raise ValueError(f"a, b and offs must be on one device, got {a.device}, {b.device}, {offs.device}")
    check_offs_values(offs, a.shape[0])


def check_offs(offs: Any, rows: int) -> None:
    """Raise ValueError unless `offs` is a non-empty 1-D int32 tensor of valid group ends for
    `rows` rows (values too, outside compiled graphs: a host sync on GPU)."""
    check_offs_form(offs)
    check_offs_values(offs, rows)


def check_offs_form(offs: Any) -> None:
    """Raise ValueError unless `offs` is a non-empty 1-D int32 tensor (its values unread)."""
    if not isinstance(offs, torch.Tensor):
        raise ValueError(f"offs must be a 1-D int32 tensor of group ends, got {type(offs).__name__}")
    problem = _offs_problem(offs)
    if problem:
        raise ValueError(problem)
    if offs.numel() == 0:
        raise ValueError("offs must hold at least one group end")


def check_offs_values(offs: torch.Tensor, rows: int) -> None:
    """Raise ValueError unless the group ends are non-decreasing within [0, rows]. Values are
    unknown while tracing, and unreadable while a CUDA graph is captured (reading them waits on
    the GPU): there, as in compiled graphs, the kernels' clamping holds (docs/design.md, "Group
    ends")."""
    if torch.compiler.is_compiling() or not offs.numel() or (offs.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    ends = offs.cpu()
    if bool((ends[1:] < ends[:-1]).any()) or int(ends[0]) < 0:
        raise ValueError(f"offs must be non-decreasing group ends, got {ends.tolist()}")
    if int(ends[-1]) > rows:
        raise ValueError(f"offs[-1]={int(ends[-1])} is past the {rows} rows")
