//! Reliability (issue 8): scrubbing, fault injection at every device call, leak reports.

use std::collections::HashMap;
use std::sync::Arc;

use vrampool_core::config::Scrub;
use vrampool_core::sizes::{GIB, KIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{Device, DeviceError, Pool, PoolConfig, PoolError, SimDevice, SimMode, StreamId};

const S0: StreamId = StreamId(0);
const S7: StreamId = StreamId(7);
const ALL: [StrategyKind; 4] = [StrategyKind::Hybrid, StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy];
/// Through the thread cache (hybrid's fast path), the slab, best-fit and buddy tiers.
const SIZES: [u64; 5] = [1000, 100 * KIB, 3 * MIB, 8 * MIB, 80 * MIB];

fn pool_with(capacity: u64, config: PoolConfig) -> (Pool, Arc<SimDevice>) {
    let dev = Arc::new(SimDevice::new(capacity, SimMode::HostBacked));
    (Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap(), dev)
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 | 1).collect()
}

/// Writes a pattern into a block, frees it, allocates the same size again (the same address)
/// and returns what the new block holds.
fn reuse_after_pattern(pool: &Pool, dev: &SimDevice, size: u64, stream: StreamId) -> Vec<u8> {
    let a = pool.allocate(size, stream).unwrap();
    dev.write(a, &pattern(size)).unwrap();
    pool.free(a, Some(size), None).unwrap();
    let b = pool.allocate(size, stream).unwrap();
    assert_eq!(a, b, "size {size}: the freed block is reused");
    let bytes = dev.read(b, size).unwrap();
    pool.free(b, None, None).unwrap();
    bytes
}

#[test]
fn scrubbing_zero_fills_reused_blocks_in_both_modes_for_every_strategy() {
    for strategy in ALL {
        for scrub in [Scrub::OnFree, Scrub::OnAlloc] {
            let (pool, dev) = pool_with(GIB, PoolConfig { strategy, scrub, ..PoolConfig::default() });
            for size in SIZES {
                for stream in [S0, S7] {
                    let bytes = reuse_after_pattern(&pool, &dev, size, stream);
                    assert!(bytes.iter().all(|&b| b == 0), "{strategy:?} {scrub:?} {size} B on {stream:?}: the last user's data leaked");
                }
            }
            assert!(dev.counters().zero_fills >= 2 * SIZES.len() as u64, "{strategy:?} {scrub:?}");
        }
    }
}

#[test]
fn scrubbing_is_off_by_default_and_then_leaves_the_bytes() {
    assert_eq!(PoolConfig::default().scrub, Scrub::Off, "scrubbing costs a fill per block: opt-in");
    for strategy in ALL {
        let (pool, dev) = pool_with(GIB, PoolConfig { strategy, ..PoolConfig::default() });
        for size in SIZES {
            assert_eq!(reuse_after_pattern(&pool, &dev, size, S0), pattern(size), "{strategy:?} {size}: off leaves the bytes");
        }
        assert_eq!(dev.counters().zero_fills, 0);
    }
}

#[test]
fn scrub_on_free_fills_deferred_frees_when_they_complete() {
    for strategy in ALL {
        let (pool, dev) = pool_with(GIB, PoolConfig { strategy, scrub: Scrub::OnFree, ..PoolConfig::default() });
        dev.set_auto_complete(false);
        for size in SIZES {
            let a = pool.allocate(size, S7).unwrap();
            dev.write(a, &pattern(size)).unwrap();
            pool.record_stream(a, StreamId(9)).unwrap();
            pool.free(a, None, None).unwrap();
            // Still in use on stream 9: not reusable yet, and not filled under that stream's feet.
            assert_eq!(dev.read(a, size).unwrap(), pattern(size), "{strategy:?} {size}: filled before stream 9 passed the free");
            dev.complete_all();
            let b = pool.allocate(size, S7).unwrap();
            assert_eq!(a, b);
            assert!(dev.read(b, size).unwrap().iter().all(|&x| x == 0), "{strategy:?} {size}");
            pool.free(b, None, None).unwrap();
            dev.complete_all();
        }
    }
}

