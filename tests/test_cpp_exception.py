"""The C++ exception a failed `vrampool_torch_malloc` (PyTorch's entry) throws under
`raise_on_failure` (what `vrampool.torch.install()` turns on), seen by C++ callers built with g++ against libstdc++: its
exact type is libstdc++'s `std::runtime_error` and its `what()` is the out-of-memory message; and
PyTorch's own `CUDAPluggableAllocator::malloc` (libtorch_cuda.so of torch 2.15 and 2.11, called
with no GPU) lets it through, and without `raise_on_failure` passes a null on as a pointer.

torch 2.11 is looked for in the folder `VRAMPOOL_TORCH_2_11` names (a `pip install --target`
of it, which scripts/test.sh makes); without it that case skips."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from string import Template
from typing import Dict, Optional

import pytest

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C++ callers")

# What every caller does with what comes back: 0 a pointer or null (in *result), 1 an exception
# whose dynamic type is exactly std::runtime_error, 2 another std::exception, 3 anything else;
# `type` gets the dynamic type's mangled name and `what` its what().
REPORT = r"""
#include <cstddef>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <typeinfo>

static void copy(char* out, const char* text, std::size_t cap) {
  std::strncpy(out, text, cap - 1);
  out[cap - 1] = 0;
}

template <class Call>
static int report(Call call, void** result, char* type, char* what, std::size_t cap) {
  try {
    *result = call();
    return 0;
  } catch (const std::exception& e) {
    copy(type, typeid(e).name(), cap);
    copy(what, e.what(), cap);
    return typeid(e) == typeid(std::runtime_error) ? 1 : 2;
  } catch (...) {
    return 3;
  }
}
"""

PLAIN_CALLER = REPORT + r"""
extern "C" int call_plain(void* fn, std::size_t size, void** result, char* type, char* what, std::size_t cap) {
  auto alloc = reinterpret_cast<void* (*)(std::size_t, int, void*)>(fn);
  return report([&] { return alloc(size, 0, nullptr); }, result, type, what, cap);
}
"""

# The two functions of torch/csrc/cuda/CUDAPluggableAllocator.cpp this caller needs, declared as
# libtorch_cuda.so exports them (the same mangled names in 2.11 and 2.15): no torch or CUDA
# headers are needed. CUDAPluggableAllocator has CUDAAllocator as its only base, at offset 0.
TORCH_CALLER = REPORT + r"""
#include <functional>
#include <memory>

struct CUstream_st;
namespace c10::cuda::CUDACachingAllocator { struct CUDAAllocator; }
namespace torch::cuda::CUDAPluggableAllocator {
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> createCustomAllocator(
    std::function<void*(std::size_t, int, CUstream_st*)> alloc_fn,
    std::function<void(void*, std::size_t, int, CUstream_st*)> free_fn);
struct CUDAPluggableAllocator {
  void* malloc(std::size_t size, signed char device, CUstream_st* stream);
};
}

extern "C" int call_through_torch(void* fn, void* free_fn, std::size_t size, void** result, char* type, char* what, std::size_t cap) {
  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  auto allocator = pluggable::createCustomAllocator(
      reinterpret_cast<void* (*)(std::size_t, int, CUstream_st*)>(fn),
      reinterpret_cast<void (*)(void*, std::size_t, int, CUstream_st*)>(free_fn));
  auto* torch_allocator = reinterpret_cast<pluggable::CUDAPluggableAllocator*>(allocator.get());
  return report([&] { return torch_allocator->malloc(size, 0, nullptr); }, result, type, what, cap);
}
"""

# Run in a fresh interpreter: $entry names the caller's entry, $extra its leading arguments.
DRIVER = Template("""
import ctypes, json
$prelude
from vrampool import _native
caller = ctypes.CDLL($caller)
lib = ctypes.CDLL(_native.__file__)
malloc, free = (ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in ("vrampool_torch_malloc", "vrampool_free"))
lib.vrampool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
entry = getattr(caller, $entry)
_native.configure("device:sim,sim_capacity:64MB")

