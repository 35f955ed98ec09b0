"""The user docs stay short and their pointers resolve: README.md is at most 250 lines, and every
repository path that README.md and docs/integrations.md name (in backticks or as a link target)
exists, as does every docs section they cite as `docs/<file>.md`, "<heading>"."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[1]
PACKAGE = ROOT / "mxfp8_inductor"
DOCS = ("README.md", "docs/integrations.md")
README_MAX_LINES = 250

# a token names a file by its extension, or a folder by its first part being a repository or
# package folder (module paths are written from the package: `kernels/rowwise.py`)
EXTENSIONS = ("py", "md", "json", "png", "txt", "toml", "csv", "yaml", "yml", "cfg")
TOP = {p.name for p in (*ROOT.iterdir(), *PACKAGE.iterdir()) if p.is_dir()
       and not p.name.startswith(("__", ".venv", ".git", ".pytest", ".ruff")) and not p.name.endswith(".egg-info")}
PATH_LIKE = re.compile(r"^\.?[\w-]+(/[\w.*-]+)*/?$|^[\w.*-]+\.(" + "|".join(EXTENSIONS) + ")$")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (commands and code there are not pointers)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return "\n".join(out)


def _looks_like_a_repo_path(token: str) -> bool:
    if not PATH_LIKE.match(token) or "://" in token:
        return False
    if "/" in token:
        return token.removeprefix("./").split("/")[0] in TOP
    return token.rsplit(".", 1)[-1] in EXTENSIONS and not token.startswith(("mx.", "torch.", "F."))


def referenced_paths(text: str) -> list[tuple[str, bool]]:
    """(path, is a link target) of every repository path the prose names in backticks or links."""
    prose = _prose(text)
    found = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        for token in span.split():
            token = token.strip("'\"(),:;")
            if _looks_like_a_repo_path(token):
                found.append((token, False))
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        target = target.split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            found.append((target, True))
    return found


def _exists(path: str, doc: pathlib.Path, link: bool) -> bool:
    bases = [doc.parent] if link else [ROOT, PACKAGE]
    return any(list(base.glob(path.rstrip("/"))) if "*" in path else (base / path).exists() for base in bases)


@pytest.mark.parametrize("doc", DOCS)
def test_every_named_path_exists(doc):
    path = ROOT / doc
    found = referenced_paths(path.read_text())
    assert found, f"{doc} names no repository path: the pattern no longer finds them"
    missing = sorted({p for p, link in found if not _exists(p, path, link)})
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def _headings(doc: pathlib.Path) -> set[str]:
    return {line.lstrip("#").strip() for line in _prose(doc.read_text()).splitlines() if line.startswith("#")}


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_section_exists(doc):
    # `docs/design.md`, "Weight cache" (the form the docs and code comments cite a section in)
    cited = re.findall(r'`(docs/[\w-]+\.md)`,\s+"([^"]+)"', " ".join(_prose((ROOT / doc).read_text()).split()))
    missing = [(file, section) for file, section in cited if section not in _headings(ROOT / file)]
    assert not missing, f"{doc} cites sections that do not exist: {missing}"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"


@pytest.mark.parametrize("text, paths", [
    ("`docs/design.md` and `python benchmarks/hopper_ceiling.py`", ["docs/design.md", "benchmarks/hopper_ceiling.py"]),
    ("`kernels/rowwise.py`, `LICENSE`, `CHANGELOG.md`", ["kernels/rowwise.py", "CHANGELOG.md"]),
    ("`model.layers.0.*`, `mx.explain`, `torch._grouped_mm`, `Qwen/Qwen3-30B-A3B`, `lm_head`", []),
    ("```\npython examples/nope.py\n```\n![plot](benchmarks/results/x.png)", ["benchmarks/results/x.png"]),
])
def test_path_pattern(text, paths):
    assert [p for p, _ in referenced_paths(text)] == paths
