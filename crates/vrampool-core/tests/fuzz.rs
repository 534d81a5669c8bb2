//! Fuzzing the pool by long proptest runs (the stable toolchain has no `cargo fuzz`): random
//! sequences of alloc / free / bad frees / trim / record_stream / event completion, for every
//! strategy, on a host-backed device. Every live block carries a tag checked at its free, and
//! the invariants are checked after every operation.
//!
//! The seeds in `tests/fuzz-corpus/*.txt` are replayed first, then the failing cases proptest
//! kept in `tests/fuzz.proptest-regressions` (commit that file), then `VRAMPOOL_FUZZ_CASES` random
//! sequences per strategy (default 32: a few seconds in a debug build) drawn from one run seed,
//! which a failure prints: `VRAMPOOL_FUZZ_SEED=N` draws the same sequences again.
//! `cargo test --release -p vrampool-core --test fuzz -- --nocapture` prints the figures.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use proptest::test_runner::{TestCaseError, TestError};
use vrampool_core::sizes::{MAX_REQUEST, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{Device, InvalidFreeReason, Pool, PoolConfig, PoolError, SimDevice, SimMode, StreamId};

const ALL: [StrategyKind; 4] = [StrategyKind::Hybrid, StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy];
/// Small enough that the largest requests run it out of memory.
const CAPACITY: u64 = 256 * MIB;
const STREAMS: u64 = 3;

mod op {
    use std::fmt;

    use proptest::prelude::*;
    use vrampool_core::sizes::MIB;

    /// One step. Blocks are named by their index among the live ones, in address order
    /// (modulo the count), so that any sequence applies to any state.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Op {
        Alloc {
            size: u64,
            stream: u64,
        },
        /// Frees a live block; `by` names the stream that used it last, when not its own.
        Free {
            nth: usize,
            by: Option<u64>,
        },
        /// Frees one of the recently freed addresses again.
        DoubleFree {
            nth: usize,
        },
        /// Frees a live block naming a size it was not allocated with.
        FreeWrongSize {
            nth: usize,
        },
        /// Frees (and records a stream on) an address inside a live block, past its start.
        FreeInterior {
            nth: usize,
            offset: u64,
        },
        /// Frees an arbitrary address.
        FreeForeign {
            addr: u64,
        },
        /// Frees the block another pool on the same device handed out.
        FreeOtherPools,
        RecordStream {
            nth: usize,
            stream: u64,
        },
        CompleteStream {
            stream: u64,
        },
        CompleteAll,
        Trim,
    }

    impl fmt::Display for Op {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Op::Alloc { size, stream } => write!(f, "alloc {size} {stream}"),
                Op::Free { nth, by: None } => write!(f, "free {nth}"),
                Op::Free { nth, by: Some(by) } => write!(f, "free {nth} by {by}"),
                Op::DoubleFree { nth } => write!(f, "double_free {nth}"),
                Op::FreeWrongSize { nth } => write!(f, "free_wrong_size {nth}"),
                Op::FreeInterior { nth, offset } => write!(f, "free_interior {nth} {offset}"),
                Op::FreeForeign { addr } => write!(f, "free_foreign {addr:#x}"),
                Op::FreeOtherPools => write!(f, "free_other_pools"),
                Op::RecordStream { nth, stream } => write!(f, "record {nth} {stream}"),
                Op::CompleteStream { stream } => write!(f, "complete {stream}"),
                Op::CompleteAll => write!(f, "complete_all"),
                Op::Trim => write!(f, "trim"),
            }
        }
    }

    /// Parses one corpus line (the format `Display` writes); blank lines and `#` comments are None.
    pub fn parse(line: &str) -> Result<Option<Op>, String> {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            return Ok(None);
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            let w = words.get(i).ok_or_else(|| format!("`{line}`: missing argument {i}"))?;
            let parsed = match w.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => w.parse(),
            };
            parsed.map_err(|e| format!("`{line}`: `{w}`: {e}"))
        };
        let nth = |i: usize| num(i).map(|n| n as usize);
        let op = match (words[0], words.len()) {
            ("alloc", 3) => Op::Alloc { size: num(1)?, stream: num(2)? },
            ("free", 2) => Op::Free { nth: nth(1)?, by: None },
            ("free", 4) if words[2] == "by" => Op::Free { nth: nth(1)?, by: Some(num(3)?) },
            ("double_free", 2) => Op::DoubleFree { nth: nth(1)? },
            ("free_wrong_size", 2) => Op::FreeWrongSize { nth: nth(1)? },
            ("free_interior", 3) => Op::FreeInterior { nth: nth(1)?, offset: num(2)? },
            ("free_foreign", 2) => Op::FreeForeign { addr: num(1)? },
            ("free_other_pools", 1) => Op::FreeOtherPools,
            ("record", 3) => Op::RecordStream { nth: nth(1)?, stream: num(2)? },
            ("complete", 2) => Op::CompleteStream { stream: num(1)? },
            ("complete_all", 1) => Op::CompleteAll,
            ("trim", 1) => Op::Trim,
            _ => return Err(format!("`{line}`: unknown operation")),
        };
        Ok(Some(op))
    }

    /// Sizes across every tier (slab, best fit, buddy), powers of two and their neighbours
    /// (the edges of size classes), the odd size that cannot fit, and the invalid ones.
    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![
            30 => 1u64..4096,
            20 => 4096u64..MIB,
            15 => MIB..(40 * MIB),
            4 => (40 * MIB)..(200 * MIB),
            10 => (9u32..28, -1i64..=1).prop_map(|(p, d)| ((1i64 << p) + d) as u64),
            1 => Just(0u64),
            1 => Just(u64::MAX),
            1 => (300 * MIB)..(1u64 << 40),
        ]
    }

    pub fn op() -> impl Strategy<Value = Op> {
        let stream = 0..super::STREAMS;
        prop_oneof![
            30 => (size(), stream.clone()).prop_map(|(size, stream)| Op::Alloc { size, stream }),
            20 => (any::<usize>(), prop::option::weighted(0.25, stream.clone())).prop_map(|(nth, by)| Op::Free { nth, by }),
            3 => any::<usize>().prop_map(|nth| Op::DoubleFree { nth }),
            2 => any::<usize>().prop_map(|nth| Op::FreeWrongSize { nth }),
            2 => (any::<usize>(), 1u64..4096).prop_map(|(nth, offset)| Op::FreeInterior { nth, offset }),
            2 => any::<u64>().prop_map(|addr| Op::FreeForeign { addr }),
            1 => Just(Op::FreeOtherPools),
            6 => (any::<usize>(), stream.clone()).prop_map(|(nth, stream)| Op::RecordStream { nth, stream }),
            4 => stream.prop_map(|stream| Op::CompleteStream { stream }),
            2 => Just(Op::CompleteAll),
            3 => Just(Op::Trim),
        ]
    }
}

