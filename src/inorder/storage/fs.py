"""Where a sink writes: a local path, ``file://`` URI or ``s3://bucket/prefix``.

:func:`resolve` turns a location plus options into a :class:`Location`: a pyarrow filesystem,
the root path inside it, and the equivalent ``storage_options`` for deltalake (object_store).
S3 settings come from explicit options first, then the usual environment variables:

============================  =================================================================
option                        environment fallback
============================  =================================================================
``endpoint_url``              ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``
``access_key_id``             ``AWS_ACCESS_KEY_ID``
``secret_access_key``         ``AWS_SECRET_ACCESS_KEY``
``session_token``             ``AWS_SESSION_TOKEN``
``region``                    ``AWS_REGION``, ``AWS_DEFAULT_REGION`` (else ``us-east-1``)
``allow_http``                ``AWS_ALLOW_HTTP`` (else: true when the endpoint is ``http://``)
============================  =================================================================

Option names are also accepted in their object_store spelling (``AWS_ENDPOINT_URL``,
``aws_access_key_id``...), case-insensitively, so one ``storage_options`` dict serves both
sinks.

:func:`put_if_absent` writes a small object only if nothing exists at that name: ``link(2)``
on local disk, ``PUT`` with ``If-None-Match: *`` on S3. Small objects on S3 go through obstore
(:mod:`inorder.storage.s3_objects`), which does conditional writes with every AWS credential
provider; data files and listings go through pyarrow's S3 filesystem.

Secrets never appear in ``repr``, ``str`` or error messages.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from inorder.errors import StorageError
from inorder.storage import s3_objects
from inorder.storage.group_sync import replace_file
from inorder.storage.s3_settings import KNOWN_OPTIONS, S3Settings


@dataclass(frozen=True)
class Location:
    """A resolved sink location: a filesystem and the root directory inside it."""

    uri: str
    """The location as the user gave it (no credentials)."""
    filesystem: pafs.FileSystem = field(repr=False, compare=False)
    root: str
    """Root path inside ``filesystem`` (``bucket/prefix`` on S3, absolute path locally)."""
    s3: S3Settings | None = None

    @property
    def is_s3(self) -> bool:
        """Whether the location is in an S3 bucket."""
        return self.s3 is not None

    @property
    def bucket(self) -> str:
        """The bucket name (S3 only)."""
        return self.root.split("/", 1)[0]

    def join(self, *parts: str) -> str:
        """A path inside the root (parts use ``/``)."""
        tail = "/".join(p.strip("/") for p in parts if p)
        return f"{self.root.rstrip('/')}/{tail}" if tail else self.root

    def delta_uri(self) -> str:
        """The location as a deltalake table URI."""
        return f"s3://{self.root}" if self.is_s3 else self.root

    def storage_options(self) -> dict[str, str] | None:
        """deltalake ``storage_options`` (``None`` for local paths)."""
        return self.s3.storage_options() if self.s3 else None


def resolve(path: str, storage_options: Mapping[str, str] | None = None) -> Location:
    """Resolve a local path, ``file://`` URI or ``s3://bucket/prefix`` to a :class:`Location`."""
    text = str(path)
    if text.startswith(("s3://", "s3a://")):
        rest = text.split("://", 1)[1].strip("/")
        if not rest:
            raise StorageError(f"sink path {text!r} names no bucket")
        settings = S3Settings.from_options(storage_options)
        try:
            fs = settings.pyarrow_fs()
        except (OSError, ValueError) as exc:
            raise StorageError(
                f"cannot set up S3 access for {text!r}: {_first_line(exc)}"
            ) from None
        return Location(uri=text, filesystem=fs, root=rest, s3=settings)
    if "://" in text and not text.startswith("file://"):
        scheme = text.split("://", 1)[0]
        raise StorageError(
            f"sink path {text!r}: scheme {scheme!r} is not supported (use s3:// or a local path)"
        )
    if storage_options:
        unknown = [k for k in storage_options if k.lower() not in KNOWN_OPTIONS]
        if unknown:
            raise StorageError(f"unknown storage option {unknown[0]!r}")
    local = text.removeprefix("file://")
    return Location(uri=text, filesystem=pafs.LocalFileSystem(), root=os.path.abspath(local))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def describe_error(exc: BaseException, secrets: tuple[str | None, ...] = ()) -> str:
    """First line of an exception's message with any secret values blanked out."""
    line = _first_line(exc)
    for secret in secrets:
        if secret:
            line = line.replace(secret, "***")
    return line


# -- create-if-absent --------------------------------------------------------------------------


class AlreadyExists(Exception):
    """:func:`put_if_absent` found an object at the target name."""


