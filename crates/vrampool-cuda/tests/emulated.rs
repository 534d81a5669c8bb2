//! Tests that need the emulated CUDA driver (`scripts/emulated-cuda.sh`): they read its call
//! counts, plan its faults, read its stream-order race check and queue its delayed test
//! kernel. Without it every test is reported as ignored (also on a GPU: these tests need the
//! emulator's own entry points), or fails with `VRAMPOOL_REQUIRE_EMULATED=1`. None of these
//! figures is a GPU figure.
//!
//! Each test that means to see a race or a fault turns strict mode off for its length (in
//! strict mode the first one ends the process); every other test asserts that none was seen.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;
use std::sync::Arc;

use common::{call_count, device, serial, MIB};
use vrampool_core::{Device, DeviceError, Pool, PoolConfig, PoolError, StrategyKind, StreamId};
use vrampool_cuda::{sys, CudaDevice, Handle, Sharing};

/// Set in the environment of the copies of this binary that some tests start with another
/// emulated machine (the emulator reads its configuration once, at the first call).
const CHILD: &str = "VRAMPOOL_EMULATED_CHILD";

/// How long the test kernel waits before it writes, where a test needs its work still pending
/// at the next call (a race to see, a block that must not come back yet): long enough that a
/// loaded CI machine does not finish it first.
const PENDING_US: u32 = 400_000;

fn main() {
    if let Ok(which) = std::env::var(CHILD) {
        match which.as_str() {
            "no_vmm" => child_without_vmm(),
            "fault_from_env" => child_with_a_fault_from_the_environment(),
            other => panic!("unknown child {other}"),
        }
        return;
    }
    let tests: Vec<(&'static str, fn())> = vec![
        ("emulated_race_check_sees_unordered_work", emulated_race_check_sees_unordered_work),
        ("emulated_legacy_stream_orders_blocking_streams_only", emulated_legacy_stream_orders_blocking_streams_only),
        ("emulated_cross_stream_reuse_waits_for_the_event", emulated_cross_stream_reuse_waits_for_the_event),
        ("emulated_trim_waits_for_queued_work", emulated_trim_waits_for_queued_work),
        ("emulated_mapped_memory_needs_set_access", emulated_mapped_memory_needs_set_access),
        ("emulated_growth_is_at_most_32_maps_and_trim_unmaps_each", emulated_growth_is_at_most_32_maps_and_trim_unmaps_each),
        ("emulated_driver_out_of_memory_releases_and_retries", emulated_driver_out_of_memory_releases_and_retries),
        ("emulated_bad_ordinal_and_unsupported_calls_are_errors", emulated_bad_ordinal_and_unsupported_calls_are_errors),
        (
            "emulated_get_proc_address_hands_out_implemented_forms_then_stubs",
            emulated_get_proc_address_hands_out_implemented_forms_then_stubs,
        ),
        ("emulated_without_vmm_the_pool_uses_plain_segments", emulated_without_vmm_the_pool_uses_plain_segments),
        ("emulated_a_fault_planned_in_the_environment_is_retried", emulated_a_fault_planned_in_the_environment_is_retried),
        ("emulated_fault_at_every_driver_call", emulated_fault_at_every_driver_call),
        ("emulated_shared_segments_export_and_import", emulated_shared_segments_export_and_import),
        ("emulated_legacy_segments_export_ipc_handles", emulated_legacy_segments_export_ipc_handles),
    ];
    let runnable = match common::device_present() {
        Ok(()) if common::emulated() => Ok(()),
        Ok(()) => Err("the CUDA driver is not the emulated one (run under scripts/emulated-cuda.sh)".into()),
        Err(why) => Err(format!("{why}; run under scripts/emulated-cuda.sh")),
    };
    common::run(tests, runnable, "VRAMPOOL_REQUIRE_EMULATED")
}

