"""/metrics: the fleet's latest state in the Prometheus text format.

Everything comes from the rows the ingest keeps current (Node, and Device rows not
vanished), in two queries whatever the fleet's size; the per-GPU history is never read.
A large fleet is scraped in shards (?shard=K&of=N): a node is in shard crc32(name) % N,
and the site-wide families (broker, alert channels, ingest counters) come in shard 0
only, so the shards together are the unsharded scrape.
The ingest counters come from the worker's multiprocess files (gpufleet/ingest/metrics.py),
the ingest stream's length and trims from one XINFO with a short timeout.

Who may scrape: a valid API token (Bearer, read scope is enough) or a logged-in user,
either with a role that may view; or, without any credential, a client whose address is in
GPUFLEET_METRICS_ALLOWED_ADDRESSES."""

from __future__ import annotations

import functools
import itertools
import json
import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gpufleet.alerts.models import Channel
from gpufleet.api.models import ApiToken
from gpufleet.core import broker, bulk
from gpufleet.core.access import VIEW, can
from gpufleet.core.security import address_in, client_ip
from gpufleet.fleet.models import Device, FindingStatus, Node

# Above this, `of` is a mistake, not a fleet: refused rather than served as empty shards.
MAX_SHARDS = 1000
# What one shard should hold at most (docs/metrics.md, "Sharding"): its scrape then stays
# far under Prometheus' default 10 s scrape_timeout.
GPUS_PER_SHARD = 32_000
# How long a scrape waits for the broker before saying it is unreachable.
BROKER_TIMEOUT_SECONDS = 0.5
MIB = 1024 * 1024
_HEALTH_RANK = {status.value: status.rank for status in FindingStatus}
# The node's name comes from the nodes' rows, read first, so the GPUs' query needs no
# join and no ORDER BY: the text's order means nothing to Prometheus.
_DEVICE_COLUMNS = (
    "node_id", "index", "uuid", "name", "utilization_percent", "vram_used_mib", "vram_total_mib",
    "temperature_c", "power_draw_w", "power_limit_w",
)
# Read out of the health JSON by the database, so the scrape never decodes the whole
# document (processes, MIG ...) of every GPU.
_HEALTH_KEYS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "xid_errors")
# GPUs' rows read and written at a time: a whole large fleet's rows are never all in memory.
_CHUNK = 2000
_NODE_COLUMNS = ("id", "name", "health", "offline", "last_seen", "gpu_count", "refused_total", "refused_last_at")


# The fleet's own families are written here, not by prometheus-client: its
# generate_latest builds a Sample and escapes every label of every sample, which made a
# large fleet's scrape several times slower. Here each GPU's labels are escaped once and
# shared by its samples. prometheus-client still writes the broker's and the ingest
# worker's families, and its parser reads this text back in the tests.
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
# Each is drawn per GPU by a panel of the Grafana dashboard (gpufleet/api/grafana/);
# in the order `_gpu_lines` writes them.
_GPU_FAMILIES = (
    ("gpufleet_gpu_utilization_percent", "GPU utilization."),
    ("gpufleet_gpu_memory_used_bytes", "GPU memory in use."),
    ("gpufleet_gpu_memory_total_bytes", "GPU memory in all."),
    ("gpufleet_gpu_temperature_celsius", "GPU temperature."),
    ("gpufleet_gpu_power_draw_watts", "GPU power draw."),
    ("gpufleet_gpu_power_limit_watts", "GPU power limit."),
    ("gpufleet_gpu_ecc_errors_corrected", "Corrected ECC errors since the driver loaded."),
    ("gpufleet_gpu_ecc_errors_uncorrected", "Uncorrected ECC errors since the driver loaded."),
    ("gpufleet_gpu_xid_errors",
     "Xid errors the kernel logged for the GPU within GPUFLEET_XID_WINDOW_HOURS, by Xid code."),
)


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the nodes whose shard_of(name, count) is `index`."""

    index: int
    count: int

    @classmethod
    def parse(cls, query: Mapping[str, Sequence[str]]) -> Shard | None:
        """The shard that a scrape's query parameters (each name's list of values) ask
        for, None for the whole fleet; ValueError, saying what is wrong, for anything else."""
        given = [name for name in ("shard", "of") if name in query]
        if not given:
            return None
        if len(given) == 1:
            raise ValueError("Give both shard and of (e.g. ?shard=0&of=4), or neither for the whole fleet.")
        values = []
        for name in ("shard", "of"):
            if len(query[name]) != 1:
                raise ValueError(f"Give {name} once.")
            raw = query[name][0]
            if not (raw.isascii() and raw.isdigit()):
                raise ValueError(f"{name} must be a whole number, not {raw[:20]!r}.")
            # More digits than MAX_SHARDS has is too many shards, however many.
            values.append(int(raw) if len(raw) <= len(str(MAX_SHARDS)) else MAX_SHARDS + 1)
        index, count = values
        if not 1 <= count <= MAX_SHARDS:
            raise ValueError(f"of (the number of shards) must be between 1 and {MAX_SHARDS}.")
        if index >= count:
            raise ValueError(f"shard must be less than of: the shards of {count} are 0 to {count - 1}.")
        return cls(index, count)


def shard_of(node_name: str, count: int) -> int:
    """The shard of `count` a node is in. CRC-32 of the name: the same in every process
    and Python version, which Python's hash() of a str, salted per process, is not."""
    return zlib.crc32(node_name.encode("utf-8")) % count


