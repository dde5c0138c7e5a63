"""The checkpoint's owner lease: one driver at a time may commit for a checkpoint.

Two drivers on one checkpoint would both plan and commit micro-batches; each commit is
idempotent on its batch id, but their state versions and offsets logs would interleave. The
lease makes the second driver refuse to start, and makes a driver that lost its lease (paused
past its expiry, cut off from storage) stop before its next commit instead of committing.

The lease is one small object beside the checkpoint's info file, ``inorder-lease.json``::

    {"epoch": 7, "token": "<uuid4 hex>", "holder": "pid 4242 on host-a",
     "acquired_at": ..., "renewed_at": ..., "expires_at": ..., "duration": 30.0}

Every change is a compare-and-swap on the version the writer last read: on S3 a ``PUT`` with
``If-None-Match: *`` (the first lease) or ``If-Match: <etag>`` (a renewal or a takeover); on
local disk a read-compare-replace under a short ``flock`` of ``.inorder-lease.lock``. Of
several drivers racing for an expired lease exactly one swap succeeds.

* **Acquire**: a missing or expired lease is taken with ``epoch + 1`` and a fresh token. An
  unexpired lease is watched: renewed while watched, its holder is alive and the start is
  refused (:class:`LeaseHeld`); left unchanged until it expires (its holder died, e.g.
  ``kill -9``), it is taken over. A lease seen unchanged for its whole duration on this
  machine's monotonic clock counts as expired whatever the wall clocks say. A local
  checkpoint's run lock, freed by the kernel when its holder dies, lets the next run take
  the lease at once.
* **Renew**: a thread of the running driver extends the lease every third of its duration.
* **Fence**: before every sink commit the driver renews once more and checks that the lease
  still carries its epoch and token (:meth:`CheckpointLease.check`); if another driver took it,
  :class:`LeaseLost` stops the run before anything is committed. A check extends the lease by a
  full duration, so no other driver can take it while that commit runs unless the commit takes
  longer than the lease (keep ``lease_duration`` well above a commit's duration) or the
  machines' wall clocks disagree by more than that.
* **Release**: a clean stop marks the lease expired, so the next start need not wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Protocol

from inorder.checkpoint.names import LEASE_FILE, LEASE_LOCK_FILE
from inorder.errors import ConfigError, InorderError, StorageError
from inorder.storage import s3_objects

if TYPE_CHECKING:
    from inorder.storage.fs import Location, S3Settings

#: How long a lease lasts without renewal when no setting says otherwise.
DEFAULT_DURATION = 30.0


class LeaseHeld(ConfigError):
    """Another live driver holds the checkpoint's lease: this one must not start."""


class LeaseLost(InorderError):
    """This driver's lease was taken by another driver: it must not commit anything more."""


class LeaseDamaged(ConfigError):
    """The lease object exists but is not a lease."""


class Conflict(Exception):
    """A compare-and-swap found another version than the one it expected."""


@dataclass(frozen=True)
class LeaseRecord:
    """The content of the lease object."""

    epoch: int
    token: str
    holder: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    duration: float

    def to_bytes(self) -> bytes:
        """The JSON form stored in the lease object."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    def describe(self) -> str:
        """Who holds it and until when, for messages."""
        until = time.strftime("%H:%M:%S", time.localtime(self.expires_at))
        return f"{self.holder}, lease epoch {self.epoch} valid until {until}"


class LeaseStore(Protocol):
    """Where a lease lives: read with its version, compare-and-swap against a version."""

    where: str

    def read(self) -> tuple[bytes, str] | None:
        """The object's bytes and version, ``None`` when there is none."""

    def swap(self, expected: str | None, data: bytes) -> str:
        """Write ``data`` if the version is still ``expected`` (``None``: absent); else
        :class:`Conflict`. Returns the new version."""


