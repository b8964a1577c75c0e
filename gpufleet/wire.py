"""The agent<->central message: the snapshot an agent sends after each
collection (the doctor report plus `schema_version`, `collected_at` and what the
agent may fix), and the names of the tasks each side sends the other. The agent
and the ingest both import it from here; it imports only the domain (and the rule of
the broker keys a node may use).

The agent builds it with `build_snapshot` and sends it as JSON text
(`encode_snapshot`); ingest accepts it only through `parse_snapshot` in
gpufleet/ingest/schema.py, which is strict: unknown keys, wrong types, or
inconsistent values are rejected with a reason, never half-stored. The schema's
pydantic models live there, so the agent, which only builds snapshots, does not
load pydantic.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet import gpu
from gpufleet.core import broker_acl
from gpufleet.gpu.dcgm import DcgmInfo

# The one version of the snapshot schema the site reads (a change of the schema bumps it:
# docs/install-and-upgrade.md says how).
SNAPSHOT_SCHEMA_VERSION = 2

# Names of the tasks the centre sends an agent: their functions' paths in
# gpufleet/agent/tasks.py (tests/core/test_task_registry.py). Agents send on the ingest
# stream (below).
COLLECT_TASK = "gpufleet.agent.tasks.collect"
APPLY_FIX_TASK = "gpufleet.agent.tasks.apply_fix"
DCGM_DIAG_TASK = "gpufleet.agent.tasks.run_dcgm_diag"


def agent_queue(node: str) -> str:
    """The queue a node's agent consumes."""
    return f"node.{node}"


def node_key_prefix(node: str) -> str:
    """The prefix of every broker key of a node's task queue (kombu's `global_keyprefix`, on
    the agent's connection and on the centre's when it sends that node a task): the only
    keys that node's broker user may use (gpufleet/core/broker_acl.py holds the rule)."""
    return broker_acl.node_key_prefix(node)

# The longest texts and lists a snapshot may carry. The agent cuts what it sends
# to these (fit_snapshot), so the site never has to reject a real host's snapshot.
TEXT_MAX, LINE_MAX, CODE_MAX = 4000, 200, 64
DRIVER_VERSION_MAX = 64
# The finding codes an agent may say it fixes (a few: gpufleet/agent/fixes.py).
FIXES_ALLOWED_MAX = 64
CDI_SPEC_FILES_MAX, CDI_SPEC_PATH_MAX, CDI_DEVICES_MAX = 256, 4096, 4096
# What one node may report, in all as well as per GPU: the largest real hosts with
# room to spare (16 GPUs in the largest DGX, 32 behind PCIe switches; MIG cuts a GPU
# into at most 7 slices, and no host has more than 16 MIG-capable GPUs). One node
# reporting a thousand GPUs once slowed every page that reads GPUs, fleet-wide.
GPUS_PER_NODE_MAX = 32
MIG_SLICES_PER_GPU_MAX, MIG_SLICES_PER_NODE_MAX = 7, 16 * 7
PROCESSES_PER_GPU_MAX, PROCESSES_PER_NODE_MAX = 64, 512
CONTAINERS_PER_GPU_MAX, CONTAINERS_PER_NODE_MAX = 64, 256  # attached and idle
XIDS_PER_GPU_MAX, XIDS_PER_NODE_MAX = 64, 256  # distinct Xid codes
# NVLinks: 18 a GPU on H100 to B200; 8 such GPUs a node, with room for larger boards.
NVLINKS_PER_GPU_MAX, NVLINKS_PER_NODE_MAX = 32, 16 * 18
# The doctor writes at most eight findings a GPU (memory, ECC, heat, power, Xid, PCIe link,
# NVLink, time held), one for each lost or unlisted GPU and a few for the host: ten a GPU
# leaves room.
FINDINGS_MAX = 10 * GPUS_PER_NODE_MAX
# A GPU's lists: the key, at most on one GPU, at most on the node, what they are.
DEVICE_LISTS = (
    ("mig_devices", MIG_SLICES_PER_GPU_MAX, MIG_SLICES_PER_NODE_MAX, "MIG slices"),
    ("xid_errors", XIDS_PER_GPU_MAX, XIDS_PER_NODE_MAX, "Xid codes"),
    ("processes", PROCESSES_PER_GPU_MAX, PROCESSES_PER_NODE_MAX, "processes"),
    ("attached_idle", CONTAINERS_PER_GPU_MAX, CONTAINERS_PER_NODE_MAX, "idle containers"),
    ("nvlink", NVLINKS_PER_GPU_MAX, NVLINKS_PER_NODE_MAX, "NVLinks"),
)
# Older than this a collected_at is junk (a BC date once took every page down).
OLDEST_SNAPSHOT = datetime(2000, 1, 1, tzinfo=UTC)


