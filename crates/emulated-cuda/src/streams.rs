//! Contexts, streams and events. Each stream has a worker thread that does its work in order,
//! so asynchronous work really is pending when the call that queued it returns.
//!
//! Ordering follows CUDA: work on the legacy default stream waits for the work queued before
//! it on every blocking stream of the context (and theirs for the legacy stream's); streams
//! made with `CU_STREAM_NON_BLOCKING` skip that; the per-thread default stream is a blocking
//! stream of its own per host thread. `cuStreamWaitEvent` makes a stream wait for the work
//! before the event's record. Every such wait is work on the stream like any other, and moves
//! the stream's clock (see `race`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::abi::{self, CuResult};
use crate::race::{self, Access, Actor, Clock, Races};

/// The machine a stream's work runs on (the emulator): it does each memset, copy and kernel
/// against its memory, and its race check follows the work from queued to done.
pub trait Machine: Sync {
    fn races(&self) -> &Races;
    /// Does `work`, queued on `stream`, when the stream comes to it.
    fn execute(&self, stream: &Stream, work: &Work);
}

/// What a stream does.
pub enum Work {
    /// memset: `len` elements of `width` bytes at `dst`.
    Fill {
        dst: u64,
        count: u64,
        value: u32,
        width: u8,
    },
    Copy {
        dst: u64,
        src: u64,
        len: u64,
    },
    /// A copy from pageable host memory, staged when it was queued (as the driver stages it).
    CopyStaged {
        dst: u64,
        bytes: Vec<u8>,
    },
    /// The test-only kernel: sleeps `delay`, then fills `[dst, dst + len)` with `value`.
    Kernel {
        dst: u64,
        len: u64,
        value: u8,
        delay: Duration,
    },
    /// Waits until `on` has done its first `upto` pieces of work.
    Wait {
        on: Arc<Stream>,
        upto: u64,
    },
}

impl Work {
    fn name(&self) -> &'static str {
        match self {
            Work::Fill { .. } => "memset",
            Work::Copy { .. } | Work::CopyStaged { .. } => "copy",
            Work::Kernel { .. } => "kernel",
            Work::Wait { .. } => "wait",
        }
    }
}

struct Queued {
    work: Work,
    /// The race check's ids of its accesses.
    pending: Vec<u64>,
}

#[derive(Default)]
struct Progress {
    queue: VecDeque<Queued>,
    enqueued: u64,
    completed: u64,
    clock: Clock,
    worker: bool,
    destroyed: bool,
}

pub struct Stream {
    pub id: u64,
    pub label: String,
    pub device: i32,
    /// Synchronises with the legacy default stream.
    pub blocking: bool,
    pub legacy: bool,
    pub flags: u32,
    progress: Mutex<Progress>,
    changed: Condvar,
}

static NEXT_STREAM: AtomicU64 = AtomicU64::new(0x5700_0000_0010);

