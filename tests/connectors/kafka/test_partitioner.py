"""Kafka's murmur2 over an Arrow column (sluice/connectors/kafka/_partitioner.py) gives Kafka's own values: those
Kafka's UtilsTest checks murmur2 against. Where librdkafka puts keyed records is checked against a real broker in
test_exactly_once.py. No Spark, no broker."""

import numpy as np
import pyarrow as pa

from sluice.connectors.kafka._partitioner import kafka_partitions, murmur2

KAFKA_UTILS_TEST = {"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
                    "a-little-bit-longer-string": -1486304829,
                    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107}


def test_murmur2_gives_kafkas_values_over_a_column_sliced_or_not():
    keys = pa.array(["pad", *KAFKA_UTILS_TEST])
    assert murmur2(keys.slice(1)).view(np.int32).tolist() == list(KAFKA_UTILS_TEST.values())
    assert murmur2(keys.cast(pa.binary()).slice(1)).view(np.int32).tolist() == list(KAFKA_UTILS_TEST.values())


def test_rows_without_a_key_take_the_partitions_in_turn():
    assert kafka_partitions(pa.array([None, "21", None, None], pa.string()), 3).to_pylist() == \
        [0, (-973932308 & 0x7FFFFFFF) % 3, 1, 2]
