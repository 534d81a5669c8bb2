"""The bad-input matrix (issue 8): wrong types, zero, negative and huge sizes, double frees,
foreign pointers, closed pools, bad names and values, truncated or malformed files, over the whole
public surface: the DevicePool API, the C ABI, the planner, the trace reader and the command line.

Every case runs in a fresh interpreter, so a crash, an abort or a Rust panic shows as such instead
of taking pytest down. The API cases of one surface share a process (one per surface keeps the
matrix quick); each prints its own outcome, and a process that dies is reported against the
first case it did not finish. Each case must end in the expected exception with a message that
says what was wrong; the C ABI's, which cannot raise, must return null or -1 and leave the
reason in ``last_error``.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest

MIB = 1 << 20
#: Signs of a crash that still exits: a Rust panic (even one caught and turned into an
#: exception), a fatal interpreter error.
CRASH_MARKERS = ("panicked at", "Fatal Python error", "Segmentation fault", "core dumped")


class Case(NamedTuple):
    name: str
    code: str
    #: The exception's class name (matched anywhere in its MRO), or None: must not raise.
    raises: Optional[str]
    #: Must appear in the message.
    says: str = ""


# ---- the DevicePool API ----

POOL_PRELUDE = """
import vrampool
from vrampool import DevicePool
pool = DevicePool("sim", capacity=1 << 30)
"""

POOL_CASES = [
    Case("size_str", "pool.allocate('4096')", "TypeError", "nbytes must be an int"),
    Case("size_float", "pool.allocate(4096.0)", "TypeError", "nbytes must be an int"),
    Case("size_none", "pool.allocate(None)", "TypeError", "nbytes must be an int"),
    Case("size_bool", "pool.allocate(True)", "TypeError", "nbytes must be an int"),
    Case("size_zero", "pool.allocate(0)", "ValueError", "must be positive"),
    Case("size_negative", "pool.allocate(-1)", "ValueError", "must be positive"),
    Case("size_2_pow_64", "pool.allocate(1 << 64)", "ValueError", "larger than any device"),
    Case("size_2_pow_63", "pool.allocate(1 << 63)", "InvalidSizeError", "larger than one block can be (128 TiB)"),
    Case("size_past_a_block", "DevicePool('sim', capacity=1 << 50, host_backed=False).allocate((1 << 48) - 512).free()", "InvalidSizeError", "128 TiB"),
    Case("size_past_the_table", "DevicePool('sim', capacity=1 << 50, host_backed=False).allocate((1 << 48) + (2 << 20))", "InvalidSizeError", "128 TiB"),
    Case("size_above_capacity", "pool.allocate((1 << 30) + 1)", "MemoryError", "out of memory: tried to allocate 1.00 GiB"),
    Case("out_of_memory", "a = pool.allocate(700 << 20); pool.allocate(700 << 20)", "OutOfMemoryError", "out of memory"),
    Case("oom_is_a_memory_error", "a = pool.allocate(700 << 20); pool.allocate(700 << 20)", "MemoryError", "tried to allocate 700.00 MiB"),
    Case("double_deallocate", "b = pool.allocate(100); pool.deallocate(b); pool.deallocate(b)", "InvalidFreeError", "already freed"),
    # DeviceBuffer.free is idempotent by design (collection frees too): the second call is a no-op.
    Case("double_buffer_free_is_a_no_op", "b = pool.allocate(100); b.free(); b.free(); assert pool.stats()['allocation.all.freed'] == 1", None),
    Case("deallocate_after_buffer_free", "b = pool.allocate(100); b.free(); pool.deallocate(b)", "InvalidFreeError", "already freed"),
    Case("foreign_buffer", "other = DevicePool('sim', capacity=1 << 30); pool.deallocate(other.allocate(100))", "ValueError", "belongs to another pool"),
    Case(
        "buffer_of_another_device",
        "other = DevicePool('sim', capacity=1 << 30, ordinal=1); pool.deallocate(other.allocate(100))",
        "WrongDeviceError",
        "device 1",
    ),
    Case("deallocate_str", "pool.deallocate('0x1000')", "TypeError", "takes a DeviceBuffer"),
    Case("deallocate_int_pointer", "pool.deallocate(pool.allocate(100).ptr)", "TypeError", "takes a DeviceBuffer"),
    Case("deallocate_none", "pool.deallocate(None)", "TypeError", "takes a DeviceBuffer"),
    Case("record_stream_after_free", "b = pool.allocate(100); pool.deallocate(b); pool.record_stream(b, 3)", "InvalidFreeError", "was freed"),
    Case("record_stream_foreign", "other = DevicePool('sim', capacity=1 << 30); pool.record_stream(other.allocate(100), 3)", "ValueError", "another pool"),
    Case("closed_allocate", "pool.close(); pool.allocate(100)", "PoolClosedError", "closed"),
    Case("closed_deallocate", "b = pool.allocate(100); pool.close(); pool.deallocate(b)", "PoolClosedError", "closed"),
    Case("closed_trim", "pool.close(); pool.trim()", "PoolClosedError", "closed"),
    Case("closed_twice_is_fine", "pool.close(); pool.close()", None),
    Case("strategy_unknown", "DevicePool('sim', strategy='first_fit')", "ValueError", "unknown strategy"),
    Case("strategy_none_is_the_default", "assert DevicePool('sim', strategy=None).strategy == 'hybrid'", None),
    Case("strategy_case", "DevicePool('sim', strategy='HYBRID')", "ValueError", "unknown strategy"),
    Case("capacity_zero", "DevicePool('sim', capacity=0)", "ValueError", "capacity must be positive"),
    Case("capacity_negative", "DevicePool('sim', capacity=-(1 << 30))", "ValueError", "capacity must be positive"),
    Case("capacity_str", "DevicePool('sim', capacity='1G')", "TypeError", "capacity must be an int"),
    Case("capacity_huge", "DevicePool('sim', capacity=1 << 64)", "ValueError", "larger than any device"),
    Case("small_max_zero", "DevicePool('sim', small_max=0)", "ValueError", "small_max must lie between 512 B and 64 MiB, got 0"),
    Case("alignment_not_power_of_two", "DevicePool('sim', alignment=3)", "ValueError", "alignment"),
    Case("tiers_inverted", "DevicePool('sim', small_max=64 << 20, large_min=1 << 20)", "ValueError", "large_min"),
    Case("limit_negative", "DevicePool('sim', limit=-1)", "ValueError", "limit must be"),
    Case("limit_str", "DevicePool('sim', limit='half')", "ValueError", "limit must be"),
    Case("limit_fraction_above_one", "DevicePool('sim', limit=1.5)", "ValueError", "limit must be"),
    Case("round_up_divisions_negative", "DevicePool('sim', round_up_divisions=-1)", "ValueError", "round_up_divisions"),
    Case("round_up_divisions_bool", "DevicePool('sim', round_up_divisions=True)", "ValueError", "round_up_divisions"),
    Case("scrub_unknown", "DevicePool('sim', scrub='always')", "ValueError", "scrub must be one of"),
    Case("track_leaks_str", "DevicePool('sim', track_leaks='yes')", "TypeError", "track_leaks must be a bool"),
    Case("unknown_option", "DevicePool('sim', slab_size=4096)", "TypeError", "slab_size"),
    Case("device_name", "DevicePool('cuda')", "ValueError", "device must be 'sim'"),
    Case("device_negative", "DevicePool(-1)", "ValueError", "device must be 'sim'"),
    Case("device_missing", "DevicePool(999)", "DeviceError", ""),
    Case("ordinal_negative", "DevicePool('sim', ordinal=-1)", "ValueError", "ordinal"),
    Case("stream_str", "pool.allocate(64, stream='default')", "TypeError", "stream must be"),
    Case("stream_float", "pool.allocate(64, stream=1.5)", "TypeError", "stream must be"),
    Case("stream_negative", "pool.allocate(64, stream=-1)", "ValueError", "out of range"),
    Case("stream_2_pow_64", "pool.allocate(64, stream=1 << 64)", "ValueError", "out of range"),
    Case(
        "stream_protocol_garbage",
        "class S:\n    def __cuda_stream__(self):\n        return 'nope'\npool.allocate(64, stream=S())",
        "TypeError",
        "__cuda_stream__",
    ),
    Case(
        "deallocate_bad_stream_keeps_the_buffer",
        "b = pool.allocate(64)\ntry:\n    pool.deallocate(b, stream='x')\nfinally:\n    assert not b.freed, 'freed despite the error'",
        "TypeError",
        "stream must be",
    ),
    Case("record_stream_bad_stream", "pool.record_stream(pool.allocate(64), stream=object())", "TypeError", "stream must be"),
    # The native pool's raw pointer interface: only record_stream takes an address.
    Case("native_record_stream_null", "pool._native.record_stream(0, 3)", "InvalidFreeError", "not a live block"),
]

# ---- the C ABI (what PyTorch's pluggable allocator calls) ----

ABI_PRELUDE = """
import ctypes
from ctypes import POINTER, c_char_p, c_double, c_int, c_size_t, c_uint64, c_void_p
from vrampool import _native