impl Stream {
    pub fn new(device: i32, flags: u32, legacy: bool, label: impl FnOnce(u64) -> String) -> Arc<Self> {
        let id = NEXT_STREAM.fetch_add(0x10, Relaxed);
        Arc::new(Self {
            id,
            label: label(id),
            device,
            blocking: flags & abi::STREAM_NON_BLOCKING == 0,
            legacy,
            flags,
            progress: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    /// (work queued so far, the stream's clock): what an event recorded now stands for.
    pub fn snapshot(&self) -> (u64, Clock) {
        let p = self.progress.lock();
        let mut clock = p.clock.clone();
        clock.insert(self.id, p.enqueued);
        (p.enqueued, clock)
    }

    pub fn is_idle(&self) -> bool {
        let p = self.progress.lock();
        p.completed == p.enqueued
    }

    /// Blocks until the first `upto` pieces of work are done.
    pub fn wait_for(&self, upto: u64) {
        let mut p = self.progress.lock();
        while p.completed < upto {
            self.changed.wait(&mut p);
        }
    }

    pub fn done_upto(&self, upto: u64) -> bool {
        self.progress.lock().completed >= upto
    }

    pub fn destroy(self: &Arc<Self>) {
        let mut p = self.progress.lock();
        p.destroyed = true;
        self.changed.notify_all();
    }
}

/// Queues `work` on `stream` after `waits` (implicit synchronisation, each with the clock of
/// what it waits for), checking its memory accesses for races first.
pub fn enqueue(
    machine: &'static dyn Machine,
    stream: &Arc<Stream>,
    waits: Vec<(Arc<Stream>, u64, Clock)>,
    work: Option<Work>,
    accesses: &[Access],
) {
    let races = machine.races();
    let mut p = stream.progress.lock();
    for (on, upto, clock) in waits {
        if upto == 0 || Arc::ptr_eq(&on, stream) {
            continue;
        }
        race::merge(&mut p.clock, &clock);
        let entry = p.clock.entry(on.id).or_insert(0);
        *entry = (*entry).max(upto);
        p.enqueued += 1;
        p.queue.push_back(Queued { work: Work::Wait { on, upto }, pending: Vec::new() });
    }
    if let Some(work) = work {
        p.enqueued += 1;
        let seq = p.enqueued;
        p.clock.insert(stream.id, seq);
        let (pending, _) = races.check(Actor::Stream(stream.id), &stream.label, Some(&p.clock), seq, work.name(), accesses);
        p.queue.push_back(Queued { work, pending });
    }
    if !p.worker && !p.queue.is_empty() {
        p.worker = true;
        let worker = Arc::clone(stream);
        std::thread::Builder::new()
            .name(format!("emucuda {:#x}", stream.id))
            .spawn(move || run(machine, worker))
            .expect("spawning a stream worker");
    }
    stream.changed.notify_all();
}

/// The worker: does the stream's work in order until the stream is destroyed and drained.
fn run(machine: &'static dyn Machine, stream: Arc<Stream>) {
    loop {
        let queued = {
            let mut p = stream.progress.lock();
            loop {
                if let Some(q) = p.queue.pop_front() {
                    break q;
                }
                if p.destroyed {
                    return;
                }
                stream.changed.wait(&mut p);
            }
        };
        machine.execute(&stream, &queued.work);
        machine.races().done(&queued.pending);
        let mut p = stream.progress.lock();
        p.completed += 1;
        stream.changed.notify_all();
    }
}

/// An event: what was queued on a stream when it was last recorded.
#[derive(Default)]
pub struct Event {
    recorded: Mutex<Option<Recorded>>,
}

#[derive(Clone)]
pub struct Recorded {
    pub stream: Arc<Stream>,
    pub upto: u64,
    pub clock: Clock,
}

impl Event {
    pub fn record(&self, stream: &Arc<Stream>) {
        let (upto, clock) = stream.snapshot();
        *self.recorded.lock() = Some(Recorded { stream: Arc::clone(stream), upto, clock });
    }

    pub fn recorded(&self) -> Option<Recorded> {
        self.recorded.lock().clone()
    }
}

/// A device's primary context.
pub struct Context {
    pub device: i32,
    pub retains: AtomicU32,
    pub flags: AtomicU32,
    pub legacy: Arc<Stream>,
    /// Every other stream in the context (made by `cuStreamCreate`, and per-thread streams).
    pub streams: Mutex<Vec<Arc<Stream>>>,
    /// An illegal address was touched by the context's work: sticky, as on a GPU.
    pub sticky: AtomicU32,
}

impl Context {
    pub fn new(device: i32) -> Self {
        Self {
            device,
            retains: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            legacy: Stream::new(device, 0, true, |_| format!("the legacy default stream of device {device}")),
            streams: Mutex::default(),
            sticky: AtomicU32::new(abi::SUCCESS),
        }
    }

    /// What work queued on `stream` now must wait for, by CUDA's implicit synchronisation.
    pub fn implicit_waits(&self, stream: &Arc<Stream>) -> Vec<(Arc<Stream>, u64, Clock)> {
        if stream.legacy {
            let streams = self.streams.lock().clone();
            streams
                .iter()
                .filter(|s| s.blocking)
                .map(|s| {
                    let (upto, clock) = s.snapshot();
                    (Arc::clone(s), upto, clock)
                })
                .collect()
        } else if stream.blocking {
            let (upto, clock) = self.legacy.snapshot();
            vec![(Arc::clone(&self.legacy), upto, clock)]
        } else {
            Vec::new()
        }
    }

    /// Every stream of the context, the legacy one first.
    pub fn all_streams(&self) -> Vec<Arc<Stream>> {
        let mut all = vec![Arc::clone(&self.legacy)];
        all.extend(self.streams.lock().iter().cloned());
        all
    }

    pub fn sticky_error(&self) -> Result<(), CuResult> {
        match self.sticky.load(Relaxed) {
            abi::SUCCESS => Ok(()),
            code => Err(code),
        }
    }
}
