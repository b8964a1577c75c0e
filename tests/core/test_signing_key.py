"""Node keys derive from the centre's signing key with HKDF (RFC 5869, SHA-256), in one
function (wire.derive_node_key) that enrolment, signing and checking all use."""

from __future__ import annotations

import json
import os

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gpufleet import wire
from gpufleet.fleet import credentials

pytestmark = pytest.mark.django_db


def _hkdf(master: bytes, node: str, generation: int) -> bytes:
    info = json.dumps(["gpufleet node key", node, generation]).encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"gpufleet node keys", info=info).derive(master)


def test_node_keys_are_hkdf_of_the_signing_key(settings):
    # The setting is the key as given; HKDF is the only step between it and a node's key.
    assert os.environ["GPUFLEET_SIGNING_KEY"].encode() == settings.GPUFLEET_SIGNING_KEY
    key = credentials.enroll("alpha")
    assert key.secret == _hkdf(settings.GPUFLEET_SIGNING_KEY, "alpha", key.generation)
    assert wire.derive_node_key(b"k" * 50, "alpha", 2) == wire.NodeKey(2, _hkdf(b"k" * 50, "alpha", 2))


def test_each_node_and_generation_gets_its_own_key():
    master = b"a signing key of the central site, long enough"
    keys = {wire.derive_node_key(master, node, generation).secret
            for node in ("alpha", "alph", "alpha\\n1") for generation in (1, 2, 11)}
    assert len(keys) == 9


def test_what_the_agent_signs_with_its_enrolled_key_the_centre_accepts():
    key = wire.NodeKey.parse(str(credentials.enroll("alpha")))
    entry = wire.read_entry(wire.encode_entry(key, "alpha", wire.SNAPSHOT, ["{}", None]))
    assert wire.entry_signed_with(entry, credentials.node_key("alpha", entry.generation))
