"""What a process tree costs the host it runs on, read from /proc (Linux): the resident
memory of a process and all its descendants, and the CPU time they have used, the
children already reaped included. The bench measures the agent with it."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree(pid: int) -> list[int]:
    """`pid` and its living descendants."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo += _children(current)
    return pids


def _program(pid: int) -> bytes | None:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None


def rss_bytes(pid: int) -> int:
    """The resident memory (VmRSS) of `pid` and its descendants, summed; 0 for one gone.
    A child that has not exec'd yet (the moment between fork and exec of every command
    run) is not counted: it still runs its parent's program in its parent's pages, which
    /proc would show as its own too."""
    total = 0
    for each in tree(pid):
        try:
            status = (PROC / str(each) / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent = int(fields.get("PPid", "0"))
        if each != pid and _program(each) == _program(parent):
            continue
        total += int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    return total


def cpu_seconds(pid: int) -> float:
    """User and system CPU of `pid` and its descendants, with what their reaped children used."""
    total = 0
    for each in tree(pid):
        try:
            stat = (PROC / str(each) / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name, which may hold spaces: utime is the 14th field.
        fields = stat.rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / _TICKS
