"""What the central site knows about each GPU host: the node, its devices (kept
when they vanish), its latest doctor findings, and per-device history."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from gpufleet import gpu, wire
from gpufleet.fleet import charts
from gpufleet.gpu import rollups
from gpufleet.gpu.usage import USE_KINDS

_COLOURS = {"ok": "green", "warn": "amber", "fail": "red", "offline": "grey"}


class FindingStatus(models.TextChoices):
    """A doctor finding's status: the domain's `gpu.Status`, with labels. It cannot
    hold "offline": that is a node's health, not something a finding says."""

    OK = gpu.Status.OK, "OK"
    WARN = gpu.Status.WARN, "Warning"
    FAIL = gpu.Status.FAIL, "Failing"

    @property
    def colour(self) -> str:
        return _COLOURS[self.value]

    @property
    def rank(self) -> int:
        return gpu.Status(self.value).rank


class Health(models.TextChoices):
    """A node's health as shown: its worst finding, or offline when it stopped
    reporting (worse than failing: nothing it said is current). `colour` names the
    CSS class; the label is always shown next to it (never colour alone)."""

    OK = gpu.Status.OK, "OK"
    WARN = gpu.Status.WARN, "Warning"
    FAIL = gpu.Status.FAIL, "Failing"
    OFFLINE = "offline", "Offline"

    @property
    def colour(self) -> str:
        return _COLOURS[self.value]

    @property
    def rank(self) -> int:
        if self is Health.OFFLINE:
            return gpu.Status.FAIL.rank + 1
        return gpu.Status(self.value).rank


# Health.rank in SQL: offline is worst, then the stored worst finding. Never NULL (ok
# is the rest), so that it sorts without a NULLS modifier, which SQLite's indexes do
# not take: the overview sorts by it, worst first, and an index of Node keeps that order.
HEALTH_RANK = models.Case(
    models.When(offline=True, then=models.Value(Health.OFFLINE.rank)),
    *(models.When(health=status.value, then=models.Value(status.rank)) for status in FindingStatus
      if status != FindingStatus.OK),
    default=models.Value(Health.OK.rank),
    output_field=models.IntegerField(),
)


class Attach(models.TextChoices):
    CDI = gpu.Attach.CDI, "CDI"
    LEGACY = gpu.Attach.LEGACY, "nvidia runtime"
    NONE = gpu.Attach.NONE, "none"


class Refusal(models.TextChoices):
    """Why the ingest refused a message from (or naming) a node, as counted per node
    (gpufleet/ingest/refusals.py) and in /metrics. A refusal never changes a node's
    health: whoever holds a broker credential can send messages naming any node."""

    UNKNOWN_NODE = "unknown-node", "names no enrolled node"
    OLD_KEY = "old-key", "signed with an old key"
    BAD_SIGNATURE = "bad-signature", "bad signature"
    OVER_CAP = "over-cap", "more than the node may send per collect interval"
    TOO_LARGE = "too-large", "too large"
    MALFORMED = "malformed", "malformed"
    REPLAY = "replay", "not newer than the stored snapshot"
    CENTRE_ONLY_CODE = "centre-only-code", "a finding only the site writes"


# The refusals that, while the node sends nothing valid, say its agent lacks its current
# key. Not a bad signature: anyone can send one in any node's name.
KEY_REFUSALS = (Refusal.OLD_KEY,)
NO_VALID_KEY = "Not reporting with a valid key"


def offline_after() -> timedelta:
    return timedelta(
        seconds=settings.GPUFLEET_COLLECT_INTERVAL * settings.GPUFLEET_OFFLINE_AFTER_INTERVALS
    )


class NodeQuerySet(models.QuerySet):
    def stale(self, now=None):
        """Online nodes that missed too many collect intervals."""
        now = now or timezone.now()
        return self.filter(offline=False, last_seen__lt=now - offline_after())


