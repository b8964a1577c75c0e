"""Enrol a node: print the settings its agent needs to be heard by this site.

    manage.py enroll gpu-017            # the node's current key (a new node: its first)
    manage.py enroll gpu-017 --rotate   # a new key; the old one stops working now
    manage.py enroll gpu-017 --revoke   # nothing the node signs is accepted any more
    manage.py enroll --list

Standard output is only the agent's settings lines, so it can go straight into the
agent's environment file (`manage.py enroll gpu-017 > agent.env`, mode 600)."""

from __future__ import annotations

import re

from django.core.management.base import BaseCommand, CommandError

from gpufleet.fleet import credentials
from gpufleet.fleet.models import NodeCredential

# The name becomes the agent's queue (node.NAME); the same rule as a snapshot's node.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class Command(BaseCommand):
    help = "Print the GPUFLEET_NODE_NAME and GPUFLEET_AGENT_KEY lines of a node's agent; rotate or revoke its key."

    def add_arguments(self, parser):
        parser.add_argument("node", nargs="?")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--rotate", action="store_true", help="issue a new key; the old one stops working")
        action.add_argument("--revoke", action="store_true", help="refuse everything the node signs from now on")
        action.add_argument("--list", action="store_true", help="list enrolled nodes and their key generation")

    def handle(self, *args, node, rotate, revoke, list, **options):
        if list:
            for credential in NodeCredential.objects.all():
                self.stdout.write(str(credential))
            return
        if not node or not _NAME.fullmatch(node):
            raise CommandError("give the node's name (letters, digits, '.', '_' and '-'), as its agent reports it")
        if revoke:
            if not credentials.revoke(node):
                raise CommandError(f"{node} is not enrolled")
            self.stderr.write(f"{node}: key revoked; `manage.py enroll {node}` issues a new one")
            return
        key = credentials.enroll(node, rotate=rotate)
        self.stdout.write(f"GPUFLEET_NODE_NAME={node}\nGPUFLEET_AGENT_KEY={key}")
