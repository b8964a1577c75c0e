"""/metrics: the fleet's latest state in the Prometheus text format.

Everything comes from the rows the ingest keeps current (Node, and Device rows not
vanished), in two queries whatever the fleet's size; the per-GPU history is never read.
The ingest counters come from the worker's multiprocess files (gpufleet/ingest/metrics.py),
the ingest stream's length and trims from one XINFO with a short timeout.

Who may scrape: a valid API token (Bearer, read scope is enough) or a logged-in user,
either with a role that may view; or, without any credential, a client whose address is in
GPUFLEET_METRICS_ALLOWED_ADDRESSES."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import timedelta

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gpufleet.api.models import ApiToken
from gpufleet.core import broker
from gpufleet.core.access import VIEW, can
from gpufleet.core.security import address_in, client_ip
from gpufleet.fleet.models import Device, FindingStatus, Node

# How long a scrape waits for the broker before saying it is unreachable.
BROKER_TIMEOUT_SECONDS = 0.5
MIB = 1024 * 1024
_HEALTH_RANK = {status.value: status.rank for status in FindingStatus}
_DEVICE_COLUMNS = (
    "node__name", "index", "uuid", "name", "utilization_percent", "vram_used_mib", "vram_total_mib",
    "temperature_c", "power_draw_w", "power_limit_w",
)
# Read out of the health JSON by the database, so the scrape never decodes the whole
# document (processes, MIG ...) of 80,000 GPUs.
_HEALTH_KEYS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "xid_errors")


# The fleet's own families are written here, not by prometheus-client: its
# generate_latest builds a Sample and escapes every label of every sample, about 9 µs
# each, so the 720,000 samples of 10,000 nodes x 8 GPUs took 8 s a scrape. Here each
# GPU's labels are escaped once and shared by its nine samples. prometheus-client
# still writes the broker's and the ingest worker's families, and its parser reads
# this text back in the tests.
_NODE_FAMILIES = (
    ("gpufleet_node_health", "The node's worst finding: 0 ok, 1 warn, 2 fail."),
    ("gpufleet_node_online", "1 while the node reports, 0 once it missed its snapshots."),
    ("gpufleet_node_last_seen_timestamp_seconds", "When the node's last snapshot arrived."),
    ("gpufleet_node_gpus", "GPUs in the node's last snapshot."),
    ("gpufleet_node_refused_messages", "Messages naming the node that the ingest refused (since its page says when);"
     " only for nodes with a refusal within the last day."),
)
# A node's refusals are shown only while recent: one series for each of 60,000 nodes
# would mostly say 0, and the fleet-wide gpufleet_ingest_refused_total{reason} counts them all.
REFUSALS_SHOWN_FOR = timedelta(days=1)
# In the order of the values `_gpu_values` yields.
_GPU_FAMILIES = (
    ("gpufleet_gpu_utilization_percent", "GPU utilization."),
    ("gpufleet_gpu_memory_used_bytes", "GPU memory in use."),
    ("gpufleet_gpu_memory_total_bytes", "GPU memory in all."),
    ("gpufleet_gpu_temperature_celsius", "GPU temperature."),
    ("gpufleet_gpu_power_draw_watts", "GPU power draw."),
    ("gpufleet_gpu_power_limit_watts", "GPU power limit."),
    ("gpufleet_gpu_ecc_errors_corrected", "Corrected ECC errors since the driver loaded."),
    ("gpufleet_gpu_ecc_errors_uncorrected", "Uncorrected ECC errors since the driver loaded."),
)
_XID_FAMILY = ("gpufleet_gpu_xid_errors",
               "Xid errors the kernel logged for the GPU within GPUFLEET_XID_WINDOW_HOURS, by Xid code.")


def fleet_text() -> Iterator[str]:
    """The nodes' and GPUs' families in the Prometheus text format (version 0.0.4), in
    pieces; two queries whatever the fleet's size."""
    yield from _families(_NODE_FAMILIES, _node_samples())
    yield from _families((*_GPU_FAMILIES, _XID_FAMILY), _gpu_samples())


def _families(families, samples: Iterator[tuple[int, str]]) -> Iterator[str]:
    """`samples` are (family position, sample line) in any order; each family's lines
    come out together under its HELP and TYPE, as the format requires."""
    lines: list[list[str]] = [[] for _ in families]
    for position, line in samples:
        lines[position].append(line)
    for (name, help_text), own in zip(families, lines, strict=True):
        yield f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        if own:
            yield "\n".join(own) + "\n"


