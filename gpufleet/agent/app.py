"""The agent's own Celery app: configured from the environment (gpufleet/core/agent_settings.py)
without Django, with only the agent's tasks. A GPU host runs it beside the workloads it
serves, so it loads neither the site's settings and apps nor a database driver; and no
Django fixup either, even when DJANGO_SETTINGS_MODULE is set in its environment."""

import logging.config
import sys

from celery import Celery, bootsteps
from celery.beat import EmbeddedService

from gpufleet.celery_common import set_up
from gpufleet.core import agent_settings

set_up()
logging.config.dictConfig(agent_settings.logging_config())


class ThreadedBeat(bootsteps.StartStopStep):
    """The agent's beat in a thread of its worker: `-B` forks a second interpreter for it,
    as big as the worker, to send one message per collect interval."""

    label = "Beat (thread)"

    def create(self, worker):
        self.service = EmbeddedService(worker.app, thread=True, schedule_filename=worker.schedule_filename)
        return self

    def start(self, worker) -> None:
        self.service.start()

    def stop(self, worker) -> None:
        self.service.stop()


app = Celery(agent_settings.AGENT_APP, fixups=[], include=["gpufleet.agent.tasks"])
app.conf.update(agent_settings.agent_celery_options(agent_settings.current()))
app.steps["worker"].add(ThreadedBeat)


def run() -> None:
    """Run the agent's worker (as `celery worker` would, without loading the rest of
    Celery's command line) until it is stopped."""
    settings = agent_settings.current()
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    worker = app.Worker(**agent_settings.agent_worker_options(settings))
    worker.start()
    sys.exit(worker.exitcode)
