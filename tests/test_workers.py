"""Isolated workers: a hanging or crashing call is a value, and the worker comes back."""
import pytest

from tuning.hardware.workers import Worker


@pytest.fixture
def worker():
    w = Worker(env={"TVM_NUM_THREADS": 3})
    yield w
    w.close()


def test_call_returns_value(worker):
    assert worker.call("math:sqrt", 16.0, timeout=60) == ("ok", 4.0)


def test_exception_is_a_value(worker):
    status, message = worker.call("math:sqrt", -1.0, timeout=60)
    assert status == "error" and "ValueError" in message
    assert worker.call("math:sqrt", 4.0, timeout=60) == ("ok", 2.0)


def test_hang_times_out_and_worker_restarts(worker):
    worker.ensure_started()
    assert worker.call("time:sleep", 30, timeout=0.5)[0] == "timeout"
    assert worker.call("math:sqrt", 9.0, timeout=60) == ("ok", 3.0)


def test_crash_is_reported_and_worker_restarts(worker):
    status, message = worker.call("os:_exit", 7, timeout=60)
    assert status == "crash" and "7" in message
    assert worker.call("math:sqrt", 1.0, timeout=60) == ("ok", 1.0)


def test_environment_reaches_the_worker(worker):
    assert worker.call("os:getenv", "TVM_NUM_THREADS", timeout=60) == ("ok", "3")


def test_calls_from_several_threads_each_get_their_own_answer(worker):
    import threading
    import time

    answers = {}

    def echo(i):
        answers[i] = worker.call("subprocess:getoutput", f"sleep 0.0{i % 3}; echo {i}", timeout=60)

    threads = [threading.Thread(target=echo, args=(i,), daemon=True) for i in range(12)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30  # calls that share the pipe can also wait forever for an answer taken
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert answers == {i: ("ok", str(i)) for i in range(12)}