/// Runs `body` with strict mode off and gives back the races it caused.
fn races_during(body: impl FnOnce()) -> u64 {
    common::set_strict(false);
    let before = common::races();
    let result = catch_unwind(AssertUnwindSafe(body));
    let seen = common::races() - before;
    common::set_strict(std::env::var("EMULATED_CUDA_STRICT").is_ok_and(|v| v == "1"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    seen
}

fn expandable_best_fit() -> PoolConfig {
    PoolConfig { strategy: StrategyKind::BestFit, expandable: true, ..PoolConfig::default() }
}

fn emulated_race_check_sees_unordered_work() {
    let _serial = serial();
    let dev = device();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let seg = dev.alloc_segment(4 * MIB).unwrap();
    // A kernel on a still writes when b zeroes the same bytes: a race, with both streams named.
    let seen = races_during(|| {
        common::launch_fill(seg, MIB, 0xab, PENDING_US, a.0);
        dev.fill_zero(seg + MIB / 2, MIB, b).unwrap();
    });
    assert_eq!(seen, 1);
    let report = common::reports();
    let last = report.lines().last().unwrap();
    assert!(last.contains(&format!("stream {:#x}", a.0)) && last.contains(&format!("stream {:#x}", b.0)), "{last}");
    assert!(last.contains(&format!("[{:#x}, {:#x})", seg + MIB / 2, seg + MIB)), "{last}");
    dev.synchronize().unwrap();
    // The same, ordered by an event: no race, and b's zeros land after a's pattern.
    let seen = races_during(|| {
        common::launch_fill(seg, MIB, 0xab, 30_000, a.0);
        let e = dev.record_event(a).unwrap();
        dev.stream_wait_event(b, e).unwrap();
        dev.fill_zero(seg + MIB / 2, MIB, b).unwrap();
        dev.synchronize_stream(b).unwrap();
        dev.release_event(e);
    });
    assert_eq!(seen, 0);
    let mut back = vec![0u8; 2 * MIB as usize];
    dev.copy_to_host(seg, &mut back).unwrap();
    assert!(back[..MIB as usize / 2].iter().all(|&x| x == 0xab));
    assert!(back[MIB as usize / 2..3 * MIB as usize / 2].iter().all(|&x| x == 0));
    // The host reading bytes a stream still writes, through a driver call, is a race too.
    let seen = races_during(|| {
        common::launch_fill(seg, MIB, 1, PENDING_US, a.0);
        dev.copy_to_host(seg, &mut back[..16]).unwrap();
    });
    assert_eq!(seen, 1);
    dev.synchronize().unwrap();
    dev.free_segment(seg, 4 * MIB).unwrap();
    dev.destroy_stream(a).unwrap();
    dev.destroy_stream(b).unwrap();
}

fn emulated_legacy_stream_orders_blocking_streams_only() {
    let _serial = serial();
    let dev = device();
    let seg = dev.alloc_segment(2 * MIB).unwrap();
    // The per-thread default stream (2) is a blocking stream: the legacy stream (0) waits for it.
    let seen = races_during(|| {
        common::launch_fill(seg, MIB, 3, 30_000, 2);
        dev.fill_zero(seg, MIB, StreamId(0)).unwrap();
        dev.synchronize().unwrap();
    });
    assert_eq!(seen, 0, "{}", common::reports());
    // A non-blocking stream (what CudaDevice makes) is not ordered with the legacy stream.
    let s = dev.create_stream().unwrap();
    let seen = races_during(|| {
        common::launch_fill(seg, MIB, 3, PENDING_US, s.0);
        dev.fill_zero(seg, MIB, StreamId(0)).unwrap();
        dev.synchronize().unwrap();
    });
    assert_eq!(seen, 1);
    dev.destroy_stream(s).unwrap();
    dev.free_segment(seg, 2 * MIB).unwrap();
}

/// The property stream-ordered reuse promises: a block freed on stream A while work that a
/// stream B queued still writes it is not handed out again until that work is done.
fn emulated_cross_stream_reuse_waits_for_the_event() {
    let _serial = serial();
    let dev = Arc::new(device());
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, expandable_best_fit()).unwrap();
    let size = 4 * MIB;
    let seen = races_during(|| {
        let x = pool.allocate(size, a).unwrap();
        pool.record_stream(x, b).unwrap();
        // b must first wait for a (x was allocated in a's order), then its kernel writes x.
        let e = dev.record_event(a).unwrap();
        dev.stream_wait_event(b, e).unwrap();
        dev.release_event(e);
        common::launch_fill(x, size, 0xb0, PENDING_US, b.0);
        pool.free(x, None, None).unwrap();
        let y = pool.allocate(size, a).unwrap();
        assert!(y + size <= x || x + size <= y, "the block came back while b's kernel still writes it");
        dev.fill_zero(y, size, a).unwrap();
        dev.synchronize().unwrap();
        pool.free(y, None, None).unwrap();
        // Once b's work is done the block is reused.
        let z = pool.allocate(size, a).unwrap();
        assert!(z == x || z == y, "a freed block is reused once it is safe");
        pool.free(z, None, None).unwrap();
    });
    assert_eq!(seen, 0, "{}", common::reports());
    drop(pool);
    dev.destroy_stream(a).unwrap();
    dev.destroy_stream(b).unwrap();
}

/// A trim gives a segment back while its last user's work may still be queued: the device
/// must wait for that work first (plain segments and expandable mappings both).
fn emulated_trim_waits_for_queued_work() {
    let _serial = serial();
    let dev = Arc::new(device());
    let s = dev.create_stream().unwrap();
    let faults = common::faults();
    for expandable in [false, true] {
        let config = PoolConfig { expandable, ..expandable_best_fit() };
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
        let seen = races_during(|| {
            let x = pool.allocate(8 * MIB, s).unwrap();
            common::launch_fill(x, 8 * MIB, 7, PENDING_US, s.0);
            // Freed on its own stream: reusable there at once, in stream order.
            pool.free(x, None, None).unwrap();
            assert!(pool.empty_cache().unwrap() >= 8 * MIB);
        });
        assert_eq!(seen, 0, "expandable {expandable}: {}", common::reports());
        assert_eq!(common::faults(), faults, "the kernel found its memory mapped");
    }
    dev.destroy_stream(s).unwrap();
}

fn emulated_mapped_memory_needs_set_access() {
    let _serial = serial();
    let dev = device();
    let g = dev.vm_granularity().expect("the emulated device has virtual memory");
    let base = dev.reserve(4 * g).unwrap();
    dev.map(base, 2 * g).unwrap();
    // Mapped by the device: readable and writable by the host too (host memory underneath).
    // SAFETY: `[base, base + 2g)` is mapped read-write just above and unmapped below.
    unsafe { std::ptr::write_bytes(base as *mut u8, 0x5a, 2 * g as usize) };
    dev.fill_zero(base, g, StreamId(0)).unwrap();
    dev.synchronize().unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { std::ptr::read((base + g) as *const u8) }, 0x5a);
    // SAFETY: as above.
    assert_eq!(unsafe { std::ptr::read(base as *const u8) }, 0);
    // Reserved but not mapped: refused by the driver's calls, a fault for a kernel.
    assert!(dev.copy_to_device(base + 2 * g, b"hole").is_err(), "checked by CudaDevice before the driver");
    let before = common::faults();
    let seen = races_during(|| {
        common::launch_fill(base + 2 * g, 64, 1, 0, 0);
        assert!(dev.synchronize().is_err(), "the fault is sticky, as on a GPU");
    });
    assert_eq!((seen, common::faults() - before), (0, 1));
    common::clear_error(0);
    dev.unmap(base, 2 * g).unwrap();
    dev.unreserve(base, 4 * g).unwrap();
}

