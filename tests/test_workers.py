"""Isolated workers: a hanging or crashing call is a value, and the worker comes back."""
from tuning.hardware.workers import Worker


def test_call_returns_value():
    worker = Worker()
    try:
        assert worker.call("math:sqrt", 16.0, timeout=60) == ("ok", 4.0)
    finally:
        worker.close()


def test_exception_is_a_value():
    worker = Worker()
    try:
        status, message = worker.call("math:sqrt", -1.0, timeout=60)
        assert status == "error" and "ValueError" in message
        assert worker.call("math:sqrt", 4.0, timeout=60) == ("ok", 2.0)
    finally:
        worker.close()


def test_hang_times_out_and_worker_restarts():
    worker = Worker()
    try:
        worker.ensure_started()
        status, _ = worker.call("time:sleep", 30, timeout=0.5)
        assert status == "timeout"
        assert worker.call("math:sqrt", 9.0, timeout=60) == ("ok", 3.0)
    finally:
        worker.close()


def test_crash_is_reported_and_worker_restarts():
    worker = Worker()
    try:
        status, message = worker.call("os:_exit", 7, timeout=60)
        assert status == "crash" and "7" in message
        assert worker.call("math:sqrt", 1.0, timeout=60) == ("ok", 1.0)
    finally:
        worker.close()


def test_environment_reaches_the_worker():
    worker = Worker(env={"TVM_NUM_THREADS": 3})
    try:
        assert worker.call("os:getenv", "TVM_NUM_THREADS", timeout=60) == ("ok", "3")
    finally:
        worker.close()