def shards_for(gpus: int) -> int:
    """How many shards docs/metrics.md recommends for a fleet of `gpus` GPUs."""
    return min(MAX_SHARDS, max(1, math.ceil(gpus / GPUS_PER_SHARD)))


def fleet_text(shard: Shard | None = None) -> Iterator[str]:
    """The nodes' and GPUs' families in the Prometheus text format (version 0.0.4), in
    pieces, for the whole fleet or one shard of it; two queries whatever the fleet's size."""
    nodes = _nodes(shard)
    yield from _families(_NODE_FAMILIES, _node_lines(nodes))
    labels = {row[0]: _escape(row[1]) for row in nodes}
    yield from _families(_GPU_FAMILIES, _gpu_lines(labels, None if shard is None else list(labels)))


def _nodes(shard: Shard | None) -> list[tuple]:
    """The _NODE_COLUMNS of the shard's nodes (all nodes without one). Every node's row
    is read and the shard's kept here, as the hash is Python's: a node's row is small
    beside its GPUs'."""
    rows = bulk.rows(Node.objects.all(), _NODE_COLUMNS)
    if shard is None:
        return rows
    return [row for row in rows if shard_of(row[1], shard.count) == shard.index]


def _families(families, texts: list[list[str]]) -> Iterator[str]:
    """Each family's HELP and TYPE, then its `texts` (whole lines), as the format requires."""
    for (name, help_text), own in zip(families, texts, strict=True):
        yield f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        yield from own


def _node_lines(nodes: list[tuple]) -> list[list[str]]:
    texts: list[list[str]] = [[] for _ in _NODE_FAMILIES]
    health, online, seen_at, gpus, refusals = (own.append for own in texts)
    recent = timezone.now() - REFUSALS_SHOWN_FOR
    for _, name, status, offline, seen, gpu_count, refused, refused_at in nodes:
        labels = f'{{node="{_escape(name)}"}}'
        health(f"gpufleet_node_health{labels} {_HEALTH_RANK.get(status, 0)}\n")
        online(f"gpufleet_node_online{labels} {0 if offline else 1}\n")
        seen_at(f"gpufleet_node_last_seen_timestamp_seconds{labels} {_value(seen.timestamp())}\n")
        gpus(f"gpufleet_node_gpus{labels} {gpu_count}\n")
        if refused_at is not None and refused_at >= recent:
            refusals(f"gpufleet_node_refused_messages{labels} {refused}\n")
    return texts


