"""GPU reservations ("claims") on a node. Whether a claim fits is decided by the
domain ledger (`gpufleet.gpu.Ledger.fit`) only; see `gpufleet.claims.services`."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

from gpufleet import gpu


class Claim(models.Model):
    """One workload's reservation on one node: a count of GPUs, every GPU
    (count 0 and no devices), or named devices (by index or UUID)."""

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="claims")
    name = models.CharField(max_length=100)
    count = models.PositiveIntegerField(default=0)
    device_ids = models.JSONField(default=list, blank=True)
    # Device ids of this claim that the node no longer reports; set at ingest.
    missing_devices = models.JSONField(default=list, blank=True)
    # Set at ingest while none of the claim's GPUs has done any work for
    # GPUFLEET_IDLE_HOURS (gpu.Ledger.idle_claims): since when they have been idle.
    idle_since = models.DateTimeField(null=True, blank=True, editable=False)
    # When the central beat told the owner that the claim sits idle (gpufleet/usage/idle.py);
    # a warning from before the current idle_since is one of an earlier idle spell.
    idle_warned_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Who answers for the claim (its creator unless set otherwise) and how to reach them.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="owned_claims"
    )
    contact = models.CharField(max_length=200, blank=True, help_text="How to reach the owner, e.g. a chat channel.")
    # When the claim ends; None never. An expired claim still holds its GPUs until it
    # is deleted (by hand, or by the central beat with GPUFLEET_RELEASE_EXPIRED).
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node", "name"]
        # "TRAIN" and "train" are one workload to the people reading the ledger.
        constraints = [models.UniqueConstraint("node", Lower("name"), name="claim_unique_name_per_node_any_case")]

    def __str__(self) -> str:
        return f"{self.name} on {self.node.name}: {self.describe()}"

    def as_gpu_claim(self) -> gpu.Claim:
        return gpu.Claim(name=self.name, count=self.count, device_ids=tuple(self.device_ids))

    @property
    def mode(self) -> str:
        if self.device_ids:
            return "devices"
        return "all" if self.count <= 0 else "count"

    def describe(self) -> str:
        if self.mode == "devices":
            return "GPUs " + ", ".join(self.device_ids)
        if self.mode == "all":
            return "all GPUs"
        return f"{self.count} GPU" + ("" if self.count == 1 else "s")

    def is_expired(self, now=None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    @property
    def expired(self) -> bool:
        return self.is_expired()

    def as_audit_dict(self) -> dict:
        return {
            "name": self.name,
            "count": self.count,
            "device_ids": list(self.device_ids),
            "owner": self.owner.get_username() if self.owner_id else None,
            "contact": self.contact,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }
