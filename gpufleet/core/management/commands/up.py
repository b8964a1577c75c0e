"""Start the whole thing on one machine: web, the ingest consumer, the central beat,
and an agent for this host, all sharing the settings' database and broker (by
default SQLite and a private Redis that `up` starts and stops, so no server needs
setting up).

The processes are the entries of a Procfile written from gpufleet/core/launch.py
into the data dir on every start, each a manage.py command as the deploy's units run
them; what ran is always in $GPUFLEET_DATA_DIR/Procfile."""

from __future__ import annotations

import argparse
import datetime
import io
import logging
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import IO

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connections
from honcho.colour import get_colours
from honcho.environ import parse_procfile
from honcho.printer import Message, Printer
from honcho.process import Popen

from gpufleet.core import broker_acl, launch
from gpufleet.core.broker import ingest_key
from gpufleet.env import read_private_text, write_private_text

# Seconds to wait before each restart of a child that keeps crashing. One more quick
# crash after the last of them and `up` gives up: it stops everything and exits 1, so a
# crash loop ends with its reason on screen instead of spinning unseen.
RESTART_DELAYS = (1, 2, 4, 8, 16)
# A child that ran this long had started fine: its next crash starts the count again.
STABLE_AFTER = 30.0
# How long the children get to stop on their own (celery finishes its current task)
# before what is left is killed.
STOP_TIMEOUT = 15.0
LOG_MAX_BYTES, LOG_BACKUPS = 10 * 2**20, 3
# Stopped after all the others: the workers finish their shutdown talking to the broker.
STOP_LAST = {"redis"}


def _node_name(value: str) -> str:
    # The name becomes a Procfile entry (agent-NAME) and a queue (node.NAME).
    if not re.fullmatch(r"[A-Za-z0-9_-]+", value):
        raise argparse.ArgumentTypeError(f"{value!r}: use letters, digits, '-' and '_' only")
    return value


class Command(BaseCommand):
    help = "Run web, ingest consumer, central beat and this host's agent until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.GPUFLEET_BIND, help="default GPUFLEET_BIND")
        parser.add_argument("--web-workers", type=int, default=settings.GPUFLEET_WEB_WORKERS,
                            help="default GPUFLEET_WEB_WORKERS")
        parser.add_argument(
            "--agent", dest="agents", action="append", default=[], type=_node_name, metavar="NAME",
            help="also run an agent that reports this host's GPUs as node NAME (repeatable; for a demo fleet)",
        )

    def handle(self, *args, bind: str, web_workers: int, agents: list[str], **options):
        node = settings.GPUFLEET_NODE_NAME
        if node in agents:
            self.stderr.write(f"gpufleet: --agent {node} is this host's own agent, which up runs anyway")
            raise SystemExit(2)
        data = settings.DATA_DIR
        data.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        self._ensure_admin()
        for name in [node, *agents]:
            self._enroll(name, data)

        broker, redis = self._broker([node, *agents])
        procfile = data / "Procfile"
        procfile.write_text(launch.up_procfile(dict.fromkeys(agents), redis))
        self.stdout.write(
            f"gpufleet: http://{bind}/  (database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
            f"broker {'private redis' if redis else broker.split('://')[0]}, node {node}, "
            f"collect every {settings.GPUFLEET_COLLECT_INTERVAL:g} s; logs in {data / 'logs'})"
        )
        self.stdout.flush()
        # The children open their own connections; ours is not needed any more.
        connections.close_all()
        # Every child gets the broker named, rather than each looking for the socket
        # while the private Redis may still be starting.
        env = {**os.environ, "CELERY_BROKER_URL": broker, "PYTHONUNBUFFERED": "1"}
        # Each agent reads its own key from the data dir (see _enroll), never one for another node.
        env.pop("GPUFLEET_AGENT_KEY", None)
        env |= {"GPUFLEET_BIND": bind, "GPUFLEET_WEB_WORKERS": str(web_workers)}
        # Once per run, before any child writes its counts there (on its private Redis, up
        # refused above to start beside another up of this data dir).
        call_command("clearmetrics")
        code = Supervisor(procfile, env, cwd=settings.BASE_DIR, log_dir=data / "logs").run()
        if code:
            raise SystemExit(code)

    def _enroll(self, name: str, data: Path) -> None:
        """Enrol a local agent and leave its key where its settings look for it
        ($GPUFLEET_DATA_DIR/agent-NAME.key, readable by this user only)."""
        printed = io.StringIO()
        # The key only: its Redis is not running yet.
        call_command("enroll", name, "--key-only", stdout=printed)
        [key] = [line.split("=", 1)[1] for line in printed.getvalue().splitlines() if line.startswith("GPUFLEET_AGENT_KEY=")]
        write_private_text(data / f"agent-{name}.key", key)

    def _broker(self, agents: list[str] = ()) -> tuple[str, list[str] | None]:
        """The broker URL for every child, and the private Redis's command line if `up` runs one:
        CELERY_BROKER_URL when set, else a Redis of our own (redis-server must be installed),
        where each of `agents` logs in as its node's own user, as in production."""
        data = settings.DATA_DIR
        if os.environ.get("CELERY_BROKER_URL"):
            for name in agents:  # left by a run with the private Redis: they would go there
                broker_acl.agent_url_file(data, name).unlink(missing_ok=True)
            return os.environ["CELERY_BROKER_URL"], None
        path = settings.PRIVATE_REDIS_SOCKET
        if _answers(path):
            # A second redis-server would take the socket over from the first `up`'s processes.
            self.stderr.write(f"gpufleet: another up runs with this data dir (its Redis answers on {path})")
            raise SystemExit(2)
        binary = shutil.which("redis-server")
        if binary is None:
            self.stderr.write("gpufleet: up runs a private Redis, and redis-server is not installed: install it"
                              " (sudo apt-get install redis-server), or set CELERY_BROKER_URL to a Redis to use")
            raise SystemExit(2)
        if len(os.fsencode(path)) >= 108:  # the longest path a unix socket can have
            self.stderr.write(f"gpufleet: {path} is too long a path for a unix socket: set GPUFLEET_DATA_DIR to a"
                              " shorter directory, or CELERY_BROKER_URL to a Redis to use")
            raise SystemExit(2)
        # Left over from a run that was killed (nothing answers on it): redis-server makes it anew.
        path.unlink(missing_ok=True)
        url = broker_acl.private_url(path, settings.PRIVATE_REDIS_PASSWORD_FILE, make=True)
        password = read_private_text(settings.PRIVATE_REDIS_PASSWORD_FILE)
        # The centre's and the local agents' lines are written anew at each start (each agent
        # a new password); the users of other nodes enroll saved stay.
        lines = [broker_acl.aclfile_line(broker_acl.CENTRE_USER, password, broker_acl.centre_rules())]
        for name in agents:
            secret = secrets.token_urlsafe(32)
            rules = broker_acl.node_rules(name, ingest_key())
            lines.append(broker_acl.aclfile_line(broker_acl.node_user(name), secret, rules))
            url_of_agent = broker_acl.node_url(name, secret, f"redis+socket://{path}")
            write_private_text(broker_acl.agent_url_file(data, name), url_of_agent)
        users = [broker_acl.CENTRE_USER, *map(broker_acl.node_user, agents)]
        broker_acl.write_aclfile(settings.PRIVATE_REDIS_ACLFILE, lines, users)
        return url, launch.redis_server(binary, path, settings.PRIVATE_REDIS_ACLFILE)

    def _ensure_admin(self) -> None:
        """Create the first admin once and print its login; never again."""
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        from django.contrib.auth.models import Group

        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser("admin", password=password)
        user.groups.add(Group.objects.get(name="admin"))
        self.stdout.write(self.style.SUCCESS(f"Admin login (shown once): admin / {password}"))


