"""Payload formats in Confluent's wire format through a schema registry (Avro, Protobuf, JSON Schema), decoded and
encoded in bulk on Arrow. Private modules; the names connectors use are re-exported by `sluice.connector`."""
