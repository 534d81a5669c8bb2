//! The C ABI path that PyTorch's pluggable allocator calls (`vrampool_malloc` / `vrampool_free`,
//! as the module exports them), timed natively with no Python in the loop, on the simulated
//! device (`device:sim`) at `steady:true` (the default) and `steady:false`.
//!
//! Workloads (on device 0, stream null unless named; the free passes the size, as PyTorch does):
//! - `pair`: a 512 B malloc + free, repeated;
//! - `step`: a repeating step of 200 buffers of 512 B..4 MiB (a fixed list), each freed three
//!   allocations later, so that every step ends with nothing live;
//! - `random`: 64 live buffers; each op frees a random one and allocates 512 B..1 MiB, from an
//!   LCG whose sequence never repeats;
//! - each on two threads at once (each its own loop) against one: the ratio of throughputs (2.0
//!   is perfect scaling), beside the same ratio for the core pool's and glibc's 512 B pairs, and
//!   the median of each turn's ratio over glibc's in that turn (below 1.0 where the second
//!   thread costs more than the machine's own loss); step and random also with each thread on a
//!   stream of its own.
//!
//! Each is timed in turns alternating with two references, as `benches/pair_ratio.rs` does (this
//! machine's speed drifts): the core pool's own 512 B pair (`vrampool_core::Pool` on a
//! `SimDevice`) and glibc's `malloc` + `free` 512 B pair. The table gives median turns (ns per
//! alloc + free) and the medians of the turns' ratios. The configuration is process-global, so
//! each steady setting runs in a child process (this binary re-executed with `--child true|false`)
//! that times its own references.
//!
//! Run: `cargo run --release -p vrampool-py --example c_abi_bench` (add `-- --quick` for a few
//! seconds' smoke test, `-- --only step` for the rows whose name begins so).

use std::ffi::{c_char, c_int, c_void, CString};
use std::hint::black_box;
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

// Links the module's rlib, whose exported entries the declarations below resolve to.
use _native as _;
use vrampool_core::{Device, Pool, PoolConfig, SimDevice, SimMode, StreamId};

extern "C" {
    fn vrampool_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void;
    fn vrampool_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void);
    fn vrampool_configure(text: *const c_char) -> c_int;
    fn vrampool_last_error(buffer: *mut c_char, capacity: usize) -> usize;
    fn malloc(size: usize) -> *mut c_void;
    fn free(ptr: *mut c_void);
}

const PAIR: usize = 512;
const STEP_BUFFERS: usize = 200;
const LIVE: usize = 64;

fn last_error() -> String {
    let mut buffer = [0u8; 1024];
    // SAFETY: the buffer has the capacity passed.
    unsafe { vrampool_last_error(buffer.as_mut_ptr().cast(), buffer.len()) };
    String::from_utf8_lossy(buffer.split(|&b| b == 0).next().unwrap_or_default()).into_owned()
}

/// A stream handle: null (the default stream), or any other value on the simulated device.
type Stream = *mut c_void;

#[inline(always)]
fn abi_malloc(size: usize, stream: Stream) -> *mut c_void {
    // SAFETY: the exported entry.
    let ptr = unsafe { vrampool_malloc(black_box(size), 0, stream) };
    assert!(!ptr.is_null(), "vrampool_malloc({size}): {}", last_error());
    ptr
}

#[inline(always)]
fn abi_free(ptr: *mut c_void, size: usize, stream: Stream) {
    // SAFETY: `ptr` is a live block of `size` bytes from `abi_malloc` on `stream`.
    unsafe { vrampool_free(black_box(ptr), size, 0, stream) }
}

/// Knuth's MMIX LCG: a period of 2^64, so a run never sees its sequence repeat.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }

    /// A size in [512 B, 2^max_log2 B): a power of two drawn evenly, plus up to as much again, so
    /// that small and large buffers are about equally common, as in a model's step.
    fn size(&mut self, max_log2: u64) -> usize {
        let base = 1usize << (9 + self.next() % (max_log2 - 9));
        base + (self.next() as usize) % base
    }
}

/// Something timed: `run(n)` does `n` alloc + free pairs.
trait Work {
    fn run(&mut self, n: u32);
}

struct AbiPair;

impl Work for AbiPair {
    fn run(&mut self, n: u32) {
        for _ in 0..n {
            abi_free(abi_malloc(PAIR, null_mut()), PAIR, null_mut());
        }
    }
}

struct Step {
    sizes: Vec<usize>,
    ptrs: Vec<*mut c_void>,
    stream: Stream,
}

impl Step {
    fn new(stream: Stream) -> Self {
        let mut rng = Lcg(42);
        Self { sizes: (0..STEP_BUFFERS).map(|_| rng.size(22)).collect(), ptrs: vec![null_mut(); STEP_BUFFERS], stream }
    }
}