mod harness {
    use super::*;
    use op::Op;

    /// A live block as the test knows it.
    #[derive(Debug, Clone)]
    struct Live {
        requested: u64,
        /// The block's real size, as the pool reported it when handing it out.
        size: u64,
        stream: u64,
        tag: u64,
        /// Other streams that used it (`record_stream`).
        users: Vec<u64>,
    }

    /// A freed block whose reuse waits for other streams: `[addr, addr + size)` may not be handed
    /// out again until every stream in `waits_for` has completed its work.
    #[derive(Debug)]
    struct Pending {
        addr: u64,
        size: u64,
        waits_for: Vec<u64>,
    }

    /// What an operation that must fail may not change.
    #[derive(Debug, PartialEq, Eq)]
    struct Observable {
        allocated: u64,
        requested: u64,
        reserved: u64,
        blocks: u64,
        device_used: u64,
        live: Vec<(u64, u64)>,
    }

    pub struct Harness {
        dev: Arc<SimDevice>,
        pool: Pool,
        /// Another pool on the same device, holding one block: a pointer foreign to `pool`.
        other: Pool,
        other_block: u64,
        live: BTreeMap<u64, Live>,
        recently_freed: Vec<u64>,
        pending: Vec<Pending>,
        next_tag: u64,
        pub ops: u64,
    }

