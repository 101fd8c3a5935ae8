"""The collector: a Segment-compatible HTTP tracking API that logs every accepted event durably.

``exactly collect`` serves :class:`~exactly.collector.app.CollectorApp` with granian; each worker
process sends its requests' events to its own appender process, which appends them to the
``raw`` topic in groups (:mod:`exactly.collector.appender`). A request is answered 200 only once
its events are durable. ``exactly import`` (:mod:`exactly.collector.importer`) loads JSON-lines
files into the same topic, resumably.
"""