def put_if_absent(location: Location, path: str, data: bytes) -> None:
    """Create ``path`` holding ``data`` only if nothing exists there; else :class:`AlreadyExists`.

    Readers never see a partial object: locally the bytes are written to a temporary file,
    fsynced and hard-linked to the final name (``link`` fails if the name exists); on S3 a
    single ``PUT`` with ``If-None-Match: *`` either creates the whole object or fails with
    412 Precondition Failed. There is no weaker fallback: a store that ignores the condition
    is refused when the sink is opened (:func:`check_conditional_writes`).
    """
    if location.s3 is None:
        _local_put_if_absent(path, data)
        return
    try:
        s3_objects.put_if_absent(location.s3, path, data)
    except s3_objects.ObjectExists:
        raise AlreadyExists(path) from None


def check_conditional_writes(location: Location, path: str) -> None:
    """On S3, refuse a store that does not honour create-only writes (no-op locally)."""
    if location.s3 is not None:
        s3_objects.check_conditional_writes(location.s3, path)


def _named(exc: OSError, path: str) -> OSError:
    """``exc`` naming ``path`` when it names no file (a full disk fails ``write``, not open)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror, path)


def _local_put_if_absent(path: str, data: bytes) -> None:
    try:
        _local_link_new(path, data)
    except OSError as exc:
        raise _named(exc, path) from None


def _local_link_new(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise AlreadyExists(path) from None
        fsync_dir(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def fsync_dir(directory: str) -> None:
    """Make a rename/link in ``directory`` durable (no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- small helpers shared by the sinks ---------------------------------------------------------


def read_bytes(location: Location, path: str) -> bytes:
    """Whole content of a small object."""
    with location.filesystem.open_input_stream(path) as inp:
        data: bytes = inp.read()
    return data


def read_bytes_if_exists(location: Location, path: str) -> bytes | None:
    """Whole content of a small object, or ``None`` when it does not exist.

    On S3 only a missing key counts as absent: a missing bucket, denied access or an
    unreachable endpoint is a :class:`StorageError` (never "no commits yet").
    """
    if location.s3 is not None:
        return s3_objects.get_if_exists(location.s3, path)
    try:
        return read_bytes(location, path)
    except FileNotFoundError:
        return None


def write_bytes(location: Location, path: str, data: bytes) -> None:
    """Write a small object (overwriting); locally via a temp file + rename."""
    if location.s3 is None:
        try:
            replace_file(path, data, sync=True)
        except OSError as exc:
            raise _named(exc, path) from None
        fsync_dir(os.path.dirname(path))
        return
    s3_objects.put(location.s3, path, data)


def exists(location: Location, path: str) -> bool:
    """Whether a file exists at ``path``."""
    return bool(location.filesystem.get_file_info(path).type == pafs.FileType.File)


def list_files(location: Location, directory: str, recursive: bool = False) -> list[pafs.FileInfo]:
    """Files under ``directory`` (empty when it does not exist)."""
    selector = pafs.FileSelector(directory, allow_not_found=True, recursive=recursive)
    return [
        info
        for info in location.filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File
    ]


def list_names(location: Location, directory: str) -> list[tuple[str, str]]:
    """``(name, path)`` of the files in ``directory`` (empty when it does not exist).

    Locally names only: :func:`list_files` stats every file, which callers that list a
    directory per topic-partition and batch need not pay.
    """
    if location.is_s3:
        return [(i.base_name, i.path) for i in list_files(location, directory)]
    try:
        with os.scandir(directory) as entries:
            return [(e.name, e.path) for e in entries if e.is_file()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def delete_quietly(location: Location, path: str) -> None:
    """Delete a file if it exists (on S3 a missing key is fine, a missing bucket is not)."""
    if location.s3 is not None:
        s3_objects.delete_if_exists(location.s3, path)
        return
    with contextlib.suppress(FileNotFoundError):
        location.filesystem.delete_file(path)


def delete_dir_quietly(location: Location, directory: str) -> None:
    """Delete a directory tree if it exists (a missing bucket is an error, not "absent")."""
    with contextlib.suppress(FileNotFoundError):
        location.filesystem.delete_dir(directory)


def move(location: Location, src: str, dst: str) -> None:
    """Publish ``src`` as ``dst`` in one step visible to readers.

    Locally ``rename(2)`` (atomic). On S3 a server-side copy (the new name appears only when
    the copy is complete) then a delete of the source.
    """
    if location.s3 is None:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
        return
    location.filesystem.copy_file(src, dst)
    delete_quietly(location, src)


__all__ = [
    "AlreadyExists",
    "Location",
    "S3Settings",
    "check_conditional_writes",
    "delete_dir_quietly",
    "delete_quietly",
    "describe_error",
    "exists",
    "list_files",
    "list_names",
    "move",
    "put_if_absent",
    "read_bytes",
    "resolve",
    "write_bytes",
]
