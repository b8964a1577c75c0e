from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpufleet.agent.host import snapshot_this_host
from gpufleet.ingest.services import REJECTED, ingest_snapshot


class Command(BaseCommand):
    help = "Run one agent cycle in-process: diagnose this host and ingest the snapshot into the database."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", required=True, help="one cycle, then exit")
        parser.add_argument("--node", default=None, help="node name to record (default GPUFLEET_NODE_NAME)")

    def handle(self, *args, node=None, **options):
        snapshot = snapshot_this_host(node or settings.GPUFLEET_NODE_NAME)
        result = ingest_snapshot(snapshot)
        if result.outcome == REJECTED:
            raise CommandError(f"snapshot rejected: {result.reason}")
        failing = [f["code"] for f in snapshot["findings"] if f["status"] == "fail"]
        self.stdout.write(
            f"{result.node}: snapshot {result.outcome}; {len(snapshot['devices'])} GPU(s), "
            f"attach {snapshot['attach']}, failing: {', '.join(failing) or 'none'}"
        )