// ---- fault injection ----

/// xorshift: reproducible.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

const WORKLOAD_SIZES: [u64; 8] = [512, 3000, 64 * KIB, MIB + 1, 3 * MIB, 20 * MIB, 70 * MIB, 130 * MIB];
const WORKLOAD_OPS: usize = 150;

#[derive(Default, Debug)]
struct RunReport {
    faults_seen: u64,
    ooms: u64,
}

/// A fixed mixed workload over two streams: allocations of every tier, frees (some by the other
/// stream, so deferred), trims. Every call must succeed or fail with an injected fault or an
/// OOM; every live block carries a tag checked at its free (no overlap, no corruption). At the
/// end everything is freed and trimmed: nothing may leak and the counters must be exact.
fn run_workload(strategy: StrategyKind, expandable: bool, fault: Option<(bool, u64)>) -> (RunReport, u64, u64) {
    let dev = Arc::new(SimDevice::new(512 * MIB, SimMode::HostBacked));
    let config = PoolConfig { strategy, expandable, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    match fault {
        Some((false, n)) => dev.fail_alloc_in(n),
        Some((true, n)) => dev.fail_map_in(n),
        None => {}
    }
    let ctx = format!("{strategy:?} expandable={expandable} fault={fault:?}");
    let mut report = RunReport::default();
    let check = |report: &mut RunReport, r: Result<(), PoolError>, what: &str| match r {
        Ok(()) => {}
        Err(PoolError::Device(DeviceError::InjectedFault(_))) => report.faults_seen += 1,
        Err(PoolError::OutOfMemory(_)) => report.ooms += 1,
        Err(other) => panic!("{ctx}: {what} failed with an unexpected error: {other}"),
    };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut live: Vec<(u64, u64, StreamId, u64)> = Vec::new();
    let mut tags: HashMap<u64, u64> = HashMap::new();
    for op in 0..WORKLOAD_OPS {
        let r = next(&mut rng);
        match r % 10 {
            0..=5 => {
                let size = WORKLOAD_SIZES[(r >> 8) as usize % WORKLOAD_SIZES.len()];
                let stream = if (r >> 16) & 1 == 0 { S0 } else { S7 };
                match pool.allocate(size, stream) {
                    Ok(addr) => {
                        let tag = next(&mut rng);
                        dev.write(addr, &tag.to_le_bytes()).unwrap();
                        dev.write(addr + size - 8, &tag.to_le_bytes()).unwrap();
                        assert!(tags.insert(addr, tag).is_none(), "{ctx}: op {op}: {addr:#x} handed out twice");
                        live.push((addr, size, stream, tag));
                    }
                    Err(e) => check(&mut report, Err(e), "allocate"),
                }
            }
            6..=8 if !live.is_empty() => {
                let (addr, size, stream, tag) = live.swap_remove((r >> 8) as usize % live.len());
                for at in [addr, addr + size - 8] {
                    assert_eq!(dev.read(at, 8).unwrap(), tag.to_le_bytes(), "{ctx}: op {op}: block {addr:#x} was overwritten");
                }
                tags.remove(&addr);
                let other = if stream == S0 { S7 } else { S0 };
                let by = ((r >> 16) % 4 == 0).then_some(other);
                pool.free(addr, Some(size), by).unwrap_or_else(|e| panic!("{ctx}: op {op}: free failed: {e}"));
            }
            _ => check(&mut report, pool.trim().map(drop), "trim"),
        }
    }
    for (addr, size, _, _) in live.drain(..) {
        pool.free(addr, Some(size), None).unwrap();
    }
    pool.trim().unwrap_or_else(|e| panic!("{ctx}: final trim: {e}"));
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 0, "{ctx}");
    assert_eq!(stats.requested_bytes.current, 0, "{ctx}");
    assert_eq!(stats.allocation.current, 0, "{ctx}");
    assert_eq!(stats.active_bytes.current, 0, "{ctx}");
    assert_eq!(stats.reserved_bytes.current, 0, "{ctx}");
    assert!(pool.live_blocks().is_empty(), "{ctx}");
    let c = dev.counters();
    assert_eq!((c.used, c.live_segments), (0, 0), "{ctx}: device memory leaked");
    // Still usable after the fault (a fault armed past the workload fires here, once).
    let addr = match pool.allocate(MIB, S0) {
        Err(PoolError::Device(DeviceError::InjectedFault(_))) => {
            report.faults_seen += 1;
            pool.allocate(MIB, S0)
        }
        other => other,
    };
    let addr = addr.unwrap_or_else(|e| panic!("{ctx}: the pool is broken after the fault: {e}"));
    pool.free(addr, None, None).unwrap();
    let calls = (c.alloc_calls, c.map_calls);
    drop(pool);
    assert_eq!(dev.counters().used, 0, "{ctx}");
    (report, calls.0, calls.1)
}

