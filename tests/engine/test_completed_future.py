"""completed_future: the acknowledged future is shared by every success, so nothing may change it once made."""

from concurrent.futures import InvalidStateError

import pytest

from sluice.engine import completed_future


def test_the_shared_acknowledged_future_cannot_be_changed():
    done = completed_future()
    assert done is completed_future()  # shared: one object for every acknowledged batch
    assert done.cancel() is False and not done.cancelled() and done.result() is None
    with pytest.raises(InvalidStateError):
        done.set_exception(RuntimeError("a store that fails it later"))
    with pytest.raises(InvalidStateError):
        done.set_result("something else")
    assert done.exception() is None and done.result() is None
    called = []
    done.add_done_callback(called.append)  # runs at once, keeps nothing
    assert called == [done]


def test_a_failed_future_is_new_each_time_and_carries_its_error():
    first, second = completed_future(ValueError("a")), completed_future(ValueError("b"))
    assert first is not second
    assert str(first.exception()) == "a" and str(second.exception()) == "b"
