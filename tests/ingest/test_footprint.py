"""The bench's reader of a process tree's memory (gpufleet/tools/footprint.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from gpufleet.tools import footprint

# A parent that holds 40 MiB, with one child forked to run without exec (its pages are the
# parent's, shared until written) and one that runs another program.
PARENT = """
import os, subprocess, sys, time
held = bytearray(40 * 2**20)
for i in range(0, len(held), 4096):
    held[i] = 1
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def own_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_a_tree_counts_what_each_exec_ran_not_a_forks_copy_of_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # the exec'd child has started its program
        pids = footprint.tree(parent.pid)
        assert len(pids) == 3
        rss = {pid: own_rss(pid) for pid in pids}
        copy, other = sorted(set(pids) - {parent.pid}, key=lambda pid: -rss[pid])
        assert rss[copy] > 40 * 2**20  # /proc shows the fork's shared pages as its own
        total = footprint.rss_bytes(parent.pid)
        assert abs(total - rss[parent.pid] - rss[other]) < 2**20
    finally:
        parent.kill()
        parent.wait()
