//! Allocation latency on a real GPU: vrampool's strategies against the driver's own allocators.
//!
//! For each size (512 B, 64 KiB, 4 MiB, 64 MiB) and each allocator it times alloc+free pairs, in
//! two patterns: `pair` (allocate, free at once: the steady state of a caching allocator) and
//! `batch32` (32 allocations, then their 32 frees: more blocks live, more bookkeeping). Each
//! cell is timed over several runs sized to about 20 ms each, and the median, min and max per
//! pair are reported. Everything is measured in the same process, one after the other.
//!
//! Allocators:
//! - `vrampool/<strategy>`: `vrampool_core::Pool` over `CudaDevice`, strategy slab, best_fit,
//!   buddy or hybrid, on the default stream (warmed up first, so segments are cached).
//! - `cuMemAlloc`: `cuMemAlloc` + `cuMemFree`, no caching.
//! - `cuMemAllocAsync`: `cuMemAllocAsync` + `cuMemFreeAsync` on one stream, from the device's
//!   default memory pool with its release threshold raised to the maximum (so the driver keeps
//!   freed memory cached, as a caching pool does; the threshold is put back afterwards). The time
//!   is the host-side cost of queueing; the stream is synchronised between runs, untimed.
//!
//! Usage: `gpu_bench [--out FILE.json] [--runs N] [--quick]`. Exits 3 (and writes
//! `{"skipped": ...}`) when there is no CUDA device.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrampool_core::{Device, DeviceError, Pool, PoolConfig, StrategyKind, StreamId};
use vrampool_cuda::{check, has_symbol, sys, CudaDevice};

const SIZES: [u64; 4] = [512, 64 << 10, 4 << 20, 64 << 20];
const BATCH: usize = 32;

