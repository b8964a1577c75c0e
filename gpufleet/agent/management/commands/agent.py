import os

from django.conf import settings
from django.core.management.base import BaseCommand

from gpufleet.core import processes


class Command(BaseCommand):
    help = "Run this host's agent: a Celery worker on queue node.<GPUFLEET_NODE_NAME> with the collect beat."

    def handle(self, *args, **options):
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        argv = processes.agent_worker(settings.GPUFLEET_NODE_NAME, settings.DATA_DIR)
        os.execve(argv[0], argv, {**os.environ, "GPUFLEET_ROLE": "agent"})
