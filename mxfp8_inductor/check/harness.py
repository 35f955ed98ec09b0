"""The equivalence harness: the same step run four ways (pass, eager op at the same sites, bf16
compiled, bf16 eager) and one table per recipe (docs/design.md, "Model-level equivalence")."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from ..backend import ensure_registered, mxfp8_backend
from ..eligibility import dense_problem
from ..lowering import grouped_mm, linear
from ..options import MXFP8Config
from ..patterns.rewrite import decide, rewrite
from ..patterns.sites import GROUPED_MM_FUNCTIONS, LINEAR_FUNCTIONS, grouped_mm_args, linear_args, problem
from .metrics import sqnr

BAR_DB = 2.0
log = logging.getLogger(__name__)  # progress lines; the CLI shows them


class OpAtSites(TorchFunctionMode):
    """Eager grouped matmuls (and, with targets="all", linears) that the pass would rewrite go to
    `mxfp8_inductor.grouped_mm` (`linear`).

    Same eligibility rule and include/exclude decision as the pass; a weight's FQN is the name of
    the parameter whose storage it views. `calls` counts the replaced calls.
    """

    def __init__(self, config: MXFP8Config, model: torch.nn.Module) -> None:
        super().__init__()
        self.config = config
        self.fqns = {p.untyped_storage().data_ptr(): name for name, p in model.named_parameters()}
        # what the pass keeps bf16 as the output projection: weights tied to an input embedding,
        # and the model's output embedding
        heads = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        heads += [head.weight] if isinstance(getattr(head, "weight", None), torch.Tensor) else []
        self.output_projections = {w.untyped_storage().data_ptr() for w in heads}
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.config
        if func in GROUPED_MM_FUNCTIONS:
            ops = grouped_mm_args(args, kwargs)
            if problem(ops, c.recipe) is None and self._decide(ops["b"], dense=False):
                self.calls += 1
                return grouped_mm(ops["a"], ops["b"], ops["offs"], recipe=c.recipe, rounding=c.rounding, wgrad=c.wgrad,
                                  weight_cache=c.weight_cache)
        if func in LINEAR_FUNCTIONS and c.targets == "all":
            ops = linear_args(args, kwargs)
            x, w, bias = ops.get("a"), ops.get("b"), ops.get("bias")
            fqn = self.fqns.get(w.untyped_storage().data_ptr()) if isinstance(w, torch.Tensor) else None
            if (fqn is not None and dense_problem(x, w, bias, c.recipe, c.dense_min_dim) is None
                    and self._decide(w, dense=True)):
                self.calls += 1
                return linear(x, w, bias, recipe=c.recipe, rounding=c.rounding, wgrad=c.wgrad,
                              weight_cache=c.weight_cache)
        return func(*args, **kwargs)

    def _decide(self, b: torch.Tensor, dense: bool) -> bool:
        weight_fqn = self.fqns.get(b.untyped_storage().data_ptr())
        module_fqn = weight_fqn.rsplit(".", 1)[0] if weight_fqn and "." in weight_fqn else None
        output_projection = dense and b.untyped_storage().data_ptr() in self.output_projections
        return decide(self.config, module_fqn, weight_fqn, dense=dense, output_projection=output_projection)[0]


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared tensor: the model output or a parameter's gradient."""

    name: str
    pass_db: float  # SQNR(bf16 compiled, pass)
    op_db: float  # SQNR(bf16 eager, op)

    @property
    def ok(self) -> bool:
        return self.pass_db >= self.op_db - BAR_DB


@dataclasses.dataclass
class Comparison:
    """The equivalence table of one model and recipe."""

    recipe: str
    rows: list[Row]
    sites_rewritten: int  # GEMM call sites the pass rewrote in the compiled graphs
    op_calls: int  # grouped matmuls the eager run sent to the op

    @property
    def passed(self) -> bool:
        return self.sites_rewritten > 0 and all(r.ok for r in self.rows)

    def __str__(self) -> str:
        head = (f"recipe {self.recipe}: {self.sites_rewritten} site(s) rewritten by the pass, "
                f"{self.op_calls} eager call(s) sent to the op")
        lines = [head, f"{'tensor':<60} {'pass dB':>8} {'op dB':>8} {'margin':>7}"]
        for r in self.rows:
            lines.append(f"{r.name:<60} {r.pass_db:8.1f} {r.op_db:8.1f} {r.pass_db - r.op_db:+7.1f}"
                         + ("" if r.ok else "  FAIL"))
        verdict = "PASS" if self.passed else "FAIL"
        why = "" if self.sites_rewritten else " (nothing was rewritten)"
        lines.append(f"{verdict}{why}: bar SQNR(pass) >= SQNR(op) - {BAR_DB:g} dB on every row")
        return "\n".join(lines)


