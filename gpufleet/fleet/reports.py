"""Doctor reports for one node or the fleet, as JSON, CSV and Markdown.

A node report is the doctor's JSON (docs/commands.md) plus `schema_version`,
`collected_at`, `last_seen` and the node `status`. Fleet reports take the
overview's filtered queryset (`NodeFilter.qs`) and stream: nodes are read in
chunks, with their devices and findings as plain values (`_chunk_contents`), so the
query count grows with chunks, never with nodes, and nothing holds the whole fleet
in memory."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import string
from collections.abc import Iterable, Iterator
from datetime import datetime

from django.db.models import Count, Prefetch, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from gpufleet import gpu
from gpufleet.core.downloads import safe_cell
from gpufleet.fleet.models import Attach, Device, Finding, FindingStatus, Health, Node

REPORT_SCHEMA_VERSION = 1
CHUNK_SIZE = 200
PROBLEM_STATUSES = (FindingStatus.WARN, FindingStatus.FAIL)
# A finding row fills the first six columns; a device row ("row" = device) names
# the GPU in `code`/`name` and fills the GPU columns after `row`: the domain's GPU
# fields (gpu.DEVICE_FIELDS), those the CSV had first in their order, then any other
# in the domain's, so that a new one comes last and no column moves.
_FIRST_DEVICE_COLUMNS = (
    "index", "uuid", "pci_bus_id", "vram_total_mib", "vram_used_mib", "utilization_percent", "temperature_c",
    "power_draw_w", "power_limit_w", "ecc_uncorrected_volatile", "throttle_reasons", "xid_errors", "processes",
    "memory_temperature_c", "fan_percent", "pstate", "sm_clock_mhz", "sm_clock_max_mhz", "persistence_mode",
    "ecc_mode", "ecc_corrected_volatile", "ecc_uncorrected_aggregate", "retired_pages_pending",
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure",
    "mig_mode", "mig_devices",
)
# Not GPU columns: the name is the row's `name`; the idle containers are on the node's
# page, not in the export.
NOT_DEVICE_CSV_COLUMNS = ("name", "attached_idle")
DEVICE_CSV_COLUMNS = (*_FIRST_DEVICE_COLUMNS, *(
    field for field in gpu.DEVICE_FIELDS if field not in _FIRST_DEVICE_COLUMNS and field not in NOT_DEVICE_CSV_COLUMNS
))
CSV_COLUMNS = ("node", "code", "name", "status", "message", "fix", "row", *DEVICE_CSV_COLUMNS)


def with_report_data(nodes: QuerySet) -> QuerySet:
    """`nodes` with what a report needs prefetched: current devices and findings."""
    return nodes.prefetch_related(
        Prefetch(
            "devices",
            queryset=Device.objects.filter(vanished_at__isnull=True).order_by("index"),
            to_attr="current_devices_cache",
        ),
        Prefetch("findings", queryset=Finding.objects.order_by("position"), to_attr="report_findings"),
    )


def node_report(node: Node, only_problems: bool = False) -> dict:
    """One node's report; the node must come from `with_report_data`."""
    findings = node.report_findings
    if only_problems:
        findings = [f for f in findings if f.status in PROBLEM_STATUSES]
    return _report(node, node.diagnosis(findings=findings))


def _report(node: Node, diagnosis: gpu.HostDiagnosis) -> dict:
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "node": node.name,
        "status": node.status.value,
        "collected_at": _iso(node.collected_at),
        "last_seen": _iso(node.last_seen),
        **diagnosis.to_dict(node.name),
    }


# What a report reads of a node row.
_REPORT_NODE_FIELDS = ("name", "offline", "health", "collected_at", "last_seen", "present", "driver_version",
                       "runtime_installed", "toolkit_version", "cdi_spec_files", "cdi_devices", "attach")


