"""Spark finds `format("sluice_kafka")` here without sluice.register(): it imports every top-level pyspark_* module."""

from sluice.spark._registry import data_source_class

DefaultSource = data_source_class("sluice_kafka")
