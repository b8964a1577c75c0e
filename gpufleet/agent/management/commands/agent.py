import os

from django.conf import settings
from django.core.management.base import BaseCommand

from gpufleet.core import broker_acl, launch
from gpufleet.env import read_private_text


class Command(BaseCommand):
    help = "Run this host's agent: a Celery worker on queue node.<GPUFLEET_NODE_NAME> with the collect beat."

    def handle(self, *args, **options):
        argv = launch.agent_worker()
        # The agent reads its settings from the environment (agent_settings) and loads no
        # Django: it serves the node and data dir this command's settings name.
        env = {**os.environ, "GPUFLEET_NODE_NAME": settings.GPUFLEET_NODE_NAME, "GPUFLEET_DATA_DIR": str(settings.DATA_DIR)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        # Beside `up`, its own broker user rather than the centre's, which up's children inherit.
        if url := read_private_text(broker_acl.agent_url_file(settings.DATA_DIR, settings.GPUFLEET_NODE_NAME)):
            env["CELERY_BROKER_URL"] = url
        os.execve(argv[0], argv, env)
