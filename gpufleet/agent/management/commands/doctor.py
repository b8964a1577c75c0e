import json as _json

from django.conf import settings
from django.core.management.base import BaseCommand

from gpufleet.agent.host import diagnose_this_host

_MARK = {"ok": "OK  ", "warn": "WARN", "fail": "FAIL"}


class Command(BaseCommand):
    help = "Diagnose this host's GPU container stack now and print the report; exit 1 when a finding fails."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, json: bool = False, **options):
        diagnosis = diagnose_this_host()
        report = diagnosis.to_dict(settings.GPUFLEET_NODE_NAME)
        if json:
            self.stdout.write(_json.dumps(report, indent=2))
        else:
            self.stdout.write(f"gpufleet doctor: {report['node']} (attach: {report['attach']})")
            for finding in report["findings"]:
                self.stdout.write(f"[{_MARK[finding['status']]}] {finding['name']}: {finding['message']}")
                if finding.get("fix"):
                    self.stdout.write(f"       fix: {finding['fix']}")
        if diagnosis.failed:
            raise SystemExit(1)