class MempoolId(ctypes.Structure):
    _fields_ = [("first", c_uint64), ("second", c_uint64)]

class AbiError(Exception):
    "What the ABI left in last_error after a refused call."

lib = ctypes.CDLL(_native.__file__)
for name, restype, argtypes in [
    ("vrampool_malloc", c_void_p, [c_size_t, c_int, c_void_p]),
    ("vrampool_free", None, [c_void_p, c_size_t, c_int, c_void_p]),
    ("vrampool_record_stream", None, [c_void_p, c_void_p]),
    ("vrampool_base_alloc", c_void_p, [c_void_p, POINTER(c_size_t)]),
    ("vrampool_memory_fraction", None, [c_double, c_int]),
    ("vrampool_end_allocate_to_pool", None, [c_int, MempoolId]),
    ("vrampool_release_pool", None, [c_int, MempoolId]),
    ("vrampool_configure", c_int, [c_char_p]),
    ("vrampool_last_error", c_size_t, [c_char_p, c_size_t]),
]:
    getattr(lib, name).restype, getattr(lib, name).argtypes = restype, argtypes
_native._abi_reset()
_native.configure("device:sim,sim_capacity:268435456")
_native.clear_last_error()
#: A live block, so that device 0's pool exists and foreign pointers reach its checks.
def first_block():
    return lib.vrampool_malloc(4096, 0, None)

