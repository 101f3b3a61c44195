"""One package per store: options, encoder, store and Spark data source."""