@dataclass
class _Run:
    """One start of a child: its process and whether its output has ended."""

    proc: Popen
    started: float
    # Set when no process holds the child's stdout any more, that is when the
    # program and everything it started (which inherits stdout) are gone.
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Child:
    name: str
    cmd: str
    colour: str
    log: RotatingFileHandler
    run: _Run | None = None  # the program is running
    last: _Run | None = None  # the run before, whose leftovers may still be stopping
    crashes: int = 0  # quick crashes in a row
    restart_at: float | None = None


class Supervisor:
    """Runs the entries of a Procfile with honcho's process and printer, keeping them running.

    honcho's own Manager stops every process as soon as one exits: right for a
    developer's Procfile, wrong for a dashboard left running for weeks, where one
    crashed worker would take the site down. So this loop starts a dead child again
    (after RESTART_DELAYS) and stops everything only on SIGINT/SIGTERM or when one
    child keeps crashing. Each child's output goes to the console and to
    <log_dir>/<name>.log."""

    def __init__(self, procfile: Path, env: dict[str, str], cwd: Path, log_dir: Path, output: IO[str] = sys.stdout):
        entries = parse_procfile(procfile.read_text()).processes
        self.env, self.cwd = env, cwd
        self.printer = Printer(output, width=max(len(name) for name in [*entries, "up"]))
        log_dir.mkdir(parents=True, exist_ok=True)
        colours = get_colours()
        self.children = {
            name: _Child(name, cmd, next(colours), _log_file(log_dir / f"{name}.log"))
            for name, cmd in entries.items()
        }
        self.lines: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.stop_by: float | None = None  # set once stopping: when what is left gets killed
        self.last_stopped = False  # STOP_LAST told to stop
        self.signalled: int | None = None
        self.returncode = 0

    def run(self) -> int:
        """Start every entry and supervise until stopped; 0 after a signal, 1 after giving up."""
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        # A closed terminal stops everything too, instead of leaving the children
        # (each in its own session) holding the port; unless nohup asked to ignore it.
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, self._on_signal)
        try:
            for child in self.children.values():
                self._start(child)
            while self.stop_by is None or any(c.run for c in self.children.values()):
                self._tick()
        finally:
            # Nothing outlives up, even when this loop itself failed.
            runs = [r for c in self.children.values() for r in (c.run, c.last) if r]
            for run in runs:
                _signal_group(run, signal.SIGKILL)
            for run in runs:  # their last lines
                run.ended.wait(2)
            self._relay(timeout=0)
            for child in self.children.values():
                child.log.close()
        return self.returncode

    def _tick(self) -> None:
        self._relay(timeout=0.2)
        now = time.monotonic()
        if self.signalled is not None:
            if self.stop_by is None:
                self._say(None, f"{signal.Signals(self.signalled).name} received; stopping")
                self._stop()
            else:  # a second Ctrl-C: do not wait
                self.stop_by = now
            self.signalled = None
        for child in self.children.values():
            if child.run and child.run.proc.poll() is not None:
                self._exited(child, now)
            elif child.restart_at is not None and now >= child.restart_at:
                self._start(child)
        if self.stop_by is not None:
            self._stop_the_last()
        if self.stop_by is not None and now >= self.stop_by:
            for child in self.children.values():
                if child.run:
                    _signal_group(child.run, signal.SIGKILL)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum

    def _start(self, child: _Child) -> None:
        if child.last:  # leftovers of the run before (see _exited) must not hold the port or files
            _signal_group(child.last, signal.SIGKILL)
        # honcho's Popen: through the shell as Procfile lines are, in a session of its own,
        # stderr into stdout. `exec` makes the pid we watch and report the program's own
        # instead of a shell's waiting on it.
        proc = Popen(f"exec {child.cmd}", env=self.env, cwd=self.cwd)
        child.run, child.restart_at = _Run(proc, time.monotonic()), None
        threading.Thread(target=self._read, args=(child.name, child.run), daemon=True).start()
        self._say(child, f"started (pid {proc.pid})")

    def _read(self, name: str, run: _Run) -> None:
        for raw in iter(run.proc.stdout.readline, b""):
            self.lines.put((name, raw.decode("utf-8", "replace").rstrip("\n")))
        run.proc.stdout.close()
        run.ended.set()

    def _exited(self, child: _Child, now: float) -> None:
        run, code = child.run, child.run.proc.returncode
        child.run, child.last = None, run
        # The program is gone but what it started may not be (gunicorn's workers, the
        # embedded beat of a celery worker): they are in its process group.
        _signal_group(run, signal.SIGTERM)
        if self.stop_by is not None:
            self._say(child, f"stopped (exit code {code})")
            return
        ran = now - run.started
        child.crashes = 1 if ran >= STABLE_AFTER else child.crashes + 1
        if child.crashes > len(RESTART_DELAYS):
            self._say(child, f"exited with code {code}, {child.crashes} times in a row within "
                             f"{STABLE_AFTER:g} s of starting; giving up and stopping everything "
                             f"(see {child.log.baseFilename})")
            self.returncode = 1
            self._stop()
            return
        delay = RESTART_DELAYS[child.crashes - 1]
        child.restart_at = now + delay
        self._say(child, f"exited with code {code} after {ran:.0f} s; restarting in {delay} s "
                         f"(restart {child.crashes} of at most {len(RESTART_DELAYS)} in a row)")

    def _stop(self) -> None:
        self.stop_by = time.monotonic() + STOP_TIMEOUT
        for child in self.children.values():
            child.restart_at = None
            if child.run and child.name not in STOP_LAST:
                # The program only: gunicorn and celery stop their own children cleanly.
                child.run.proc.terminate()

    def _stop_the_last(self) -> None:
        """Once the others are gone, stop what they needed until the end."""
        if self.last_stopped or any(c.run for c in self.children.values() if c.name not in STOP_LAST):
            return
        self.last_stopped = True
        for child in self.children.values():
            if child.run and child.name in STOP_LAST:
                child.run.proc.terminate()

    def _relay(self, timeout: float) -> None:
        """Copy the children's lines to the console and their log files, waiting up to `timeout` for the first."""
        try:
            name, line = self.lines.get(timeout=timeout) if timeout else self.lines.get_nowait()
            while True:
                child = self.children[name]
                self._write(child.name, child.colour, line)
                child.log.handle(logging.makeLogRecord({"msg": line}))
                name, line = self.lines.get_nowait()
        except queue.Empty:
            pass

    def _say(self, child: _Child | None, text: str) -> None:
        """up's own line about a child: on the console, and in that child's log to explain gaps."""
        self._write("up", None, f"{child.name} {text}" if child else text)
        if child:
            child.log.handle(logging.makeLogRecord({"msg": f"[up] {text}"}))

    def _write(self, name: str, colour: str | None, line: str) -> None:
        try:
            self.printer.write(Message(type="line", data=line, time=datetime.datetime.now(), name=name, colour=colour))
        except OSError:  # the terminal is gone (SIGHUP is on its way); the log files still get everything
            pass


def _answers(path: Path) -> bool:
    """Whether something listens on the unix socket at `path`."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(1)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _log_file(path: Path) -> RotatingFileHandler:
    # Rotated, so a site left running for months cannot fill the disk with access logs.
    handler = RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    return handler


def _signal_group(run: _Run, signum: int) -> None:
    """Signal everything a run started. Only while its output is still held open: then its
    process group still has members, so the group id cannot belong to anyone else yet."""
    if run.ended.is_set():
        return
    try:
        os.killpg(run.proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