class Node(models.Model):
    """One GPU host, as of its latest accepted snapshot. Fleet-wide figures (GPU
    count, VRAM, mean utilization, reserved GPUs) are kept on the row so the
    overview reads one table whatever the fleet size."""

    name = models.CharField(max_length=200, unique=True)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now, help_text="When the last snapshot arrived.")
    collected_at = models.DateTimeField(null=True, blank=True, help_text="When the agent took it.")
    offline = models.BooleanField(default=False)
    # The worst finding of the latest snapshot; whether it is offline is `offline`.
    health = models.CharField(max_length=8, choices=FindingStatus.choices, default=FindingStatus.OK)

    present = models.BooleanField(default=False)
    driver_version = models.CharField(max_length=64, blank=True)
    runtime_installed = models.BooleanField(default=False)
    toolkit_version = models.CharField(max_length=200, blank=True)
    attach = models.CharField(max_length=8, choices=Attach.choices, default=Attach.NONE)
    cdi_spec_files = models.JSONField(default=list, blank=True)
    cdi_devices = models.JSONField(default=list, blank=True)
    fixes_allowed = models.JSONField(default=list, blank=True, help_text="Finding codes the agent may fix.")
    # DCGM as the agent last said ({}: an agent from before DCGM detection), and the last
    # DCGM diagnostic that ran (verdict, level, summary, at, job): kept on the row ingest
    # reads anyway, so a failed run stays a finding at every snapshot with no query more.
    dcgm = models.JSONField(default=dict, blank=True, help_text="DCGM on the node: installed, version, problem.")
    diagnostic = models.JSONField(default=dict, blank=True, help_text="The node's last DCGM diagnostic that ran.")

    gpu_count = models.PositiveIntegerField(default=0)
    vram_total_mib = models.BigIntegerField(default=0)
    vram_used_mib = models.BigIntegerField(default=0)
    utilization_mean = models.FloatField(null=True, blank=True)
    gpus_reserved = models.PositiveIntegerField(default=0)
    # GPUs busy (a process, a container attached) that no claim accounts for
    # (gpu.Ledger.busy_unclaimed): not free, though not reserved either.
    gpus_busy_unclaimed = models.PositiveIntegerField(default=0)
    # GPUs the node had but no longer reports (lost capacity until someone forgets them).
    gpus_lost = models.PositiveIntegerField(default=0)
    # The worst finding in words ("GPU 2 (...): Hardware slowdown active ..."), for the
    # overview's problem column, and the GPU models, for its name search: both kept
    # on the row so the overview reads one table.
    problem = models.CharField(max_length=300, blank=True)
    gpu_models = models.CharField(max_length=500, blank=True)
    # Made by `manage.py simulate`, which removes only these: a real node is never one.
    simulated = models.BooleanField(default=False)
    # Messages the ingest refused that named this node (gpufleet/ingest/refusals.py):
    # shown on its page and in /metrics, never as its health.
    refused_total = models.PositiveBigIntegerField(default=0)
    refused_since = models.DateTimeField(null=True, blank=True)
    refused_last_at = models.DateTimeField(null=True, blank=True)
    refused_last_reason = models.CharField(max_length=32, choices=Refusal.choices, blank=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        indexes = [
            # The overview's default order, worst first: its first page is read off this
            # index instead of sorting the whole fleet.
            models.Index(HEALTH_RANK.desc(), models.F("name"), name="node_worst_first"),
        ]
        permissions = [
            ("diagnose_node", "Can ask a node to diagnose itself now"),
            ("apply_fix", "Can apply a doctor fix on a node"),
            ("acknowledge_xid", "Can acknowledge a GPU's Xid errors"),
            ("run_dcgm_diag", "Can run a DCGM diagnostic on a node"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def status(self) -> Health:
        """Health as shown: a node that stopped reporting is offline, whatever it said last."""
        return Health.OFFLINE if self.offline else Health(self.health)

    @property
    def lacks_valid_key(self) -> bool:
        """Offline while what came naming it since its last valid snapshot was refused
        for its key: its agent most likely still has a key from before a rotation."""
        return (self.offline and self.refused_last_at is not None and self.refused_last_at > self.last_seen
                and self.refused_last_reason in KEY_REFUSALS)

    # GPUs neither reserved nor busy with unclaimed work, as the database reckons it
    # (below 0 when a node lost GPUs its claims still hold); `gpus_free` in Python.
    FREE = models.F("gpu_count") - models.F("gpus_reserved") - models.F("gpus_busy_unclaimed")

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpu_count - self.gpus_reserved - self.gpus_busy_unclaimed)

    @property
    def agent_queue(self) -> str:
        return wire.agent_queue(self.name)

    def current_devices(self) -> list[Device]:
        """The GPUs of the latest snapshot (not the vanished ones), by index. Uses
        the prefetched `current_devices_cache` when the queryset has one."""
        cached = getattr(self, "current_devices_cache", None)
        if cached is not None:
            return cached
        return list(self.devices.filter(vanished_at__isnull=True).order_by("index"))

    def gpu_info(self, devices: list[Device] | None = None) -> gpu.Info:
        """The node as the domain sees it. `devices` are the current Device rows;
        read with `current_devices()` when not given."""
        return self._info_of(self._gpu_devices(devices))

    def _gpu_devices(self, devices: list[Device] | None) -> tuple[gpu.Device, ...]:
        if devices is None:
            devices = self.current_devices()
        return tuple(d.as_gpu_device() for d in sorted(devices, key=lambda d: d.index))

    def _info_of(self, devices: tuple[gpu.Device, ...]) -> gpu.Info:
        return gpu.Info(
            present=self.present,
            driver_version=self.driver_version,
            devices=devices,
            runtime_installed=self.runtime_installed,
            cdi_devices=tuple(self.cdi_devices),
        )

    def ledger(self, excluding=None, devices: list[Device] | None = None, claims=None,
               gpus: tuple[gpu.Device, ...] | None = None, at: datetime | None = None) -> gpu.Ledger:
        """The node's claims ledger: its current GPUs and its claims in force at `at`
        (default now; read once, or from a prefetch), or the `claims` given, as given
        (those in force, or those meeting a window to fit), but `excluding` (the claim
        being edited, which is checked against the others). `devices` saves a query
        when the caller has them already; `gpus`, the domain's GPUs by index, save
        making them from `devices`."""
        if claims is None:
            at = at or timezone.now()
            claims = [c for c in self.claims.all() if c.in_force(at)]
        others = [c for c in claims if excluding is None or c.pk != excluding.pk]
        info = self._info_of(gpus) if gpus is not None else self.gpu_info(devices)
        return gpu.Ledger(info, [c.as_gpu_claim() for c in others])

    def diagnosis(self, devices: list[Device] | None = None, findings=None) -> gpu.HostDiagnosis:
        """The stored snapshot as the domain's diagnosis, so every report of it
        (doctor JSON, exports, API) is built by `HostDiagnosis.to_dict`."""
        if findings is None:
            findings = self.findings.all()
        return self.diagnosis_of(self._gpu_devices(devices), tuple(f.as_gpu_finding() for f in findings))

    def diagnosis_of(self, devices: tuple[gpu.Device, ...], findings: tuple[gpu.Finding, ...]) -> gpu.HostDiagnosis:
        """`diagnosis` from the domain's own devices (by index) and findings; the fleet
        exports pass none and add the GPUs' and findings' dicts to the report themselves."""
        return gpu.HostDiagnosis(
            info=self._info_of(devices),
            toolkit_version=self.toolkit_version,
            cdi_spec_files=tuple(self.cdi_spec_files),
            cdi_devices=tuple(self.cdi_devices),
            attach=gpu.Attach(self.attach),
            findings=findings,
        )


class Device(models.Model):
    """One GPU of a node, identified by its UUID. A GPU missing from the latest
    snapshot keeps its row with `vanished_at` set, so the dashboard can say so."""

    # No index of its own: the unique (node, uuid) index serves lookups by node.
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices", db_index=False)
    uuid = models.CharField(max_length=100)
    index = models.IntegerField()
    name = models.CharField(max_length=200)
    vram_total_mib = models.BigIntegerField(null=True, blank=True)
    vram_used_mib = models.BigIntegerField(null=True, blank=True)
    utilization_percent = models.IntegerField(null=True, blank=True)
    # The health figures the tables show and sort by; the rest of what nvidia-smi
    # and the kernel log said (ECC, throttling, MIG, Xid ...) is kept in `health`.
    pci_bus_id = models.CharField(max_length=32, blank=True)
    temperature_c = models.IntegerField(null=True, blank=True)
    power_draw_w = models.FloatField(null=True, blank=True)
    power_limit_w = models.FloatField(null=True, blank=True)
    health = models.JSONField(default=dict, blank=True)
    last_seen = models.DateTimeField(default=timezone.now)
    vanished_at = models.DateTimeField(null=True, blank=True)
    # Since when the centre has heard of this GPU, and when a snapshot last showed
    # it at work (a process, or utilization at GPUFLEET_IDLE_UTIL_PERCENT or more):
    # the history's answer to "idle for how long", kept at ingest, because the
    # samples keep no processes. Null busy_at: no work seen since first_seen.
    first_seen = models.DateTimeField(default=timezone.now)
    busy_at = models.DateTimeField(null=True, blank=True)

    # What a snapshot's device carries, column by column; the rest goes in `health`.
    COLUMNS = ("index", "uuid", "name", "vram_total_mib", "vram_used_mib", "utilization_percent",
               "temperature_c", "power_draw_w", "power_limit_w")
    # A GPU is its UUID: everything else about it is rewritten by each snapshot.
    UPDATED_ON_INGEST = (*(c for c in COLUMNS if c != "uuid"), "pci_bus_id", "health", "last_seen", "vanished_at",
                         "busy_at")
    # What of a reported GPU is not kept in `health`.
    NOT_HEALTH = frozenset((*COLUMNS, "pci_bus_id"))

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "uuid"], name="device_unique_uuid_per_node")]
        indexes = [
            # The overview lists the latest vanished GPUs: a few rows among a fleet's
            # tens of thousands, found without scanning them all.
            models.Index(fields=["-vanished_at"], name="device_vanished_latest",
                         condition=models.Q(vanished_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.node.name} GPU {self.index} ({self.uuid})"

    @property
    def vanished(self) -> bool:
        return self.vanished_at is not None

    @staticmethod
    def idle_since(busy_at, first_seen):
        """Since when no snapshot has shown a GPU at work, from its row's busy_at and
        first_seen (ingest has them back from its upsert, not as a Device)."""
        return busy_at or first_seen

    def as_gpu_device(self) -> gpu.Device:
        return gpu.Device.from_dict(self.reported(self.health, {key: getattr(self, key) for key in self.COLUMNS},
                                                  self.pci_bus_id))

    @classmethod
    def reported(cls, health: dict, columns: dict, pci_bus_id: str) -> dict:
        """The GPU as its snapshot reported it (gpu.Device.to_dict's keys) from a row's
        parts (what ingest splits a reported GPU into), for readers of plain values (exports)."""
        return {**health, **columns, "pci_bus_id": pci_bus_id or None}

    @property
    def xid_errors(self) -> list[dict]:
        return self.health.get("xid_errors") or []

    @property
    def throttle_reasons(self) -> list[str]:
        return self.health.get("throttle_reasons") or []

    @property
    def mig_devices(self) -> list[dict]:
        return self.health.get("mig_devices") or []

    @property
    def processes(self) -> list[dict]:
        return self.health.get("processes") or []

    @property
    def attached_idle(self) -> list[dict]:
        return self.health.get("attached_idle") or []


class Finding(models.Model):
    """One doctor finding of a node's latest snapshot."""

    # The unique (node, code) index serves lookups by node. Each snapshot deletes and
    # inserts its node's findings, so every index costs ingest: the only other one is
    # partial, holding the few warn and fail rows that the overview's "Problems by
    # cause" reads, so that it never scans the fleet's many ok findings.
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="findings", db_index=False)
    position = models.PositiveIntegerField(default=0)
    code = models.CharField(max_length=64)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=8, choices=FindingStatus.choices)
    message = models.TextField(blank=True)
    fix = models.TextField(blank=True)

    class Meta:
        ordering = ["node", "position"]
        constraints = [models.UniqueConstraint(fields=["node", "code"], name="finding_unique_code_per_node")]
        indexes = [models.Index(fields=["status"], name="finding_problems",
                                condition=models.Q(status__in=[FindingStatus.WARN, FindingStatus.FAIL])),
                   # The claims-vs-use page lists only these findings, a few among the fleet's.
                   models.Index(fields=["code"], name="finding_use", condition=models.Q(code__in=list(USE_KINDS)))]

    def __str__(self) -> str:
        return f"{self.node.name} {self.code}: {self.status}"

    @property
    def health(self) -> FindingStatus:
        return FindingStatus(self.status)

    def as_gpu_finding(self) -> gpu.Finding:
        return gpu.Finding(code=self.code, name=self.name, status=self.status, message=self.message, fix=self.fix)


