"""One config source: the core parses every option, so `DevicePool(...)`, `vrampool.torch.install`
/ `configure`, `VRAMPOOL_CONF`, the C ABI's `vrampool_configure` and `replay --conf` take the same
keys and give the same text the same meaning. Each symptom of issue 17 is a test here."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import vrampool
import vrampool.torch as vt
from vrampool import DevicePool, _native
from vrampool.options import POOL_KEYS
from vrampool.whatif.cli import main
from vrampool.whatif.replay import check_conf, replay

MIB = 1 << 20
ROWS = [(0, 0, 2, MIB), (1, 1, 3, 3 * MIB), (2, 2, 4, 70 * MIB)]


@pytest.fixture
def abi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("VRAMPOOL_CONF", raising=False)
    _native._abi_reset()
    yield
    _native._abi_reset()


def accepted(make: Any) -> bool:
    try:
        make()
    except ValueError:
        return False
    return True


# ---- the keys are the core's ----


def test_every_layer_takes_the_cores_keys() -> None:
    keys = {name for name, _, _ in _native.config_keys()}
    assert set(vt.OPTIONS) == keys
    assert set(POOL_KEYS) == set(_native.allocator_options("pool")) == keys - {"device", "sim_capacity"}
    assert {"scrub", "track_leaks", "reclaim", "expandable_segments"} <= set(POOL_KEYS)


def test_install_takes_scrub(abi: None) -> None:
    # Issue 17: vrampool.torch.install(scrub="on_free") raised TypeError.
    assert vt.configure(device="sim", sim_capacity="64MB", scrub="on_free", track_leaks=True) == "device:sim,sim_capacity:64MB,scrub:on_free,track_leaks:true"
    c = vt.configuration()
    assert (c["scrub"], c["track_leaks"], c["device"]) == ("on_free", True, "sim")


def test_install_takes_scrub_with_torch(run_python: Callable[..., str]) -> None:
    pytest.importorskip("torch")
    out = run_python(
        """
        import vrampool.torch as vt
        vt.install(device="sim", sim_capacity="64MB", scrub="on_free")
        print(vt.configuration()["scrub"], vt.is_installed())
        """
    )
    assert out == "on_free True"


# ---- a fraction is a fraction ----


def test_a_limit_above_one_is_refused_everywhere(abi: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], run_python: Callable[..., str]) -> None:
    # Issue 17: limit:1.5 became a 1-byte limit in VRAMPOOL_CONF, --conf and configure().
    with pytest.raises(ValueError, match="limit must be"):
        DevicePool("sim", capacity=64 * MIB, limit=1.5)
    with pytest.raises(ValueError, match="limit must be"):
        vt.configure(device="sim", limit=1.5)
    with pytest.raises(ValueError, match="limit must be"):
        _native.configure("device:sim,limit:1.5")
    with pytest.raises(ValueError, match="limit must be"):
        replay(ROWS, conf="limit:1.5")
    trace = tmp_path / "t.csv"
    trace.write_text("id,lower,upper,size\n" + "".join(f"{i},{lo},{up},{size}\n" for i, lo, up, size in ROWS))
    assert main(["replay", str(trace), "--conf", "limit:1.5"]) == 1
    err = capsys.readouterr().err
    assert "limit must be" in err and err.count("\n") == 1
    out = run_python(
        """
        import ctypes
        from vrampool import _native
        lib = ctypes.CDLL(_native.__file__)
        lib.vrampool_malloc.restype = ctypes.c_void_p
        lib.vrampool_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        print(lib.vrampool_malloc(4096, 0, None))
        print(_native.last_error())
        """,
        VRAMPOOL_CONF="device:sim,sim_capacity:64MB,limit:1.5",
    )
    first, message = out.splitlines()
    assert first == "None" and "VRAMPOOL_CONF `device:sim,sim_capacity:64MB,limit:1.5`: limit must be" in message


def test_a_whole_number_limit_is_bytes_and_a_point_makes_a_fraction(abi: None) -> None:
    # Issue 17: DevicePool(limit=1) meant the whole device.
    one_byte = DevicePool("sim", capacity=64 * MIB, limit=1)
    assert one_byte._native.capacity == 1
    with pytest.raises(vrampool.OutOfMemoryError):
        one_byte.allocate(512)
    assert DevicePool("sim", capacity=64 * MIB, limit=1.0)._native.capacity == 64 * MIB
    assert DevicePool("sim", capacity=64 * MIB, limit=0.5)._native.capacity == 32 * MIB
    assert DevicePool("sim", capacity=64 * MIB, limit="16MB")._native.capacity == 16 * MIB
    vt.configure(device="sim", sim_capacity="64MB", limit=1)
    assert vt.configuration()["limit"] == 1
    lib = ctypes.CDLL(_native.__file__)
    lib.vrampool_malloc.restype, lib.vrampool_malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert lib.vrampool_malloc(4096, 0, None) is None and _native.last_oom()["too_large"]
    assert _native.abi_stats(0)["capacity_bytes"] == 1


# ---- bytes are whole numbers ----


def test_a_fractional_byte_count_is_refused_everywhere(abi: None) -> None:
    # Issue 17: alignment:4096.9 became 4096.
    for make in (
        lambda: DevicePool("sim", capacity=64 * MIB, alignment=4096.9),
        lambda: DevicePool("sim", capacity=64 * MIB, alignment="4096.9"),
        lambda: vt.configure(device="sim", alignment=4096.9),
        lambda: _native.configure("alignment:4096.9"),
        lambda: replay(ROWS, conf="alignment:4096.9"),
    ):
        with pytest.raises(ValueError, match="alignment: `4096.9` is not a whole number of bytes"):
            make()
    assert DevicePool("sim", capacity=64 * MIB, alignment=4096).allocate(100).ptr % 4096 == 0


@pytest.mark.parametrize("key, value", [
    ("small_max", "64KB"), ("small_max", "65536"), ("small_max", "64.5KB"), ("small_max", "1e5"), ("small_max", "-1"), ("small_max", "64 KiB"),
    ("limit", "0.5"), ("limit", "1"), ("limit", "1.5"), ("limit", "1.5GB"), ("limit", "5e-1"), ("limit", "nan"),
    ("strategy", "best_fit"), ("strategy", "best-fit"), ("strategy", "HYBRID"),
    ("scrub", "on_alloc"), ("scrub", "on-alloc"), ("expandable", "false"), ("round_up_divisions", "4.0"),
])
def test_the_same_text_means_the_same_everywhere(abi: None, key: str, value: str) -> None:
    text = f"{key}:{value}"
    verdicts = {
        "DevicePool": accepted(lambda: DevicePool("sim", capacity=64 * MIB, **{key: value}) if key != "expandable" else DevicePool("sim", capacity=64 * MIB)),
        "configure": accepted(lambda: _native.configure(f"device:sim,{text}")),
        "pool text": accepted(lambda: _native.NativePool(64 * MIB, text)),
        "replay --conf": accepted(lambda: check_conf(text)),
    }
    if key == "expandable":
        del verdicts["DevicePool"]  # a bool option takes a Python bool, not its text
    assert len(set(verdicts.values())) == 1, f"{text}: {verdicts}"


# ---- a replay row runs what its name says ----


def test_replay_conf_cannot_rename_a_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 17: replay --conf strategy:slab ran every row as slab, labelled best_fit / buddy / hybrid.
    for rows in ("best_fit", "buddy", "hybrid", "best_fit,buddy,hybrid", "all"):
        with pytest.raises(ValueError, match="is named for its strategy"):
            replay(ROWS, rows, conf="strategy:slab")
    with pytest.raises(ValueError, match="would run it as torch\\+expandable"):
        replay(ROWS, "torch", conf="expandable_segments:True")
    with pytest.raises(ValueError, match="would run it as best_fit\\+vm"):
        replay(ROWS, "best_fit", conf="expandable_segments:true")
    # The default row is the pool as configured: it takes the strategy, and runs it.
    default = replay(ROWS, "default", conf="strategy:slab")
    slab = replay(ROWS, "slab+vm")
    assert default["strategy"] == "default"
    assert (default["peak_reserved_bytes"], default["device_allocs"]) == (slab["peak_reserved_bytes"], slab["device_allocs"])
    trace = tmp_path / "t.csv"
    trace.write_text("id,lower,upper,size\n" + "".join(f"{i},{lo},{up},{size}\n" for i, lo, up, size in ROWS))
    assert main(["replay", str(trace), "--strategy", "best_fit,buddy,hybrid", "--conf", "strategy:slab"]) == 1
    err = capsys.readouterr().err
    assert "the row `best_fit` is named for its strategy" in err and "--strategy slab" in err and err.count("\n") == 1


@pytest.mark.parametrize("conf", ["foo:[1", "small_max:16KB,foo:[1,colour:blue", "a:1],colour:blue", "roundup_power2_divisions:[256:1"])
def test_replay_conf_with_unbalanced_brackets_stops_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], conf: str
) -> None:
    # Issue 48: the rest of the option after an unclosed `[` was dropped, unknown keys and all, and the run went on.
    with pytest.raises(ValueError, match="unbalanced brackets"):
        check_conf(conf)
    trace = tmp_path / "t.csv"
    trace.write_text("id,lower,upper,size\n" + "".join(f"{i},{lo},{up},{size}\n" for i, lo, up, size in ROWS))
    assert main(["replay", str(trace), "--strategy", "default,torch", "--conf", conf]) == 1
    out, err = capsys.readouterr()
    assert "unbalanced brackets" in err and err.count("\n") == 1, err
    assert out == ""


def test_a_vrampool_conf_that_is_not_utf8_is_an_error_that_names_it() -> None:
    # Issue 48: bytes that are not UTF-8 read as an unset VRAMPOOL_CONF, and the defaults served.
    code = textwrap.dedent(
        """
        from vrampool import _native
        for call in (_native.configuration, lambda: _native.configure("strategy:slab")):
            try:
                print("no error", call())
            except ValueError as e:
                print(type(e).__name__, e)
        """
    )
    env = {k: v for k, v in os.environb.items() if k != b"VRAMPOOL_CONF"}
    env[b"VRAMPOOL_CONF"] = b"device:sim,limit:\xff"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=120)
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr
    for line in lines:
        assert line.startswith("ValueError") and "VRAMPOOL_CONF is not UTF-8 text" in line, line