    type Step = Result<(), TestCaseError>;

    macro_rules! ensure {
        ($cond:expr, $($msg:tt)+) => {
            if !$cond {
                return Err(TestCaseError::fail(format!($($msg)+)));
            }
        };
    }

    impl Harness {
        pub fn new(strategy: StrategyKind, expandable: bool) -> Self {
            let dev = Arc::new(SimDevice::new(CAPACITY, SimMode::HostBacked));
            dev.set_auto_complete(false);
            let config = PoolConfig { strategy, expandable, ..PoolConfig::default() };
            let pool = Pool::new(dev.clone() as Arc<dyn Device>, config.clone()).unwrap();
            let other = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
            let other_block = other.allocate(4096, StreamId(0)).unwrap();
            Harness {
                dev,
                pool,
                other,
                other_block,
                live: BTreeMap::new(),
                recently_freed: Vec::new(),
                pending: Vec::new(),
                next_tag: 1,
                ops: 0,
            }
        }

        pub fn run(&mut self, ops: &[Op]) -> Step {
            for (i, op) in ops.iter().enumerate() {
                self.apply(op).map_err(|e| TestCaseError::fail(format!("op {i} `{op}`: {e}")))?;
                self.note_syncs();
                self.check().map_err(|e| TestCaseError::fail(format!("after op {i} `{op}`: {e}")))?;
                self.ops += 1;
            }
            self.finish()
        }

        fn nth_live(&self, nth: usize) -> Option<(u64, Live)> {
            let n = self.live.len();
            (n > 0).then(|| self.live.iter().nth(nth % n).map(|(&a, b)| (a, b.clone())).expect("in range"))
        }

        /// A stream the pool waited for (before giving memory back) has passed its work.
        fn note_syncs(&mut self) {
            for stream in self.dev.take_synced_streams() {
                self.complete(Some(stream.0));
            }
        }

        fn complete(&mut self, stream: Option<u64>) {
            match stream {
                Some(s) => self.dev.complete_stream(StreamId(s)),
                None => self.dev.complete_all(),
            }
            for p in &mut self.pending {
                p.waits_for.retain(|&w| stream.is_some_and(|s| s != w));
            }
            self.pending.retain(|p| !p.waits_for.is_empty());
        }

        fn block_size(&self, addr: u64) -> u64 {
            self.pool.live_blocks().iter().find(|b| b.addr == addr).map_or(0, |b| b.size)
        }

        fn observe(&self) -> Observable {
            let s = self.pool.stats();
            Observable {
                allocated: s.allocated_bytes.current,
                requested: s.requested_bytes.current,
                reserved: s.reserved_bytes.current,
                blocks: s.allocation.current,
                device_used: self.dev.counters().used,
                live: self.pool.live_blocks().iter().map(|b| (b.addr, b.size)).collect(),
            }
        }

        /// Runs a call that must be refused as an invalid free, changing nothing.
        fn refused(&self, what: &str, call: impl FnOnce(&Pool) -> Result<(), PoolError>) -> Step {
            let before = self.observe();
            match call(&self.pool) {
                Err(PoolError::InvalidFree { .. }) => {}
                other => return Err(TestCaseError::fail(format!("{what}: expected an invalid-free error, got {other:?}"))),
            }
            ensure!(self.observe() == before, "{what} changed the pool");
            Ok(())
        }

