"""What the broker carries: compressed messages inflate to a bounded size, in every
process of gpufleet (central workers and agents alike), before anything else reads them."""

from __future__ import annotations

import bz2
import lzma
import zlib

import pytest
from kombu import compression

from gpufleet import celery as gpufleet_celery
from gpufleet.celery import INFLATED_MAX_BYTES, MessageTooLarge

CODECS = [("application/x-gzip", zlib.compress), ("application/x-bz2", bz2.compress),
          ("application/x-lzma", lzma.compress)]


@pytest.mark.parametrize(("content_type", "compress"), CODECS)
def test_a_compressed_message_inflates_as_it_was(content_type, compress):
    body = b'{"node": "gpu-01"}' * 1000
    assert compression.decompress(compress(body), content_type) == body


@pytest.mark.parametrize(("content_type", "compress"), CODECS)
def test_a_message_inflating_past_the_bound_is_refused_before_it_is_all_inflated(content_type, compress):
    bomb = compress(b"\0" * (INFLATED_MAX_BYTES + 1))
    assert len(bomb) < INFLATED_MAX_BYTES // 1000  # what a broker writer would send
    with pytest.raises(MessageTooLarge, match="inflates to more than"):
        compression.decompress(bomb, content_type)


def test_a_message_of_exactly_the_bound_still_inflates():
    body = b"\0" * INFLATED_MAX_BYTES
    assert compression.decompress(zlib.compress(body), "zlib") == body


@pytest.mark.parametrize(("content_type", "compress"), CODECS)
def test_a_truncated_message_is_refused_not_read_in_part(content_type, compress):
    whole = compress(b"gpufleet " * 10_000)
    with pytest.raises(ValueError, match="truncated"):
        compression.decompress(whole[: len(whole) // 2], content_type)


def test_a_compression_that_cannot_be_bounded_is_refused(monkeypatch):
    # As brotli or zstd would be, were either installed: kombu registers them on import.
    monkeypatch.setattr(compression, "_encoders", dict(compression._encoders))
    monkeypatch.setattr(compression, "_decoders", dict(compression._decoders))
    compression.register(lambda body: body, lambda body: body, "application/x-unbounded")
    gpufleet_celery.bound_decompression()
    with pytest.raises(ValueError, match="zlib, bzip2 or lzma only"):
        compression.decompress(b"anything", "application/x-unbounded")