class DeviceSample(models.Model):
    """What one GPU reported at one collection (the raw history), kept
    GPUFLEET_HISTORY_RAW_HOURS and rolled up into `NodeRollup5m` meanwhile. On
    PostgreSQL the table is partitioned by `collected_at` (see fleet/partitions.py):
    its primary key there is (id, collected_at), `id` alone to Django."""

    # No index of its own: the (device, collected_at) index serves lookups by device.
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="samples", db_index=False)
    collected_at = models.DateTimeField()
    vram_used_mib = models.BigIntegerField(null=True, blank=True)
    utilization_percent = models.IntegerField(null=True, blank=True)
    temperature_c = models.IntegerField(null=True, blank=True)
    power_draw_w = models.FloatField(null=True, blank=True)

    # The figures a rollup keeps the minimum, mean and maximum of: those a chart draws.
    MEASURES = charts.MEASURES

    class Meta:
        ordering = ["device", "collected_at"]
        indexes = [models.Index(fields=["device", "collected_at"]), models.Index(fields=["collected_at"])]

    def __str__(self) -> str:
        return f"{self.device} at {self.collected_at:%Y-%m-%d %H:%M:%S}"


class NodeRollup(models.Model):
    """A node's GPUs over one bucket of time (from `bucket`, `resolution` long): for each
    GPU, its sample count and the minimum, mean and maximum of each measure, packed in
    `figures` (the format: gpufleet/gpu/rollups.py). One row per node and bucket, not per
    GPU: the row's and its index entries' overhead is shared by the node's GPUs. Written
    only by gpufleet.fleet.history's roll-up; partitioned by `bucket` on PostgreSQL."""

    resolution: timedelta  # set by each series

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    bucket = models.DateTimeField(help_text="Start of the bucket.")
    figures = models.BinaryField()

    class Meta:
        abstract = True
        ordering = ["node", "bucket"]

    def gpus(self) -> list[rollups.Gpu]:
        return rollups.unpack(self.figures)

    def __str__(self) -> str:
        gpus = len(self.figures) // rollups.GPU_BYTES
        return f"{self.node} from {self.bucket:%Y-%m-%d %H:%M}, {gpus} GPU{'' if gpus == 1 else 's'}"


