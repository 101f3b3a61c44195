"""librdkafka's requests, counted from its statistics (the producer's stats_cb), for the tests that count them."""

import json


def counting_requests(producer_config: dict) -> tuple[dict, dict[str, int]]:
    """`producer_config` reporting librdkafka's statistics every 50 ms, and the dict each report refills: requests
    sent per type (Produce, AddPartitionsToTxn, ...), summed over the brokers."""
    requests: dict[str, int] = {}

    def on_stats(raw: str) -> None:
        requests.clear()
        for broker in json.loads(raw)["brokers"].values():
            for kind, n in broker["req"].items():
                requests[kind] = requests.get(kind, 0) + n

    return {**producer_config, "statistics.interval.ms": 50, "stats_cb": on_stats}, requests
