"""The user docs' Python blocks run as written: each ```python block of README.md and
docs/integrations.md, read from the file, runs in a fresh namespace on CPU (its setup lines build
the tiny models it is shown on), and the FQN patterns it passes as `include` / `exclude` match
expert sites of the model it shows. A block is named by its file and the heading above it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import warnings
from typing import Any

import pytest
import torch

import mxfp8_inductor as mx

ROOT = pathlib.Path(__file__).parents[1]
# each file with the python blocks it must hold at least: an edit that drops one shows here
# (README: the quick start, the three ways in, the ops; integrations: TorchTitan's config)
DOCS = {"README.md": 3, "docs/integrations.md": 1}


def python_blocks(text: str) -> list[tuple[str, int, str]]:
    """(id, first line number, source) of each ```python block: the id is the nearest heading above
    it, numbered where a heading holds several blocks. Lines inside fences are never headings."""
    blocks: list[tuple[str, int, list[str]]] = []
    heading, fence, body, start = "(top)", None, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if fence is None:
            if line.startswith("```"):
                fence, body, start = line[3:].strip(), [], number + 1
            elif line.startswith("#"):
                heading = line.lstrip("#").strip()
        elif line.strip() == "```":
            if fence == "python":
                blocks.append((heading, start, body))
            fence = None
        else:
            body.append(line)
    seen: dict[str, int] = {}
    for heading, _, _ in blocks:
        seen[heading] = seen.get(heading, 0) + 1
    count: dict[str, int] = {}
    out = []
    for heading, start, body in blocks:
        count[heading] = count.get(heading, 0) + 1
        name = heading if seen[heading] == 1 else f"{heading} #{count[heading]}"
        out.append((name, start, "\n".join(body) + "\n"))
    return out


# (file, block name, first line number, source) of every block
BLOCKS = [(doc, name, line, source) for doc in DOCS for name, line, source in python_blocks((ROOT / doc).read_text())]


@pytest.mark.parametrize("doc", DOCS)
def test_doc_has_the_python_blocks(doc):
    names = [name for file, name, _, _ in BLOCKS if file == doc]
    assert len(names) >= DOCS[doc], names


def _imported_modules(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _skip_if_a_dependency_is_missing(tree: ast.Module) -> None:
    """Skip a block whose imports need a package that this install leaves out on purpose: a
    dependency of a library the block imports (torchtitan's trainer needs tensorboard, datasets and
    torchdata, which the test command's `--no-deps` install omits). A module the block names itself
    that is missing (a typo, a moved module) fails."""
    modules = _imported_modules(tree)
    named = {m.split(".")[0] for m in modules}
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            missing = (e.name or "").split(".")[0]
            if not missing or missing in named:
                raise
            pytest.skip(f"importing {module} needs {e.name!r}, a dependency of {module.split('.')[0]} that this "
                        f"install omits (the test command installs torchtitan with --no-deps)")


def _patterns(tree: ast.Module) -> list[str]:
    """The string FQN patterns the block passes as include / exclude, as keywords or option keys."""
    lists: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("include", "exclude"):
            lists.append(node.value)
        elif isinstance(node, ast.Dict):
            lists += [v for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value in ("include", "exclude")]
    return [e.value for value in lists if isinstance(value, (ast.List, ast.Tuple))
            for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _expert_sites(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module FQN, weight FQN) of each expert weight (3-D parameter): what patterns must match."""
    return [(name.rpartition(".")[0], name) for name, p in model.named_parameters() if p.dim() == 3]


def _shown_models(namespace: dict[str, Any]) -> list[torch.nn.Module]:
    """The model a block shows: the one it names `model`, else the model the config function it
    defines (TorchTitan's `my_configs.py`) builds, on the meta device."""
    if isinstance(namespace.get("model"), torch.nn.Module):
        return [namespace["model"]]
    models = []
    for value in list(namespace.values()):
        if inspect.isfunction(value) and value.__module__ == namespace["__name__"] and not inspect.signature(
                value).parameters:
            config = value()  # what TorchTitan's --config calls
            spec = getattr(config, "model_spec", None)
            if spec is not None:
                with torch.device("meta"):
                    models.append(spec.model.build())
    return models


@pytest.mark.parametrize("doc, name, line, source", BLOCKS, ids=[f"{doc}: {name}" for doc, name, _, _ in BLOCKS])
def test_doc_block_runs(doc, name, line, source):
    tree = ast.parse(source)
    _skip_if_a_dependency_is_missing(tree)
    first = source.lstrip().splitlines()[0]
    module = first[2:].removesuffix(".py").strip() if first.startswith("# ") and first.endswith(".py") else "doc_block"
    namespace: dict[str, Any] = {"__name__": module}
    # line numbers in a traceback are the doc's
    code = compile("\n" * (line - 1) + source, str(ROOT / doc), "exec")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*matches no grouped-matmul site")
        exec(code, namespace)
        models = _shown_models(namespace)

    patterns = _patterns(tree)
    if patterns:
        assert models, f"{name}: FQN patterns {patterns} but no model to match them against"
        sites = [site for model in models for site in _expert_sites(model)]
        for pattern in patterns:
            assert not mx.MXFP8Config(exclude=[pattern]).unmatched(sites), (
                f"{name}: pattern {pattern!r} matches no expert of {[type(m).__name__ for m in models]}")
    # an explain() report the block leaves: its model compiled and ran, and the pass rewrote sites
    for report in (v for v in namespace.values() if isinstance(v, mx.Report)):
        assert report.graphs and report.aot_graphs, report
        assert any(s.action == "rewritten" for s in report.sites), report