class SnapshotError(ValueError):
    """A snapshot that cannot be ingested; the message says why, `refusal` the code it
    is counted under (gpufleet.fleet.models.Refusal)."""

    refusal = "malformed"


class CentreOnlyFinding(SnapshotError):
    """A snapshot with a finding that only the centre writes: an agent saying a claim
    fits, or that its lost GPUs are there, or that the site refused nothing."""

    refusal = "centre-only-code"


# The finding codes the centre adds at ingest (gpufleet/ingest/services.py and
# gpu.claim_use_findings): never taken from an agent. The agent's own "snapshot-clipped"
# is not one of them.
CENTRE_ONLY_CODES = frozenset({
    "rejected-snapshot", "claims-overlap", "lost-capacity", "use-unclaimed", "attached-unclaimed", "use-misplaced",
    "claim-idle", "dcgm-diag",
})



def encode_snapshot(snapshot: dict) -> str:
    """The snapshot as an agent sends it: its compact JSON text, which the stream entry
    carries (compressed) and the entry's signature covers as it is."""
    return json.dumps(snapshot, separators=(",", ":"))


def decode_snapshot(text: str) -> Any:
    """A snapshot's JSON text as an ingest message carries it (encode_snapshot), decoded.
    Text that is not JSON is a SnapshotError that says where."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than Python's stack
        raise SnapshotError(f"snapshot is not JSON: {str(exc)[:LINE_MAX]}") from None



def build_snapshot(
    diagnosis: gpu.HostDiagnosis,
    node: str,
    fixes_allowed: list[str] | tuple[str, ...] = (),
    collected_at: datetime | None = None,
    dcgm: DcgmInfo | None = None,
) -> dict:
    """The JSON-ready snapshot of one collection on this host, cut to the schema's limits.
    `dcgm`: whether the host has DCGM (an agent from before DCGM detection sends no key)."""
    collected_at = collected_at or datetime.now(UTC)
    data = {
        "schema_version": SNAPSHOT_SCHEMA_VERSION,
        **diagnosis.to_dict(node),
        "collected_at": collected_at.isoformat(),
        "fixes_allowed": list(fixes_allowed),
    }
    if dcgm is not None:
        data["dcgm"] = dcgm.to_dict()
    return fit_snapshot(data)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f]")


def clean_text(value: str) -> str:
    """`value` with NUL and the other control characters but tab and newline as spaces:
    PostgreSQL stores no NUL, and the pages show no control characters. For every text
    an agent sends (snapshots, job output)."""
    return _CONTROL.sub(" ", value)


def _text(value: str, limit: int, one_line: bool = False) -> str:
    value = _LINE_BREAKS.sub(" ", value) if one_line else clean_text(value)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def fit_snapshot(data: dict) -> dict:
    """Cut `data` to what the site accepts: control characters become spaces, long
    texts and lists are clipped, and a "snapshot-clipped" finding says what was cut.
    A real host can print more than any limit (129 MIG CDI names, 80 spec files)."""
    cuts: list[str] = []

    def clip_list(key: str, items: list, limit: int, what: str) -> list:
        if len(items) > limit:
            cuts.append(f"{len(items)} {what}, kept {limit}")
            return items[:limit]
        return items

    data["driver_version"] = _text(data["driver_version"], DRIVER_VERSION_MAX, one_line=True)
    if isinstance(data.get("dcgm"), dict):
        data["dcgm"]["version"] = _text(data["dcgm"]["version"], DRIVER_VERSION_MAX, one_line=True)
        data["dcgm"]["problem"] = _text(data["dcgm"]["problem"], LINE_MAX, one_line=True)
    data["toolkit_version"] = _text(data["toolkit_version"], LINE_MAX, one_line=True)
    data["cdi_spec_files"] = [
        _text(p, CDI_SPEC_PATH_MAX, one_line=True)
        for p in clip_list("cdi_spec_files", data["cdi_spec_files"], CDI_SPEC_FILES_MAX, "CDI spec files")
    ]
    data["cdi_devices"] = [
        _text(d, LINE_MAX, one_line=True)
        for d in clip_list("cdi_devices", data["cdi_devices"], CDI_DEVICES_MAX, "CDI devices")
    ]
    data["devices"] = clip_list("devices", data["devices"], GPUS_PER_NODE_MAX, "GPUs")
    for key, per_gpu, per_node, what in DEVICE_LISTS:
        # Each GPU to its own bound, then the node to its: the first GPUs keep theirs.
        reported = kept = 0
        for device in data["devices"]:
            items = clip_list(key, device.get(key, []), per_gpu, f"{what} on GPU {device['index']}")
            reported += len(items)
            device[key] = items[: max(0, per_node - kept)]
            kept += len(device[key])
        if reported > kept:
            cuts.append(f"{reported} {what} on the node, kept {kept}")
    for device in data["devices"]:
        device["name"] = _text(device["name"], LINE_MAX, one_line=True)
        for process in device["processes"]:
            process["name"] = _text(process["name"], LINE_MAX, one_line=True)
    findings = clip_list("findings", data["findings"], FINDINGS_MAX - 1, "findings")
    for finding in findings:
        for key, limit in (("name", LINE_MAX), ("message", TEXT_MAX), ("fix", TEXT_MAX)):
            if key in finding:
                finding[key] = _text(finding[key], limit, one_line=key == "name")
    if cuts:
        findings.append(
            {
                "code": "snapshot-clipped",
                "name": "Snapshot size",
                "status": "warn",
                "message": _text("The agent cut this snapshot to the site's limits: " + "; ".join(cuts), TEXT_MAX),
            }
        )
    data["findings"] = findings
    return data


# Signatures. Every message between an agent and the centre carries `auth`: who signed
# it (the node), with which generation of its key, when, and an HMAC-SHA256 over the
# canonical JSON of all that plus the direction, the task name and the arguments. One
# key per node, shared by the node's agent and the centre: the agent signs what it sends
# (snapshots, job progress) and checks what the centre sends it (diagnose now, apply
# fix); the direction inside the signed text keeps one from passing for the other.
# Plain hmac over JSON rather than Celery's message signing, which signs with one
# certificate per process and could not say which node a message speaks for.
SIGNATURE_VERSION = 1
TO_CENTRE, TO_AGENT = "to-centre", "to-agent"


class SignatureError(ValueError):
    """A message whose signature is missing, malformed, unknown or wrong; says which."""


@dataclass(frozen=True)
class NodeKey:
    """A node's key: its generation (one more at each rotation) and the secret."""

    generation: int
    secret: bytes

    def __str__(self) -> str:
        # The value of the agent's GPUFLEET_AGENT_KEY.
        return f"{self.generation}.{base64.urlsafe_b64encode(self.secret).decode().rstrip('=')}"

    @classmethod
    def parse(cls, text: str) -> NodeKey:
        generation, _, secret = text.strip().partition(".")
        try:
            key = cls(int(generation), base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4)))
        except ValueError:
            key = None
        if key is None or key.generation < 1 or len(key.secret) != 32:
            raise ValueError("not a node key (GENERATION.SECRET, as `manage.py enroll` prints it)")
        return key


