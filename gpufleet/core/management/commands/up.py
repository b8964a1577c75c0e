"""Start the whole thing on one machine: web, ingest worker with the central beat,
and an agent for this host, all sharing the settings' database and broker
(by default SQLite and the embedded file broker, so no server is needed)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from gpufleet.core import processes as commands


class Command(BaseCommand):
    help = "Run web, ingest worker, central beat and this host's agent until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=os.environ.get("GPUFLEET_BIND", "127.0.0.1:8000"))
        parser.add_argument("--web-workers", type=int, default=2)

    def handle(self, *args, bind: str, web_workers: int, **options):
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        self._ensure_admin()

        node = settings.GPUFLEET_NODE_NAME
        processes = {
            "web": commands.web(bind, web_workers),
            "ingest": commands.ingest_worker(settings.DATA_DIR, with_beat=True),
            "agent": commands.agent_worker(node, settings.DATA_DIR),
        }
        roles = {"web": "central", "ingest": "central", "agent": "agent"}
        self.stdout.write(
            f"gpufleet: http://{bind}/  (database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
            f"broker {settings.CELERY_BROKER_URL.split('://')[0]}, node {node}, "
            f"collect every {settings.GPUFLEET_COLLECT_INTERVAL:g} s)"
        )
        self._supervise(processes, roles)

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

    def _supervise(self, commands: dict[str, list[str]], roles: dict[str, str]) -> None:
        children: dict[str, subprocess.Popen] = {}
        for name, argv in commands.items():
            env = {**os.environ, "GPUFLEET_ROLE": roles[name], "PYTHONUNBUFFERED": "1"}
            children[name] = subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                cwd=settings.BASE_DIR, start_new_session=True,
            )
            threading.Thread(target=self._relay, args=(name, children[name]), daemon=True).start()

        stopping = threading.Event()

        def stop(signum, frame):
            stopping.set()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exited = None
        while not stopping.is_set() and exited is None:
            exited = next((n for n, p in children.items() if p.poll() is not None), None)
            time.sleep(0.5)
        if exited:
            self.stderr.write(f"gpufleet: {exited} exited with code {children[exited].returncode}; stopping")
        for proc in children.values():
            if proc.poll() is None:
                proc.terminate()  # each parent stops its own children cleanly
        deadline = time.monotonic() + 15
        for proc in children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if exited:
            raise SystemExit(1)

    def _relay(self, name: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.stdout.write(f"{name:>6} | {line.rstrip()}")
