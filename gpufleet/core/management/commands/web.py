"""`manage.py web`: the site's web, gunicorn serving gpufleet.wsgi (gpufleet/core/launch.py),
where GPUFLEET_BIND says with GPUFLEET_WEB_WORKERS workers of GPUFLEET_WEB_THREADS threads
each, a worker killed when stuck for GPUFLEET_WEB_TIMEOUT seconds."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from gpufleet.core import launch


class Command(BaseCommand):
    help = "Serve the site with gunicorn on GPUFLEET_BIND with GPUFLEET_WEB_WORKERS workers."

    def add_arguments(self, parser):
        parser.add_argument("--bind", help="HOST:PORT to listen on (default GPUFLEET_BIND)")
        parser.add_argument("--workers", type=int, help="worker processes (default GPUFLEET_WEB_WORKERS)")

    def handle(self, *args, bind=None, workers=None, **options):
        argv = launch.gunicorn(bind or settings.GPUFLEET_BIND, workers or settings.GPUFLEET_WEB_WORKERS,
                               settings.GPUFLEET_WEB_THREADS, settings.GPUFLEET_WEB_TIMEOUT)
        # exec: the pid systemd and `up` watch and signal is gunicorn's own.
        os.execv(argv[0], argv)