#[test]
fn a_fault_at_every_segment_allocation_and_map_leaves_the_pool_consistent_and_leak_free() {
    let (mut runs, mut injected) = (0u64, 0u64);
    let mut k_max = 0;
    for strategy in ALL {
        for expandable in [false, true] {
            let (clean, allocs, maps) = run_workload(strategy, expandable, None);
            assert_eq!(clean.faults_seen, 0);
            // Every fault point the clean run reaches, and one past them (it fires only in the
            // check that the pool still works).
            for (is_map, k) in [(false, allocs + 1), (true, maps + 1)] {
                k_max = k_max.max(k);
                for n in 1..=k {
                    let (report, _, _) = run_workload(strategy, expandable, Some((is_map, n)));
                    runs += 1;
                    injected += report.faults_seen;
                }
            }
        }
    }
    eprintln!("fault injection: {runs} runs, {injected} injected faults surfaced as errors, K up to {k_max}");
    assert!(injected > 0, "the faults must actually fire");
}

// ---- leak reports ----

#[test]
fn leak_report_gives_size_and_age_when_tracking_is_on() {
    for strategy in ALL {
        let (pool, _) = pool_with(GIB, PoolConfig { strategy, track_leaks: true, ..PoolConfig::default() });
        let kept = pool.allocate(1000, S7).unwrap();
        let freed = pool.allocate(5 * MIB, S0).unwrap();
        pool.free(freed, None, None).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let young = pool.allocate(3 * MIB, S0).unwrap();
        let report = pool.live_blocks();
        assert_eq!(report.len(), 2, "{strategy:?}");
        let old = report.iter().find(|b| b.addr == kept).unwrap();
        assert_eq!((old.requested, old.stream), (1000, S7));
        assert!(old.size >= 1000);
        let old_age = old.age_ns.expect("tracked");
        let young_age = report.iter().find(|b| b.addr == young).unwrap().age_ns.expect("tracked");
        assert!(old_age >= 5_000_000 && old_age > young_age, "{strategy:?}: {old_age} vs {young_age}");
        let leaks = pool.close();
        assert_eq!(leaks.iter().map(|b| b.addr).collect::<Vec<_>>(), report.iter().map(|b| b.addr).collect::<Vec<_>>());
        assert!(leaks.iter().all(|b| b.age_ns.is_some()));
    }
    // Off (the default): no clock read, no ages.
    let (pool, _) = pool_with(GIB, PoolConfig::default());
    assert!(!PoolConfig::default().track_leaks);
    pool.allocate(1000, S0).unwrap();
    assert_eq!(pool.live_blocks()[0].age_ns, None);
}

// ---- event-record faults ----

const S9: StreamId = StreamId(9);

