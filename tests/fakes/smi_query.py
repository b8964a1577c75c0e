"""How the fake nvidia-smi answers `--query-gpu=...` from a recording (stdlib only).

A recording that starts with a header row (as `--format=csv` prints it:
"index, uuid, name, memory.total [MiB], ...") is a driver that knows exactly those
fields: asked for fields it has, it prints them in the order asked, without the
header; asked for one it lacks, it answers like a real older driver,
`Field "x" is not a valid field to query.` and exit code 2. Lines that are not rows
(warnings, "Unable to determine the device handle ...") pass through in place.

Asked `--help-query-gpu`, it lists the fields it knows in nvidia-smi's own format
(`help_text`); given a recorded listing instead (a real driver's, `known`), it knows
those fields as well and prints "[N/A]" for those the recording has no column of, as a
driver does for a field this GPU does not support.

A recording without a header holds the seven reference fields. Asked for those it
prints itself; asked for more (with exit code 0) it is a driver that knows no
other field. A recording of a failure (non-zero exit, no header) prints as it is:
the driver fails before any field matters.
"""

from __future__ import annotations

import csv
import re

REFERENCE = ["index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu", "driver_version"]
BAD_ARGUMENT = 2
_UNIT = re.compile(r"\s*\[[^\]]*\]$")


def requested_fields(argv: list[str]) -> list[str] | None:
    for arg in argv:
        if arg.startswith("--query-gpu="):
            return [f.strip() for f in arg.split("=", 1)[1].split(",")]
    return None


def answer(argv: list[str], recording: str, exit_code: int,
           known: frozenset[str] = frozenset()) -> tuple[str, str, int]:
    """(stdout, stderr, exit code) of nvidia-smi run with `argv` on this recording, on a
    driver that also knows the fields `known` (a recorded --help-query-gpu's)."""
    wanted = requested_fields(argv)
    lines = recording.splitlines(keepends=True)
    header = _header(lines)
    if wanted is None or (header is None and (exit_code != 0 or wanted == REFERENCE)):
        return recording, "", exit_code
    columns_known = header or REFERENCE
    missing = [f for f in wanted if f not in columns_known and f not in known]
    if missing:
        return f'Field "{missing[0]}" is not a valid field to query.\n\n', "", BAD_ARGUMENT
    out = []
    for line in lines[1:] if header else lines:
        values = _row(line, len(columns_known))
        if values is None:
            out.append(line)
        else:
            out.append(", ".join(values[columns_known.index(f)] if f in columns_known else "[N/A]"
                                 for f in wanted) + "\n")
    return "".join(out), "", exit_code


def help_text(recording: str) -> str:
    """What `nvidia-smi --help-query-gpu` prints on the driver of a recording: the fields
    of its header (the reference fields without one), in nvidia-smi's format."""
    header = _header(recording.splitlines(keepends=True)) or REFERENCE
    entries = "".join(f'"{name}"\nWhat nvidia-smi says of "{name}".\n\n' for name in header)
    return 'List of valid properties to query for the switch "--query-gpu":\n\n' + entries


def known_fields(help_recording: str) -> frozenset[str]:
    """The field names of a recorded --help-query-gpu listing."""
    names: set[str] = set()
    for line in help_recording.splitlines():
        if _PROPERTY.fullmatch(line.strip()):
            names.update(re.findall(r'"([^"]+)"', line))
    return frozenset(names)


# A property line: its names, quoted, joined by " or " (descriptions may quote words too).
_PROPERTY = re.compile(r'"[^"\s]+"(?: or "[^"\s]+")*')


def _header(lines: list[str]) -> list[str] | None:
    if not lines or not lines[0].lower().startswith("index"):
        return None
    return [_UNIT.sub("", f.strip()) for f in lines[0].split(",")]


def _row(line: str, width: int) -> list[str] | None:
    if "," not in line or line.lstrip()[:1].isalpha():
        return None
    values = [v.strip() for v in next(csv.reader([line.strip()], skipinitialspace=True))]
    return values if len(values) == width else None


def nvlink_status_without_links(recording: str) -> str:
    """What `nvidia-smi nvlink -s` prints for GPUs without NVLink: each GPU, no links."""
    return listing(recording)


def listing(recording: str) -> str:
    """What `nvidia-smi -L` prints for the GPUs of a recording (no MIG devices)."""
    text, _, _ = answer(["--query-gpu=index,name,uuid"], recording, 0)
    rows = [row for line in text.splitlines() if (row := _row(line, 3)) is not None]
    return "".join(f"GPU {index}: {name} (UUID: {uuid})\n" for index, name, uuid in rows)


def persistence_on(recording: str) -> str:
    """What `nvidia-smi -pm 1` prints for the GPUs of a recording that has pci.bus_id."""
    text, _, _ = answer(["--query-gpu=pci.bus_id"], recording, 0)
    buses = [line.strip() for line in text.splitlines() if line.strip().startswith("0")]
    return "".join(f"Enabled persistence mode for GPU {bus}.\n" for bus in buses) + "All done.\n"