class LocalLeaseStore:
    """A lease file on a local (or NFS) filesystem; swaps are serialised by ``flock``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LEASE_FILE)
        self.where = self.path

    def read(self) -> tuple[bytes, str] | None:
        """The file's bytes; the version is the content itself (it holds a unique token)."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read the lease {self.path}: {exc.strerror}") from None
        return data, data.hex()

    def swap(self, expected: str | None, data: bytes) -> str:
        """Replace the file (temp file + rename) if it still holds ``expected``."""
        import fcntl

        from inorder.storage.fs import fsync_dir

        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, LEASE_LOCK_FILE), "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                current = self.read()
                if (current[1] if current else None) != expected:
                    raise Conflict(self.path)
                tmp = f"{self.path}.tmp-{uuid.uuid4().hex}"
                with open(tmp, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
                fsync_dir(self.directory)
        except OSError as exc:
            raise StorageError(f"cannot write the lease {self.path}: {exc.strerror}") from None
        return data.hex()


class S3LeaseStore:
    """A lease object on S3; swaps are conditional ``PUT`` requests on the ETag."""

    def __init__(self, settings: S3Settings, path: str) -> None:
        self.settings = settings
        self.path = path
        self.where = f"s3://{path}"

    def read(self) -> tuple[bytes, str] | None:
        """The object's bytes and ETag."""
        import obstore

        bucket, _, key = self.path.partition("/")
        try:
            result = obstore.get(s3_objects.store(self.settings, bucket), key)
            data = bytes(result.bytes())
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise s3_objects.failure("GET", self.settings, self.path, exc) from None
            return None
        except Exception as exc:
            raise s3_objects.failure("GET", self.settings, self.path, exc) from None
        return data, str(result.meta["e_tag"])

    def swap(self, expected: str | None, data: bytes) -> str:
        """``PUT`` with ``If-None-Match: *`` or ``If-Match: <expected>``."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        bucket, _, key = self.path.partition("/")
        mode: obstore.PutMode = "create" if expected is None else {"e_tag": expected}
        try:
            result = obstore.put(s3_objects.store(self.settings, bucket), key, data, mode=mode)
        except (AlreadyExistsError, PreconditionError):
            raise Conflict(self.path) from None
        except Exception as exc:
            raise s3_objects.failure("PUT", self.settings, self.path, exc) from None
        return str(result["e_tag"])


def lease_store(location: Location) -> LeaseStore:
    """The lease store of a checkpoint root's resolved location."""
    path = location.join(LEASE_FILE)
    if location.s3 is not None:
        return S3LeaseStore(location.s3, path)
    return LocalLeaseStore(location.root)


class CheckpointLease:
    """One driver's hold on a checkpoint: acquire, renew, check before commits, release."""

    def __init__(
        self,
        store: LeaseStore,
        duration: float = DEFAULT_DURATION,
        *,
        holder: str | None = None,
        info: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if duration <= 0:
            raise ConfigError(f"pipeline.lease_duration must be positive, not {duration:g} s")
        self.store = store
        self.duration = float(duration)
        self.holder = holder or f"pid {os.getpid()} on {socket.gethostname()}"
        self._info = info or (lambda _line: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._held: LeaseRecord | None = None
        self._version: str | None = None
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def epoch(self) -> int | None:
        """The epoch this driver holds (``None`` before :meth:`acquire`)."""
        return self._held.epoch if self._held else None

    @property
    def renew_interval(self) -> float:
        """How often the running driver renews."""
        return self.duration / 3

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> tuple[LeaseRecord | None, str | None]:
        found = self.store.read()
        if found is None:
            return None, None
        data, version = found
        try:
            doc = json.loads(data)
            return LeaseRecord(**doc), version
        except (ValueError, TypeError):
            raise LeaseDamaged(
                f"checkpoint lease {self.store.where} is damaged; make sure no other run uses "
                "this checkpoint, then delete that file"
            ) from None

    def current_holder(self) -> LeaseRecord | None:
        """The lease as stored when a run holds it now (unexpired), else ``None``; read only."""
        record, _ = self._read()
        return record if record is not None and record.expires_at > time.time() else None

    # -- acquiring -------------------------------------------------------------------------

    def acquire(self, wait: bool = True, holder_gone: bool = False) -> LeaseRecord:
        """Take the lease, or raise :class:`LeaseHeld` naming its live holder.

        With ``wait``, an unexpired lease that nobody renews (its holder died) is waited
        for and taken over once it expires; without, any unexpired lease refuses at once.
        ``holder_gone``: the caller knows the holder is dead (it got the local run lock,
        which the kernel frees when its holder dies), so the lease is taken at once; were
        that knowledge wrong, fencing still stops the other driver before its next commit.
        """
        seen: tuple[str | None, float] | None = None  # (version, monotonic time first seen)
        while True:
            current, version = self._read()
            now = self._clock()
            unchanged_for = (
                time.monotonic() - seen[1] if seen is not None and seen[0] == version else 0.0
            )
            if current is not None and current.expires_at > now and not holder_gone:
                if not wait or (seen is not None and seen[0] != version):
                    raise self._held_error(current)
                if unchanged_for < current.duration:
                    if seen is None:
                        seen = (version, time.monotonic())
                        self._info(
                            f"checkpoint lease held by {current.describe()}; waiting to see "
                            "whether that run is alive"
                        )
                    remaining = min(current.expires_at - now, current.duration - unchanged_for)
                    time.sleep(max(0.05, min(remaining, current.duration / 2)))
                    continue
            record = LeaseRecord(
                epoch=(current.epoch + 1) if current is not None else 1,
                token=uuid.uuid4().hex,
                holder=self.holder,
                acquired_at=now,
                renewed_at=now,
                expires_at=now + self.duration,
                duration=self.duration,
            )
            try:
                new_version = self.store.swap(version, record.to_bytes())
            except Conflict:
                latest, _ = self._read()
                raise self._held_error(latest) from None
            if current is not None and current.expires_at > 0:
                why = "expired" if current.expires_at <= now else "its run is gone"
                self._info(f"took over the checkpoint lease of {current.holder} ({why})")
            with self._lock:
                self._held, self._version, self._lost = record, new_version, None
            return record

    def _held_error(self, current: LeaseRecord | None) -> LeaseHeld:
        who = current.describe() if current is not None else "another run"
        return LeaseHeld(
            f"checkpoint lease {self.store.where} is held by another run ({who}); stop that "
            "copy first, or give this one its own pipeline.checkpoint"
        )

    # -- holding ---------------------------------------------------------------------------

    def renew(self) -> LeaseRecord:
        """Extend the lease by a full duration; :class:`LeaseLost` if another driver has it."""
        with self._lock:
            if self._lost is not None:
                raise self._lost
            held = self._held
            if held is None:
                raise LeaseLost(f"checkpoint lease {self.store.where} was never acquired")
            now = self._clock()
            record = replace(held, renewed_at=now, expires_at=now + self.duration)
            for _ in range(2):
                try:
                    self._version = self.store.swap(self._version, record.to_bytes())
                    self._held = record
                    return record
                except Conflict:
                    # A renewal whose answer was lost may have been written: adopt it if so.
                    current, version = self._read()
                    if current is None or (current.token, current.epoch) != (
                        held.token,
                        held.epoch,
                    ):
                        self._lost = self._lost_error(current)
                        raise self._lost from None
                    self._version = version
            raise LeaseLost(f"checkpoint lease {self.store.where} keeps changing under its holder")

    def _lost_error(self, current: LeaseRecord | None) -> LeaseLost:
        mine = self._held.epoch if self._held else "?"
        who = current.describe() if current is not None else "nobody (it was deleted)"
        return LeaseLost(
            f"this run lost checkpoint lease {self.store.where} (its epoch {mine}) to "
            f"{who}; this run stopped and commits nothing more (the other run goes on)"
        )

    def check(self, batch_id: int | None = None) -> None:
        """The fencing check before a commit: renew, and raise :class:`LeaseLost` if lost."""
        self.renew()

    @property
    def lost(self) -> LeaseLost | None:
        """The error if the renewal thread found the lease taken."""
        return self._lost

    def start_renewing(self, on_lost: Callable[[LeaseLost], None] | None = None) -> None:
        """Renew every :attr:`renew_interval` in a daemon thread until :meth:`release`."""

        def loop() -> None:
            while not self._stop.wait(self.renew_interval):
                try:
                    self.renew()
                except LeaseLost as exc:
                    if on_lost is not None:
                        on_lost(exc)
                    return
                except InorderError:
                    continue  # storage unreachable for now: the commit check decides

        self._thread = threading.Thread(target=loop, name="inorder-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and mark the lease expired (if still ours), so a restart need not wait."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.duration)
        with self._lock:
            held = self._held
            if held is None or self._lost is not None:
                return
            with contextlib.suppress(Conflict, InorderError):
                self.store.swap(self._version, replace(held, expires_at=0.0).to_bytes())
            self._held = None


__all__ = [
    "DEFAULT_DURATION",
    "LEASE_FILE",
    "CheckpointLease",
    "LeaseHeld",
    "LeaseLost",
    "LeaseRecord",
    "LeaseStore",
    "LocalLeaseStore",
    "S3LeaseStore",
    "lease_store",
]