def _output(out: Any) -> torch.Tensor:
    """The tensor to compare of a model's output: `.logits`, else the first floating tensor."""
    if hasattr(out, "logits") and isinstance(out.logits, torch.Tensor):
        return out.logits
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf
    raise ValueError(f"the model returned no floating-point tensor to compare: {type(out).__name__}")


def _step(
    model: torch.nn.Module, fn: Callable, inputs: Sequence[Any], forward_mode: Any = None
) -> dict[str, torch.Tensor]:
    # the backward runs outside `forward_mode`: the op's own backward calls torch._grouped_mm
    with forward_mode or contextlib.nullcontext():
        out = _output(fn(*inputs))
    out.float().pow(2).mean().backward()
    grads = {f"grad {n}": p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return {"output": out.detach().float(), **grads}


def compare(
    model: torch.nn.Module,
    inputs: Sequence[Any],
    recipes: Sequence[str] = ("mxfp8", "fp8_rowwise"),
    compiler: str = "inductor",
    **options: Any,
) -> list[Comparison]:
    """The four runs on deep copies of `model` (left untouched), one table per recipe. The copies
    run in eval mode: dropout and router noise would draw different random numbers compiled and
    eager; gradients flow as in training.

    `options` as for backend="mxfp8" (include, exclude, rounding, wgrad); the bf16 runs are shared.
    `compiler="aot_eager_decomp_partition"` checks the graph-level pass (rewrite, AOTAutograd,
    the ops' Inductor decompositions, the partitioner) without Inductor's code generation: seconds
    instead of a minute per model on a CPU.
    """
    ensure_registered()
    model = copy.deepcopy(model).eval()
    eager_model = copy.deepcopy(model)
    log.info("bf16: eager and compiled (%s) steps", compiler)
    bf16_eager = _step(eager_model, eager_model, inputs)
    bf16_compiled = _compiled(model, inputs, compiler)
    out = []
    for recipe in recipes:
        config = MXFP8Config.from_options({**options, "recipe": recipe})
        rows: list = []

        def with_pass(gm: torch.fx.GraphModule, example_inputs: list[Any], config=config, rows=rows):
            rows.extend(rewrite(gm, config))  # the backend's own rewrite then finds these sites decided
            if compiler == "inductor":
                return mxfp8_backend(gm, example_inputs, options={**options, "recipe": config.recipe})
            return torch._dynamo.lookup_backend(compiler)(gm, example_inputs)

        log.info("%s: eager op and compiled pass steps", recipe)
        op_model = copy.deepcopy(model)
        mode = OpAtSites(config, op_model)
        op = _step(op_model, op_model, inputs, mode)
        passed = _compiled(model, inputs, with_pass)
        table = _table(bf16_compiled, passed, bf16_eager, op)
        rewritten = sum(r.role == "forward" and r.action == "rewritten" for r in rows)
        out.append(Comparison(recipe, table, rewritten, mode.calls))
    return out


def _table(bf16_compiled, passed, bf16_eager, op) -> list[Row]:
    """One row per tensor; gradients of vectors (norm weights, biases, attention sinks) are pooled
    into one row: a vector's gradient is a sum over every token, so single rounding events upstream
    swing its SQNR by dB either way and it does not measure an error level."""
    vectors = [n for n, t in bf16_eager.items() if n != "output" and t.dim() < 2]
    rows = [Row(n, sqnr(bf16_compiled[n], passed[n]), sqnr(bf16_eager[n], op[n]))
            for n in bf16_eager if n not in vectors]
    if vectors:
        def cat(run):
            return torch.cat([run[n].flatten() for n in vectors])

        rows.append(Row(f"{len(vectors)} vector gradient(s), pooled", sqnr(cat(bf16_compiled), cat(passed)),
                        sqnr(cat(bf16_eager), cat(op))))
    return rows


def _compiled(model: torch.nn.Module, inputs: Sequence[Any], backend: Any) -> dict[str, torch.Tensor]:
    """One compiled step of a copy of `model`. Inductor rounds to bf16 where eager does, so that
    SQNR(bf16 compiled, pass) measures the pass and not Inductor's fp32 intermediates."""
    m = copy.deepcopy(model)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(emulate_precision_casts=True):
            return _step(m, torch.compile(m, backend=backend), inputs)
    finally:
        torch._dynamo.reset()
