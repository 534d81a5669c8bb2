"""Shared test helpers."""

from __future__ import annotations

import threading
from typing import Callable, List

import pytest


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
