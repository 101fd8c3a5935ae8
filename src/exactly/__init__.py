"""exactly: an effectively-once analytics event pipeline on Apache Spark."""

__version__ = "0.1.0"
