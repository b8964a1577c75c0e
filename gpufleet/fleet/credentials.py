"""Node identity on the central side: enrolling a node (its agent's key), rotating and
revoking that key, and checking the signature of what agents send before anything is
written (wire.sign / wire.verify do the cryptography)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpufleet import wire
from gpufleet.audit.models import record
from gpufleet.events import services as events
from gpufleet.fleet.models import NodeCredential

log = logging.getLogger(__name__)


def _key(name: str, generation: int) -> wire.NodeKey:
    return wire.derive_node_key(settings.GPUFLEET_SIGNING_KEY, name, generation)


def enroll(name: str, user=None, rotate: bool = False) -> wire.NodeKey:
    """The key `name`'s agent signs with. A node enrolled before gets its current key
    back, unless `rotate` (or it was revoked): then a new generation, and the old key
    stops working at once."""
    with transaction.atomic():
        credential, created = NodeCredential.objects.select_for_update().get_or_create(name=name)
        if created:
            record(user, "node.enroll", target=name, after={"key": credential.generation})
        elif rotate or credential.revoked_at is not None:
            before = credential.generation
            credential.generation += 1
            credential.issued_at, credential.revoked_at = timezone.now(), None
            credential.save()
            record(user, "node.rotate_key", target=name, before={"key": before}, after={"key": credential.generation})
            events.key_changed(name, revoked=False, generation=credential.generation)
    return _key(name, credential.generation)


def revoke(name: str, user=None) -> bool:
    """From now on nothing signed with `name`'s key is accepted. False if not enrolled."""
    with transaction.atomic():
        updated = NodeCredential.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if updated:
            record(user, "node.revoke_key", target=name)
            events.key_changed(name, revoked=True)
    return bool(updated) or NodeCredential.objects.filter(name=name).exists()


def key_for(name: str, generation: int) -> wire.NodeKey | None:
    """`name`'s key if `generation` is its current, unrevoked one."""
    valid = NodeCredential.objects.filter(name=name, generation=generation, revoked_at__isnull=True).exists()
    return _key(name, generation) if valid else None


def current_generations(names: Iterable[str] | None = None) -> dict[str, int]:
    """Every enrolled, unrevoked node's current key generation (of those `names`), by name."""
    valid = NodeCredential.objects.filter(revoked_at__isnull=True)
    if names is not None:
        valid = valid.filter(name__any=sorted(names))
    return dict(valid.values_list("name", "generation"))


def node_key(name: str, generation: int) -> wire.NodeKey:
    """`name`'s key of `generation` (whether that is still valid is the caller's question)."""
    return _key(name, generation)


def sign_for_agent(name: str, task: str, args: list) -> dict | None:
    """The centre's `auth` for a task to `name`'s agent; None when the node has no valid key."""
    credential = NodeCredential.objects.filter(name=name, revoked_at__isnull=True).first()
    if credential is None:
        return None
    return wire.sign(_key(name, credential.generation), name, wire.TO_AGENT, task, args)


def enroll_many(names: list[str]) -> dict[str, wire.NodeKey]:
    """Keys for many nodes at once (a simulated fleet): each enrolled if it was not,
    revoked ones left out. Not audited row by row; the caller records what it did."""
    NodeCredential.objects.bulk_create([NodeCredential(name=name) for name in names], ignore_conflicts=True)
    valid = NodeCredential.objects.filter(name__in=names, revoked_at__isnull=True).values_list("name", "generation")
    return {name: _key(name, generation) for name, generation in valid}