def derive_node_key(master: bytes, node: str, generation: int) -> NodeKey:
    """The key of `node` at `generation`, from the centre's signing key, by HKDF-SHA256
    (RFC 5869) with the node and generation as its context. Derived, not stored: the
    database holds no secret, and rotating the signing key re-keys every node. The one
    derivation of node keys: enrolment, signing and checking all come here."""
    # Only the centre derives keys: imported here, so an agent never loads the library.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    # JSON, so no node name can pass for another's name and generation.
    info = json.dumps(["gpufleet node key", node, generation], ensure_ascii=True).encode()
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"gpufleet node keys", info=info)
    return NodeKey(generation, hkdf.derive(master))


def _signed_text(direction: str, task: str, node: str, generation: int, at: str, args: list) -> bytes:
    # ensure_ascii: the same bytes for any string, lone surrogates included.
    body = [SIGNATURE_VERSION, direction, task, node, generation, at, args]
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(key: NodeKey, node: str, direction: str, task: str, args: list, at: datetime | None = None) -> dict:
    """The `auth` that goes with a message of `task` with `args`, signed as `node`."""
    at_text = (at or datetime.now(UTC)).isoformat()
    text = _signed_text(direction, task, node, key.generation, at_text, list(args))
    digest = hmac.new(key.secret, text, hashlib.sha256).hexdigest()
    return {"v": SIGNATURE_VERSION, "node": node, "key": key.generation, "at": at_text, "sig": digest}


