"""`manage.py alerts --once`: plan and send what is due now, as the beat does."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from gpufleet.alerts import services


class Command(BaseCommand):
    help = "Send the alerts due now (what the central beat does every GPUFLEET_ALERT_TICK_S)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="plan and send what is due now, then exit")

    def handle(self, *args, **options):
        if not options["once"]:
            raise CommandError("the central beat sends alerts; say --once to send what is due now")
        run = services.run_once()
        self.stdout.write(f"{run.planned} notice(s) due, {run.sent} notification(s) sent, "
                          f"{run.failed} failed for good")
