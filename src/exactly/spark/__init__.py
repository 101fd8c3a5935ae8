"""Spark integration, in three parts.

* Starting Spark: ``java.py`` (a Java Spark runs on), ``home.py`` (a SPARK_HOME whose workers
  start fast), ``class_sharing.py`` and ``class_training.py`` (the driver's classes from an
  archive), ``session.py`` (the SparkSession built from the settings, with the data source
  registered and the JVM's output in the data dir's logs).
* The ``exactly`` data source and sink, in :mod:`exactly.spark.datasource`: the log as a batch
  and streaming source, the exactly-once sink, their options, offsets, marks and the sink lease.
  They take their options from Spark, never the settings.
* Running queries: ``streaming.py`` (start, watch, stop between batches, one-line errors),
  ``batches.py`` (``foreachBatch`` queries), ``checkpoint.py`` (reading a query's checkpoint),
  ``copy.py`` (the copy stage).
"""