/// Cross-stream frees over every tier: some blocks freed by the other stream, some used on a
/// third stream through `record_stream` first, some both, so each free records one or two events.
/// Returns the recordings made and the faults seen. A free the device fails to order must change
/// nothing: the block stays live with its recorded streams, and freeing it again succeeds. At the
/// end nothing may leak and the counters must be exact.
fn run_cross_stream_frees(strategy: StrategyKind, fail_record_at: Option<u64>) -> (u64, u64) {
    let (pool, dev) = pool_with(512 * MIB, PoolConfig { strategy, ..PoolConfig::default() });
    dev.set_auto_complete(false);
    if let Some(n) = fail_record_at {
        dev.fail_record_in(n);
    }
    let ctx = format!("{strategy:?} record fault at {fail_record_at:?}");
    let mut faults = 0;
    for round in 0..3u64 {
        for (i, &size) in SIZES.iter().enumerate() {
            let owner = if (round + i as u64) % 2 == 0 { S0 } else { S7 };
            let other = if owner == S0 { S7 } else { S0 };
            let addr = pool.allocate(size, owner).unwrap();
            let tag = (round << 8 | i as u64).to_le_bytes();
            dev.write(addr, &tag).unwrap();
            let recorded = (round + i as u64) % 3 != 0;
            if recorded {
                pool.record_stream(addr, S9).unwrap();
            }
            let by = (i % 2 == 0 || !recorded).then_some(other);
            match pool.free(addr, Some(size), by) {
                Ok(()) => {}
                Err(PoolError::Device(DeviceError::InjectedFault("event record"))) => {
                    faults += 1;
                    let live = pool.live_blocks();
                    assert!(live.iter().any(|b| b.addr == addr && b.requested == size), "{ctx}: a failed free must leave the block live");
                    assert_eq!(dev.read(addr, 8).unwrap(), tag, "{ctx}: the block was touched");
                    pool.free(addr, Some(size), by).unwrap_or_else(|e| panic!("{ctx}: the second free failed: {e}"));
                }
                Err(e) => panic!("{ctx}: free failed with an unexpected error: {e}"),
            }
            assert!(pool.free(addr, Some(size), by).is_err(), "{ctx}: double free refused");
            let stats = pool.stats();
            assert_eq!(stats.allocated_bytes.current, 0, "{ctx}: round {round} size {size}");
            assert_eq!(stats.requested_bytes.current, 0, "{ctx}");
            assert!(pool.live_blocks().is_empty(), "{ctx}");
        }
        if round == 1 {
            dev.complete_all();
        }
    }
    dev.complete_all();
    pool.trim().unwrap_or_else(|e| panic!("{ctx}: trim: {e}"));
    let stats = pool.stats();
    assert_eq!((stats.active_bytes.current, stats.reserved_bytes.current, stats.allocation.current), (0, 0, 0), "{ctx}");
    assert_eq!(dev.live_events(), 0, "{ctx}: events leaked");
    let c = dev.counters();
    assert_eq!((c.used, c.live_segments), (0, 0), "{ctx}: device memory leaked");
    (c.record_calls, faults)
}

#[test]
fn a_fault_at_every_event_record_leaves_the_block_live_and_nothing_leaks() {
    let mut points = 0;
    for strategy in ALL {
        let (recordings, faults) = run_cross_stream_frees(strategy, None);
        assert_eq!(faults, 0);
        assert!(recordings > 20, "{strategy:?}: the workload records events ({recordings})");
        for n in 1..=recordings {
            let (_, faults) = run_cross_stream_frees(strategy, Some(n));
            assert_eq!(faults, 1, "{strategy:?}: the fault at recording {n} surfaced once");
            points += 1;
        }
    }
    eprintln!("event-record faults: {points} fault points, each surfaced as an error");
}

// ---- other threads' caches (issue 16) ----

/// Sizes that the thread caches keep (class sizes up to `small_max`), a few blocks of each.
const THREAD_CACHED: [u64; 6] = [512, 2 * KIB, 8 * KIB, 64 * KIB, 512 * KIB, MIB];