        fn apply(&mut self, op: &Op) -> Step {
            match *op {
                Op::Alloc { size, stream } => self.alloc(size, stream)?,
                Op::Free { nth, by } => {
                    let Some((addr, block)) = self.nth_live(nth) else { return Ok(()) };
                    let size = block.size;
                    let tag = block.tag.to_le_bytes();
                    for at in [addr, addr + size.max(8) - 8] {
                        ensure!(
                            self.dev.read(at, 8).map_err(|e| TestCaseError::fail(e.to_string()))? == tag,
                            "block {addr:#x} ({size} B) was overwritten while live"
                        );
                    }
                    self.pool.free(addr, Some(block.requested), by.map(StreamId)).map_err(|e| TestCaseError::fail(format!("free: {e}")))?;
                    self.live.remove(&addr);
                    self.recently_freed.push(addr);
                    let mut waits_for = block.users;
                    waits_for.extend(by.filter(|&s| s != block.stream && !waits_for.contains(&s)));
                    if !waits_for.is_empty() {
                        self.pending.push(Pending { addr, size, waits_for });
                    }
                }
                Op::DoubleFree { nth } => {
                    if self.recently_freed.is_empty() {
                        return Ok(());
                    }
                    let addr = self.recently_freed[nth % self.recently_freed.len()];
                    if !self.live.contains_key(&addr) {
                        self.refused("double free", |p| p.free(addr, None, None))?;
                    }
                }
                Op::FreeWrongSize { nth } => {
                    let Some((addr, block)) = self.nth_live(nth) else { return Ok(()) };
                    let wrong = block.size + 1;
                    let before = self.observe();
                    match self.pool.free(addr, Some(wrong), None) {
                        Err(PoolError::InvalidFree { reason: InvalidFreeReason::WrongSize { expected, given }, .. }) => {
                            ensure!(expected == block.requested && given == wrong, "wrong-size error names {expected} and {given}");
                        }
                        other => return Err(TestCaseError::fail(format!("wrong-size free: got {other:?}"))),
                    }
                    ensure!(self.observe() == before, "a wrong-size free changed the pool");
                }
                Op::FreeInterior { nth, offset } => {
                    let Some((addr, block)) = self.nth_live(nth) else { return Ok(()) };
                    let inside = addr + offset % block.size.max(2).saturating_sub(1) + 1;
                    self.refused("interior free", |p| p.free(inside, None, None))?;
                    self.refused("interior record_stream", |p| p.record_stream(inside, StreamId(1)))?;
                }
                Op::FreeForeign { addr } => {
                    if !self.live.contains_key(&addr) {
                        self.refused("foreign free", |p| p.free(addr, None, None))?;
                    }
                }
                Op::FreeOtherPools => {
                    let addr = self.other_block;
                    if !self.live.contains_key(&addr) {
                        let others_before = self.other.stats().allocated_bytes.current;
                        self.refused("free of another pool's block", |p| p.free(addr, None, None))?;
                        ensure!(self.other.stats().allocated_bytes.current == others_before, "the other pool changed");
                    }
                }
                Op::RecordStream { nth, stream } => {
                    let Some((addr, block)) = self.nth_live(nth) else { return Ok(()) };
                    self.pool.record_stream(addr, StreamId(stream)).map_err(|e| TestCaseError::fail(format!("record_stream: {e}")))?;
                    if stream != block.stream && !block.users.contains(&stream) {
                        self.live.get_mut(&addr).expect("live").users.push(stream);
                    }
                }
                Op::CompleteStream { stream } => self.complete(Some(stream)),
                Op::CompleteAll => self.complete(None),
                Op::Trim => {
                    self.pool.trim().map_err(|e| TestCaseError::fail(format!("trim: {e}")))?;
                }
            }
            Ok(())
        }

