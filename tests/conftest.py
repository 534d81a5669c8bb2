"""Shared test helpers."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
from typing import Callable, Iterator, List

import pytest

from vrampool import DevicePool
from vrampool._native import STRATEGIES


@pytest.fixture(params=STRATEGIES)
def pool(request: pytest.FixtureRequest) -> DevicePool:
    """A simulated pool of 1 GiB, once per strategy (test files on a device define their own)."""
    return DevicePool("sim", capacity=1 << 30, strategy=request.param)


@pytest.fixture
def device_pool() -> Iterator[DevicePool]:
    """A pool on device 0 (a GPU, or the emulated driver's), closed once its buffers are collected."""
    pool = DevicePool(0)
    yield pool
    gc.collect()
    pool.close()


def _run_in_threads(work: Callable[[int], None], threads: int) -> None:
    """Runs ``work(seed)`` for seeds 0..threads-1 at once and re-raises the first failure."""
    errors: List[BaseException] = []

    def guarded(seed: int) -> None:
        try:
            work(seed)
        except BaseException as e:  # pragma: no cover - re-raised below
            errors.append(e)

    running = [threading.Thread(target=guarded, args=(s,)) for s in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    if errors:
        raise errors[0]


@pytest.fixture
def run_in_threads() -> Callable[[Callable[[int], None], int], None]:
    """``run_in_threads(work, n)``: ``work(seed)`` on n threads at once; the first failure is raised."""
    return _run_in_threads


def _run_python(code: str, **env: str) -> str:
    """Runs ``code`` (dedented) in a fresh interpreter, without ``VRAMPOOL_CONF`` unless given
    in ``env``; returns its stdout. A failure shows its output."""
    full_env = {k: v for k, v in os.environ.items() if k != "VRAMPOOL_CONF"}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def run_python() -> Callable[..., str]:
    """``run_python(code, **env)``: ``code`` in a fresh interpreter (the C ABI's state is per
    process); its stdout."""
    return _run_python
