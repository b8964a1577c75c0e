"""`manage.py usage`: the usage report of a period (docs/usage.md), a row per group.

    manage.py usage --from 2025-03-01 --to 2025-03-31 --by owner
    manage.py usage --period month --by team
    manage.py usage --period week --by claim --node-id 12
    manage.py usage --period month --json      # exactly what GET /api/usage/ answers

A plain aligned table by default, the totals last and the hours nobody saw stated under
them; the options are the API's parameters and are read by the same code
(gpufleet.usage.query), so a refusal is in the same words."""

from __future__ import annotations

import json as _json

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from gpufleet.usage import period, query, report

# Each option, by the API parameter it is.
OPTIONS = {
    "--from": "from",
    "--to": "to",
    "--period": "period",
    "--by": "by",
    "--owner": "owner",
    "--team": "team",
    "--claim-id": "claim_id",
    "--node-id": "node_id",
    "--image": "image",
    "--model": "model",
}
HELP = {
    "from": "the first day, YYYY-MM-DD (UTC)",
    "to": "the last day, included (default: today)",
    "period": f"this {', '.join(period.PRESETS[:-1])} or {period.PRESETS[-1]} so far, instead of --from and --to"
              " (neither: this month so far)",
    "by": f"what each row is the usage of: {', '.join(report.GROUPS)} (default: {query.DEFAULT_GROUP})",
    "owner": "only the GPU time of claims this user owned",
    "team": "only the GPU time of claims of this team",
    "claim_id": "only the GPU time this claim held",
    "node_id": "only the GPU time of this node",
    "image": "only the GPU time of containers of this image",
    "model": "only the GPU time of GPUs of this model, as nvidia-smi names it",
}
# The table's columns after the key: heading, the answer's figure, how it is written.
COLUMNS = [
    ("reserved", "gpu_hours_reserved", "{:.2f}"),
    ("used", "gpu_hours_used", "{:.2f}"),
    ("idle reserved", "gpu_hours_idle_reserved", "{:.2f}"),
    ("used unreserved", "gpu_hours_used_unreserved", "{:.2f}"),
    ("efficiency", "efficiency", "{:.0%}"),
    ("kWh", "energy_kwh", "{:.2f}"),
    ("cost", "cost", "{:.2f}"),
]
# A group whose key is empty, in words.
NONE = {"owner": "(no owner)", "team": "(no team)", "image": "(no image)", "label": "(no label)", "model": "(no model)"}


class Command(BaseCommand):
    help = "Print GPU-hours reserved, used and idle, energy and cost over a period, by owner, team, claim, image, " \
           "label, node or model: a table, or with --json what GET /api/usage/ answers."

    OPTIONS = OPTIONS

    def add_arguments(self, parser):
        for option, name in OPTIONS.items():
            parser.add_argument(option, dest=name, metavar=name.upper().replace("_", "-"), help=HELP[name])
        parser.add_argument("--json", action="store_true", help="print what GET /api/usage/ answers")

    def handle(self, *args, json: bool = False, **options):
        try:
            asked = query.read({name: options.get(name) for name in OPTIONS.values()}, timezone.now())
        except query.QueryError as exc:
            raise CommandError(str(exc)) from None
        answer = query.run(asked)
        if json:
            self.stdout.write(_json.dumps(answer, indent=2))
            return
        for line in table(answer):
            self.stdout.write(line)


def table(answer: dict) -> list[str]:
    """The answer as aligned lines: a title, the heading, a line per group, the total,
    and the hours no snapshot covered or without a power reading."""
    by = answer["by"]
    cost = f"cost {answer['currency']}" if answer["currency"] else "cost"
    heading = [by, *(cost if figure == "cost" else name for name, figure, _ in COLUMNS)]
    rows = [[_key(by, row["key"]), *_figures(row)] for row in answer["rows"]]
    rows.append(["total", *_figures(answer["total"])])
    widths = [max(len(line[i]) for line in [heading, *rows]) for i in range(len(heading))]

    def aligned(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    total = answer["total"]
    return [
        f"GPU-hours by {by}, {answer['from']} to {answer['to']} (UTC)",
        aligned(heading),
        *(aligned(row) for row in rows),
        f"unknown: {total['gpu_hours_unknown']:.2f} GPU-hours no snapshot covered (neither used nor idle); "
        f"{total['gpu_hours_power_unknown']:.2f} GPU-hours seen without a power reading (not in kWh)",
    ]


def _figures(row: dict) -> list[str]:
    return ["-" if row[figure] is None else written.format(row[figure]) for _, figure, written in COLUMNS]


def _key(by: str, key: dict) -> str:
    if by == "claim":
        return f"{key['claim'] or 'unreserved'} on {key['node']}"
    value = key["node" if by == "node" else by]
    return value or NONE.get(by, "(none)")
