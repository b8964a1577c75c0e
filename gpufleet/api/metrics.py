"""/metrics: the fleet's latest state in the Prometheus text format.

Everything comes from the rows the ingest keeps current (Node, and Device rows not
vanished), in two queries whatever the fleet's size; the per-GPU history is never read.
The ingest counters come from the worker's multiprocess files (gpufleet/ingest/metrics.py),
the broker queue depth from one LLEN with a short timeout.

Who may scrape: a valid API token (Bearer, read scope is enough) or a logged-in user,
either with a role that may view; or, without any credential, a client whose address is in
GPUFLEET_METRICS_ALLOWED_ADDRESSES."""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Iterator

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gpufleet.api.models import ApiToken
from gpufleet.core.access import VIEW, can
from gpufleet.core.security import client_ip
from gpufleet.fleet.models import Device, FindingStatus, Node

# How long a scrape waits for the broker before saying it is unreachable.
BROKER_TIMEOUT_SECONDS = 0.5
MIB = 1024 * 1024
GPU_LABELS = ["node", "gpu", "uuid", "model"]
_HEALTH_RANK = {status.value: status.rank for status in FindingStatus}
_DEVICE_COLUMNS = (
    "node__name", "index", "uuid", "name", "utilization_percent", "vram_used_mib", "vram_total_mib",
    "temperature_c", "power_draw_w", "power_limit_w",
)
# Read out of the health JSON by the database, so the scrape never decodes the whole
# document (processes, MIG ...) of 80,000 GPUs.
_HEALTH_KEYS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "xid_errors")


