"""Shared body of the fake `nvidia-smi` and `nvidia-ctk` executables (stdlib only).

Behaviour comes from environment variables, PREFIX being SMI or CTK:

    FAKE_<PREFIX>_STDOUT    file whose bytes go to stdout (default: the recorded healthy output)
    FAKE_<PREFIX>_STDERR    file whose bytes go to stderr (default: nothing)
    FAKE_<PREFIX>_EXIT      exit code (default 0)
    FAKE_<PREFIX>_HANG=1    after printing, start a child that keeps stdout/stderr open and
                            sleep forever (a stuck driver call)
    FAKE_<PREFIX>_PIDFILE   with HANG: write "<own pid> <child pid>" there once both run
    FAKE_SMI_APPS           file nvidia-smi prints for --query-compute-apps (default: no processes)
    FAKE_SMI_LIST           file nvidia-smi prints for -L (default: one line per GPU of the
                            recording, no MIG devices)
    FAKE_SMI_HELP           file nvidia-smi prints for --help-query-gpu: a real driver's listing,
                            whose fields it then also knows (default: the recording's header
                            fields, see smi_query.help_text). Answered even by a hung driver:
                            the listing needs no GPU.
    FAKE_SMI_NVLINK_STATUS  file nvidia-smi prints for `nvlink -s` (default: each GPU, no links)
    FAKE_SMI_NVLINK_ERRORS  file nvidia-smi prints for `nvlink -e` (default: each GPU, no links)
    FAKE_TOOL_LOG           append one JSON line per call: tool, argv, LC_ALL, PATH
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recorded  # noqa: E402  (tests/fakes/recorded.py, the index of the recordings)
import smi_query  # noqa: E402  (tests/fakes/smi_query.py, shared with the in-memory runner)

# recorded.py short names; the kernel log is empty unless a test gives one
DEFAULT_STDOUT = {"SMI": "h200", "CTK": "1.18.2", "DMESG": ""}


def _copy(path: str, stream) -> None:
    with open(path, "rb") as fh:
        stream.buffer.write(fh.read())
    stream.flush()


def main(prefix: str) -> int:
    env = os.environ
    log = env.get("FAKE_TOOL_LOG")
    if log:
        entry = {
            "tool": os.path.basename(sys.argv[0]),
            "argv": sys.argv[1:],
            "lc_all": env.get("LC_ALL"),
            "path": env.get("PATH"),
        }
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    stdout = env.get(f"FAKE_{prefix}_STDOUT")
    if stdout is None:
        default = DEFAULT_STDOUT[prefix]
        stdout = str(recorded.data_path(default)) if default else ""
    exit_code = int(env.get(f"FAKE_{prefix}_EXIT", "0") or 0)
    if prefix == "SMI" and any(a.startswith("--query-compute-apps=") for a in sys.argv[1:]):
        # The processes on the GPUs: FAKE_SMI_APPS names their recording (default none).
        apps = env.get("FAKE_SMI_APPS")
        if apps:
            _copy(apps, sys.stdout)
        return 0
    if prefix == "SMI" and sys.argv[1:] == ["-pm", "1"]:
        # Turning persistence mode on, as root: what the driver says of each GPU.
        with open(stdout, encoding="utf-8", errors="replace") as fh:
            sys.stdout.write(smi_query.persistence_on(fh.read()))
        return 0
    if prefix == "SMI" and sys.argv[1:] == ["--help-query-gpu"]:
        listing = env.get("FAKE_SMI_HELP")
        if listing:
            _copy(listing, sys.stdout)
        else:
            with open(stdout, encoding="utf-8", errors="replace") as fh:
                sys.stdout.write(smi_query.help_text(fh.read()))
        return 0
    if prefix == "SMI" and sys.argv[1:] in (["nvlink", "-s"], ["nvlink", "-e"]):
        recorded_links = env.get("FAKE_SMI_NVLINK_STATUS" if sys.argv[2] == "-s" else "FAKE_SMI_NVLINK_ERRORS")
        if recorded_links:
            _copy(recorded_links, sys.stdout)
        elif stdout and exit_code == 0:
            with open(stdout, encoding="utf-8", errors="replace") as fh:
                sys.stdout.write(smi_query.nvlink_status_without_links(fh.read()))
        return exit_code
    if prefix == "SMI" and sys.argv[1:] == ["-L"]:
        listing = env.get("FAKE_SMI_LIST")
        if listing:
            _copy(listing, sys.stdout)
        elif stdout and exit_code == 0:
            with open(stdout, encoding="utf-8", errors="replace") as fh:
                sys.stdout.write(smi_query.listing(fh.read()))
        return exit_code
    if prefix == "SMI" and stdout and smi_query.requested_fields(sys.argv[1:]) is not None:
        # A driver that knows the recording's fields answers the ones asked for.
        known = frozenset()
        if env.get("FAKE_SMI_HELP"):
            with open(env["FAKE_SMI_HELP"], encoding="utf-8", errors="replace") as fh:
                known = smi_query.known_fields(fh.read())
        with open(stdout, encoding="utf-8", errors="replace") as fh:
            text, _, exit_code = smi_query.answer(sys.argv[1:], fh.read(), exit_code, known)
        sys.stdout.write(text)
        sys.stdout.flush()
    elif stdout:
        _copy(stdout, sys.stdout)
    stderr = env.get(f"FAKE_{prefix}_STDERR")
    if stderr:
        _copy(stderr, sys.stderr)

    if env.get(f"FAKE_{prefix}_HANG") == "1":
        child = subprocess.Popen(  # inherits stdout/stderr: the pipes stay open
            [sys.executable, "-c", "import time; time.sleep(3600)"]
        )
        pidfile = env.get(f"FAKE_{prefix}_PIDFILE")
        if pidfile:
            tmp = pidfile + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()} {child.pid}\n")
            os.replace(tmp, pidfile)
        while True:
            time.sleep(3600)

    return exit_code