/// A thread that allocates `sizes` (each `copies` times), frees them all into its own cache, and
/// then stays alive and idle, never calling the pool again, until the returned sender is
/// dropped.
fn idle_worker(pool: &Arc<Pool>, sizes: &[u64], copies: usize) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let (ready, is_ready) = std::sync::mpsc::channel::<()>();
    let (pool, sizes) = (Arc::clone(pool), sizes.to_vec());
    let worker = std::thread::spawn(move || {
        let blocks: Vec<u64> = sizes.iter().flat_map(|&s| std::iter::repeat_n(s, copies)).map(|s| pool.allocate(s, S0).unwrap()).collect();
        blocks.into_iter().for_each(|b| pool.free(b, None, None).unwrap());
        ready.send(()).unwrap();
        let _ = wait.recv();
    });
    is_ready.recv().unwrap();
    (release, worker)
}

#[test]
fn a_trim_reaches_the_cache_of_a_thread_that_stays_idle() {
    for strategy in ALL {
        let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
        let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig { strategy, ..PoolConfig::default() }).unwrap());
        let (release, worker) = idle_worker(&pool, &THREAD_CACHED, 2);
        assert_eq!(pool.stats().allocated_bytes.current, 0);
        assert!(
            pool.snapshot().iter().flat_map(|s| &s.blocks).any(|b| b.2 == vrampool_core::BlockState::Cached),
            "{strategy:?}: the worker cached blocks"
        );
        pool.trim().unwrap();
        assert_eq!(pool.stats().reserved_bytes.current, 0, "{strategy:?}: the idle worker's cached blocks went back");
        assert_eq!(dev.counters().used, 0);
        drop(release);
        worker.join().unwrap();
        assert_eq!(pool.stats().allocation.current, 0);
    }
}

/// The case: a worker's cached blocks pin segments of a small device; the main thread's
/// large allocation gets them back through the out-of-memory retry (and, with `reclaim`, through
/// the emptying of the caches before a growth).
#[test]
fn an_allocation_gets_the_memory_an_idle_thread_has_cached() {
    for strategy in ALL {
        for reclaim in [true, false] {
            // Buddy's segments are powers of two: it gets a device that one such request fills.
            let (capacity, request) = if strategy == StrategyKind::Buddy { (64 * MIB, 64 * MIB) } else { (48 * MIB, 44 * MIB) };
            let dev = Arc::new(SimDevice::new(capacity, SimMode::AddressOnly));
            let config = PoolConfig { strategy, reclaim, ..PoolConfig::default() };
            let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap());
            // Blocks spread over many segments, each of which a cached block then pins.
            let sizes: Vec<u64> = (0..40).map(|i| THREAD_CACHED[i % THREAD_CACHED.len()]).collect();
            let (release, worker) = idle_worker(&pool, &sizes, 1);
            let reserved = pool.stats().reserved_bytes.current;
            assert!(reserved + request > capacity, "{strategy:?}: the cached blocks pin {reserved} B, too little to matter");
            let big = pool.allocate(request, S0).unwrap_or_else(|e| panic!("{strategy:?} reclaim {reclaim}: {e}"));
            pool.free(big, None, None).unwrap();
            drop(release);
            worker.join().unwrap();
        }
    }
}

thread_local! {
    /// A destructor that runs before the thread cache's (thread-local destructors run in the
    /// reverse order of first use): it holds the thread between its last call and the return of
    /// its cache, as a Python thread is held after `Thread.join()` has returned.
    static HOLD_AT_EXIT: HoldAtExit = const { HoldAtExit(std::cell::RefCell::new(None)) };
}

struct HoldAtExit(std::cell::RefCell<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>);

impl Drop for HoldAtExit {
    fn drop(&mut self) {
        if let Some((exiting, resume)) = self.0.borrow_mut().take() {
            let _ = exiting.send(());
            let _ = resume.recv();
        }
    }
}

