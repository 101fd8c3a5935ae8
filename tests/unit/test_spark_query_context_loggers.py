"""PySpark's query-context loggers stay PySparkLoggers (a race in PySpark can make them plain)."""

from __future__ import annotations

import logging

from pyspark.logger import PySparkLogger

from exactly.spark.session import QUERY_CONTEXT_LOGGERS, query_context_loggers


def test_a_plain_logger_left_by_the_race_is_replaced() -> None:
    name = QUERY_CONTEXT_LOGGERS[0]
    logging.Logger.manager.loggerDict.pop(name, None)
    plain = logging.getLogger(name)  # what the interleaved class swaps create
    assert not isinstance(plain, PySparkLogger)
    query_context_loggers()
    for each in QUERY_CONTEXT_LOGGERS:
        logger = logging.getLogger(each)
        assert isinstance(logger, PySparkLogger)
        logger.propagate = False
        logger.handlers = [logging.NullHandler()]
        logger.exception("logged as PySpark does", file="x.py", line="1", errorClass="E")


def test_loggers_already_right_are_kept() -> None:
    query_context_loggers()
    first = logging.getLogger(QUERY_CONTEXT_LOGGERS[1])
    query_context_loggers()
    assert logging.getLogger(QUERY_CONTEXT_LOGGERS[1]) is first
