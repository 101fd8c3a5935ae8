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


class NotIndexed(LogError):
    """The log keeps no index by key, so ``exactly trace`` would be a scan (only sqlite has one)."""


class ShortRead(LogUnavailable):
    """A read of an offset range got nowhere before the range's end for too long."""


class Fenced(LogError):
    """A fenced partition writer was superseded: a newer writer with the same id opened since."""


class InvalidEvent(ExactlyError):
    """An event (or a request envelope) breaks the rules; ``code`` names the rule for metrics."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ImportFailed(ExactlyError):
    """A file cannot be imported (missing, unreadable, not gzip although it says so)."""


class InvalidLines(ExactlyError):
    """Some lines of an imported file were invalid (each was reported with its number)."""


class StreamError(ExactlyError):
    """A Spark source or sink of the log was used in a way that would break its guarantee."""


class TopicOwned(StreamError):
    """The topic is written by another streaming query's sink."""


class DedupeError(ExactlyError):
    """Base of errors of the dedupe stores and the dedupe job."""


class InvalidId(DedupeError):
    """A messageId or an owner cannot be packed for a dedupe store (empty, out of range)."""


class StoreUnavailable(DedupeError):
    """A dedupe store cannot be opened or reached (locked by another process, server down)."""


class AggregateError(ExactlyError):
    """Base of errors of the aggregate job, its database and its audit."""


class DatabaseUnavailable(AggregateError):
    """The aggregate database could not be reached for longer than the job retries."""


class JobDBError(ExactlyError):
    """The JobDB refused an operation or cannot be reached."""


class DirectorLockHeld(JobDBError):
    """Another director holds the JobDB's lock, or every partition's lease."""


class PartitionLost(JobDBError):
    """A director's partition lease was lost (its connection ended) and another took it."""


class ReplayRunning(JobDBError):
    """Another replay of the same destination holds its lock."""


class ArchiveError(ExactlyError):
    """The archive cannot be reached, refused a write, or holds a file it cannot read."""


class PartKeepsDying(ExactlyError):
    """A part of ``exactly up`` died ``patience`` times in a row soon after starting, or once
    refusing its configuration (:data:`CONFIG_REFUSED`)."""


CONFIG_REFUSED = 78  # a part's exit status when it refuses its configuration (sysexits' EX_CONFIG)


class LakeError(ExactlyError):
    """A lake table cannot be opened, written or maintained."""


class LakeConflict(LakeError):
    """Another writer committed to the lake table first; the operation can be run again."""