def fleet_reports(nodes: QuerySet, only_problems: bool = False) -> FleetReports:
    """Reports of `nodes` in their order; with `only_problems`, nodes with nothing
    to report (online, no warn or fail finding) are left out. Each has the shape of
    `HostDiagnosis.to_dict` (one node's report), with its GPUs and findings read as
    plain values a chunk of nodes at a time and written by the domain's own rules
    (gpu.device_dict, gpu.finding_dict): a model row, or a domain Device, for each
    GPU made a large fleet's export several times slower."""
    return FleetReports(nodes, only_problems)


class FleetReports:
    """The fleet's reports, made as they are iterated. The Markdown prints of a node's
    GPUs only how many there are: `with_gpu_counts` gives each report without its
    GPUs and their count, so their figures are not read at all."""

    def __init__(self, nodes: QuerySet, only_problems: bool):
        self.nodes = nodes
        self.only_problems = only_problems

    def __iter__(self) -> Iterator[dict]:
        return (report for report, _ in self._reports(with_devices=True))

    def with_gpu_counts(self) -> Iterator[tuple[dict, int]]:
        return self._reports(with_devices=False)

    def _reports(self, with_devices: bool) -> Iterator[tuple[dict, int]]:
        rows = self.nodes.only(*_REPORT_NODE_FIELDS).iterator(chunk_size=CHUNK_SIZE)
        while chunk := list(itertools.islice(rows, CHUNK_SIZE)):
            ids = [node.pk for node in chunk]
            findings, devices = _chunk_contents(ids, self.only_problems, with_devices)
            counts = None if with_devices else _gpu_counts(ids)
            for node in chunk:
                report = _report(node, node.diagnosis_of((), ()))
                report["findings"] = [gpu.finding_dict(*cells) for cells in findings[node.pk]]
                if self.only_problems and not report["findings"] and report["status"] != Health.OFFLINE:
                    continue
                if counts is None:
                    report["devices"] = [gpu.device_dict(d) for d in devices[node.pk]]
                    yield report, len(report["devices"])
                else:
                    del report["devices"]
                    yield report, counts.get(node.pk, 0)


def _current_devices(ids: list[int]) -> QuerySet:
    return Device.objects.filter(node_id__in=ids, vanished_at__isnull=True)


def _gpu_counts(ids: list[int]) -> dict[int, int]:
    """How many current GPUs each of the nodes `ids` has (those with none left out); one query."""
    return dict(_current_devices(ids).values("node_id").annotate(count=Count("pk")).values_list("node_id", "count"))


def _chunk_contents(ids: list[int], only_problems: bool, with_devices: bool) -> tuple[dict, dict]:
    """For the nodes `ids`: their findings as (code, name, status, message, fix) in the
    doctor's order (the warn and fail ones with `only_problems`), and their current
    GPUs as reported (gpu.Device.to_dict's keys, those an older agent did not send
    missing) by index; two queries."""
    findings = Finding.objects.filter(node_id__in=ids).order_by("node_id", "position")
    if only_problems:
        findings = findings.filter(status__in=PROBLEM_STATUSES)
    by_node: dict[int, list] = {pk: [] for pk in ids}
    for node_id, *cells in findings.values_list("node_id", "code", "name", "status", "message", "fix"):
        by_node[node_id].append(cells)
    devices: dict[int, list] = {pk: [] for pk in ids}
    if with_devices:
        rows = list(_current_devices(ids).order_by("node_id", "index").values_list(
            "node_id", Cast("health", TextField()), "pci_bus_id", *Device.COLUMNS
        ))
        # `health` as text, decoded here for the whole chunk at once: JSONField's own
        # decoding per row took half of this read, and a json.loads per row much of the rest.
        healths = json.loads("[" + ",".join(health for _, health, *_ in rows) + "]")
        for (node_id, _, pci_bus_id, *columns), health in zip(rows, healths, strict=True):
            devices[node_id].append(Device.reported(health, dict(zip(Device.COLUMNS, columns, strict=True)), pci_bus_id))
    return by_node, devices


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# --- JSON -------------------------------------------------------------------


