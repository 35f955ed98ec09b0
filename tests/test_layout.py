"""The package's imports flow one way: entry points -> patterns -> lowering -> kernels, with
eligibility, options, routes and spec as leaves that every layer may use (docs/design.md, "Layout")."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parents[1] / "mxfp8_inductor"
# a module may import modules of its own rank or lower
RANK = {"_warn": 0, "_version": 0, "options": 0, "marks": 0, "routes": 0, "spec": 0, "eligibility": 1, "kernels": 2,
        "lowering": 3, "patterns": 4}
ENTRY = 5  # __init__, backend, marking, explain, check


def _name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _rank(module: str) -> int:
    parts = module.split(".")
    return RANK.get(parts[1], ENTRY) if len(parts) > 1 else ENTRY


def _imports(path: pathlib.Path) -> set[str]:
    """Package modules `path` imports, at module level or inside functions."""
    here = _name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mxfp8_inductor")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.startswith("mxfp8_inductor"):
                submodules = {f"{module}.{a.name}" for a in node.names if _is_module(f"{module}.{a.name}")}
                # `from .. import marks` reads a module, not the package's own names
                found |= submodules if node.module is None and len(submodules) == len(node.names) else {module}
                found |= submodules
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[_name(p) for p in MODULES])
def test_imports_flow_one_way(path):
    source = _name(path)
    wrong = [m for m in _imports(path) if _rank(m) > _rank(source)]
    assert not wrong, f"{source} (rank {_rank(source)}) imports {wrong}"


def test_the_rule_sees_a_wrong_way_import(tmp_path, monkeypatch):
    """A kernels module importing lowering is caught (so the test above can fail)."""
    fake = PACKAGE / "kernels" / "reference.py"
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: "from ..lowering import ops\n")
    assert _imports(fake) == {"mxfp8_inductor.lowering", "mxfp8_inductor.lowering.ops"}
    assert _rank("mxfp8_inductor.lowering.ops") > _rank(_name(fake))


def test_torch_range_is_checked_at_import():
    import warnings

    from mxfp8_inductor._version import check_torch

    with pytest.raises(ImportError, match="needs torch >= 2.11"):
        check_torch("2.10.1+cu128")
    with pytest.raises(ImportError, match="needs torch >= 2.11"):
        check_torch("2.10.0a0+git1234abc")
    with pytest.warns(UserWarning, match="tested with torch 2.11 to 2.13, found 2.14.0"):
        check_torch("2.14.0")
    with pytest.warns(UserWarning, match="found 2.14.0.dev20261101"):
        check_torch("2.14.0.dev20261101")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_torch("2.11.0+cu130")
        check_torch("2.11.0.dev20260301+cu130")  # a nightly of a tested release counts as it
        check_torch("2.13.0+cpu")
        check_torch("2.13.1rc1")
