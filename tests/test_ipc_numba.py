"""Numba's IPC with the vrampool EMM plugin (issue 50), under the emulated CUDA driver: arrays of
a pool that shares by legacy IPC handle go to spawned children, Numba's own ``test_ipc`` runs
with the plugin beside Numba's own manager, and pools that cannot share are refused clearly.
Each case runs tests/_numba_ipc.py in a fresh process (the plugin is picked before Numba's
context exists). Host memory, not a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

pytest.importorskip("numba.cuda")
if os.environ.get("NUMBA_CUDA_DRIVER", "").find("emulated-cuda") < 0:
    if os.environ.get("VRAMPOOL_REQUIRE_EMULATED") == "1":
        raise RuntimeError("VRAMPOOL_REQUIRE_EMULATED=1 but Numba is not on the emulated driver; run under scripts/emulated-cuda.sh")
    pytest.skip("Numba is not on the emulated driver; run under scripts/emulated-cuda.sh", allow_module_level=True)

SCRIPT = Path(__file__).with_name("_numba_ipc.py")
LEGACY = "ipc:true,ipc_handles:legacy"


def run(mode: str, conf: str, plugin: bool = True) -> Dict[str, Any]:
    env = dict(os.environ, VRAMPOOL_CONF=conf, EMULATED_CUDA_DEVICES="2")
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    if plugin:
        env["NUMBA_CUDA_MEMORY_MANAGER"] = "vrampool.numba"
    done = subprocess.run([sys.executable, str(SCRIPT), mode], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_numba_arrays_of_a_legacy_pool_open_in_spawned_children() -> None:
    report = run("share", LEGACY)
    assert report["manager"] == "VrampoolMemoryManager"
    assert report["devices"] == 2
    # Whole arrays and slices, each opened as an array, as a pickled handle on both devices
    # (device 1 stages through the host), and from its bare bytes where Numba can.
    per_case = report["devices"] + 1 + int(report["raw_path"])
    assert report["matched"] == report["cases"] * per_case, report
    assert report["offsets"] > 1, "arrays lie at several offsets of their segments"
    assert report["twice"] == ["IpcHandle is already opened"]
    assert report["free_back"], "every segment went back once the arrays were freed"


@pytest.mark.parametrize(
    "conf, says",
    [("", "without ipc=True"), ("ipc:true", "shares by file descriptor")],
)
def test_get_ipc_handle_refuses_a_pool_that_cannot_give_numba_its_handles(conf: str, says: str) -> None:
    report = run("refusal", conf)
    assert report["error"] == "ValueError" and says in report["message"], report
    assert "ipc_handles:legacy" in report["message"], "the error says the way round"


def _failure_is_numbas(name: str, outcome: Optional[str]) -> bool:
    """Where Numba's own test code reads ``CUipcMemHandle.reserved``, which cuda.bindings 13.4
    and later no longer have (Numba's manager fails there too); or ``test_ipc_handle``, which
    opens bare handle bytes at offset 0 (only an array that is its own allocation is there)."""
    return outcome is not None and ("attribute 'reserved'" in outcome or name.endswith("TestIpcMemory.test_ipc_handle"))


def test_numbas_own_ipc_tests_pass_with_the_plugin_where_they_pass_with_numbas_manager() -> None:
    theirs = run("numba-suite", "", plugin=False)
    ours = run("numba-suite", LEGACY)
    assert set(theirs) <= set(ours) and len(ours) >= 19, sorted(set(theirs) - set(ours))
    for name, outcome in theirs.items():
        if outcome == "ok":
            assert ours[name] == "ok" or _failure_is_numbas(name, ours[name]), (name, ours[name])
    failed = {name: outcome for name, outcome in ours.items() if outcome != "ok"}
    assert all(_failure_is_numbas(name, outcome) for name, outcome in failed.items()), failed
    passed = [name for name, outcome in ours.items() if outcome == "ok"]
    assert sum("test_ipc_array" in name for name in passed) >= 9, passed