def _gpu_lines(node_labels: dict[int, str], node_ids: list[int] | None) -> list[list[str]]:
    """The GPU families' text, of the GPUs of `node_ids` (None: of every node), one
    string per family per chunk of rows. This is most of a large scrape's time, so each
    family's lines are made by a comprehension over the chunk, with no call per sample
    but where a value needs one. A figure nvidia-smi did not give is left out, not 0."""
    devices = Device.objects.filter(vanished_at__isnull=True)
    if node_ids is not None:
        devices = devices.filter(node_id__in=_one_parameter(node_ids))
    rows = (devices.annotate(**{key: KT(f"health__{key}") for key in _HEALTH_KEYS})
            .values_list(*_DEVICE_COLUMNS, *_HEALTH_KEYS).iterator(chunk_size=_CHUNK))
    texts: list[list[str]] = [[] for _ in _GPU_FAMILIES]
    for chunk in iter(lambda: list(itertools.islice(rows, _CHUNK)), []):
        # A node added since the nodes' rows were read waits for the next scrape.
        known = [row for row in chunk if row[0] in node_labels]
        if not known:
            continue
        (nodes, index, uuid, model, util, used, total, temp, draw, limit,
         corrected, uncorrected, xids) = zip(*known, strict=True)  # the chunk's columns
        inner = [f'node="{node_labels[n]}",gpu="{i}",uuid="{_escape(u)}",model="{_model_label(m)}"'
                 for n, i, u, m in zip(nodes, index, uuid, model, strict=True)]
        labels = [f"{{{each}}} " for each in inner]  # each GPU's, with the space before the value
        for own, text in zip(texts, (
            [f"gpufleet_gpu_utilization_percent{lab}{v}\n" for lab, v in zip(labels, util, strict=True) if v is not None],
            [f"gpufleet_gpu_memory_used_bytes{lab}{v * MIB}\n" for lab, v in zip(labels, used, strict=True) if v is not None],
            [f"gpufleet_gpu_memory_total_bytes{lab}{v * MIB}\n" for lab, v in zip(labels, total, strict=True) if v is not None],
            [f"gpufleet_gpu_temperature_celsius{lab}{v}\n" for lab, v in zip(labels, temp, strict=True) if v is not None],
            [f"gpufleet_gpu_power_draw_watts{lab}{_value(v)}\n" for lab, v in zip(labels, draw, strict=True) if v is not None],
            [f"gpufleet_gpu_power_limit_watts{lab}{_value(v)}\n" for lab, v in zip(labels, limit, strict=True) if v is not None],
            [f"gpufleet_gpu_ecc_errors_corrected{lab}{t}\n" for lab, v in zip(labels, corrected, strict=True)
             if (t := _count_text(v)) is not None],
            [f"gpufleet_gpu_ecc_errors_uncorrected{lab}{t}\n" for lab, v in zip(labels, uncorrected, strict=True)
             if (t := _count_text(v)) is not None],
            [f'gpufleet_gpu_xid_errors{{{each},xid="{_escape(str(e["xid"]))}"}} {_value(e["count"])}\n'
             for each, v in zip(inner, xids, strict=True) for e in _xid_counts(v)],
        ), strict=True):
            own.append("".join(text))
    return texts


def _one_parameter(ids: list[int]) -> RawSQL:
    """`ids` as a subquery of one parameter: a shard of a large fleet can be more nodes
    than a statement may have parameters (PostgreSQL 65,535) when each id is one."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", (ids,))
    return RawSQL("SELECT value FROM json_each(%s)", (json.dumps(ids),))


def _escape(label_value: str) -> str:
    return label_value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# A fleet has a few GPU models and small ECC counts: each text is made once a scrape or
# so, not once a GPU. Bounded, as both come from what nodes send.
_model_label = functools.lru_cache(maxsize=256)(_escape)


@functools.lru_cache(maxsize=256)
def _count_text(raw) -> str | None:
    """A count read out of the health JSON as text, as a sample value; None when unknown."""
    number = _number(raw)
    return None if number is None else _value(number)


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


class AlertChannelCollector:
    """Each alert channel, 1 while its notifications fail (until one gets through)."""

    def collect(self) -> Iterator[Metric]:
        failing = GaugeMetricFamily("gpufleet_alert_channel_failing",
                                    "1 while the alert channel's sends fail, until one gets through; else 0.",
                                    labels=["channel"])
        for name, since in Channel.objects.order_by("name").values_list("name", "failing_since"):
            failing.add_metric([name], int(since is not None))
        yield failing


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


def render(shard: Shard | None = None) -> bytes:
    """One scrape's text: the fleet's (or one shard's) latest state, then the broker, the
    alert channels and the ingest counters, which are site-wide and so come in shard 0 only."""
    fleet = "".join(fleet_text(shard)).encode()
    if shard is not None and shard.index != 0:
        return fleet
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector())
    registry.register(AlertChannelCollector())
    MultiProcessCollector(registry, path=str(settings.GPUFLEET_METRICS_DIR))
    return fleet + generate_latest(registry)


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
    try:
        shard = Shard.parse(dict(request.GET.lists()))
    except ValueError as error:
        return _text(400, str(error))
    return HttpResponse(render(shard), content_type=CONTENT_TYPE_LATEST)
