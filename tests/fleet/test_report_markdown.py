"""The Markdown export, read as a CommonMark viewer reads it: whatever text a node or
a user stored (a finding's message, name or fix, the node's name, its driver or
toolkit), it comes out as that text, never as HTML, an image or a link."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from gpufleet.fleet import reports
from gpufleet.fleet.models import Finding, Node

# CommonMark with GFM tables, as ticket systems and code hosts render Markdown.
_MD = MarkdownIt("commonmark").enable("table")
ACTIVE = {"html_inline", "html_block", "image", "link_open", "autolink"}

HOSTILE = (
    "<img src=x onerror=alert(1)>",
    "``<img src=x onerror=alert(1)>``",
    "a `` b <script>alert(1)</script> ``",
    "![t](http://evil.example/pixel.png)",
    "[click](javascript:alert(1))",
    "<http://evil.example>",
    "&lt;b&gt; &amp; &#60;i&#62;",
    "a | b \\| c",
    "*not* _emph_ **bold** ~~gone~~",
    "\\",
    "` ",
    "[x]: http://evil.example\n[y][x]",
    "# heading\n- item\n> quote",
)


def _walk(tokens: list[Token]):
    for token in tokens:
        yield token
        yield from _walk(token.children or [])


def _text(inline: Token) -> str:
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


def _rows(tokens: list[Token]) -> list[list[Token]]:
    """The table's rows, each as the inline tokens of its cells."""
    rows, row = [], None
    for token in tokens:
        if token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token)
        elif token.type == "tr_close":
            rows.append(row)
            row = None
    return rows


def _report(name="alpha", message="m", title="t", fix=None, driver="550.54.14", toolkit="1.17.3") -> dict:
    finding = {"code": "driver", "name": title, "status": "warn", "message": message}
    if fix is not None:
        finding["fix"] = fix
    return {"node": name, "status": "warn", "collected_at": None, "last_seen": None, "devices": [],
            "driver_version": driver, "toolkit_version": toolkit, "attach": "legacy", "findings": [finding]}


def _shown(text: str | None) -> str:
    """What a reader sees of `text`: one line, and NUL as CommonMark replaces it."""
    return " ".join((text or "").split()).replace("\x00", "\ufffd")


def _assert_inert(markdown: str, name: str, message: str, title: str, fix: str | None) -> None:
    tokens = _MD.parse(markdown)
    assert not [t.type for t in _walk(tokens) if t.type in ACTIVE]
    heading = next(tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2")
    assert _text(heading) == f"{_shown(name)}: Warning"
    header, row = _rows(tokens)
    assert len(header) == len(row) == 4  # no cell split off or swallowed
    assert [_text(cell) for cell in row] == ["WARN", _shown(title), _shown(message), _shown(fix)]
    codes = [c for c in row[3].children or [] if c.type == "code_inline"]
    assert len(codes) == (1 if (fix or "").split() else 0)  # the fix is one code span, whole


@pytest.mark.parametrize("text", HOSTILE)
def test_it_writes_hostile_text_as_text(text):
    markdown = reports.node_markdown(_report(name=text, message=text, title=text, fix=text))
    _assert_inert(markdown, text, text, text, text)


_PIECES = st.sampled_from([*HOSTILE, "`", "``", "```", "\\", "|", "<", ">", "&", "!", "[", "]", "(", ")", " ", "\n"])
_HOSTILE_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=8).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=_HOSTILE_TEXT, message=_HOSTILE_TEXT, title=_HOSTILE_TEXT, fix=_HOSTILE_TEXT)
def test_no_generated_text_becomes_markup(name, message, title, fix):
    markdown = reports.node_markdown(_report(name=name, message=message, title=title, fix=fix or None))
    _assert_inert(markdown, name, message, title, fix or None)


@pytest.mark.django_db
def test_the_downloaded_report_keeps_stored_text_inert(viewer_client, alpha):
    fix = "``<img src=x onerror=alert(1)>``"
    message = "see ![t](http://evil.example/p.png) and <b>bold</b>"
    Finding.objects.filter(node=alpha, code="driver").update(message=message, fix=fix, status="warn")
    Node.objects.filter(pk=alpha.pk).update(health="warn")
    body = b"".join(viewer_client.get("/nodes/alpha/report.md").streaming_content).decode()
    tokens = _MD.parse(body)
    assert not [t.type for t in _walk(tokens) if t.type in ACTIVE]
    cells = {_text(row[1]): row for row in _rows(tokens)}
    driver = next(row for row in cells.values() if _text(row[2]) == message)
    assert [c.content for c in driver[3].children if c.type == "code_inline"] == [fix]


def test_it_names_the_attach_mode_as_the_pages_do():
    markdown = reports.node_markdown(_report())
    assert "attach: nvidia runtime" in markdown.replace("\\", "")
    assert "legacy" not in markdown