class FleetCollector:
    """Yields the fleet's metrics for one scrape (prometheus-client's custom collector)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._nodes()
        yield from self._gpus()
        yield from self._broker()

    def _nodes(self) -> Iterator[Metric]:
        health = GaugeMetricFamily(
            "gpufleet_node_health", "The node's worst finding: 0 ok, 1 warn, 2 fail.", labels=["node"]
        )
        online = GaugeMetricFamily(
            "gpufleet_node_online", "1 while the node reports, 0 once it missed its snapshots.", labels=["node"]
        )
        last_seen = GaugeMetricFamily(
            "gpufleet_node_last_seen_timestamp_seconds", "When the node's last snapshot arrived.", labels=["node"]
        )
        gpus = GaugeMetricFamily("gpufleet_node_gpus", "GPUs in the node's last snapshot.", labels=["node"])
        rows = Node.objects.order_by("name").values_list("name", "health", "offline", "last_seen", "gpu_count")
        for name, status, offline, seen, gpu_count in rows.iterator(chunk_size=2000):
            health.add_metric([name], _HEALTH_RANK.get(status, 0))
            online.add_metric([name], 0 if offline else 1)
            last_seen.add_metric([name], seen.timestamp())
            gpus.add_metric([name], gpu_count)
        yield from (health, online, last_seen, gpus)

    def _gpus(self) -> Iterator[Metric]:
        def family(name: str, help_text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_text, labels=GPU_LABELS)

        utilization = family("gpufleet_gpu_utilization_percent", "GPU utilization.")
        memory_used = family("gpufleet_gpu_memory_used_bytes", "GPU memory in use.")
        memory_total = family("gpufleet_gpu_memory_total_bytes", "GPU memory in all.")
        temperature = family("gpufleet_gpu_temperature_celsius", "GPU temperature.")
        power = family("gpufleet_gpu_power_draw_watts", "GPU power draw.")
        power_limit = family("gpufleet_gpu_power_limit_watts", "GPU power limit.")
        ecc_corrected = family("gpufleet_gpu_ecc_errors_corrected", "Corrected ECC errors since the driver loaded.")
        ecc_uncorrected = family(
            "gpufleet_gpu_ecc_errors_uncorrected", "Uncorrected ECC errors since the driver loaded."
        )
        xid = GaugeMetricFamily(
            "gpufleet_gpu_xid_errors",
            "Xid errors the kernel logged for the GPU within GPUFLEET_XID_WINDOW_HOURS, by Xid code.",
            labels=[*GPU_LABELS, "xid"],
        )
        rows = (
            Device.objects.filter(vanished_at__isnull=True)
            .order_by("node__name", "index")
            .values_list(*_DEVICE_COLUMNS, *(KT(f"health__{key}") for key in _HEALTH_KEYS))
        )
        for (node, index, uuid, model, util, used_mib, total_mib, temp, draw, limit,
             corrected, uncorrected, xids) in rows.iterator(chunk_size=2000):
            labels = [node, str(index), uuid, model]
            # A figure nvidia-smi did not give is left out, not reported as 0.
            if util is not None:
                utilization.add_metric(labels, util)
            if used_mib is not None:
                memory_used.add_metric(labels, used_mib * MIB)
            if total_mib is not None:
                memory_total.add_metric(labels, total_mib * MIB)
            if temp is not None:
                temperature.add_metric(labels, temp)
            if draw is not None:
                power.add_metric(labels, draw)
            if limit is not None:
                power_limit.add_metric(labels, limit)
            if (corrected := _number(corrected)) is not None:
                ecc_corrected.add_metric(labels, corrected)
            if (uncorrected := _number(uncorrected)) is not None:
                ecc_uncorrected.add_metric(labels, uncorrected)
            for entry in _xid_counts(xids):
                xid.add_metric([*labels, str(entry["xid"])], entry["count"])
        yield from (utilization, memory_used, memory_total, temperature, power, power_limit,
                    ecc_corrected, ecc_uncorrected, xid)

    def _broker(self) -> Iterator[Metric]:
        url = settings.CELERY_BROKER_URL
        queue = settings.CELERY_TASK_DEFAULT_QUEUE
        if not url.startswith(("redis://", "rediss://", "redis+socket://")):
            return  # a broker other than Redis (memory:// in tests): no queue depth to ask for
        up = GaugeMetricFamily("gpufleet_broker_up", "1 if this scrape reached the broker, else 0.")
        depth = GaugeMetricFamily(
            "gpufleet_broker_queue_depth", "Messages waiting in the broker queue.", labels=["queue"]
        )
        try:
            waiting = _queue_length(url, queue)
        except (redis.RedisError, OSError):
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        depth.add_metric([queue], waiting)
        yield from (up, depth)


def _number(raw) -> float | None:
    # A JSON null may come back as the text "null" (SQLite): an unknown figure.
    try:
        return None if raw is None else float(raw)
    except ValueError:
        return None


def _xid_counts(raw) -> list[dict]:
    if not raw or raw == "null":
        return []
    # PostgreSQL gives the JSON list as text, SQLite may too.
    entries = json.loads(raw) if isinstance(raw, str) else raw
    return [e for e in entries if isinstance(e, dict) and "xid" in e and "count" in e]


def _queue_length(url: str, queue: str) -> int:
    # kombu's Redis transport keeps a queue as a Redis list named after it.
    client = redis.Redis.from_url(
        url.replace("redis+socket://", "unix://", 1),
        socket_timeout=BROKER_TIMEOUT_SECONDS,
        socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
    )
    try:
        return client.llen(queue)
    finally:
        client.close()


def render() -> bytes:
    """One scrape's text: the fleet's latest state, the broker, the ingest counters."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    MultiProcessCollector(registry, path=str(settings.GPUFLEET_METRICS_DIR))
    return generate_latest(registry)


def scrape_seconds() -> float:
    """How long one scrape of the current database takes, for the benchmark."""
    started = time.perf_counter()
    render()
    return time.perf_counter() - started


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may scrape, else the answer that says why not."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, secret = header.partition(" ")
        token = ApiToken.find(secret.strip()) if scheme.lower() == "bearer" and secret.strip() else None
        if token is None:
            return _text(401, "The API token is unknown or revoked (send Authorization: Bearer <token>).")
        if not can(token.user, VIEW):
            return _text(403, "This API token's user has no role that may view the fleet.")
        token.touch()
        return None
    if request.user.is_authenticated:
        if can(request.user, VIEW):
            return None
        return _text(403, "Your role may not view the fleet.")
    if _address_allowed(client_ip(request)):
        return None
    return _text(401, "Send an API token (Authorization: Bearer <token>), or scrape from an address "
                      "in GPUFLEET_METRICS_ALLOWED_ADDRESSES.")


def _address_allowed(address: str) -> bool:
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(client in ipaddress.ip_network(allowed, strict=False)
               for allowed in settings.GPUFLEET_METRICS_ALLOWED_ADDRESSES)


def _text(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


@login_not_required
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = _refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