/// The driver calls of a growth, a trim and a cross-stream reuse (figures in BENCHMARKS.md).
fn emulated_growth_is_at_most_32_maps_and_trim_unmaps_each() {
    let _serial = serial();
    let dev = Arc::new(device());
    let g = dev.vm_granularity().unwrap();
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, expandable_best_fit()).unwrap();
    let counted = [
        "cuMemAddressReserve",
        "cuMemCreate",
        "cuMemMap",
        "cuMemSetAccess",
        "cuMemUnmap",
        "cuMemRelease",
        "cuMemAddressFree",
        "cuMemAlloc",
        "cuMemFree",
        "cuCtxSynchronize",
        "cuEventRecord",
        "cuEventQuery",
        "cuEventCreate",
        "cuStreamSynchronize",
    ];
    let calls = |from: &[u64]| -> Vec<u64> { counted.iter().zip(from).map(|(n, f)| call_count(n) - f).collect() };
    let now = || counted.iter().map(|n| call_count(n)).collect::<Vec<_>>();
    // A growth of 200 MiB (100 granules): 25 pieces of 8 MiB (at most 32 a growth, not one a
    // granule), each one physical allocation, one map, one access.
    let start = now();
    let x = pool.allocate(200 * MIB, StreamId(0)).unwrap();
    let growth = calls(&start);
    println!("calls for one growth of 200 MiB: {:?}", counted.iter().zip(&growth).filter(|(_, &c)| c > 0).collect::<Vec<_>>());
    assert_eq!(&growth[..4], &[1, 25, 25, 25], "one reserve; create, map, set access once a piece");
    // A second growth of 50 MiB (25 granules, so a granule a piece) in the same (256 MiB) range.
    let start = now();
    let y = pool.allocate(50 * MIB, StreamId(0)).unwrap();
    assert_eq!(&calls(&start)[..4], &[0, 25, 25, 25]);
    assert_eq!(dev.mapped_bytes(), (250 * MIB).next_multiple_of(g));
    pool.free(x, None, None).unwrap();
    pool.free(y, None, None).unwrap();
    let start = now();
    pool.empty_cache().unwrap();
    let trim = calls(&start);
    println!("calls for a trim of both growths: {:?}", counted.iter().zip(&trim).filter(|(_, &c)| c > 0).collect::<Vec<_>>());
    assert_eq!(&trim[4..7], &[50, 50, 1], "one unmap and one release per piece, then the range goes");
    assert_eq!((trim[9], trim[13]), (0, 1), "the trim waits for the stream that used the memory, not the context");
    assert_eq!(dev.mapped_bytes(), 0);
    // A cross-stream reuse: one event recorded at the free, queried until done.
    let other = dev.create_stream().unwrap();
    let z = pool.allocate(MIB, StreamId(0)).unwrap();
    pool.record_stream(z, other).unwrap();
    let start = now();
    pool.free(z, None, None).unwrap();
    dev.synchronize().unwrap();
    let again = pool.allocate(MIB, StreamId(0)).unwrap();
    let reuse = calls(&start);
    println!("calls for a cross-stream free and reuse: {:?}", counted.iter().zip(&reuse).filter(|(_, &c)| c > 0).collect::<Vec<_>>());
    assert_eq!(reuse[10], 1, "one event recorded");
    assert!(reuse[11] >= 1, "queried before reuse");
    assert_eq!(again, z, "the block came back once its event was done");
    pool.free(again, None, None).unwrap();
    drop(pool);
    dev.destroy_stream(other).unwrap();
}

