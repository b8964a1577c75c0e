"""Enrol a node: print the settings its agent needs to be heard by this site.

    manage.py enroll gpu-017            # the node's current key (a new node: its first)
    manage.py enroll gpu-017 --rotate   # a new key and broker password; the old ones stop working now
    manage.py enroll gpu-017 --revoke   # nothing the node signs is accepted any more, its broker user is gone
    manage.py enroll --list

Each node also gets a user of its own on the broker (gpufleet/core/broker_acl.py: it may
append to the ingest stream and use its own task queue, nothing else), whose password
is printed once, in the agent's CELERY_BROKER_URL. Standard output is only the agent's
settings lines, so it can go straight into the agent's environment file
(`manage.py enroll gpu-017 > agent.env`, mode 600)."""

from __future__ import annotations

import re

from django.core.management.base import BaseCommand, CommandError

from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import NodeCredential

# The name becomes the agent's queue (node.NAME); the same rule as a snapshot's node.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class Command(BaseCommand):
    help = ("Print the GPUFLEET_NODE_NAME, GPUFLEET_AGENT_KEY and CELERY_BROKER_URL lines of a node's agent (making its"
            " broker user); rotate or revoke its key and broker user.")

    def add_arguments(self, parser):
        parser.add_argument("node", nargs="?")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--rotate", action="store_true", help="issue a new key; the old one stops working")
        action.add_argument("--revoke", action="store_true", help="refuse everything the node signs from now on")
        action.add_argument("--list", action="store_true", help="list enrolled nodes and their key generation")
        parser.add_argument("--broker-url", metavar="URL",
                            help="the broker as the agent reaches it (default: this site's CELERY_BROKER_URL)")
        parser.add_argument("--key-only", action="store_true",
                            help="enrol the key only, making no broker user (`up` makes its agents' users itself)")

    def handle(self, *args, node, rotate, revoke, list, broker_url, key_only, **options):
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
            if not key_only:
                try:
                    broker_users.remove(node)
                except broker_users.BrokerError as exc:
                    raise CommandError(f"{node}: the broker user was NOT removed ({exc}): once the broker answers,"
                                       f" run `manage.py enroll {node} --revoke` again") from None
                self.stderr.write(f"{node}: broker user removed, its connections closed")
            return
        key = credentials.enroll(node, rotate=rotate)
        self.stdout.write(f"GPUFLEET_NODE_NAME={node}\nGPUFLEET_AGENT_KEY={key}")
        if key_only:
            return
        try:
            password = broker_users.make(node, rotate=rotate)
        except broker_users.BrokerError as exc:
            # The key is enrolled either way; only the broker user is missing.
            again = f"manage.py enroll {node}" + (" --rotate" if rotate else "")
            raise CommandError(f"{node}: key enrolled, but the broker user was NOT made ({exc}), so the agent"
                               f" cannot reach the broker yet: once it answers, run `{again}` again") from None
        if password is None:
            self.stderr.write(f"{node}: its broker user exists and keeps its password, which is not kept here"
                              f" (its rights are renewed): `manage.py enroll {node} --rotate` issues a new key and"
                              f" password")
            return
        self.stdout.write(f"CELERY_BROKER_URL={broker_users.agent_broker_url(node, password, broker_url)}")
