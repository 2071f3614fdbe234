"""The CPU kernels' own worker pool (csrc/cpu/work_pool.h, behind parallel_for_work): results
on one and two threads, torch.set_num_threads honoured, exceptions from a chunk, calls from two
Python threads at once, fork, interpreter exit, and no nested thread team from a chunk that
calls an ATen op. What needs a fresh process runs in a subprocess with a timeout, so a hang
fails the test instead of stalling the run."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import opforge_ops
from ops_inputs import random_rois

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(opforge_ops.__file__)))
TIMEOUT = 120


def run_python(code, timeout=TIMEOUT):
    """Runs code in a fresh interpreter that imports this opforge_ops; returns its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, *sys.path[1:]]))
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def on_threads(n, fn):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn()
    finally:
        torch.set_num_threads(threads)


def roi_align_case(num_rois, channels=16, size=32):
    x = torch.randn(2, channels, size, size)
    rois = random_rois(num_rois, 2, size, size)
    return x, rois


def roi_align(x, rois):
    return opforge_ops.roi_align(x, rois, (7, 7), 1.0, 2, True)


# ------------------------------------------------------------------ results
# 16 channels x 49 bins x 4 samples x 4 units per roi: about 50k units a roi, so the calls
# below straddle the 2**22-unit threshold (about 84 rois) under which a call stays on one thread.
@pytest.mark.parametrize("num_rois", [1, 2, 60, 84, 85, 100, 333])
def test_roi_align_equal_on_one_and_two_threads_across_the_threshold(num_rois):
    x, rois = roi_align_case(num_rois)
    one = on_threads(1, lambda: roi_align(x, rois))
    two = on_threads(2, lambda: roi_align(x, rois))
    torch.testing.assert_close(two, one, rtol=0, atol=0)


def test_repeated_calls_reuse_the_pool_and_stay_equal():
    x, rois = roi_align_case(300)
    one = on_threads(1, lambda: roi_align(x, rois))
    for _ in range(50):
        torch.testing.assert_close(on_threads(2, lambda: roi_align(x, rois)), one, rtol=0, atol=0)


# ------------------------------------------------------------------ exceptions
def roi_pool_backward_args(bad_channels):
    """_roi_pool_backward on 512 rois x 128 channels x 49 bins (about 3.2M entries: above the
    threshold), with an out-of-range argmax in bad_channels, so chunks on both threads throw."""
    rois = random_rois(512, 1, 32, 32)
    argmax = torch.randint(0, 32 * 32, (512, 128, 7, 7), dtype=torch.int32)
    for c in bad_channels:
        argmax[:, c, 3, 3] = 5000
    grad = torch.ones(512, 128, 7, 7)
    return grad, rois, argmax, 1.0, 7, 7, 1, 128, 32, 32


@pytest.mark.parametrize("bad_channels", [[127], [0], list(range(0, 128, 3))], ids=["last", "first", "many"])
def test_an_exception_in_a_chunk_is_raised_on_the_caller_with_its_message(bad_channels):
    args = roi_pool_backward_args(bad_channels)
    for n in (1, 2):
        with pytest.raises(RuntimeError, match="argmax holds 5000, outside an input plane of 1024"):
            on_threads(n, lambda: torch.ops.opforge._roi_pool_backward(*args))
    # the pool is usable afterwards
    good = roi_pool_backward_args([])
    one = on_threads(1, lambda: torch.ops.opforge._roi_pool_backward(*good))
    two = on_threads(2, lambda: torch.ops.opforge._roi_pool_backward(*good))
    torch.testing.assert_close(two, one, rtol=0, atol=0)


