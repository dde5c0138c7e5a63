"""Errors inorder shows to users: one line, naming what is wrong and where."""

from __future__ import annotations


class InorderError(Exception):
    """Base class: an error whose message is fit to print as is (no traceback needed)."""

    exit_code = 1


class ConfigError(InorderError):
    """A setting is missing, unknown or invalid; or a service it names is unreachable."""

    exit_code = 2


class BrokerUnavailable(InorderError):
    """The broker stopped answering while the run ran (it answered when the run started):
    a broker failure, not a wrong setting, so exit code 1 rather than :class:`ConfigError`'s 2."""


class DataLossError(InorderError):
    """Records the pipeline must read are gone (retention expired, topic deleted)."""


class IntegrityError(InorderError):
    """A record broke an integrity rule under the ``fail`` policy."""


class SinkError(InorderError):
    """A sink cannot be used (unwritable path, bad credentials, missing bucket...).

    The message is one line, names the location and never contains credentials.
    """


class StorageError(SinkError):
    """A storage location (local or S3) cannot be read or written.

    A :class:`SinkError` too, since the sinks are storage's first user: code that catches
    ``SinkError`` around a sink keeps catching storage failures.
    """