def verify(auth: Any, direction: str, task: str, args: list, key_for, max_age: float | None = None,
           now: datetime | None = None) -> str:
    """The node that signed this message, or SignatureError. `key_for(node, generation)`
    gives the node's key when that generation is its current, unrevoked one, else None.
    With `max_age` (seconds), an older signature is refused too (a replayed task)."""
    if auth is None:
        raise SignatureError("the message is not signed")
    if not isinstance(auth, dict) or set(auth) != {"v", "node", "key", "at", "sig"} or auth["v"] != SIGNATURE_VERSION:
        raise SignatureError("the signature is malformed")
    node, generation, at, digest = auth["node"], auth["key"], auth["at"], auth["sig"]
    if not (isinstance(node, str) and isinstance(generation, int) and isinstance(at, str) and isinstance(digest, str)):
        raise SignatureError("the signature is malformed")
    key = key_for(node, generation)
    if key is None:
        raise SignatureError(f"node {node[:LINE_MAX]!r} has no valid key of generation {generation}: "
                             "not enrolled, rotated since, or revoked")
    expected = hmac.new(key.secret, _signed_text(direction, task, node, generation, at, list(args)), hashlib.sha256)
    if not hmac.compare_digest(expected.hexdigest(), digest):
        raise SignatureError(f"the signature does not match: not signed with node {node[:LINE_MAX]!r}'s key")
    if max_age is not None:
        try:
            signed_at = datetime.fromisoformat(at)
        except ValueError:
            raise SignatureError("the signature's time is unreadable") from None
        if signed_at.tzinfo is None or (now or datetime.now(UTC)) - signed_at > timedelta(seconds=max_age):
            raise SignatureError(f"the signature is older than {max_age:g} s")
    return node


# The ingest stream. Agents append one entry per message to one Redis stream, through
# the function the centre loads there (gpufleet/core/broker.py, which refuses any entry
# read_entry would refuse for its shape or size), and the central `manage.py ingest`
# reads it as a consumer group. An entry's fields:
# node, gen (its key generation), kind, sig and body: the zlib-compressed JSON of the
# payload, signed as sent. Node and generation are plain fields so that the consumer
# can refuse an entry of no enrolled node before any inflating or JSON work.
INGEST_GROUP = "ingest"
SNAPSHOT, PROGRESS = "snapshot", "progress"
ENTRY_KINDS = (SNAPSHOT, PROGRESS)
ENTRY_FIELDS = frozenset({b"node", b"gen", b"kind", b"sig", b"body"})
# The most one entry's body may be (compressed) and inflate to: far above any real
# snapshot, and above the largest the schema admits.
ENTRY_BODY_MAX = 1 * 2**20
ENTRY_INFLATED_MAX = 8 * 2**20


class EntryError(ValueError):
    """A stream entry that cannot be read (fields, body, payload); says why, and how many
    bytes its body was inflated to before that was found (`inflated`)."""

    def __init__(self, message: str, inflated: int = 0) -> None:
        super().__init__(message)
        self.inflated = inflated


class EntryTooLarge(EntryError):
    """An entry whose body is, or inflates to, more than the bound."""


@dataclass(frozen=True)
class Entry:
    """A stream entry as read: who it says it is from, and its body as sent."""

    node: str
    generation: int
    kind: str
    sig: str
    body: bytes


