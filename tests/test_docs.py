"""The README stays short and the docs stay true: every environment variable the code
reads is in docs/configuration.md's settings tables and every one listed there is read,
found by parsing the source rather than kept as a list here; every relative link of the
README and docs/ names a file that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]
README_LIMIT_BYTES = 10 * 1024
_NAME = re.compile(r"`([A-Z][A-Z0-9_]+)`")


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _literal(args: list[ast.expr]) -> str | None:
    if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value
    return None


def variables_read(source: str) -> set[str]:
    """Names of environment variables `source` reads: os.environ.get/setdefault/[...],
    os.getenv, and the env_* helpers of gpufleet/env.py, each with a literal name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Call) and _reads_environment(node.func):
            name = _literal(node.args)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            name = _literal([node.slice])
        if name:
            found.add(name)
    return found


def _reads_environment(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return (func.attr in ("get", "setdefault") and _is_environ(func.value)) or func.attr == "getenv"
    return isinstance(func, ast.Name) and func.id.startswith("env_")


def code_variables() -> set[str]:
    return set().union(*(variables_read(p.read_text(encoding="utf-8")) for p in (REPO / "gpufleet").rglob("*.py")))


def documented_variables(text: str) -> set[str]:
    """The variables named in the first column of the settings tables."""
    found = set()
    for line in text.splitlines():
        cells = line.strip().split("|")
        if line.strip().startswith("|") and len(cells) > 2:
            found |= set(_NAME.findall(cells[1]))
    return found


def test_every_variable_the_code_reads_is_documented_and_every_documented_one_is_read():
    read = code_variables()
    documented = documented_variables((REPO / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert not read - documented, f"read by gpufleet/ but not in docs/configuration.md: {sorted(read - documented)}"
    assert not documented - read, f"in docs/configuration.md but read nowhere in gpufleet/: {sorted(documented - read)}"


def test_the_parser_finds_each_way_of_reading_a_variable():
    source = (
        "import os\nfrom gpufleet.env import env_int\n"
        "a = os.environ.get('A')\nb = os.environ['B']\nos.environ.setdefault('C', 'x')\n"
        "d = os.getenv('D')\ne = env_int('E', 1)\nos.environ['F'] = 'set, not read'\n"
        "g = os.environ.get(name)\nh = {'H': 1}.get('H')\n"
    )
    assert variables_read(source) == {"A", "B", "C", "D", "E"}


def test_the_table_parser_reads_first_columns_only():
    table = "| variable | default | meaning |\n| --- | --- | --- |\n| `DEBUG`, `TIME_ZONE` | `UTC` | like `SECRET_KEY` |\n"
    assert documented_variables(table) == {"DEBUG", "TIME_ZONE"}


def test_the_readme_stays_short():
    size = (REPO / "README.md").stat().st_size
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes; move detail to docs/ (limit {README_LIMIT_BYTES})"


def _links(tokens) -> list[str]:
    found = []
    for token in tokens:
        if token.type == "link_open":
            found.append(token.attrs.get("href", ""))
        elif token.type == "image":
            found.append(token.attrs.get("src", ""))
        if token.children:
            found += _links(token.children)
    return found


def relative_links(path: Path) -> list[str]:
    """Links and images of a Markdown file that point into the repository."""
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))
    return [link for link in _links(tokens) if link and not re.match(r"^([a-z][a-z0-9+.-]*:|#|//)", link)]


def anchors(path: Path) -> set[str]:
    """The fragments a Markdown page's headings answer to, made as GitHub makes them."""
    tokens = MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))
    titles = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def broken_links(pages: list[Path]) -> list[str]:
    broken = []
    for page in pages:
        for link in relative_links(page):
            path, _, fragment = link.partition("#")
            target = (page.parent / path).resolve()
            if not target.exists() or (fragment and target.suffix == ".md" and fragment not in anchors(target)):
                broken.append(f"{page.name}: {link}")
    return broken


def test_every_relative_link_of_the_readme_and_docs_names_a_file_and_heading():
    broken = broken_links([REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    assert not broken, f"links to nothing: {broken}"


def test_a_link_to_a_missing_file_or_heading_is_broken(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Agent (each GPU host)\n")
    page = tmp_path / "p.md"
    page.write_text("[ok](a.md#agent-each-gpu-host) [top](a.md#a-page) [gone](b.md) [no heading](a.md#nowhere)\n")
    assert broken_links([page]) == ["p.md: b.md", "p.md: a.md#nowhere"]


def test_the_link_finder_skips_outside_links_and_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](docs/a.md#x) ![i](images/i.png) [w](https://x.org) [s](#top) <http://127.0.0.1:8000/>\n")
    assert relative_links(page) == ["docs/a.md#x", "images/i.png"]