fn emulated_driver_out_of_memory_releases_and_retries() {
    let _serial = serial();
    let dev = Arc::new(device());
    let total = dev.total_memory();
    let used = total - dev.mem_info().unwrap().free;
    common::set_memory(0, used + 256 * MIB);
    let result = catch_unwind(AssertUnwindSafe(|| {
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, expandable_best_fit()).unwrap();
        let a = pool.allocate(200 * MIB, StreamId(0)).unwrap();
        match pool.allocate(100 * MIB, StreamId(0)) {
            Err(PoolError::OutOfMemory(report)) => assert!(report.requested == 100 * MIB, "{report:?}"),
            other => panic!("expected out of memory, got {other:?}"),
        }
        // Cached but free: the pool gives it back to the driver and retries, on another stream.
        pool.free(a, None, None).unwrap();
        let s = dev.create_stream().unwrap();
        let b = pool.allocate(180 * MIB, s).expect("release and retry");
        assert!(pool.stats().num_alloc_retries >= 1);
        pool.free(b, None, None).unwrap();
        drop(pool);
        dev.destroy_stream(s).unwrap();
        // The raw calls say so too.
        assert_eq!(dev.alloc_segment(512 * MIB), Err(DeviceError::OutOfMemory));
    }));
    common::set_memory(0, total);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert_eq!(dev.mem_info().unwrap().free, total - used, "everything went back");
}