#[test]
fn a_trim_reaches_the_cache_of_a_thread_that_is_exiting() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let (exiting, is_exiting) = std::sync::mpsc::channel::<()>();
    let (resume, wait) = std::sync::mpsc::channel::<()>();
    let worker = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let b = pool.allocate(4096, S0).unwrap();
            pool.free(b, None, None).unwrap();
            // First used after the cache, so destroyed before it.
            HOLD_AT_EXIT.with(|h| *h.0.borrow_mut() = Some((exiting, wait)));
        })
    };
    is_exiting.recv().unwrap();
    pool.trim().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0, "the exiting thread's cached block went back before its destructors ran");
    resume.send(()).unwrap();
    worker.join().unwrap();
    pool.trim().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(pool.stats().allocation.current, 0);
}

/// Eight threads allocate and free thread-cached sizes (each block stamped, so that a block
/// handed to two holders shows) while another thread trims without pause: every trim takes the
/// caches of threads in the middle of their calls.
#[test]
fn trims_racing_eight_busy_threads_lose_and_duplicate_no_block() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::HostBacked));
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The workers start once the trimmer has trimmed, so that the two overlap however the
    // scheduler runs them on a loaded machine.
    let trimming = Arc::new(std::sync::Barrier::new(9));
    let trimmer = {
        let (pool, done, trimming) = (Arc::clone(&pool), Arc::clone(&done), Arc::clone(&trimming));
        std::thread::spawn(move || {
            let mut trims = 0u64;
            loop {
                pool.trim().unwrap();
                trims += 1;
                if trims == 1 {
                    trimming.wait();
                }
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break trims;
                }
            }
        })
    };
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let pool = Arc::clone(&pool);
            let trimming = Arc::clone(&trimming);
            std::thread::spawn(move || {
                trimming.wait();
                let mut rng = 0x2545_F491_4F6C_DD1D ^ (t + 1);
                let mut live: Vec<(u64, u64, u64)> = Vec::new();
                for i in 0..15_000u64 {
                    let r = next(&mut rng);
                    if live.len() < 16 && (r % 2 == 0 || live.is_empty()) {
                        let size = THREAD_CACHED[(r >> 8) as usize % 4];
                        let addr = pool.allocate(size, S0).unwrap();
                        let tag = t << 48 | i;
                        // SAFETY: a fresh live block of a host-backed pool, this thread's alone.
                        unsafe { std::ptr::write_unaligned(addr as *mut u64, tag) };
                        live.push((addr, size, tag));
                    } else {
                        let (addr, size, tag) = live.swap_remove((r >> 8) as usize % live.len());
                        // SAFETY: still live: this thread has not freed it.
                        let seen = unsafe { std::ptr::read_unaligned(addr as *const u64) };
                        assert_eq!(seen, tag, "block {addr:#x} was handed out twice");
                        pool.free(addr, Some(size), None).unwrap();
                    }
                }
                live.into_iter().for_each(|(addr, size, _)| pool.free(addr, Some(size), None).unwrap());
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(trimmer.join().unwrap() > 0);
    let stats = pool.stats();
    assert_eq!(stats.allocation.current, 0);
    assert_eq!(stats.allocation.allocated, stats.allocation.freed);
    assert!(pool.live_blocks().is_empty());
    pool.trim().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(dev.counters().used, 0);
}

// ---- sizes past what a block can record (issue 16) ----

/// The live-block table keeps sizes in 48 bits: requests past `MAX_REQUEST` are refused (in
/// release builds too), and the largest one taken is recorded whole, in every strategy.
#[test]
fn sizes_the_live_table_cannot_hold_are_refused_and_the_largest_taken_is_recorded_whole() {
    use vrampool_core::sizes::MAX_REQUEST;
    // Plain segments: an expandable growth maps one chunk at a time, too slow at this size.
    for strategy in ALL {
        {
            let dev = Arc::new(SimDevice::new(1 << 50, SimMode::AddressOnly));
            let config = PoolConfig { strategy, expandable: false, ..PoolConfig::default() };
            let pool = Pool::new(dev as Arc<dyn Device>, config).unwrap();
            for size in [MAX_REQUEST + 1, (1 << 48) - 512, 1 << 48, (1 << 48) + 2 * MIB, 1 << 49] {
                match pool.allocate(size, S0) {
                    Err(PoolError::InvalidSize { .. }) => {}
                    other => panic!("{strategy:?}: {size} B gave {other:?}"),
                }
            }
            let big = pool.allocate(MAX_REQUEST, S0).unwrap();
            let stats = pool.stats();
            assert!(stats.allocated_bytes.current >= MAX_REQUEST, "{strategy:?}: recorded as {} B", stats.allocated_bytes.current);
            assert!(stats.allocated_bytes.current <= stats.reserved_bytes.current);
            pool.free(big, Some(MAX_REQUEST), None).unwrap();
            assert_eq!(pool.stats().allocated_bytes.current, 0, "{strategy:?}");
        }
    }
}

#[test]
fn a_segment_the_device_fails_to_free_stays_the_pools_and_the_next_trim_frees_it() {
    let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: false, ..PoolConfig::default() };
    let (pool, dev) = pool_with(64 * MIB, config);
    let a = pool.allocate(2 * MIB, StreamId(0)).unwrap();
    pool.free(a, None, None).unwrap();
    let reserved = pool.stats().reserved_bytes.current;
    dev.fail_free_in(1);
    assert!(pool.trim().is_err(), "the failed free is reported");
    assert_eq!(pool.stats().reserved_bytes.current, reserved, "still reserved");
    let shown: u64 = pool.snapshot().iter().map(|s| s.size).sum();
    assert_eq!(shown, reserved, "and still in the snapshot");
    assert_eq!(pool.trim().unwrap(), reserved, "the next trim gives it back");
    assert_eq!((pool.stats().reserved_bytes.current, dev.counters().live_segments), (0, 0));
    let b = pool.allocate(2 * MIB, StreamId(0)).unwrap();
    pool.free(b, None, None).unwrap();
    dev.fail_free_in(1);
    assert!(pool.trim().is_err());
    assert!(pool.close().is_empty(), "no block is live");
    assert_eq!(dev.counters().live_segments, 0, "close tried the free again");
}