def _entry_digest(secret: bytes, node: str, kind: str, body: bytes) -> str:
    # Node names and kinds hold no NUL (the schema's name pattern), so the framing is unambiguous.
    text = b"gpufleet entry\0" + kind.encode() + b"\0" + node.encode() + b"\0" + body
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def encode_entry(key: NodeKey, node: str, kind: str, payload: list) -> dict[bytes, bytes]:
    """The fields of the stream entry an agent appends: `payload` (for a snapshot
    [snapshot text (encode_snapshot), job id or None]; for progress [job id, status,
    output, error]) as compressed JSON, signed with the node's key."""
    return signed_entry(key, node, kind, zlib.compress(json.dumps(payload, separators=(",", ":")).encode()))


def signed_entry(key: NodeKey, node: str, kind: str, body: bytes) -> dict[bytes, bytes]:
    """The fields of an entry with `body` as it is (compressed already), signed."""
    if kind not in ENTRY_KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    return {b"node": node.encode(), b"gen": str(key.generation).encode(), b"kind": kind.encode(),
            b"sig": _entry_digest(key.secret, node, kind, body).encode(), b"body": body}


def read_entry(fields: Any) -> Entry:
    """An entry's fields as Redis gives them (bytes to bytes), checked for shape only:
    nothing inflated, nothing verified. EntryError says what is wrong."""
    if not isinstance(fields, dict) or set(fields) != ENTRY_FIELDS:
        raise EntryError("the entry does not have the fields node, gen, kind, sig and body")
    try:
        node, gen, kind, sig = (fields[k].decode("ascii") for k in (b"node", b"gen", b"kind", b"sig"))
    except (UnicodeDecodeError, AttributeError):
        raise EntryError("the entry's node, gen, kind or sig is not ASCII text") from None
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", node):
        raise EntryError("the entry's node is not a node name")
    if not re.fullmatch(r"[1-9][0-9]{0,8}", gen):
        raise EntryError("the entry's gen is not a key generation")
    if kind not in ENTRY_KINDS:
        raise EntryError(f"the entry's kind is not one of {', '.join(ENTRY_KINDS)}")
    if not re.fullmatch(r"[0-9a-f]{64}", sig):
        raise EntryError("the entry's sig is not an HMAC-SHA256 in hex")
    body = fields[b"body"]
    if len(body) > ENTRY_BODY_MAX:
        raise EntryTooLarge(f"the entry's body is over {ENTRY_BODY_MAX} bytes")
    return Entry(node, int(gen), kind, sig, body)


def entry_signed_with(entry: Entry, key: NodeKey) -> bool:
    """Whether `entry` was signed with `key` (the node's current one)."""
    return hmac.compare_digest(_entry_digest(key.secret, entry.node, entry.kind, entry.body), entry.sig)


def entry_payload(entry: Entry, inflated_max: int = ENTRY_INFLATED_MAX) -> tuple[list, int]:
    """The payload of a signed entry and the bytes it inflated to: its body inflated to at
    most `inflated_max` bytes, decoded and checked for shape (not the snapshot itself:
    parse_snapshot does that)."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(entry.body, inflated_max + 1)
    except zlib.error as exc:
        # How far it got is not known: as much as it might have.
        raise EntryError(f"the entry's body does not inflate: {exc}", inflated_max) from None
    inflated = len(data)
    if inflated > inflated_max:
        raise EntryTooLarge(f"the entry's body inflates to more than {inflated_max} bytes", inflated)
    if not inflater.eof:
        raise EntryError("the entry's body is truncated", inflated)
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):
        raise EntryError("the entry's body is not JSON", inflated) from None
    if entry.kind == SNAPSHOT:
        if not (isinstance(payload, list) and len(payload) == 2 and isinstance(payload[0], str)
                and (payload[1] is None or type(payload[1]) is int)):
            raise EntryError("a snapshot entry's body must be [snapshot text, job id or null]", inflated)
    elif not (isinstance(payload, list) and len(payload) == 4 and type(payload[0]) is int
              and all(isinstance(text, str) for text in payload[1:])):
        raise EntryError("a progress entry's body must be [job id, status, output, error]", inflated)
    return payload, inflated
