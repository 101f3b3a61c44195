"""The build's own steps, run from the checkout's root as modules: `python -m tools.pyspark_zip` (bytecode into a
test environment's pyspark.zip) and `python -m tools.lines_table` (docs/deploy.md's capability table from the Spark
lines' test runs). Neither is imported by sluice or its tests."""