#[test]
fn memory_goes_back_after_waiting_for_its_own_streams_alone() {
    let (pool, dev) = pool_with(GIB, PoolConfig::default());
    dev.set_auto_complete(false);
    let (s1, s2) = (StreamId(11), StreamId(12));
    let a = pool.allocate(8 * MIB, s1).unwrap();
    let b = pool.allocate(8 * MIB, s2).unwrap();
    pool.free(a, None, None).unwrap();
    let syncs = dev.counters().stream_syncs;
    assert!(pool.trim().unwrap() > 0);
    assert_eq!(dev.counters().stream_syncs - syncs, 1, "one wait, for the stream whose memory went back");
    pool.free(b, None, None).unwrap();
}

#[test]
fn a_stream_that_cannot_be_waited_for_keeps_its_memory_until_it_can() {
    let (pool, dev) = pool_with(GIB, PoolConfig::default());
    let blocks: Vec<u64> = SIZES.iter().map(|&n| pool.allocate(n, S7).unwrap()).collect();
    blocks.into_iter().for_each(|b| pool.free(b, None, None).unwrap());
    let reserved = pool.stats().reserved_bytes.current;
    let used = dev.counters().used;
    dev.fail_sync_in(1);
    assert!(matches!(pool.trim(), Err(PoolError::Device(DeviceError::InjectedFault(_)))), "a clear error");
    assert_eq!((pool.stats().reserved_bytes.current, dev.counters().used), (reserved, used), "nothing went back unwaited");
    assert_eq!(pool.trim().unwrap(), reserved, "the next trim waits and gives it all back");
    assert_eq!(dev.counters().used, 0);
}
