"""The embedded broker: kombu's filesystem transport, made safe for several
processes. Used when CELERY_BROKER_URL is ``fsq://`` (the single-machine default).

kombu's stock transport writes a message file in place while consumers list and
read the same folder, and moves claimed files across filesystems with a copy, so
under load consumers read half-written JSON (and die) or two consumers take the
same message. Here every step is a rename within one filesystem, which is atomic:
a message appears in the queue folder only when complete, and exactly one
consumer wins the rename that claims it.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from queue import Empty
from time import time_ns

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property


class Channel(filesystem.Channel):
    @cached_property
    def _folder(self) -> Path:
        folder = self.transport_options.get("folder")
        if not folder:
            raise ChannelError("the fsq:// broker needs transport option 'folder'")
        root = Path(folder).resolve()
        for sub in ("queue", "tmp", "claimed", "control"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return root

    @cached_property
    def data_folder_in(self) -> str:
        return str(self._folder / "queue")

    @cached_property
    def data_folder_out(self) -> str:
        return str(self._folder / "queue")

    @cached_property
    def control_folder(self) -> Path:
        return self._folder / "control"

    @cached_property
    def store_processed(self) -> bool:
        return False

    def _put(self, queue, payload, **kwargs):
        # Wall-clock nanoseconds keep FIFO order across processes; the uuid keeps
        # names unique.
        name = f"{time_ns():020d}_{uuid.uuid4().hex}.{queue}.msg"
        tmp = self._folder / "tmp" / name
        try:
            with open(tmp, "wb") as f:
                f.write(dumps(payload).encode())
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add message {name!r} to the queue folder") from exc

    def _get(self, queue):
        suffix = f".{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != suffix[1:]:
                continue
            claimed = self._folder / "claimed" / f"{os.getpid()}-{name}"
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first
            try:
                payload = claimed.read_bytes()
            finally:
                claimed.unlink(missing_ok=True)
            return loads(payload.decode())
        raise Empty()

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        # The stock version creates the exchange file with "wb" after an exists()
        # check, so two workers starting together can truncate each other's
        # bindings. Open-or-create, then read and rewrite under one lock.
        file = self._exchange_file(exchange)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+b", buffering=0) as f:
            filesystem.lock(f, filesystem.LOCK_EX)
            try:
                raw = f.read()
                table = [filesystem.exchange_queue_t(*q) for q in loads(raw.decode())] if raw else []
                if entry not in table:
                    table.insert(0, entry)
                    f.seek(0)
                    f.write(dumps(table).encode())
                    f.truncate()
            finally:
                filesystem.unlock(f)

    def get_table(self, exchange):
        try:
            return super().get_table(exchange)
        except ValueError:  # an exchange file created but not yet written
            return []


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = "fsq"
    driver_name = "fsq"

    def driver_version(self):
        return "1"


# Make "fsq://" resolve to this transport in every process that loads the Celery app.
TRANSPORT_ALIASES.setdefault("fsq", "gpufleet.broker:Transport")