struct Args {
    out: Option<String>,
    runs: usize,
    run_time: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { out: None, runs: 9, run_time: Duration::from_millis(20) };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => args.out = Some(it.next().ok_or("--out needs a file")?),
            "--runs" => {
                args.runs = it.next().and_then(|n| n.parse().ok()).filter(|&n: &usize| n > 0).ok_or("--runs needs a positive number")?
            }
            "--quick" => {
                args.runs = 3;
                args.run_time = Duration::from_millis(5);
            }
            "-h" | "--help" => {
                println!("usage: gpu_bench [--out FILE.json] [--runs N] [--quick]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

/// One cell of the table: an allocator, a pattern and a size.
struct Cell {
    allocator: String,
    pattern: &'static str,
    size: u64,
    outcome: Result<Timing, String>,
}

struct Timing {
    pairs_per_run: usize,
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
}

/// Something that allocates and frees device memory.
trait Allocator {
    fn alloc(&mut self, size: u64) -> Result<u64, String>;
    fn free(&mut self, addr: u64, size: u64) -> Result<(), String>;
    /// Called between runs, untimed (e.g. to synchronise a stream).
    fn settle(&mut self) -> Result<(), String> {
        Ok(())
    }
}

struct PoolAllocator(Pool);

impl Allocator for PoolAllocator {
    fn alloc(&mut self, size: u64) -> Result<u64, String> {
        self.0.allocate(size, StreamId(0)).map_err(|e| e.to_string())
    }
    fn free(&mut self, addr: u64, _size: u64) -> Result<(), String> {
        self.0.free(addr, None, None).map_err(|e| e.to_string())
    }
}

/// `cuMemAlloc` / `cuMemFree`. Needs the device's context current on this thread.
struct DriverAllocator;

impl Allocator for DriverAllocator {
    fn alloc(&mut self, size: u64) -> Result<u64, String> {
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; the context is current (`bind_to_thread` in `main`).
        check(unsafe { sys::cuMemAlloc_v2(&mut addr, size as usize) }, "cuMemAlloc").map_err(|e| e.to_string())?;
        Ok(addr)
    }
    fn free(&mut self, addr: u64, _size: u64) -> Result<(), String> {
        // SAFETY: `addr` came from `alloc` above, is freed once, and no kernel uses it.
        check(unsafe { sys::cuMemFree_v2(addr) }, "cuMemFree").map_err(|e| e.to_string())
    }
}

/// `cuMemAllocAsync` / `cuMemFreeAsync` on one stream the device made.
struct AsyncAllocator {
    stream: u64,
}

impl AsyncAllocator {
    fn stream(&self) -> sys::CUstream {
        self.stream as usize as sys::CUstream
    }
}

impl Allocator for AsyncAllocator {
    fn alloc(&mut self, size: u64) -> Result<u64, String> {
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; the stream is live (made by the device, destroyed after).
        check(unsafe { sys::cuMemAllocAsync(&mut addr, size as usize, self.stream()) }, "cuMemAllocAsync").map_err(|e| e.to_string())?;
        Ok(addr)
    }
    fn free(&mut self, addr: u64, _size: u64) -> Result<(), String> {
        // SAFETY: `addr` came from `cuMemAllocAsync` on this stream and is freed once.
        check(unsafe { sys::cuMemFreeAsync(addr, self.stream()) }, "cuMemFreeAsync").map_err(|e| e.to_string())
    }
    fn settle(&mut self) -> Result<(), String> {
        // SAFETY: the stream is live.
        check(unsafe { sys::cuStreamSynchronize(self.stream()) }, "cuStreamSynchronize").map_err(|e| e.to_string())
    }
}

/// Runs `count` alloc+free pairs in the given pattern.
fn run_pairs(a: &mut dyn Allocator, pattern: &str, size: u64, count: usize, held: &mut Vec<u64>) -> Result<(), String> {
    if pattern == "pair" {
        for _ in 0..count {
            let addr = a.alloc(size)?;
            a.free(addr, size)?;
        }
        return Ok(());
    }
    for _ in 0..count / BATCH {
        for _ in 0..BATCH {
            held.push(a.alloc(size)?);
        }
        for addr in held.drain(..) {
            a.free(addr, size)?;
        }
    }
    Ok(())
}

fn measure(a: &mut dyn Allocator, pattern: &'static str, size: u64, args: &Args) -> Result<Timing, String> {
    let mut held = Vec::with_capacity(BATCH);
    let result = (|| {
        // Warm up (fills caches, grows segments) and calibrate the pairs per run.
        let start = Instant::now();
        run_pairs(a, pattern, size, BATCH, &mut held)?;
        a.settle()?;
        let per_pair = start.elapsed().as_secs_f64() / BATCH as f64;
        let wanted = (args.run_time.as_secs_f64() / per_pair.max(1e-9)) as usize;
        let pairs = wanted.clamp(BATCH, 20_000) / BATCH * BATCH;
        let mut samples = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            let start = Instant::now();
            run_pairs(a, pattern, size, pairs, &mut held)?;
            samples.push(start.elapsed().as_nanos() as f64 / pairs as f64);
            a.settle()?;
        }
        samples.sort_by(f64::total_cmp);
        Ok(Timing { pairs_per_run: pairs, median_ns: samples[samples.len() / 2], min_ns: samples[0], max_ns: samples[samples.len() - 1] })
    })();
    // A failure half-way through a batch leaves blocks held: give them back.
    for addr in held.drain(..) {
        let _ = a.free(addr, size);
    }
    let _ = a.settle();
    result
}

fn strategy_name(kind: StrategyKind) -> &'static str {
    match kind {
        StrategyKind::Slab => "slab",
        StrategyKind::BestFit => "best_fit",
        StrategyKind::Buddy => "buddy",
        StrategyKind::Hybrid => "hybrid",
    }
}

fn bench_all(dev: &Arc<CudaDevice>, args: &Args) -> (Vec<Cell>, Vec<String>) {
    let mut cells = Vec::new();
    let mut notes = Vec::new();
    let cell = |cells: &mut Vec<Cell>, name: &str, a: &mut dyn Allocator| {
        for size in SIZES {
            for pattern in ["pair", "batch32"] {
                let outcome = measure(a, pattern, size, args);
                cells.push(Cell { allocator: name.to_string(), pattern, size, outcome });
            }
        }
    };

    for kind in [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid] {
        let name = format!("vrampool/{}", strategy_name(kind));
        let config = PoolConfig { strategy: kind, ..PoolConfig::default() };
        match Pool::new(dev.clone() as Arc<dyn Device>, config) {
            Ok(pool) => {
                let mut a = PoolAllocator(pool);
                cell(&mut cells, &name, &mut a);
                let stats = a.0.stats();
                notes.push(format!(
                    "{name}: {} device allocations, {} fast-path hits, peak reserved {} B",
                    stats.num_device_alloc, stats.fast_path_hits, stats.reserved_bytes.peak
                ));
                if let Err(e) = a.0.empty_cache() {
                    notes.push(format!("{name}: empty_cache failed: {e}"));
                }
            }
            Err(e) => notes.push(format!("{name}: no pool: {e}")),
        }
    }

    cell(&mut cells, "cuMemAlloc", &mut DriverAllocator);

    match async_setup(dev) {
        Ok((stream, restore)) => {
            cell(&mut cells, "cuMemAllocAsync", &mut AsyncAllocator { stream: stream.0 });
            restore();
            let _ = dev.destroy_stream(stream);
        }
        Err(e) => notes.push(format!("cuMemAllocAsync: skipped: {e}")),
    }
    (cells, notes)
}

/// A stream for the async allocator, and a closure that puts the default pool's release
/// threshold back (and trims the pool) when done.
fn async_setup(dev: &Arc<CudaDevice>) -> Result<(StreamId, impl FnOnce()), DeviceError> {
    let needed = [
        "cuMemAllocAsync",
        "cuMemFreeAsync",
        "cuDeviceGetDefaultMemPool",
        "cuMemPoolSetAttribute",
        "cuMemPoolGetAttribute",
        "cuMemPoolTrimTo",
    ];
    if let Some(missing) = needed.iter().find(|n| !has_symbol(n)) {
        return Err(DeviceError::Driver(format!("driver has no {missing}")));
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes one pool handle; the device handle is the device's own.
    check(unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev.cu_device()) }, "cuDeviceGetDefaultMemPool")?;
    let threshold = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    let mut old: u64 = 0;
    // SAFETY: the release threshold is a u64, read into a local.
    check(unsafe { sys::cuMemPoolGetAttribute(pool, threshold, &mut old as *mut u64 as *mut std::ffi::c_void) }, "cuMemPoolGetAttribute")?;
    let mut max = u64::MAX;
    // SAFETY: the release threshold is a u64, read from a local.
    check(unsafe { sys::cuMemPoolSetAttribute(pool, threshold, &mut max as *mut u64 as *mut std::ffi::c_void) }, "cuMemPoolSetAttribute")?;
    let stream = dev.create_stream()?;
    let pool_handle = pool as usize;
    let restore = move || {
        let pool = pool_handle as sys::CUmemoryPool;
        let mut old = old;
        // SAFETY: the default pool lives as long as the context; the value is a u64 local.
        let _ = unsafe { sys::cuMemPoolSetAttribute(pool, threshold, &mut old as *mut u64 as *mut std::ffi::c_void) };
        // SAFETY: as above; gives the pool's cached memory back.
        let _ = unsafe { sys::cuMemPoolTrimTo(pool, 0) };
    };
    Ok((stream, restore))
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn to_json(dev: &CudaDevice, args: &Args, cells: &[Cell], notes: &[String], seconds: f64) -> String {
    let mut j = String::new();
    let _ = writeln!(j, "{{");
    let _ = writeln!(j, "  \"benchmark\": \"alloc+free pair latency\",");
    let _ = writeln!(j, "  \"unit\": \"ns per alloc+free pair\",");
    let _ = writeln!(j, "  \"statistic\": \"median over runs; min and max over runs too\",");
    let _ = writeln!(
        j,
        "  \"device\": {{\"name\": {}, \"ordinal\": {}, \"total_bytes\": {}, \"driver_version\": {}, \"vm_granularity\": {}}},",
        json_str(dev.name()),
        dev.ordinal(),
        dev.total_memory(),
        CudaDevice::driver_version().unwrap_or(0),
        dev.vm_granularity().map_or("null".to_string(), |g| g.to_string()),
    );
    let _ = writeln!(j, "  \"runs\": {},", args.runs);
    let _ = writeln!(j, "  \"target_run_ms\": {},", args.run_time.as_millis());
    let _ = writeln!(j, "  \"batch\": {BATCH},");
    let _ = writeln!(j, "  \"seconds\": {seconds:.2},");
    let _ = writeln!(j, "  \"results\": [");
    for (i, c) in cells.iter().enumerate() {
        let comma = if i + 1 < cells.len() { "," } else { "" };
        let head = format!("\"allocator\": {}, \"pattern\": {}, \"size\": {}", json_str(&c.allocator), json_str(c.pattern), c.size);
        match &c.outcome {
            Ok(t) => {
                let _ = writeln!(
                    j,
                    "    {{{head}, \"pairs_per_run\": {}, \"median_ns\": {:.1}, \"min_ns\": {:.1}, \"max_ns\": {:.1}}}{comma}",
                    t.pairs_per_run, t.median_ns, t.min_ns, t.max_ns
                );
            }
            Err(e) => {
                let _ = writeln!(j, "    {{{head}, \"error\": {}}}{comma}", json_str(e));
            }
        }
    }
    let _ = writeln!(j, "  ],");
    let notes: Vec<String> = notes.iter().map(|n| json_str(n)).collect();
    let _ = writeln!(j, "  \"notes\": [{}]", notes.join(", "));
    let _ = writeln!(j, "}}");
    j
}

fn table(cells: &[Cell]) -> String {
    let mut t = format!("{:<24} {:<8}", "allocator", "pattern");
    for size in SIZES {
        let _ = write!(t, " {:>12}", human(size));
    }
    t.push('\n');
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for row in cells.iter().map(|c| (c.allocator.as_str(), c.pattern)) {
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    for (allocator, pattern) in rows {
        let _ = write!(t, "{allocator:<24} {pattern:<8}");
        for size in SIZES {
            let cell = cells.iter().find(|c| c.allocator == allocator && c.pattern == pattern && c.size == size);
            let text = match cell.map(|c| &c.outcome) {
                Some(Ok(timing)) => format!("{:.0} ns", timing.median_ns),
                Some(Err(_)) => "error".to_string(),
                None => "-".to_string(),
            };
            let _ = write!(t, " {text:>12}");
        }
        t.push('\n');
    }
    t
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn write_out(args: &Args, text: &str) {
    match &args.out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("gpu_bench: cannot write {path}: {e}");
                std::process::exit(1);
            }
        }
        None => print!("{text}"),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            std::process::exit(2);
        }
    };
    let dev = match CudaDevice::new(0) {
        Ok(dev) => Arc::new(dev),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            write_out(&args, &format!("{{\"skipped\": {}}}\n", json_str(&e.to_string())));
            std::process::exit(3);
        }
    };
    if let Err(e) = dev.bind_to_thread() {
        eprintln!("gpu_bench: {e}");
        std::process::exit(1);
    }
    eprintln!("gpu_bench: {dev:?}, {} runs per cell", args.runs);
    let start = Instant::now();
    let (cells, notes) = bench_all(&dev, &args);
    let seconds = start.elapsed().as_secs_f64();
    eprint!("{}", table(&cells));
    for note in &notes {
        eprintln!("note: {note}");
    }
    write_out(&args, &to_json(&dev, &args, &cells, &notes, seconds));
    let failed = cells.iter().filter(|c| c.outcome.is_err()).count();
    for c in cells.iter().filter(|c| c.outcome.is_err()) {
        eprintln!("error: {} {} {}: {}", c.allocator, c.pattern, c.size, c.outcome.as_ref().err().unwrap_or(&String::new()));
    }
    if failed > 0 {
        eprintln!("gpu_bench: {failed} cell(s) failed");
        std::process::exit(1);
    }
}