fn emulated_bad_ordinal_and_unsupported_calls_are_errors() {
    let _serial = serial();
    let count = CudaDevice::count().unwrap();
    match CudaDevice::new(count) {
        Err(DeviceError::Driver(text)) => assert!(text.contains(&format!("no CUDA device {count}: {count} device(s) visible")), "{text}"),
        other => panic!("expected a driver error, got {other:?}"),
    }
    assert_eq!(CudaDevice::driver_version().unwrap(), 13000);
    let dev = device();
    dev.bind_to_thread().unwrap();
    // A function the emulator does not implement: an error with a name and a string, no crash.
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: writes one handle (the emulator writes nothing and refuses).
    let result = unsafe { sys::cuGraphCreate(&mut graph, 0) };
    assert_eq!(result, sys::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED);
    match vrampool_cuda::check(result, "cuGraphCreate") {
        Err(DeviceError::Driver(text)) => assert_eq!(text, "cuGraphCreate failed: CUDA_ERROR_NOT_SUPPORTED (801): operation not supported"),
        other => panic!("{other:?}"),
    }
}

/// `cuGetProcAddress` (how cuda.bindings, cuda.core and Numba find every function): the newest
/// implemented form of a name, else its stub, else not found.
fn emulated_get_proc_address_hands_out_implemented_forms_then_stubs() {
    use std::ffi::{c_void, CStr};
    let _serial = serial();
    device().bind_to_thread().unwrap();
    let lookup = |name: &CStr, version: i32| {
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        // SAFETY: a NUL-terminated name and live out-parameters.
        let rc = unsafe { sys::cuGetProcAddress_v2(name.as_ptr(), &mut pfn, version, 0, &mut status) };
        (rc, pfn, status)
    };
    // SAFETY: only looks the exports up.
    let export = |name: &[u8]| unsafe { *sys::culib().get::<*mut c_void>(name).unwrap() };
    let (rc, pfn, status) = lookup(c"cuMemAlloc", 3020);
    assert_eq!(rc, sys::cudaError_enum::CUDA_SUCCESS);
    assert_eq!(status, sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS);
    assert_eq!(pfn, export(b"cuMemAlloc_v2"), "the _v2 form");
    // cuCtxGetDevice_v2 is a stub: the implemented first form answers (for the current context).
    assert_eq!(lookup(c"cuCtxGetDevice", 13000).1, export(b"cuCtxGetDevice"));
    // A function the emulator does not implement: its stub, which says so.
    let (rc, stub, _) = lookup(c"cuGraphCreate", 12000);
    assert!(rc == sys::cudaError_enum::CUDA_SUCCESS && !stub.is_null());
    // SAFETY: the stub reads no argument and returns a CUresult.
    let stub: extern "C" fn() -> sys::CUresult = unsafe { std::mem::transmute(stub) };
    assert_eq!(stub(), sys::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED);
    let (rc, pfn, status) = lookup(c"cuNoSuchFunction", 12000);
    assert_eq!((rc, pfn.is_null()), (sys::cudaError_enum::CUDA_ERROR_NOT_FOUND, true));
    assert_eq!(status, sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

fn emulated_without_vmm_the_pool_uses_plain_segments() {
    let out = Command::new(std::env::current_exe().unwrap()).env(CHILD, "no_vmm").env("EMULATED_CUDA_VMM", "0").output().unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("plain segments: ok"));
}

fn child_without_vmm() {
    let dev = Arc::new(device());
    assert_eq!(dev.vm_granularity(), None, "attribute 0: no virtual-memory growth");
    assert_eq!(dev.reserve(2 * MIB), Err(DeviceError::Unsupported("virtual-memory growth")));
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, expandable_best_fit()).unwrap();
    let blocks: Vec<u64> = [MIB, 50 * MIB, 300 * MIB].iter().map(|&s| pool.allocate(s, StreamId(0)).unwrap()).collect();
    assert!(dev.live_segments() >= 1);
    assert_eq!((call_count("cuMemCreate"), call_count("cuMemAddressReserve")), (0, 0));
    assert!(call_count("cuMemAlloc") >= 1);
    for b in blocks {
        pool.free(b, None, None).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(dev.live_segments(), 0);
    println!("plain segments: ok");
}

/// `EMULATED_CUDA_FAIL` fails the first `cuMemCreate` as out of memory: the pool gives back what
/// it caches and tries once more, which succeeds.
fn emulated_a_fault_planned_in_the_environment_is_retried() {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, "fault_from_env")
        .env("EMULATED_CUDA_FAIL", "cuMemCreate:1:OUT_OF_MEMORY")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("retried: ok"));
}

