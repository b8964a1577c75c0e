"""`manage.py beat`: the central beat and the housekeeping worker that runs what it
schedules (gpufleet/core/launch.py central_beat), its schedule in GPUFLEET_DATA_DIR.
Exactly one per site."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from gpufleet.core import launch


class Command(BaseCommand):
    help = "Run the central beat with its housekeeping worker (exactly one per site)."

    def handle(self, *args, **options):
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        argv = launch.central_beat(settings.DATA_DIR)
        # exec: the pid systemd and `up` watch and signal is the worker's own.
        os.execv(argv[0], argv)
