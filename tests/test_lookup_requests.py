"""The lookup SDK's concurrent requests (source/_lookup_requests.py), without a store: results come back in the
requests' order whatever order they complete in, and one failed request fails the batch."""

import threading

import pytest

from sluice.source._lookup_requests import run_requests


def test_results_keep_the_requests_order_when_they_complete_in_reverse():
    """Each request waits for the next one to finish: the last completes first, the first last."""
    finished = [threading.Event() for _ in range(4)]
    order = []

    def request(i):
        if i + 1 < len(finished):
            assert finished[i + 1].wait(30), f"request {i + 1} never finished"
        order.append(i)
        finished[i].set()
        return f"answer {i}"

    assert run_requests(("test", "reverse"), 4, request, [0, 1, 2, 3]) == [f"answer {i}" for i in range(4)]
    assert order == [3, 2, 1, 0]


def test_a_failed_request_fails_the_batch_while_others_answer():
    """Two threads, five requests: the first fails while the others answer; the batch raises its error, never the
    others' answers alone."""
    second_running, sent = threading.Event(), []

    def request(i):
        sent.append(i)
        if i == 0:
            assert second_running.wait(30), "the second request never started"
            raise ConnectionError("server gone")
        second_running.set()
        return i

    with pytest.raises(ConnectionError, match="server gone"):
        run_requests(("test", "failing"), 2, request, [0, 1, 2, 3, 4])
    assert 0 in sent and 1 in sent