def _node_samples() -> Iterator[tuple[int, str]]:
    rows = Node.objects.order_by("name").values_list("name", "health", "offline", "last_seen", "gpu_count",
                                                     "refused_total", "refused_last_at")
    recent = timezone.now() - REFUSALS_SHOWN_FOR
    for name, status, offline, seen, gpu_count, refused, refused_at in rows.iterator(chunk_size=2000):
        labels = f'{{node="{_escape(name)}"}}'
        yield 0, f"gpufleet_node_health{labels} {_HEALTH_RANK.get(status, 0)}"
        yield 1, f"gpufleet_node_online{labels} {0 if offline else 1}"
        yield 2, f"gpufleet_node_last_seen_timestamp_seconds{labels} {_value(seen.timestamp())}"
        yield 3, f"gpufleet_node_gpus{labels} {gpu_count}"
        if refused_at is not None and refused_at >= recent:
            yield 4, f"gpufleet_node_refused_messages{labels} {refused}"


def _gpu_samples() -> Iterator[tuple[int, str]]:
    rows = (
        Device.objects.filter(vanished_at__isnull=True)
        .order_by("node__name", "index")
        .values_list(*_DEVICE_COLUMNS, *(KT(f"health__{key}") for key in _HEALTH_KEYS))
    )
    names = [name for name, _ in _GPU_FAMILIES]
    xid_family = len(names)
    for (node, index, uuid, model, util, used_mib, total_mib, temp, draw, limit,
         corrected, uncorrected, xids) in rows.iterator(chunk_size=2000):
        labels = f'node="{_escape(node)}",gpu="{index}",uuid="{_escape(uuid)}",model="{_escape(model)}"'
        values = (util, None if used_mib is None else used_mib * MIB, None if total_mib is None else total_mib * MIB,
                  temp, draw, limit, _number(corrected), _number(uncorrected))
        for position, value in enumerate(values):
            # A figure nvidia-smi did not give is left out, not reported as 0.
            if value is not None:
                yield position, f"{names[position]}{{{labels}}} {_value(value)}"
        for entry in _xid_counts(xids):
            yield xid_family, f'{_XID_FAMILY[0]}{{{labels},xid="{_escape(str(entry["xid"]))}"}} {_value(entry["count"])}'


def _escape(label_value: str) -> str:
    return label_value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(number) -> str:
    if isinstance(number, float) and not math.isfinite(number):
        return "NaN" if math.isnan(number) else ("+Inf" if number > 0 else "-Inf")
    return repr(number)


class BrokerCollector:
    """The broker's families for one scrape (prometheus-client's custom collector)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._broker()

    def _broker(self) -> Iterator[Metric]:
        url = settings.CELERY_BROKER_URL
        if not url.startswith(("redis://", "rediss://", "redis+socket://")):
            return  # a broker other than Redis (memory:// in tests): no stream to ask about
        up = GaugeMetricFamily("gpufleet_broker_up", "1 if this scrape reached the broker, else 0.")
        depth = GaugeMetricFamily(
            "gpufleet_broker_queue_depth", "Entries waiting in the ingest stream (not stored yet).", labels=["queue"]
        )
        trimmed = GaugeMetricFamily(
            "gpufleet_ingest_stream_trimmed",
            "Entries the ingest stream's MAXLEN dropped before they were stored (GPUFLEET_INGEST_STREAM_MAXLEN).",
        )
        client = broker.connect(url, timeout=BROKER_TIMEOUT_SECONDS, retries=0)
        try:
            waiting, dropped = broker.stream_status(client)
        except (redis.RedisError, OSError):
            up.add_metric([], 0)
            yield up
            return
        finally:
            client.close()
        up.add_metric([], 1)
        depth.add_metric(["ingest"], waiting)
        trimmed.add_metric([], dropped)
        yield from (up, depth, trimmed)


def _number(raw) -> float | None:
    # A JSON null may come back as the text "null" (SQLite): an unknown figure.
    try:
        return None if raw is None else float(raw)
    except ValueError:
        return None


def _xid_counts(raw) -> list[dict]:
    if not raw or raw in ("null", "[]"):  # most GPUs: nothing to decode
        return []
    # PostgreSQL gives the JSON list as text, SQLite may too.
    entries = json.loads(raw) if isinstance(raw, str) else raw
    return [e for e in entries if isinstance(e, dict) and "xid" in e and "count" in e]


def render() -> bytes:
    """One scrape's text: the fleet's latest state, the broker, the ingest counters."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector())
    MultiProcessCollector(registry, path=str(settings.GPUFLEET_METRICS_DIR))
    return "".join(fleet_text()).encode() + generate_latest(registry)


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
    if address_in(client_ip(request), settings.GPUFLEET_METRICS_ALLOWED_ADDRESSES):
        return None
    return _text(401, "Send an API token (Authorization: Bearer <token>), or scrape from an address "
                      "in GPUFLEET_METRICS_ALLOWED_ADDRESSES.")


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