def refused():
    "Raises AbiError with the C-side last error, read through vrampool_last_error."
    n = lib.vrampool_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.vrampool_last_error(buf, n + 1)
    if n:
        raise AbiError(buf.value.decode())

def live_blocks():
    return _native.abi_stats(0)["allocation.all.current"]
"""

ABI_CASES = [
    Case("malloc_huge", "assert lib.vrampool_malloc(1 << 62, 0, None) is None; refused()", "AbiError", "larger than the pool may ever reserve"),
    Case("malloc_size_max", "assert lib.vrampool_malloc(2**64 - 1, 0, None) is None; refused()", "AbiError", "larger than the pool may ever reserve"),
    Case("malloc_out_of_memory", "p = lib.vrampool_malloc(200 << 20, 0, None); assert lib.vrampool_malloc(200 << 20, 0, None) is None; refused()", "AbiError", "out of memory"),
    Case("malloc_zero_is_null_without_error", "assert lib.vrampool_malloc(0, 0, None) is None; refused()", None),
    Case("malloc_negative_device", "assert lib.vrampool_malloc(4096, -1, None) is None; refused()", "AbiError", "not a device ordinal"),
    Case("free_null_is_a_no_op", "lib.vrampool_free(None, 0, 0, None); refused()", None),
    Case("free_foreign", "first_block(); lib.vrampool_free(0xDEAD0000, 0, 0, None); refused()", "AbiError", "not a live block"),
    Case("free_stack_address", "first_block(); x = ctypes.c_int(5); lib.vrampool_free(ctypes.addressof(x), 4, 0, None); refused()", "AbiError", "not a live block"),
    Case(
        "free_interior_keeps_the_block",
        "p = lib.vrampool_malloc(4096, 0, None)\nlib.vrampool_free(p + 2, 0, 0, None)\nassert live_blocks() == 1, 'the block was freed'\nrefused()",
        "AbiError",
        "not a live block",
    ),
    Case("double_free", "p = lib.vrampool_malloc(4096, 0, None); lib.vrampool_free(p, 4096, 0, None); lib.vrampool_free(p, 4096, 0, None); refused()", "AbiError", "not a live block"),
    Case("free_wrong_size", "p = lib.vrampool_malloc(4096, 0, None); lib.vrampool_free(p, 12345, 0, None); refused()", "AbiError", "allocated with 4096 bytes"),
    Case("free_on_another_device", "p = lib.vrampool_malloc(4096, 0, None); lib.vrampool_free(p, 4096, 7, None); refused()", "AbiError", "no vrampool pool on device 7"),
    Case("free_max_pointer", "first_block(); lib.vrampool_free(2**64 - 512, 0, 0, None); refused()", "AbiError", "not a live block"),
    Case("record_stream_foreign", "first_block(); lib.vrampool_record_stream(0xDEAD0000, 5); refused()", "AbiError", "not a live block"),
    Case("record_stream_null", "first_block(); lib.vrampool_record_stream(None, 5); refused()", "AbiError", "not a live block"),
    Case("base_alloc_foreign", "first_block(); n = c_size_t(7); assert lib.vrampool_base_alloc(0xDEAD0000, ctypes.byref(n)) is None and n.value == 0; refused()", "AbiError", "not in any vrampool segment"),
    Case("base_alloc_null_size", "first_block(); assert lib.vrampool_base_alloc(0xDEAD0000, None) is None; refused()", "AbiError", "not in any vrampool segment"),
    Case("memory_fraction_negative", "lib.vrampool_memory_fraction(-0.5, 0); refused()", "AbiError", "fraction must lie in [0, 1]"),
    Case("memory_fraction_nan", "lib.vrampool_memory_fraction(float('nan'), 0); refused()", "AbiError", "fraction must lie in [0, 1]"),
    Case("memory_fraction_above_one", "lib.vrampool_memory_fraction(2.0, 0); refused()", "AbiError", "fraction must lie in [0, 1]"),
    Case("end_pool_never_begun", "lib.vrampool_end_allocate_to_pool(0, MempoolId(1, 2)); refused()", "AbiError", "no such open pool"),
    Case("release_unknown_pool", "lib.vrampool_release_pool(0, MempoolId(9, 9)); refused()", "AbiError", "no such pool"),
    Case("configure_garbage", "assert lib.vrampool_configure(b'strategy:first_fit') == -1; refused()", "AbiError", "first_fit"),
    Case("configure_binary", "assert lib.vrampool_configure(b'\\xff\\xfe:\\x01') == -1; refused()", "AbiError", "vrampool_configure"),
    Case("configure_after_first_malloc", "lib.vrampool_malloc(4096, 0, None); assert lib.vrampool_configure(b'strategy:buddy') == -1; refused()", "AbiError", "before the first allocation"),
    Case("last_error_into_a_tiny_buffer", "lib.vrampool_free(0xDEAD0000, 0, 0, None); b = ctypes.create_string_buffer(1); assert lib.vrampool_last_error(b, 1) > 0 and b.value == b''", None),
]

# ---- the planner ----

PLAN_PRELUDE = """
import vrampool
from pathlib import Path
tmp = Path(TMP)
def csv(name, text):
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)
"""

PLAN_CASES = [
    Case("plan_row_of_strings", "vrampool.plan([('a', '0', '1', '8')])", "ValueError", "(id, lower, upper, size) ints"),
    Case("plan_row_too_short", "vrampool.plan([(0, 0, 1)])", "ValueError", "(id, lower, upper, size) ints"),
    Case("plan_row_of_floats", "vrampool.plan([(0, 0, 1, 8.5)])", "ValueError", "(id, lower, upper, size) ints"),
    Case("plan_row_of_bools", "vrampool.plan([(0, False, True, 8)])", "ValueError", "(id, lower, upper, size) ints"),
    Case("plan_negative", "vrampool.plan([(0, -1, 1, 8)])", "ValueError", "negative"),
    Case("plan_zero_size", "vrampool.plan([(0, 0, 1, 0)])", "ValueError", "size is zero"),
    Case("plan_empty_lifetime", "vrampool.plan([(0, 3, 3, 8)])", "ValueError", "empty lifetime"),
    Case("plan_backwards_lifetime", "vrampool.plan([(0, 5, 3, 8)])", "ValueError", "empty lifetime"),
    Case("plan_duplicate_id", "vrampool.plan([(0, 0, 1, 8), (0, 1, 2, 8)])", "ValueError", "appears twice"),
    Case("plan_sizes_overflow", "vrampool.plan([(0, 0, 1, 2**64 - 1), (1, 0, 1, 2**64 - 1)])", "ValueError", "overflows"),
    Case("plan_size_above_u64", "vrampool.plan([(0, 0, 1, 2**64)])", "ValueError", "above 2**64 - 1"),
    Case("plan_unknown_algorithm", "vrampool.plan([(0, 0, 1, 8)], algorithm='fast')", "ValueError", "unknown algorithm"),
    Case("plan_alignment_zero", "vrampool.plan([(0, 0, 1, 8)], alignment=0)", "ValueError", "alignment must be"),
    Case("plan_budget_negative", "vrampool.plan([(0, 0, 1, 8)], budget_ms=-5)", "ValueError", "budget_ms must be"),
    Case("plan_none", "vrampool.plan(None)", "TypeError", "not iterable"),
    Case("plan_missing_file", "vrampool.plan(str(tmp / 'missing.csv'))", "FileNotFoundError", "missing.csv"),
    Case("plan_csv_malformed", "vrampool.plan(csv('m.csv', 'id,lower,upper,size\\n0,1,x,8\\n'))", "ValueError", "line 2"),
    Case("plan_csv_truncated", "vrampool.plan(csv('t.csv', 'id,lower,upper,size\\n0,1,2,8\\n1,2'))", "ValueError", "line 3"),
    Case("plan_csv_negative", "vrampool.plan(csv('n.csv', 'id,lower,upper,size\\n0,-1,2,8\\n'))", "ValueError", "negative"),
    Case("plan_csv_empty", "vrampool.plan(csv('e.csv', ''))", "ValueError", "header"),
    Case("plan_csv_binary", "vrampool.plan(csv('b.csv', bytes(range(256))))", "ValueError", ""),
]

# ---- the trace reader and replay ----

TRACE_PRELUDE = PLAN_PRELUDE + """
from vrampool.whatif.replay import replay
from vrampool.whatif.traces import read_trace
"""

TRACE_CASES = [
    Case("read_missing", "read_trace(str(tmp / 'missing.csv'))", "FileNotFoundError", "missing.csv"),
    Case("read_missing_jsonl", "read_trace(str(tmp / 'missing.jsonl'))", "FileNotFoundError", "missing.jsonl"),
    Case("read_csv_malformed", "read_trace(csv('m.csv', 'id,lower,upper,size\\n0,a,2,8\\n'))", "ValueError", "line 2"),
    Case("read_csv_truncated", "read_trace(csv('t.csv', 'id,lower,upper,size\\n0,0,2,8\\n1,0'))", "ValueError", "line 3"),
    Case("read_csv_negative", "read_trace(csv('n.csv', 'id,lower,upper,size\\n0,0,2,-8\\n'))", "ValueError", "negative"),
    Case("read_csv_binary", "read_trace(csv('b.csv', bytes(range(256))))", "ValueError", ""),
    Case("read_csv_empty", "read_trace(csv('e.csv', ''))", "ValueError", "header"),
    Case("read_jsonl_malformed", "read_trace(csv('m.jsonl', '{\"kind\": \\n'))", "ValueError", ""),
    Case("read_jsonl_binary", "read_trace(csv('b.jsonl', bytes(range(256))))", "ValueError", ""),
    Case("replay_backwards_row", "replay([(0, 5, 3, 8)])", "ValueError", "must exceed lower"),
    Case("replay_negative_row", "replay([(0, 0, 3, -8)])", "ValueError", "negative"),
    Case("replay_short_row", "replay([(0, 0, 3)])", "ValueError", "expected (id, lower, upper, size[, stream])"),
    Case("replay_string_row", "replay([('a', 0, 3, 8)])", "ValueError", "invalid literal"),
    Case("replay_unknown_strategy", "replay([(0, 0, 3, 8)], strategy='first_fit')", "ValueError", "unknown strategy"),
    Case("replay_size_above_u64", "replay([(0, 0, 3, 2**64)])", "ValueError", "above 2**64 - 1"),
    Case("replay_missing_file", "replay(str(tmp / 'missing.csv'))", "FileNotFoundError", "missing.csv"),
]

API_SURFACES: Dict[str, Tuple[str, List[Case]]] = {
    "pool": (POOL_PRELUDE, POOL_CASES),
    "c_abi": (ABI_PRELUDE, ABI_CASES),
    "plan": (PLAN_PRELUDE, PLAN_CASES),
    "trace": (TRACE_PRELUDE, TRACE_CASES),
}

#: Runs each case in a fresh namespace after the prelude; prints one JSON line per case.
RUNNER = """
import json, sys
prelude, cases = json.loads(sys.stdin.read())
for name, code in cases:
    scope = {"TMP": sys.argv[1]}
    try:
        exec(prelude, scope)
        exec(code, scope)
        outcome = {"name": name, "mro": None, "message": ""}
    except BaseException as e:
        outcome = {"name": name, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)}
    print(json.dumps(outcome), flush=True)
