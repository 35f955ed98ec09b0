"""`explain(model, *args)`: what the pass does to a model, site by site, with the rewritten graphs."""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import marks
from .backend import ensure_registered, split_options
from .options import MXFP8Config
from .patterns.rewrite import SiteReport, rewrite


@dataclasses.dataclass
class Report:
    """Per-site decisions, the rewritten graphs and the graph breaks of one explained call.

    sites: one row per (call site, role); graphs: the rewritten Dynamo graphs as code;
    aot_graphs: the forward and backward graphs AOTAutograd made of them, as code.
    """

    sites: list[SiteReport]
    graphs: list[str]
    aot_graphs: list[str]
    graph_breaks: list[str]

    def __str__(self) -> str:
        if not self.sites:
            lines = [f"no grouped matmul was captured ({len(self.graphs)} graph(s) compiled): nothing to rewrite."]
            if self.graph_breaks:
                lines.append("graph breaks: " + "; ".join(self.graph_breaks))
            lines.append("An eager per-expert loop (torch.where / nonzero per expert) is not capturable; "
                         "use a grouped-mm experts implementation (torch._grouped_mm).")
            return "\n".join(lines)
        header = ("module", "weight", "role", "action", "runs", "reason")
        rows = [(s.module_fqn or "-", s.weight_fqn or "-", s.role, s.action, s.impl, s.reason) for s in self.sites]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
        out += [fmt.format(*r) for r in rows]
        counts = collections.Counter(s.action for s in self.sites)
        tally = ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
        out.append(f"{tally}; {len(self.graph_breaks)} graph break(s)")
        return "\n".join(out)


def graph_code(gm: torch.fx.GraphModule) -> str:
    """A GraphModule's code without comments and blank lines (stable for expecttest)."""
    lines = []
    for line in gm.code.splitlines():
        line = re.sub(r"\s*#.*$", "", line).rstrip()
        if line:
            lines.append(line)
    return "\n".join(lines)


def explain(
    model: torch.nn.Module, *args: Any, options: MXFP8Config | dict[str, Any] | None = None, **kwargs: Any
) -> Report:
    """Compile `model`, run it on the inputs (forward, then a backward that leaves `.grad`
    untouched) and report what the pass did.

    Options as for backend="mxfp8" ("inductor" patches apply while the pass plans: CUDA graphs
    change what `recipe="auto"` times); without them a model marked with `mxfp8()` uses its own
    options and an unmarked one the defaults. Resets Dynamo's caches before and after.
    """
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor import config as inductor_config

    ensure_registered()
    table = marks.marked_params()
    marked = any(marks.lookup(p, table) is not None for p in model.parameters())
    config, patches = split_options(options) if options is not None or not marked else (None, {})
    if config is not None:
        config.check_graph_route("explain(options=...)")
    sites: list[SiteReport] = []
    graphs: list[str] = []
    aot_graphs: list[str] = []

    def capture(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]):
            aot_graphs.append(f"# {kind}\n" + graph_code(gm))
            return make_boxed_func(gm.forward)

        return compiler

    aot = aot_autograd(fw_compiler=capture("forward"), bw_compiler=capture("backward"))

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **_: Any):
        with inductor_config.patch(patches):
            sites.extend(rewrite(gm, config))
        graphs.append(graph_code(gm))
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    breaks_before = _graph_breaks()
    try:
        out = torch.compile(model, backend=backend)(*args, **kwargs)
        leaves = [t for t in pytree.tree_leaves(out)
                  if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
        inputs = [p for p in model.parameters() if p.requires_grad]
        inputs += [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
        if leaves and inputs:
            torch.autograd.grad(sum(t.float().sum() for t in leaves), inputs, allow_unused=True)
    finally:
        torch._dynamo.reset()
    breaks = _graph_breaks() - breaks_before
    return Report(sites, graphs, aot_graphs, sorted(breaks))


def _graph_breaks() -> collections.Counter:
    """Dynamo's graph-break reasons so far (first line of each), including skipped frames."""
    counters = torch._dynamo.utils.counters
    reasons: collections.Counter = collections.Counter()
    for group in ("graph_break", "unimplemented"):
        for reason, n in counters[group].items():
            reasons[str(reason).strip().splitlines()[0]] += n
    return reasons