def call(size):
    ptr, kind, what = ctypes.c_void_p(), ctypes.create_string_buffer(2048), ctypes.create_string_buffer(2048)
    code = entry(*[ctypes.c_void_p(a) for a in $extra], ctypes.c_size_t(size), ctypes.byref(ptr), kind, what, ctypes.c_size_t(2048))
    if ptr.value:
        lib.vrampool_free(ptr.value, size, 0, None)
    return {"code": code, "pointer": bool(ptr.value), "type": kind.value.decode(), "what": what.value.decode()}

out = {"served": call(4096), "null": call(1 << 40)}
assert _native.abi_raise_on_failure(True)
out["thrown"] = call(1 << 40)
out["message"] = _native.last_oom()["message"]
out["served_after"] = call(4096)
print(json.dumps(out))
""")


def build(tmp_path: Path, name: str, source: str, *link: str) -> Path:
    (tmp_path / f"{name}.cpp").write_text(source)
    lib = tmp_path / f"{name}.so"
    cmd = ["g++", "-std=c++17", "-shared", "-fPIC", "-O1", "-o", str(lib), str(tmp_path / f"{name}.cpp"), *link]
    subprocess.run(cmd, check=True)
    return lib


def drive(caller: Path, entry: str, extra: str, prelude: str = "", pythonpath: Optional[str] = None) -> Dict:
    code = DRIVER.substitute(prelude=prelude, caller=repr(str(caller)), entry=repr(entry), extra=extra)
    env = {k: v for k, v in os.environ.items() if k != "VRAMPOOL_CONF"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_thrown_as_oom(out: Dict) -> None:
    assert out["served"] == {"code": 0, "pointer": True, "type": "", "what": ""}
    thrown = out["thrown"]
    assert (thrown["code"], thrown["pointer"], thrown["type"]) == (1, False, "St13runtime_error"), thrown
    assert thrown["what"] == out["message"]
    assert thrown["what"].startswith("CUDA out of memory. vrampool could not allocate 1.00 TiB on device 0")
    assert out["served_after"]["code"] == 0 and out["served_after"]["pointer"]


def test_the_exception_is_libstdcxx_runtime_error_with_the_oom_message(tmp_path: Path) -> None:
    caller = build(tmp_path, "plain", PLAIN_CALLER)
    # The caller's own load brings libstdc++ in, as torch's does.
    out = drive(caller, "call_plain", "[malloc]")
    assert out["null"] == {"code": 0, "pointer": False, "type": "", "what": ""}
    assert_thrown_as_oom(out)


def torch_folder(version: str) -> Optional[str]:
    """Where torch `version` is: None for the venv's own (2.15), else VRAMPOOL_TORCH_2_11's folder."""
    if version == "2.15":
        return None
    folder = os.environ.get("VRAMPOOL_TORCH_2_11")
    if not folder or not (Path(folder) / "torch").is_dir():
        pytest.skip("torch 2.11 not installed: VRAMPOOL_TORCH_2_11 names its folder (scripts/test.sh installs it)")
    return folder


@pytest.mark.parametrize("version", ["2.15", "2.11"])
def test_torchs_pluggable_allocator_passes_the_exception_and_the_null_on(tmp_path: Path, version: str) -> None:
    folder = torch_folder(version)
    if folder is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            pytest.skip("torch is not installed")
        torch_lib = Path(spec.origin).parent / "lib"
    else:
        torch_lib = Path(folder) / "torch" / "lib"
    caller = build(tmp_path, "torch_caller", TORCH_CALLER, f"-L{torch_lib}", "-ltorch_cuda", "-lc10")
    # torch first: the caller then binds to the libtorch_cuda.so that torch loaded.
    prelude = f"import torch\nassert torch.__version__.startswith({version + '.'!r}), torch.__version__"
    out = drive(caller, "call_through_torch", "[malloc, free]", prelude, folder)
    # PyTorch does not check the pluggable allocator's pointer: a null goes through as a result.
    assert out["null"] == {"code": 0, "pointer": False, "type": "", "what": ""}
    assert_thrown_as_oom(out)