fn child_with_a_fault_from_the_environment() {
    let dev = Arc::new(device());
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, expandable_best_fit()).unwrap();
    let block = pool.allocate(10 * MIB, StreamId(0)).expect("the retry succeeds");
    assert_eq!(pool.stats().num_alloc_retries, 1);
    assert_eq!(call_count("cuMemCreate"), 1 + 5, "the failed call, then the retry's five 2 MiB pieces");
    pool.free(block, None, None).unwrap();
    println!("retried: ok");
}

/// One pool's life on the device: growth in every tier, a cross-stream free, reuse, trim.
fn scenario() -> Result<(), String> {
    let dev = Arc::new(CudaDevice::new(0).map_err(|e| e.to_string())?);
    let other = dev.create_stream().map_err(|e| e.to_string())?;
    let result = (|| {
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).map_err(|e| e.to_string())?;
        let mut live = Vec::new();
        for size in [512, 300 << 10, 3 * MIB, 40 * MIB, 70 * MIB] {
            live.push(pool.allocate(size, StreamId(0)).map_err(|e| e.to_string())?);
        }
        pool.record_stream(live[2], other).map_err(|e| e.to_string())?;
        for addr in live.drain(..) {
            pool.free(addr, None, None).map_err(|e| e.to_string())?;
        }
        dev.synchronize().map_err(|e| e.to_string())?;
        live.push(pool.allocate(3 * MIB, StreamId(0)).map_err(|e| e.to_string())?);
        pool.free(live[0], None, None).map_err(|e| e.to_string())?;
        pool.empty_cache().map_err(|e| e.to_string())?;
        Ok(())
    })();
    let destroyed = dev.destroy_stream(other).map_err(|e| e.to_string());
    result.and(destroyed)
}

/// Every driver call the backend makes, failed at each of its first three calls in turn (as
/// an unknown error, and as out of memory): each scenario either finishes or stops with an
/// error, nothing panics, and every byte goes back to the driver.
fn emulated_fault_at_every_driver_call() {
    let _serial = serial();
    let free_now = || CudaDevice::new(0).unwrap().mem_info().unwrap().free;
    let start = free_now();
    common::reset();
    scenario().expect("the scenario runs without faults");
    let calls: Vec<(String, u64)> = common::call_counts().into_iter().filter(|(n, _)| n.starts_with("cu")).collect();
    assert!(calls.len() >= 20, "{calls:?}");
    let mut runs = 0;
    let mut failed_runs = Vec::new();
    for (name, count) in &calls {
        for nth in 1..=(*count).min(3) {
            for code in [sys::cudaError_enum::CUDA_ERROR_UNKNOWN, sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY] {
                common::reset();
                common::fail(name, nth, code);
                let outcome = catch_unwind(scenario);
                common::reset();
                runs += 1;
                match outcome {
                    Err(_) => panic!("{name} failing at call {nth} with {code:?}: a panic"),
                    Ok(Err(text)) => failed_runs.push(format!("{name}#{nth} {code:?}: {text}")),
                    Ok(Ok(())) => {}
                }
                let free = free_now();
                assert_eq!(free, start, "{name} failing at call {nth} with {code:?} leaked {} B", start as i64 - free as i64);
            }
        }
    }
    println!("{runs} runs over {} driver functions; {} stopped with an error, e.g.:", calls.len(), failed_runs.len());
    for line in failed_runs.iter().step_by((failed_runs.len() / 8).max(1)) {
        println!("  {line}");
    }
    assert!(!failed_runs.is_empty());
    assert_eq!(common::races(), 0);
}