class NodeRollup5m(NodeRollup):
    """Five-minute rollups of `DeviceSample`, kept GPUFLEET_HISTORY_5M_DAYS."""

    resolution = timedelta(minutes=5)

    class Meta(NodeRollup.Meta):
        verbose_name = "GPU history (5 minutes)"
        verbose_name_plural = "GPU history (5 minutes)"
        # The unique index serves the charts (a node, a time range) and the hourly roll;
        # the one on `bucket` finds the last bucket rolled.
        constraints = [models.UniqueConstraint(fields=["node", "bucket"], name="one_5m_rollup_per_node")]
        indexes = [models.Index(fields=["bucket"], name="fleet_node5m_bucket_idx")]


class NodeRollup1h(NodeRollup):
    """Hourly rollups, made from the five-minute ones and kept GPUFLEET_HISTORY_HOURLY_DAYS."""

    resolution = timedelta(hours=1)

    class Meta(NodeRollup.Meta):
        verbose_name = "GPU history (hourly)"
        verbose_name_plural = "GPU history (hourly)"
        constraints = [models.UniqueConstraint(fields=["node", "bucket"], name="one_1h_rollup_per_node")]
        indexes = [models.Index(fields=["bucket"], name="fleet_node1h_bucket_idx")]


class XidAcknowledgement(models.Model):
    """An admin's "seen it" for one GPU's Xid errors: the GPU's Xid finding stays
    cleared until the kernel log shows an Xid newer than those acknowledged."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="xid_acknowledgements")
    device_uuid = models.CharField(max_length=100)
    xid_errors = models.JSONField(default=list)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "device_uuid"], name="one_xid_ack_per_gpu")]

    def __str__(self) -> str:
        return f"{self.node.name} {self.device_uuid} Xids acknowledged {self.at:%Y-%m-%d %H:%M}"


class NodeCredential(models.Model):
    """A node's enrolment: which generation of its key is valid (wire.derive_node_key
    makes the key itself, so no secret is stored), and whether it was revoked. Keyed by
    name, not by Node: a node is enrolled before its first snapshot makes its row."""

    name = models.CharField(max_length=200, unique=True)
    generation = models.PositiveIntegerField(default=1)
    issued_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        state = f"revoked {self.revoked_at:%Y-%m-%d %H:%M}" if self.revoked_at else f"key {self.generation}"
        return f"{self.name} ({state})"


class Maintenance(models.Model):
    """A node taken out of service until `until`: it takes no new claims, is left out
    of find-a-node and sends no alerts; its events are still recorded. Its own row,
    not columns of Node, so that setting it never touches the row ingest rewrites.
    A passed `until` is simply not in maintenance (every reader compares with now)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="maintenance")
    until = models.DateTimeField()
    REASON_MAX = 500

    reason = models.CharField(max_length=REASON_MAX)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    started_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.node.name} in maintenance until {self.until:%Y-%m-%d %H:%M}"

    def as_audit_dict(self) -> dict:
        return {"until": self.until.isoformat(), "reason": self.reason}


class Validation(models.Model):
    """A node in validation: it takes no new claim until a DCGM diagnostic of at least
    `level` passes (one that finished after `since`), typically after maintenance. Its
    own row, as Maintenance's; the passing run removes it (gpufleet/fleet/maintenance.py)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="validation")
    since = models.DateTimeField(default=timezone.now)
    level = models.PositiveSmallIntegerField(default=1, help_text="The least DCGM diagnostic level that validates.")
    reason = models.CharField(max_length=Maintenance.REASON_MAX, blank=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")

    def __str__(self) -> str:
        return f"{self.node.name} in validation since {self.since:%Y-%m-%d %H:%M}"

    def as_audit_dict(self) -> dict:
        return {"since": self.since.isoformat(), "level": self.level, "reason": self.reason}