# ------------------------------------------------------------------ concurrency
def test_two_python_threads_calling_ops_at_once_get_the_serial_results():
    x, rois = roi_align_case(300)
    good = roi_pool_backward_args([])
    expected_align = on_threads(1, lambda: roi_align(x, rois))
    expected_pool = on_threads(1, lambda: torch.ops.opforge._roi_pool_backward(*good))
    errors = []

    def loop(fn, expected):
        try:
            for _ in range(30):
                torch.testing.assert_close(fn(), expected, rtol=0, atol=0)
        except BaseException as error:  # reported below, on the test's thread
            errors.append(error)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        workers = [
            threading.Thread(target=loop, args=(lambda: roi_align(x, rois), expected_align)),
            threading.Thread(target=loop, args=(lambda: torch.ops.opforge._roi_pool_backward(*good), expected_pool)),
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=TIMEOUT)
        assert not any(w.is_alive() for w in workers), "a call from a second Python thread hung"
    finally:
        torch.set_num_threads(threads)
    assert not errors, errors[0]


# ------------------------------------------------------------------ threads the pool starts
THREAD_COUNT = """
    import os, torch, opforge_ops
    from torch.nn.functional import conv2d
    def tasks():
        return len(os.listdir("/proc/self/task"))
    torch.set_num_threads({threads})
    x = torch.randn(1, 256, 32, 32)
    offset = torch.randn(1, 18, 32, 32)
    weight = torch.randn(256, 256, 3, 3)
    rois = torch.tensor([[0, 1.0, 1.0, 30.0, 30.0]] * 400)
    conv2d(x, weight, padding=1)  # torch's own team, if any, starts here
    before = tasks()
    for _ in range(3):
        opforge_ops.roi_align(x, rois, (7, 7), 1.0, 2, True)
        opforge_ops.deform_conv2d(x, offset, weight, padding=(1, 1))
    print(before, tasks())
"""


def test_two_threads_add_one_pool_worker_and_no_nested_team():
    # deform_conv2d's products call bmm inside the pool's chunks: a worker must not start an
    # OpenMP/MKL team of its own there (it would be a third and fourth thread on two cores).
    before, after = map(int, run_python(THREAD_COUNT.format(threads=2)).split())
    assert after == before + 1


def test_one_thread_starts_no_worker():
    before, after = map(int, run_python(THREAD_COUNT.format(threads=1)).split())
    assert after == before


# ------------------------------------------------------------------ fork and exit
def _child(x, rois, expected):
    # Runs in the forked child: the parent's pool worker does not exist here.
    # The comparison runs on one thread: torch's own OpenMP team (libgomp) is not usable in a
    # child forked from a process that ran one, which is why DataLoader workers run on one
    # thread; our ops are asked for two here, to use a pool of the child's own.
    results = []
    for _ in range(5):
        torch.set_num_threads(2)
        out = roi_align(x, rois)
        torch.set_num_threads(1)
        results.append(torch.equal(out, expected))
    os._exit(0 if all(results) else 3)


def test_ops_in_a_forked_child_of_a_process_that_used_the_pool():
    x, rois = roi_align_case(300)
    expected = on_threads(2, lambda: roi_align(x, rois))  # the parent's pool is running
    child = multiprocessing.get_context("fork").Process(target=_child, args=(x, rois, expected))
    child.start()
    try:
        child.join(timeout=TIMEOUT)
        assert not child.is_alive(), "the forked child hung in an op"
        assert child.exitcode == 0, f"the forked child's results differ (exit code {child.exitcode})"
    finally:
        if child.is_alive():
            child.kill()
    # and the parent's pool still works
    torch.testing.assert_close(on_threads(2, lambda: roi_align(x, rois)), expected, rtol=0, atol=0)


def test_interpreter_exit_does_not_hang_after_using_the_pool():
    out = run_python(
        """
        import threading, torch, opforge_ops
        torch.set_num_threads(2)
        x = torch.randn(2, 16, 32, 32)
        rois = torch.tensor([[0, 1.0, 1.0, 30.0, 30.0]] * 300)
        opforge_ops.roi_align(x, rois, (7, 7), 1.0, 2, True)
        # and a second Python thread that used it too
        t = threading.Thread(target=lambda: opforge_ops.roi_align(x, rois, (7, 7), 1.0, 2, True))
        t.start(); t.join()
        print("ok")
        """,
        timeout=60,
    )
    assert out.strip() == "ok"