def node_json(report: dict) -> Iterator[str]:
    yield json.dumps(report, indent=2) + "\n"


# json.dumps as it stands, but for the check for a list or dict that holds itself, which
# a report (a tree made here) never does and which slowed the writing of each.
_json_report = json.JSONEncoder(check_circular=False).encode


def fleet_json(reports: Iterable[dict], generated_at: datetime | None = None) -> Iterator[str]:
    """{"schema_version": 1, "generated_at": ..., "nodes": [...]}, written node by node."""
    generated_at = generated_at or timezone.now()
    yield f'{{"schema_version": {REPORT_SCHEMA_VERSION}, "generated_at": {json.dumps(generated_at.isoformat())}, "nodes": ['
    for i, report in enumerate(reports):
        yield ("," if i else "") + "\n" + _json_report(report)
    yield "\n]}\n"


# --- CSV --------------------------------------------------------------------

def csv_report(nodes: QuerySet, only_problems: bool = False) -> Iterator[str]:
    """The CSV of `nodes` in their order: per node one row per finding (node, code,
    name, status, message, fix), then one per current GPU with its health figures;
    with `only_problems`, the warn and fail findings alone.

    Read as plain values, a chunk of nodes at a time (three queries a chunk), and
    written a chunk at a time: building each node's report as the JSON export does
    made a fleet's CSV far slower than PostgreSQL's own COPY of the same rows
    (`manage.py bench` compares the two; tests/fleet/test_reports.py holds them equal)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    rows = nodes.values_list("pk", "name").iterator(chunk_size=CHUNK_SIZE)
    while chunk := list(itertools.islice(rows, CHUNK_SIZE)):
        buffer.seek(0)
        buffer.truncate()
        writer.writerows(_csv_rows(chunk, only_problems))
        yield buffer.getvalue()


def _csv_rows(chunk: list[tuple[int, str]], only_problems: bool) -> Iterator[list]:
    by_node, devices = _chunk_contents([pk for pk, _ in chunk], only_problems, with_devices=not only_problems)
    for pk, name in chunk:
        for code, title, status, message, fix in by_node[pk]:
            yield [name, *map(safe_cell, (code, title, status, message, fix)), "finding", *_NO_DEVICE]
        for d in devices[pk]:
            yield _device_row(name, d)


# Every row has every column (RFC 4180); a finding's GPU columns are empty.
_NO_DEVICE = ("",) * len(DEVICE_CSV_COLUMNS)


# How the GPU fields that are lists read in one cell; every other field is its value.
LIST_CELLS = {
    "throttle_reasons": lambda reasons: " ".join(reasons or ()),
    "xid_errors": lambda xids: " ".join(f"{x['xid']}x{x['count']}" for x in xids or ()),
    "processes": lambda processes: len(processes or ()),
    "mig_devices": lambda slices: " ".join(f"{m['profile']}:{m['uuid']}" for m in slices or ()),
    "nvlink": lambda links: " ".join(f"{link['link']}:{link['state']}" for link in links or ()),
}


# Each GPU column with how its list reads in a cell (None: the value as it is).
_DEVICE_CELLS = tuple((column, LIST_CELLS.get(column)) for column in DEVICE_CSV_COLUMNS)
# Cells written as they are, most of a GPU's (csv writes None empty): _cell is for the rest.
_AS_IS = frozenset((int, float, type(None)))


def _device_row(node: str, d: dict) -> list:
    get = d.get
    cells = [get(column) if as_cell is None else as_cell(get(column)) for column, as_cell in _DEVICE_CELLS]
    return [safe_cell(node), f"gpu{d['index']}", safe_cell(d["name"]), "", "", "", "device",
            *[cell if type(cell) in _AS_IS else _cell(cell) for cell in cells]]


def _cell(value):
    """A GPU figure as a cell: numbers and None as they are (csv writes None empty),
    booleans as JSON (and PostgreSQL's ->>) writes them, text made safe."""
    if value is None or type(value) in (int, float):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return safe_cell(value)


# --- Markdown ---------------------------------------------------------------

_MARK = {"ok": "OK", "warn": "WARN", "fail": "FAIL"}


# CommonMark gives meaning only to ASCII punctuation, and a backslash before any of it
# stands for the character itself. < > & become entities instead, so that a renderer
# which skips backslash escapes still builds no tag or entity from them.
_MD_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
_MD_ESCAPES = str.maketrans({c: _MD_ENTITIES.get(c, "\\" + c) for c in string.punctuation})
_BACKTICK_RUNS = re.compile(r"`+")


def md_cell(value, code: bool = False) -> str:
    """`value` as Markdown that renders as exactly that text on one line (whitespace
    runs become one space), never as markup: every ASCII punctuation mark escaped, or,
    with `code`, a code span fenced by more backticks than any run inside it. Pipes are
    escaped either way: a table row splits its cells before it reads code spans."""
    text = " ".join(("" if value is None else str(value)).split())
    if not code:
        return text.translate(_MD_ESCAPES)
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in _BACKTICK_RUNS.findall(text)), default=0) + 1)
    # Inside the fence nothing is markup; one space each side is stripped by the reader,
    # so text that starts or ends with a backtick cannot join the fence.
    text = text.replace("|", "\\|")
    return f"{fence} {text} {fence}"


