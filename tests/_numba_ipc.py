"""Numba's IPC through the vrampool EMM plugin, run by tests/test_ipc_numba.py as
``python tests/_numba_ipc.py MODE`` under the emulated driver, the plugin and the pool's
``VRAMPOOL_CONF`` in the environment; prints one JSON report. Modes: ``share`` (arrays to spawned
children), ``refusal`` (what ``get_ipc_handle`` raises), ``numba-suite`` (Numba's own
``test_ipc``, each case's outcome). Children are spawned, so this file must stay importable
without side effects."""

from __future__ import annotations

import json
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Dict

import numpy as np


def open_array(ipch: Any) -> Any:
    """A child: the array behind a pickled ``IpcArrayHandle``, opened, read and closed."""
    with ipch as darr:
        out = darr.copy_to_host()
        try:
            with ipch:
                pass
            twice = "no error"
        except ValueError as e:
            twice = str(e)
    return out, twice


def open_handle(handle: Any, device: int) -> Any:
    """A child: a pickled ``IpcHandle`` opened on ``device`` (staged through the host when that is
    not the exporter's device), read and closed."""
    from numba import cuda

    with cuda.gpus[device]:
        darr = handle.open_array(cuda.current_context(), shape=handle.size // 8, dtype=np.dtype(np.intp))
        out = darr.copy_to_host()
        handle.close()
    return out


def open_raw(raw: bytes, size: int, offset: int) -> Any:
    """A child: ``cuda.open_ipc_array`` of the handle's bare 64 bytes and the array's offset."""
    from numba import cuda

    with cuda.open_ipc_array(raw, shape=size // 8, dtype=np.intp, offset=offset) as darr:
        return darr.copy_to_host()


def share() -> Dict[str, Any]:
    from numba import cuda

    from vrampool.numba import _handle_bytes

    report: Dict[str, Any] = {"manager": type(cuda.current_context().memory_manager).__name__}
    pool = cuda.current_context().memory_manager.pool
    free_before = pool.mem_info()[0]
    executor = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    arrays = [cuda.to_device(np.arange(n, dtype=np.intp) * (i + 1)) for i, n in enumerate((10, 1000, 70_000, 300_000))]
    cases = [(a, None) for a in arrays] + [(arrays[1], slice(3, 800)), (arrays[2], slice(10, None))]
    # cuda.bindings 13.4 made CUipcMemHandle opaque, and Numba's open_ipc_array still sets its
    # `reserved` field: the bare-bytes path is Numba's to fix there, and is run where it works.
    from numba.cuda.cudadrv.driver import binding

    raw_path = hasattr(binding.CUipcMemHandle(), "reserved")
    matched, offsets, twice = 0, set(), set()
    for array, index in cases:
        view = array if index is None else array[index]
        got, message = executor.submit(open_array, view.get_ipc_handle()).result(timeout=120)
        matched += int(np.array_equal(got, view.copy_to_host()))
        twice.add(message)
        handle = cuda.current_context().get_ipc_handle(view.gpu_data)
        offsets.add(handle.offset)
        if pickle.loads(pickle.dumps(handle)).size != handle.size:
            raise AssertionError("the handle's size did not survive pickling")
        if raw_path:
            got = executor.submit(open_raw, _handle_bytes(handle.handle), handle.size, handle.offset).result(timeout=120)
            matched += int(np.array_equal(got, view.copy_to_host()))
        for device in range(len(cuda.gpus)):
            got = executor.submit(open_handle, handle, device).result(timeout=120)
            matched += int(np.array_equal(got, view.copy_to_host()))
    report.update(cases=len(cases), devices=len(cuda.gpus), raw_path=raw_path, matched=matched, twice=sorted(twice), offsets=len(offsets))
    executor.shutdown()
    del arrays, cases, array, view, handle
    import gc

    gc.collect()
    cuda.current_context().deallocations.clear()  # Numba defers its frees
    cuda.synchronize()
    pool.trim()
    report["free_back"] = pool.mem_info()[0] == free_before
    return report


def refusal() -> Dict[str, Any]:
    from numba import cuda

    try:
        cuda.to_device(np.arange(10)).get_ipc_handle()
        return {"error": None}
    except Exception as e:  # noqa: BLE001 - the test reads the report
        return {"error": type(e).__name__, "message": str(e)}


def numba_suite() -> Dict[str, Any]:
    """Numba's own IPC tests: each case (subtests apart) as "ok" or its error's last line."""
    import unittest

    outcomes: Dict[str, str] = {}

    class Collect(unittest.TestResult):
        def addSuccess(self, test: Any) -> None:  # noqa: N802 - unittest's names
            outcomes[test.id()] = "ok"

        def addError(self, test: Any, err: Any) -> None:  # noqa: N802
            outcomes[test.id()] = f"{err[0].__name__}: {err[1]}"

        addFailure = addError

        def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
            outcomes[subtest.id()] = "ok" if err is None else f"{err[0].__name__}: {err[1]}"

    suite = unittest.defaultTestLoader.loadTestsFromName("numba.cuda.tests.cudapy.test_ipc")
    suite.run(Collect())
    return outcomes


if __name__ == "__main__":
    import sys

    print(json.dumps({"share": share, "refusal": refusal, "numba-suite": numba_suite}[sys.argv[1]]()))