"""


class Run(NamedTuple):
    returncode: int
    stderr: str
    outcomes: Dict[str, dict]


@functools.lru_cache(maxsize=None)
def run_surface(surface: str, tmp: str) -> Run:
    prelude, cases = API_SURFACES[surface]
    payload = json.dumps([textwrap.dedent(prelude), [(c.name, c.code) for c in cases]])
    done = subprocess.run([sys.executable, "-c", RUNNER, tmp], input=payload, capture_output=True, text=True, timeout=300)
    outcomes = {o["name"]: o for o in map(json.loads, done.stdout.splitlines())}
    return Run(done.returncode, done.stderr, outcomes)


def assert_no_crash(returncode: int, stderr: str, what: str) -> None:
    assert returncode >= 0, f"{what}: killed by signal {-returncode}\n{stderr[-2000:]}"
    for marker in CRASH_MARKERS:
        assert marker not in stderr, f"{what}: {marker!r} on stderr\n{stderr[-2000:]}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("bad-inputs"))


@pytest.mark.parametrize(
    "surface,case",
    [(surface, case) for surface, (_, cases) in API_SURFACES.items() for case in cases],
    ids=[f"{surface}-{case.name}" for surface, (_, cases) in API_SURFACES.items() for case in cases],
)
def test_api_case(surface: str, case: Case, scratch: str) -> None:
    run = run_surface(surface, scratch)
    outcome = run.outcomes.get(case.name)
    if outcome is None:
        # The process died on this case (or an earlier one ended it).
        assert_no_crash(run.returncode, run.stderr, f"{surface}: the process died at or before {case.name}")
        pytest.fail(f"{surface}: {case.name} reported nothing (exit {run.returncode})\n{run.stderr[-2000:]}")
    if case.raises is None:
        assert outcome["mro"] is None, f"{case.name}: raised {outcome['mro'][0]}: {outcome['message']}"
    else:
        assert outcome["mro"] is not None, f"{case.name}: did not raise (expected {case.raises})"
        assert case.raises in outcome["mro"], f"{case.name}: raised {outcome['mro'][0]}: {outcome['message']}"
        assert case.says in outcome["message"], f"{case.name}: message {outcome['message']!r} lacks {case.says!r}"
        assert outcome["message"].strip(), f"{case.name}: empty message"


def test_api_processes_exit_normally(scratch: str) -> None:
    for surface in API_SURFACES:
        run = run_surface(surface, scratch)
        assert_no_crash(run.returncode, run.stderr, surface)
        assert run.returncode == 0, f"{surface}: exit {run.returncode}\n{run.stderr[-2000:]}"


# ---- the command line ----

#: name -> (file name, file contents or None for a path that does not exist)
CLI_FILES: Dict[str, Tuple[str, Optional[bytes]]] = {
    "missing": ("missing.csv", None),
    "empty": ("empty.csv", b""),
    "header_typo": ("typo.csv", b"id,lower,uper,size\n0,0,1,8\n"),
    "truncated": ("truncated.csv", b"id,lower,upper,size\n0,0,2,64\n1,1"),
    "malformed": ("malformed.csv", b"id,lower,upper,size\n0,zero,2,64\n"),
    "binary": ("binary.csv", bytes(range(256)) * 4),
    "negative": ("negative.csv", b"id,lower,upper,size\n0,0,2,-64\n"),
    "backwards": ("backwards.csv", b"id,lower,upper,size\n0,5,2,64\n"),
    "huge": ("huge.csv", b"id,lower,upper,size\n0,0,2,99999999999999999999999\n"),
    "directory": ("a-directory", b""),
}

CLI_CASES = [(command, kind) for command in ("plan", "replay") for kind in CLI_FILES] + [
    ("plan-alignment-zero", "empty"),
    ("plan-unknown-algorithm", "empty"),
    ("replay-unknown-strategy", "empty"),
    ("no-command", "empty"),
]


def cli_args(command: str, path: str) -> List[str]:
    return {
        "plan": ["plan", "--input", path],
        "replay": ["replay", path],
        "plan-alignment-zero": ["plan", "--input", path, "--alignment", "0"],
        "plan-unknown-algorithm": ["plan", "--input", path, "--algorithm", "fastest"],
        "replay-unknown-strategy": ["replay", path, "--strategy", "first_fit"],
        "no-command": [],
    }[command]


@pytest.mark.parametrize("command,kind", CLI_CASES, ids=[f"{c}-{k}" for c, k in CLI_CASES])
def test_cli_case(command: str, kind: str, tmp_path: Path) -> None:
    name, contents = CLI_FILES[kind]
    path = tmp_path / name
    if kind == "directory":
        path.mkdir()
    elif contents is not None:
        path.write_bytes(contents)
    done = subprocess.run([sys.executable, "-m", "vrampool.whatif.cli", *cli_args(command, str(path))], capture_output=True, text=True, timeout=120)
    assert_no_crash(done.returncode, done.stderr, f"{command} {kind}")
    assert done.returncode != 0, f"{command} {kind}: exit 0\n{done.stdout[-2000:]}"
    assert "Traceback" not in done.stderr, f"{command} {kind}: a traceback\n{done.stderr[-3000:]}"
    assert done.stderr.strip(), f"{command} {kind}: no message on stderr"


# ---- hostile values for every subcommand and argument (issue 16) ----


def _snapshot(trace: List[Dict[str, int]], segments: Optional[list] = None) -> bytes:
    import pickle

    return pickle.dumps({"device_traces": [trace], "segments": segments})


#: name -> (file name, contents): inputs no reader may crash on, quote in full, or take
#: unbounded memory for.
HOSTILE_FILES: Dict[str, Tuple[str, bytes]] = {
    "empty": ("empty.jsonl", b""),
    "blank": ("blank.jsonl", b"\n\n   \n"),
    "header_only": ("header.csv", b"id,lower,upper,size\n"),
    "zeros_one_line": ("zeros.jsonl", bytes(3 << 20)),
    "long_csv_field": ("field.csv", b"id,lower,upper,size\n0,0,1," + b"9" * 500_000 + b"x\n"),
    "long_json_string": ("string.jsonl", b'{"op": "' + b"a" * 500_000 + b'"}\n'),
    "id_2_pow_64": ("id.jsonl", b'{"op": "alloc", "id": 18446744073709551616, "size": 8}\n'),
    "size_2_pow_64": ("size.jsonl", b'{"op": "alloc", "id": 1, "size": 18446744073709551616}\n'),
    "stream_2_pow_64": ("stream.jsonl", b'{"op": "alloc", "id": 1, "size": 8, "stream": 18446744073709551616}\n'),
    "size_10000_digits": ("digits.jsonl", b'{"op": "alloc", "id": 1, "size": ' + b"9" * 10_000 + b"}\n"),
    "deep_json": ("deep.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n"),
    "not_utf8": ("latin1.jsonl", b'{"op": "step"}\n{"op": "\xe9"}\n'),
    "csv_huge_value": ("huge.csv", b"id,lower,upper,size\n0,0,2,99999999999999999999999\n"),
    "size_past_a_block": ("block.csv", b"id,lower,upper,size\n0,0,2,281474978709504\n"),
    "snapshot_addr_2_pow_70": ("addr.pickle", _snapshot([{"action": "alloc", "addr": 1 << 70, "size": 8}], [])),
    "snapshot_size_2_pow_64": ("size.pickle", _snapshot([{"action": "alloc", "addr": 4096, "size": 1 << 64}], [])),
    "snapshot_segment_free_first": (
        "segfree.pickle",
        _snapshot([{"action": "segment_free", "addr": 0, "size": 1 << 40}, {"action": "alloc", "addr": 4096, "size": 512}]),
    ),
    "snapshot_not_a_dict": ("list.pickle", b"\x80\x04]\x94."),
}

#: (arguments, FILE standing for the file's path; the files to give them) for every subcommand
#: that reads one.
FILE_COMMANDS = [
    # A summary only describes: a buffer larger than a pool's block is a fine thing to describe.
    (["summary", "FILE"], [k for k in HOSTILE_FILES if k != "size_past_a_block"]),
    (["replay", "FILE"], list(HOSTILE_FILES)),
    (["replay", "FILE", "--strategy", "all", "--json"], ["empty", "id_2_pow_64", "snapshot_segment_free_first", "size_past_a_block"]),
    # A plan is offsets: a buffer larger than a pool's block plans fine.
    (["plan", "--input", "FILE"], [k for k, (name, _) in HOSTILE_FILES.items() if not name.endswith(".pickle") and k != "size_past_a_block"]),
]

GOOD_CSV = b"id,lower,upper,size\n0,0,2,4096\n1,1,3,8192\n"
#: Hostile argument values, each in a command that would otherwise succeed (GOOD: a good trace).
HOSTILE_ARGS = [
    ["plan", "--input", "GOOD", "--alignment", str(2**64)],
    ["plan", "--input", "GOOD", "--alignment", "-1"],
    ["plan", "--input", "GOOD", "--alignment", "0x10"],
    ["plan", "--input", "GOOD", "--budget-ms", "1e20"],
    ["plan", "--input", "GOOD", "--budget-ms", str(10**30)],
    ["plan", "--input", "GOOD", "--algorithm", "fastest"],
    ["plan", "--input", "GOOD", "--output", "/proc/no/such/dir/plan.csv"],
    ["replay", "GOOD", "--repeat", "0"],
    ["replay", "GOOD", "--repeat", str(10**30)],
    ["replay", "GOOD", "--repeat", "1e9"],
    ["replay", "GOOD", "--conf", "small_max:1e999"],
    ["replay", "GOOD", "--conf", "strategy:first_fit"],
    ["replay", "GOOD", "--conf", "alignment:" + str(2**64)],
    ["replay", "GOOD", "--conf", "x" * 100_000],
    ["replay", "GOOD", "--strategy", "first_fit"],
    ["replay", "GOOD", "--plot", "/proc/no/such/dir/plot.svg"],
    ["summary", "/proc/no/such/file.jsonl"],
    ["summary", "/"],
    ["capture", "--model", "gpt", "--scale", "100000"],
    ["capture", "--model", "gpt", "--steps", "0"],
    ["capture", "--model", "gpt", "--steps", str(10**30)],
    ["capture", "--model", "gpt", "--seed", "-1"],
    ["capture", "--model", "nope"],
    ["demo", "--scale", "0"],
    ["demo", "--steps", str(2**64)],
    ["demo", "--conf", "small_max:nope", "--steps", "1", "--scale", "1"],
    ["nosuchcommand"],
    [],
]


def _run_cli(args: List[str], timeout: int = 120) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "vrampool.whatif.cli", *args], capture_output=True, text=True, timeout=timeout, errors="replace")


def _assert_one_line_error(done: "subprocess.CompletedProcess[str]", what: str) -> str:
    assert_no_crash(done.returncode, done.stderr, what)
    assert done.returncode != 0, f"{what}: exit 0\n{done.stdout[-500:]}"
    assert "Traceback" not in done.stderr, f"{what}: a traceback\n{done.stderr[-3000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"{what}: {len(lines)} lines on stderr\n{done.stderr[:3000]}"
    assert len(lines[0]) < 500, f"{what}: a {len(lines[0])}-character message quotes too much input"
    return lines[0]


FILE_CASES = [(c, k) for c, kinds in FILE_COMMANDS for k in kinds]


@pytest.mark.parametrize("command,kind", FILE_CASES, ids=[f"{c[0]}{'-all' if 'all' in c else ''}-{k}" for c, k in FILE_CASES])
def test_every_file_command_gives_one_line_for_hostile_input(command: List[str], kind: str, tmp_path: Path) -> None:
    name, contents = HOSTILE_FILES[kind]
    path = tmp_path / name
    path.write_bytes(contents)
    line = _assert_one_line_error(_run_cli([str(path) if a == "FILE" else a for a in command]), f"{command} {kind}")
    assert name in line, f"the message does not name the file: {line}"


@pytest.mark.parametrize("args", HOSTILE_ARGS, ids=[" ".join(a)[:60] for a in HOSTILE_ARGS])
def test_every_argument_gives_one_line_for_hostile_values(args: List[str], tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_bytes(GOOD_CSV)
    _assert_one_line_error(_run_cli([str(good) if a == "GOOD" else a for a in args], timeout=300), " ".join(args)[:200])


def test_a_byte_order_mark_is_accepted_by_every_reader(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    csv_path, jsonl_path = tmp_path / "bom.csv", tmp_path / "bom.jsonl"
    csv_path.write_bytes(bom + GOOD_CSV)
    jsonl_path.write_bytes(bom + b'{"op": "alloc", "id": 1, "size": 4096}\n{"op": "free", "id": 1}\n')
    for args in (["summary", str(csv_path)], ["summary", str(jsonl_path)], ["replay", str(csv_path)], ["plan", "--input", str(csv_path)]):
        done = _run_cli(args)
        assert done.returncode == 0, f"{args}: {done.stderr}"


def test_an_empty_trace_gets_one_verdict_from_summary_replay_and_plan() -> None:
    for args in (["summary", "/dev/null"], ["replay", "/dev/null"], ["plan", "--input", "/dev/null"]):
        _assert_one_line_error(_run_cli(args), " ".join(args))


def test_replay_repeat_takes_the_memory_of_one_copy(tmp_path: Path) -> None:
    import resource

    trace = tmp_path / "small.csv"
    trace.write_bytes(GOOD_CSV)
    limit = 2 << 30  # address space: the copies of the trace would need several times this

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    args = [sys.executable, "-m", "vrampool.whatif.cli", "replay", str(trace), "--strategy", "default", "--repeat", "5000000", "--json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["events"] == 4 * 5_000_000
