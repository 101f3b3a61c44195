"""Spark finds `format("postgres_changes")` here without sluice.register(): it imports every pyspark_* module."""

from sluice.spark._registry import data_source_class

DefaultSource = data_source_class("postgres_changes")