        fn alloc(&mut self, size: u64, stream: u64) -> Step {
            let live_before = self.observe().live;
            let allocated = self.pool.allocate(size, StreamId(stream));
            self.note_syncs();
            match allocated {
                Ok(addr) => {
                    ensure!(size != 0 && size <= CAPACITY, "{size} B handed out");
                    ensure!(!self.live.contains_key(&addr), "{addr:#x} handed out twice");
                    let block_size = self.block_size(addr);
                    if let Some(p) = self.pending.iter().find(|p| addr < p.addr + p.size && p.addr < addr + block_size) {
                        return Err(TestCaseError::fail(format!(
                            "{addr:#x} ({block_size} B) reuses {:#x} before streams {:?} passed its free",
                            p.addr, p.waits_for
                        )));
                    }
                    let tag = self.next_tag;
                    self.next_tag += 1;
                    let end = addr + block_size.max(8) - 8;
                    for at in [addr, end] {
                        self.dev
                            .write(at, &tag.to_le_bytes())
                            .map_err(|e| TestCaseError::fail(format!("block {addr:#x} is not device memory: {e}")))?;
                    }
                    self.live.insert(addr, Live { requested: size, size: block_size, stream, tag, users: Vec::new() });
                    self.recently_freed.retain(|&a| a != addr);
                }
                Err(PoolError::InvalidSize { .. }) => ensure!(size == 0 || size > MAX_REQUEST, "{size} B refused as invalid"),
                Err(PoolError::OutOfMemory(report)) => {
                    ensure!(report.requested == size, "the OOM report names {} B, not {size}", report.requested);
                    ensure!(self.observe().live == live_before, "an OOM changed the live blocks");
                }
                Err(e) => return Err(TestCaseError::fail(format!("alloc {size}: unexpected error {e}"))),
            }
            Ok(())
        }

        /// The invariants: live blocks are what the test holds and never overlap, the counters
        /// add up, and the device agrees on what is reserved.
        fn check(&self) -> Step {
            let blocks = self.pool.live_blocks();
            ensure!(blocks.len() == self.live.len(), "{} live blocks, the test holds {}", blocks.len(), self.live.len());
            let mut end = 0;
            for b in &blocks {
                let Some(mine) = self.live.get(&b.addr) else {
                    return Err(TestCaseError::fail(format!("{:#x} is live but was not handed out", b.addr)));
                };
                ensure!(
                    b.requested == mine.requested && b.size == mine.size && b.size >= b.requested,
                    "block {:#x}: {} B for {} requested",
                    b.addr,
                    b.size,
                    b.requested
                );
                ensure!(b.addr >= end, "block {:#x} overlaps the one before (ending at {end:#x})", b.addr);
                end = b.addr + b.size;
            }
            let s = self.pool.stats();
            ensure!(
                s.allocated_bytes.current == blocks.iter().map(|b| b.size).sum::<u64>(),
                "allocated {} != sum of live sizes",
                s.allocated_bytes.current
            );
            ensure!(s.requested_bytes.current == self.live.values().map(|b| b.requested).sum::<u64>(), "requested bytes disagree");
            ensure!(s.allocation.current == blocks.len() as u64, "allocation count disagrees");
            ensure!(s.allocated_bytes.current <= s.reserved_bytes.current, "allocated above reserved");
            let other_reserved = self.other.stats().reserved_bytes.current;
            ensure!(
                s.reserved_bytes.current + other_reserved == self.dev.counters().used,
                "reserved {} + {other_reserved} != device used {}",
                s.reserved_bytes.current,
                self.dev.counters().used
            );
            Ok(())
        }

        /// Frees everything, lets every stream pass, trims: the device must be back to the other
        /// pool's one segment, with no event left.
        fn finish(&mut self) -> Step {
            for (addr, block) in std::mem::take(&mut self.live) {
                self.pool.free(addr, Some(block.requested), None).map_err(|e| TestCaseError::fail(format!("final free: {e}")))?;
            }
            self.complete(None);
            self.pool.trim().map_err(|e| TestCaseError::fail(format!("final trim: {e}")))?;
            let s = self.pool.stats();
            ensure!(
                (s.allocated_bytes.current, s.active_bytes.current, s.reserved_bytes.current) == (0, 0, 0),
                "after freeing everything and trim: {s:?}"
            );
            self.other.free(self.other_block, None, None).map_err(|e| TestCaseError::fail(e.to_string()))?;
            self.other.trim().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let c = self.dev.counters();
            ensure!((c.used, c.live_segments) == (0, 0), "device memory leaked: {c:?}");
            ensure!(self.dev.live_events() == 0, "{} events leaked", self.dev.live_events());
            Ok(())
        }
    }
}

