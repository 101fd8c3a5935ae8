"""One exception tree for the whole project.

Every error a user can cause or fix derives from :class:`ExactlyError`, and its message says what to
do. The CLI prints ``str(error)`` on one line and exits non-zero; it never shows a traceback for
these.
"""

from __future__ import annotations


class ExactlyError(Exception):
    """Base of every error `exactly` raises on purpose."""


class ConfigError(ExactlyError):
    """The configuration (file, environment or flags) is invalid."""


class EnvironmentProblem(ExactlyError):
    """Something the machine must provide is missing (Java, a package extra, ...)."""


class LogError(ExactlyError):
    """Base of errors raised by a log backend."""


class InvalidLogURL(LogError, ConfigError):
    """A log URL could not be understood."""


class UnknownTopic(LogError):
    """The topic does not exist."""


class TopicExists(LogError):
    """A topic with that name already exists with another partition count."""


class InvalidTopicName(LogError):
    """The topic name is not allowed."""


class PartitionOutOfRange(LogError):
    """The partition number is not in ``0 .. partitions - 1``."""


class RecordTooLarge(LogError):
    """A record is larger than the log accepts."""


class InvalidRecord(LogError):
    """A record or an append request is malformed."""


class LogUnavailable(LogError):
    """The log backend cannot be reached or did not answer in time."""
