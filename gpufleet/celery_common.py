"""What every gpufleet Celery process (the central workers and the agents, each with its
own app) sets up before it reads a message: compressed messages inflate to a bounded
size, and no warning about running as root."""

import bz2
import lzma
import warnings
import zlib

from celery.exceptions import SecurityWarning
from kombu import compression

# The most a compressed message may inflate to: far above the largest snapshot the
# schema admits in practice, far below what a few kilobytes of zeros inflate to.
INFLATED_MAX_BYTES = 64 * 2**20
# kombu's own decoders inflate without a bound, and a message is inflated before
# anything (its signature included) is checked: anyone who can write to the broker
# could make a worker allocate gigabytes. kombu offers no limit, hence these.
_BOUNDED = {"application/x-gzip": zlib.decompressobj, "application/x-bz2": bz2.BZ2Decompressor,
            "application/x-lzma": lzma.LZMADecompressor}


class MessageTooLarge(ValueError):
    pass


def _bounded(make_decompressor):
    def inflate(body: bytes) -> bytes:
        decompressor = make_decompressor()
        data = decompressor.decompress(body, INFLATED_MAX_BYTES + 1)
        if len(data) > INFLATED_MAX_BYTES:
            raise MessageTooLarge(f"the message inflates to more than {INFLATED_MAX_BYTES} bytes")
        if not decompressor.eof:
            raise ValueError("the compressed message is truncated")
        return data
    return inflate


def _refuse(body: bytes) -> bytes:
    raise ValueError("gpufleet reads messages compressed with zlib, bzip2 or lzma only")


def bound_decompression() -> None:
    """Make every compression kombu knows inflate at most INFLATED_MAX_BYTES (a worker
    logs a message past that as undecodable and drops it); one this cannot bound
    (brotli, zstd, when installed) is refused."""
    for content_type in compression.encoders():
        encoder, _ = compression.get_encoder(content_type)
        make = _BOUNDED.get(content_type)
        compression.register(encoder, _bounded(make) if make else _refuse, content_type)




def set_up() -> None:
    bound_decompression()
    # Celery warns (a five-line warning per worker) whenever a worker runs as root or in
    # group sudo/wheel. The agent runs as root on purpose (the kernel log, the fixes), and
    # what the warning guards against, unpickling a message as root, cannot happen here:
    # workers accept JSON only, and Celery refuses to start as root with pickle anyway.
    warnings.filterwarnings("ignore", category=SecurityWarning, message="You're running the worker with superuser")