use harness::Harness;
use op::Op;

/// Random sequences per strategy, unless `VRAMPOOL_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u32 = 32;

fn corpus() -> Vec<(String, Vec<Op>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let ops = text
                .lines()
                .enumerate()
                .filter_map(|(i, line)| op::parse(line).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1)))
                .collect();
            (path.file_name().unwrap().to_string_lossy().into_owned(), ops)
        })
        .collect()
}

#[test]
fn corpus_seeds_pass_for_every_strategy() {
    let seeds = corpus();
    assert!(seeds.len() >= 3, "the corpus is in the repository");
    for (name, ops) in &seeds {
        for strategy in ALL {
            for expandable in [true, false] {
                if let Err(e) = Harness::new(strategy, expandable).run(ops) {
                    panic!("seed {name}, {strategy:?}, expandable={expandable}: {e}");
                }
            }
        }
    }
}

#[test]
fn corpus_format_round_trips() {
    let ops = [
        Op::Alloc { size: 4096, stream: 1 },
        Op::Free { nth: 3, by: Some(2) },
        Op::Free { nth: 0, by: None },
        Op::FreeForeign { addr: 0xdead_beef },
        Op::FreeInterior { nth: 1, offset: 8 },
        Op::Trim,
    ];
    for op in ops {
        assert_eq!(op::parse(&op.to_string()), Ok(Some(op.clone())));
    }
    assert_eq!(op::parse("  # a comment"), Ok(None));
    assert!(op::parse("alloc 12").is_err() && op::parse("malloc 1 2").is_err());
}

fn fuzz(strategy: StrategyKind) {
    use proptest::prelude::*;
    let seed = vrampool_fuzz::run_seed();
    let mut runner = vrampool_fuzz::runner(env!("CARGO_MANIFEST_DIR"), vrampool_fuzz::cases(DEFAULT_CASES), seed);
    let input = (any::<bool>(), prop::collection::vec(op::op(), 1..160));
    let started = Instant::now();
    let (sequences, ops) = (Cell::new(0u64), Cell::new(0u64));
    let result = runner.run(&input, |(expandable, seq)| {
        let mut harness = Harness::new(strategy, expandable);
        let outcome = harness.run(&seq);
        sequences.set(sequences.get() + 1);
        ops.set(ops.get() + harness.ops);
        outcome
    });
    match result {
        Ok(()) => {
            let (sequences, ops, secs) = (sequences.get(), ops.get(), started.elapsed().as_secs_f64());
            eprintln!("fuzz {strategy:?}: {sequences} sequences, {ops} operations in {secs:.1} s");
        }
        Err(TestError::Fail(why, (expandable, seq))) => {
            let lines: Vec<String> = seq.iter().map(ToString::to_string).collect();
            let minimal = format!("minimal sequence (a corpus seed):\n{}", lines.join("\n"));
            panic!("{}", vrampool_fuzz::failure_report(&format!("{strategy:?} expandable={expandable}"), &why, seed, &minimal));
        }
        Err(e) => panic!("{strategy:?}, run seed {seed}: {e}"),
    }
}

#[test]
fn fuzz_hybrid() {
    fuzz(StrategyKind::Hybrid);
}

#[test]
fn fuzz_slab() {
    fuzz(StrategyKind::Slab);
}

#[test]
fn fuzz_best_fit() {
    fuzz(StrategyKind::BestFit);
}

#[test]
fn fuzz_buddy() {
    fuzz(StrategyKind::Buddy);
}