/// Issue 50: a shared device's segments are shareable allocations; an export maps in another
/// device (here in the same process: the emulator imports a process's own descriptors) onto
/// the same bytes, and everything goes back once closed and freed.
fn emulated_shared_segments_export_and_import() {
    use std::os::fd::AsRawFd;
    let _serial = serial();
    let plain = device();
    let base = plain.alloc_segment(MIB).unwrap();
    assert!(matches!(plain.export(base, 16), Err(DeviceError::Unsupported(_))), "made without ipc");
    plain.free_segment(base, MIB).unwrap();
    let shared = CudaDevice::new_shared(0).unwrap();
    assert_eq!((shared.sharing(), plain.sharing()), (Sharing::FileDescriptor, Sharing::None));
    let free_before = shared.mem_info().unwrap().free;
    let base = shared.alloc_segment(3 * MIB).unwrap();
    let export = shared.export(base + 4096, 100).unwrap();
    assert_eq!((export.offset, export.size), (4096, 4 * MIB), "one allocation of whole granules");
    assert!(matches!(shared.export(base + 4 * MIB - 10, 100), Err(DeviceError::Driver(_))), "past the allocation");
    let Handle::Fd(fd) = &export.handle else { panic!("a file descriptor: the emulator has VMM") };
    let imported = plain.import(fd.as_raw_fd(), export.size).unwrap();
    shared.copy_to_device(base + 4096, b"shared bytes").unwrap();
    let mut back = [0u8; 12];
    plain.copy_to_host(imported + 4096, &mut back).unwrap();
    assert_eq!(&back, b"shared bytes");
    assert!(matches!(plain.export(imported, 16), Err(DeviceError::Unsupported(_))));
    assert!(plain.import(0, 4 * MIB).is_err(), "stdin is no export");
    assert!(plain.import(fd.as_raw_fd(), 8 * MIB).is_err(), "larger than the allocation");
    assert_eq!(plain.open_imports(), 1, "the refused imports left nothing behind");
    common::fail("cuMemExportToShareableHandle", 1, sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY);
    assert!(shared.export(base, 16).is_err(), "an injected fault is an error");
    drop(shared.export(base, 16).unwrap());
    for call in ["cuMemUnmap", "cuMemAddressFree"] {
        common::fail(call, 1, sys::cudaError_enum::CUDA_ERROR_UNKNOWN);
        assert!(plain.close_import(imported).is_err(), "{call} failing is an error");
        assert_eq!(plain.open_imports(), 1, "{call} failing leaves the import open, to close again");
    }
    plain.close_import(imported).unwrap();
    assert!(plain.close_import(imported).is_err(), "closed once");
    shared.free_segment(base, 3 * MIB).unwrap();
    drop(export);
    assert_eq!(shared.mem_info().unwrap().free, free_before, "nothing leaks");
}

/// Issue 50: a legacy-shared device keeps `cuMemAlloc` segments and exports their IPC handle,
/// with the block's offset from the allocation's start. (Opening one needs another process:
/// `tests/test_ipc.py` does; here the emulator's refusal of the process's own handle is checked.)
fn emulated_legacy_segments_export_ipc_handles() {
    let _serial = serial();
    let legacy = CudaDevice::new_shared_legacy(0).unwrap();
    assert_eq!(legacy.sharing(), Sharing::Legacy);
    let free_before = legacy.mem_info().unwrap().free;
    let base = legacy.alloc_segment(3 * MIB).unwrap();
    let export = legacy.export(base + 4096, 100).unwrap();
    let Handle::Legacy(handle) = export.handle else { panic!("a legacy handle") };
    assert_eq!((export.offset, export.size), (4096, 3 * MIB), "the segment is the allocation");
    let again = legacy.export(base, 16).unwrap();
    assert!(matches!(again.handle, Handle::Legacy(h) if h == handle), "one handle per allocation");
    assert!(matches!(legacy.export(base + 3 * MIB - 10, 100), Err(DeviceError::Driver(_))), "past the segment");
    assert!(matches!(legacy.export(base + 4 * MIB, 16), Err(DeviceError::Driver(_))), "no segment there");
    assert!(legacy.import_legacy(handle).is_err(), "a process cannot open its own handle");
    assert!(legacy.import_legacy([7; 64]).is_err(), "a made-up handle");
    assert_eq!(legacy.open_imports(), 0, "the refused opens left nothing behind");
    common::fail("cuIpcGetMemHandle", 1, sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY);
    assert!(legacy.export(base, 16).is_err(), "an injected fault is an error");
    legacy.free_segment(base, 3 * MIB).unwrap();
    assert_eq!(legacy.mem_info().unwrap().free, free_before, "nothing leaks");
}
