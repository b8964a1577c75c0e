"""The README stays short and the docs stay true: every environment variable the code
reads is in docs/configuration.md's settings tables and every one listed there is read,
found by parsing the source rather than kept as a list here; every relative link of the
README and docs/ names a file that exists."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from markdown_it import MarkdownIt

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.usage import report
from tests.factories import snapshot

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


# --- files cited by name ------------------------------------------------------

# A path into the repository, or a Markdown file named alone (README.md, docs' pages).
_CITED_PATH = re.compile(r"(?<![\w/.-])((?:gpufleet|tests|docs|templates)/[\w./-]*[\w/])")
_CITED_PAGE = re.compile(r"(?<![\w/.-])([A-Za-z][\w-]*\.md)\b")
_CITING = {".py", ".md", ".html", ".css", ".js", ".txt", ".ini", ".toml", ".sh", ".service", ".cfg"}


def _citing_files(root: Path) -> list[Path]:
    found = [p for p in root.iterdir() if p.is_file() and p.suffix in _CITING]
    for folder in ("docs", "gpufleet", "templates", "tests", ".ci"):
        found += [p for p in (root / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and (p.suffix in _CITING or not p.suffix)]
    return sorted(found)


def missing_citations(root: Path, files: list[Path]) -> list[str]:
    """`file: name` for each file a text cites that the repository does not hold: a path
    from the top (a static file's from its app's static folder), or a page named alone."""
    pages = {p.name for p in root.rglob("*.md") if ".venv" not in p.parts}
    missing = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for path in _CITED_PATH.findall(text):
            if not (root / path).exists() and not any(root.glob(f"gpufleet/*/static/{path}")):
                missing.append(f"{file.relative_to(root)}: {path}")
        missing += [f"{file.relative_to(root)}: {page}" for page in _CITED_PAGE.findall(text) if page not in pages]
    return missing


def test_docs_and_code_cite_only_files_that_are_in_the_repository():
    # This module's own examples name files that are nowhere, on purpose.
    files = [f for f in _citing_files(REPO) if f != Path(__file__).resolve()]
    assert missing_citations(REPO, files) == []


def test_a_cited_file_that_is_not_there_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text("# Architecture\n")
    (tmp_path / "gpufleet" / "core" / "static" / "gpufleet").mkdir(parents=True)
    (tmp_path / "gpufleet" / "core" / "static" / "gpufleet" / "app.css").write_text("")
    code = tmp_path / "gpufleet" / "reports.py"
    code.write_text('"""As NOTES.md says, and docs/architecture.md; docs/gone.md; tests/test_x.py."""\n'
                    "STATIC = 'gpufleet/app.css'\n")
    assert missing_citations(tmp_path, [code]) == [
        "gpufleet/reports.py: docs/gone.md", "gpufleet/reports.py: tests/test_x.py", "gpufleet/reports.py: NOTES.md"]


# --- what the guides say the code does ---------------------------------------


def _guide(name: str) -> str:
    """A page of docs/ with its lines joined, so a sentence is found across line breaks."""
    return " ".join((REPO / "docs" / name).read_text(encoding="utf-8").split())


def test_the_deployment_guide_says_the_admin_role_opens_the_admin_site(admin_role_client, admin_user):
    assert not admin_user.is_staff and admin_role_client.get("/admin/").status_code == 200
    guide = _guide("deployment.md")
    assert "Django's admin site opens to staff and to the `admin` role" in guide
    assert '"Staff status" to let them' not in guide


@pytest.mark.django_db
def test_the_usage_guide_says_what_a_first_snapshot_counts_and_that_a_new_owner_is_a_row_of_their_own(
        settings, operator, admin_user):
    settings.GPUFLEET_COLLECT_INTERVAL = 300
    start = datetime(2026, 3, 2, 10, tzinfo=UTC)
    with time_machine.travel(start, tick=False) as clock:
        assert ingest_snapshots([snapshot("one", 2, at=start)])[0].outcome == "accepted"
        seen = report.report(start - timedelta(hours=1), start + timedelta(hours=1), "node").total.power_unknown
        assert seen == pytest.approx(2 * 300 / 3600)  # the node's first snapshot: a whole interval of 2 GPUs
        node = Node.objects.get(name="one")
        made = claims.save_claim(node, gpu.Claim("train", device_ids=("0",)), operator)
        for minutes in (5, 10, 15, 20):
            if minutes == 15:
                claims.save_claim(node, gpu.Claim("train", device_ids=("0",)), operator, editing=made,
                                  terms=claims.Terms(owner=admin_user))
            clock.move_to(start + timedelta(minutes=minutes))
            assert ingest_snapshots([snapshot("one", 2, at=start + timedelta(minutes=minutes))])[0].outcome == "accepted"
    rows = report.report(start - timedelta(hours=1), start + timedelta(hours=1), "claim").rows
    held = [row.key for row in rows if row.key["claim_id"] is not None]
    assert sorted(key["owner"] for key in held) == sorted([operator.username, admin_user.username])
    assert {key["claim_id"] for key in held} == {made.pk}
    guide = _guide("usage.md")
    assert "A node's first snapshot, and one after a longer gap, covers one whole collect interval" in guide
    assert "a claim whose owner changed (or that was renamed) appears once per owner (and name)" in guide
    assert "with the same `claim_id`" in guide


@pytest.mark.django_db
def test_the_architecture_says_findings_are_replaced_by_every_snapshot():
    first = snapshot("one", 2)
    assert ingest_snapshots([first])[0].outcome == "accepted"
    before = set(Node.objects.get(name="one").findings.values_list("pk", flat=True))
    again = snapshot("one", 2, at=datetime.fromisoformat(first["collected_at"]) + timedelta(minutes=1))
    assert ingest_snapshots([again])[0].outcome == "accepted"
    after = set(Node.objects.get(name="one").findings.values_list("pk", flat=True))
    assert before and after and not before & after  # the same findings, stored again
    guide = _guide("architecture.md")
    assert "its findings (replaced by the snapshot's every time, changed or not" in guide
    assert "replaced only when they changed" not in guide


def test_the_api_guide_says_which_parameter_a_to_without_from_names(viewer_client):
    answer = viewer_client.get("/api/usage/", {"to": "2025-03-01"})
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "from"
    assert "`to` without `from` names `from`" in _guide("api.md")