def node_markdown(report: dict, heading: str = "##", gpus: int | None = None) -> str:
    """One node's section; of its GPUs only how many there are (`gpus`, else counted
    from the report's own)."""
    status = Health(report["status"])
    if gpus is None:
        gpus = len(report["devices"])
    lines = [
        f"{heading} {md_cell(report['node'])}: {status.label}",
        "",
        f"- Collected: {report['collected_at'] or 'never'} (last seen {report['last_seen']})",
        f"- Driver: {md_cell(report['driver_version']) or 'none'}; GPUs: {gpus}; "
        f"attach: {md_cell(Attach(report['attach']).label)}",
        f"- Toolkit: {md_cell(report['toolkit_version']) or 'not installed'}",
    ]
    if status == Health.OFFLINE:
        lines.append("- **Offline**: the node stopped reporting; findings below are from its last report.")
    lines.append("")
    if report["findings"]:
        lines += ["| Status | Check | Message | Fix |", "| --- | --- | --- | --- |"]
        for f in sorted(report["findings"], key=lambda f: -gpu.Status(f["status"]).rank):
            cells = (_MARK.get(f["status"], f["status"]), md_cell(f["name"]), md_cell(f["message"]),
                     md_cell(f.get("fix"), code=True))
            lines.append(f"| {' | '.join(cells)} |")
    else:
        lines.append("No findings to report.")
    return "\n".join(lines) + "\n\n"


def fleet_markdown(reports: Iterable[dict], generated_at: datetime | None = None, only_problems: bool = False) -> Iterator[str]:
    """The fleet's Markdown; given `fleet_reports`, it reads of each node's GPUs only their count."""
    generated_at = generated_at or timezone.now()
    scope = " (warnings and failures only)" if only_problems else ""
    yield f"# gpufleet doctor report{scope}\n\nGenerated {generated_at.isoformat()}\n\n"
    if isinstance(reports, FleetReports):
        counted = reports.with_gpu_counts()
    else:
        counted = ((report, len(report["devices"])) for report in reports)
    empty = True
    for report, gpus in counted:
        empty = False
        yield node_markdown(report, gpus=gpus)
    if empty:
        yield "No nodes to report.\n"


def node_markdown_doc(report: dict, only_problems: bool = False) -> Iterator[str]:
    scope = " (warnings and failures only)" if only_problems else ""
    yield f"# gpufleet doctor report{scope}\n\n"
    yield node_markdown(report)