impl Work for Step {
    /// `n / 200` steps.
    fn run(&mut self, n: u32) {
        for _ in 0..n as usize / STEP_BUFFERS {
            for i in 0..STEP_BUFFERS {
                self.ptrs[i] = abi_malloc(self.sizes[i], self.stream);
                if i >= 3 {
                    abi_free(self.ptrs[i - 3], self.sizes[i - 3], self.stream);
                }
            }
            for i in STEP_BUFFERS - 3..STEP_BUFFERS {
                abi_free(self.ptrs[i], self.sizes[i], self.stream);
            }
        }
    }
}

struct Random {
    rng: Lcg,
    live: Vec<(*mut c_void, usize)>,
    stream: Stream,
}

impl Random {
    fn new(seed: u64, stream: Stream) -> Self {
        let mut rng = Lcg(seed);
        let live = (0..LIVE).map(|_| rng.size(20)).map(|size| (abi_malloc(size, stream), size)).collect();
        Self { rng, live, stream }
    }
}

impl Work for Random {
    fn run(&mut self, n: u32) {
        for _ in 0..n {
            let slot = &mut self.live[self.rng.next() as usize % LIVE];
            abi_free(slot.0, slot.1, self.stream);
            let size = self.rng.size(20);
            *slot = (abi_malloc(size, self.stream), size);
        }
    }
}

impl Drop for Random {
    fn drop(&mut self) {
        self.live.iter().for_each(|&(ptr, size)| abi_free(ptr, size, self.stream));
    }
}

struct CorePair(Arc<Pool>);

impl Work for CorePair {
    fn run(&mut self, n: u32) {
        for _ in 0..n {
            let addr = self.0.allocate(black_box(PAIR as u64), StreamId(0)).unwrap();
            self.0.free(black_box(addr), None, None).unwrap();
        }
    }
}

struct GlibcPair;

impl Work for GlibcPair {
    fn run(&mut self, n: u32) {
        for _ in 0..n {
            // SAFETY: glibc's malloc and free of one block.
            unsafe {
                let ptr = malloc(black_box(PAIR));
                assert!(!ptr.is_null());
                free(black_box(ptr));
            }
        }
    }
}

