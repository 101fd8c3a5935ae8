"""Spark integration: Java discovery and the project's SparkSession."""
