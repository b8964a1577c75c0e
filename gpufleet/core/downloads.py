"""Downloads every export shares: CSV written line by line with cells a spreadsheet
will not run, and the streamed attachment (the doctor reports, claims against use,
the events)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator

from django.http import Http404, StreamingHttpResponse
from django.utils import timezone

FORMATS = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
}

_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value) -> str:
    """A CSV cell a spreadsheet will not run: text starting like a formula gets a
    leading apostrophe (OWASP's CSV injection advice)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_PREFIXES) else text


class _Echo:
    """csv.writer target that hands each written row back instead of buffering it."""

    def write(self, value: str) -> str:
        return value


def csv_stream(columns: Iterable[str], rows: Iterable[Iterable]) -> Iterator[str]:
    """A CSV download line by line (constant memory): the header, then each row,
    every cell made safe for spreadsheets."""
    writer = csv.writer(_Echo())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow([safe_cell(cell) for cell in row])


def download(body: Iterable[str], fmt: str, stem: str) -> StreamingHttpResponse:
    """`body` streamed as an attachment named after `stem` and the time, never cached."""
    if fmt not in FORMATS:
        raise Http404("unknown report format")
    response = StreamingHttpResponse(body, content_type=FORMATS[fmt])
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="{stem}-{stamp}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response