fn ns_per_op(work: &mut dyn Work, n: u32) -> f64 {
    let t = Instant::now();
    work.run(n);
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Median turns of `work`, the core pool's pair and glibc's pair, and the medians of the turns'
/// ratios `work / glibc` and `work / core`.
fn interleaved(work: &mut dyn Work, core: &mut CorePair, turns: usize, n: u32) -> [f64; 5] {
    // Warm-up: the steady arena has seen the step by the first turn.
    work.run(n);
    core.run(n);
    GlibcPair.run(n);
    let mut samples: [Vec<f64>; 5] = Default::default();
    for _ in 0..turns {
        let (w, c, g) = (ns_per_op(work, n), ns_per_op(core, n), ns_per_op(&mut GlibcPair, n));
        for (sample, value) in samples.iter_mut().zip([w, c, g, w / g, w / c]) {
            sample.push(value);
        }
    }
    samples.map(median)
}

type Make<'a> = &'a (dyn Fn(u64) -> Box<dyn Work> + Sync);

/// For each work, each turn's (ops/s on two threads) / (ops/s on one): a turn times `n` ops on
/// this thread alone, then `n` ops on each of two threads at once.
fn scaling(makes: &[Make], turns: usize, n: u32) -> Vec<Vec<f64>> {
    let barrier = Barrier::new(2);
    thread::scope(|s| {
        s.spawn(|| {
            let mut works: Vec<_> = makes.iter().map(|make| make(2)).collect();
            works.iter_mut().for_each(|w| w.run(n));
            for _ in 0..turns {
                for w in &mut works {
                    barrier.wait();
                    w.run(n);
                    barrier.wait();
                }
            }
        });
        let mut works: Vec<_> = makes.iter().map(|make| make(1)).collect();
        works.iter_mut().for_each(|w| w.run(n));
        let mut ratios = vec![Vec::new(); works.len()];
        for _ in 0..turns {
            for (w, ratio) in works.iter_mut().zip(&mut ratios) {
                let one = ns_per_op(w.as_mut(), n);
                // The two-thread time includes a barrier's wake-up (tens of µs): `n` is large
                // enough that a turn lasts milliseconds.
                barrier.wait();
                let t = Instant::now();
                w.run(n);
                barrier.wait();
                let two = t.elapsed().as_nanos() as f64 / f64::from(n);
                ratio.push(2.0 * one / two);
            }
        }
        ratios
    })
}

/// One steady setting, in this process: prints a tab-separated row per workload for the parent.
fn child(steady: &str, quick: bool, only: Option<&str>) {
    let text = CString::new(format!("device:sim,steady:{steady}")).unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { vrampool_configure(text.as_ptr()) }, 0, "vrampool_configure: {}", last_error());
    let (turns, n) = if quick { (10, 2_000) } else { (200, 20_000) };
    let pool =
        Arc::new(Pool::new(Arc::new(SimDevice::new(1 << 36, SimMode::AddressOnly)) as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let mut core = CorePair(pool.clone());
    let wanted = |name: &str| only.is_none_or(|only| name.starts_with(only));
    let works: [(&str, Make); 3] = [
        ("pair", &|_| Box::new(AbiPair)),
        ("step", &|_| Box::new(Step::new(null_mut()))),
        ("random", &|seed| Box::new(Random::new(seed, null_mut()))),
    ];
    for (name, make) in works.into_iter().filter(|(name, _)| wanted(name)) {
        let values = interleaved(&mut *make(7), &mut core, turns, n);
        println!("{name}\t{}", values.map(|v| v.to_string()).join("\t"));
    }
    let core_pair = |_: u64| Box::new(CorePair(pool.clone())) as Box<dyn Work>;
    let glibc_pair = |_: u64| Box::new(GlibcPair) as Box<dyn Work>;
    let abi_pair = |_: u64| Box::new(AbiPair) as Box<dyn Work>;
    let random = |seed: u64| Box::new(Random::new(seed, null_mut())) as Box<dyn Work>;
    let step = |_: u64| Box::new(Step::new(null_mut())) as Box<dyn Work>;
    // The two threads make their works with seeds 1 and 2: a stream each.
    let own_stream = |seed: u64| (seed * 16) as Stream;
    let random_streams = |seed: u64| Box::new(Random::new(seed, own_stream(seed))) as Box<dyn Work>;
    let step_streams = |seed: u64| Box::new(Step::new(own_stream(seed))) as Box<dyn Work>;
    let rows: [(&str, Make); 5] = [
        ("pair, 2 threads", &abi_pair),
        ("step, 2 threads", &step),
        ("random, 2 threads", &random),
        ("step, 2 threads, 2 streams", &step_streams),
        ("random, 2 threads, 2 streams", &random_streams),
    ];
    for (name, make) in rows.into_iter().filter(|(name, _)| wanted(name)) {
        let r = scaling(&[make, &core_pair, &glibc_pair], turns / 4, 10 * n);
        // A turn where the machine gave the second thread less than a core shows in glibc's
        // scaling of the same turn.
        let against_glibc = median(r[0].iter().zip(&r[2]).map(|(w, g)| w / g).collect());
        let [w, c, g] = [0, 1, 2].map(|i| median(r[i].clone()));
        println!("{name}\t{w}\t{c}\t{g}\t{against_glibc}\tNaN");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args.iter().position(|a| a == "--only").map(|i| args[i + 1].clone());
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(&args[i + 1], quick, only.as_deref());
    }
    let runs: Vec<Vec<(String, Vec<f64>)>> = ["true", "false"]
        .iter()
        .map(|steady| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command.args(["--child", steady]).args(quick.then_some("--quick")).stderr(Stdio::inherit());
            if let Some(only) = &only {
                command.args(["--only", only]);
            }
            let out = command.output().expect("the child runs");
            assert!(out.status.success(), "the steady:{steady} child failed: {}", out.status);
            let parse = |line: &str| {
                let mut fields = line.split('\t');
                (fields.next().unwrap().to_string(), fields.map(|f| f.parse().unwrap()).collect())
            };
            String::from_utf8(out.stdout).unwrap().lines().map(parse).collect()
        })
        .collect();
    println!(
        "ns per alloc + free (median turn); ratios: medians of per-turn ratios in one process; a / b: the steady on / steady:false run's"
    );
    println!(
        "2-thread rows: (ops/s on 2 threads) / (ops/s on 1), median over turns; in the ÷ glibc columns, the median of each turn's scaling over glibc's pair's scaling in the same turn"
    );
    println!();
    println!(
        "| workload | steady on | steady:false | core pool pair | glibc pair | on ÷ glibc | false ÷ glibc | on ÷ core | false ÷ core |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for ((name, on), (_, off)) in runs[0].iter().zip(&runs[1]) {
        if name.contains("threads") {
            println!(
                "| {name} | {:.2}x | {:.2}x | {:.2}x / {:.2}x | {:.2}x / {:.2}x | {:.2} | {:.2} | | |",
                on[0], off[0], on[1], off[1], on[2], off[2], on[3], off[3]
            );
        } else {
            println!(
                "| {name} | {:.1} ns | {:.1} ns | {:.1} / {:.1} ns | {:.1} / {:.1} ns | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
                on[0], off[0], on[1], off[1], on[2], off[2], on[3], off[3], on[4], off[4]
            );
        }
    }
}
