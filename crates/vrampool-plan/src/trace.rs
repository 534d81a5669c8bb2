//! What an ablation needs of `plan`: which stages of the exact search may run (`Stages`, all of them unless the
//! ablation benchmark says otherwise) and when the search first reached each arena (`Trace`). `plan` itself
//! runs every stage and records nothing.

use std::time::{Duration, Instant};

use crate::instance::Instance;

/// A stage of `plan(Auto)`'s exact search that can be left out, one at a time, to see what it earns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The round robin's jittered turns (`exact/jitter.rs`).
    Jitter,
    /// More nodes for the round robin's turns that placed the most buffers (`exact/deepest_boost.rs`).
    DeepestBoost,
    /// The descent below a small part's best plan (`exact/descent.rs`); the round robin at the bound alone
    /// without it.
    Descent,
    /// Best fit decreasing on size classes for a large part (`exact/classes.rs`).
    Classes,
    /// The classes' plan settled (`floors/settle.rs`).
    Settle,
    /// The portfolio's lowest floor first runs (`exact/portfolio/floor_runs.rs`).
    FloorRuns,
    /// The portfolio's best fit by start with the gap chosen by the neighbours' ends
    /// (`exact/portfolio/aligned.rs`).
    Aligned,
    /// The portfolio's runs with a first phase: longest, largest, bytes (`exact/portfolio/first_phases.rs`).
    FirstPhases,
    /// The squeaky wheel after the runs (`exact/portfolio/squeaky.rs`).
    Squeaky,
    /// Lowering the peaks by bands (`exact/lowering.rs`).
    Lowering,
}

impl Stage {
    pub const ALL: [Stage; 10] = [
        Stage::Jitter,
        Stage::DeepestBoost,
        Stage::Descent,
        Stage::Classes,
        Stage::Settle,
        Stage::FloorRuns,
        Stage::Aligned,
        Stage::FirstPhases,
        Stage::Squeaky,
        Stage::Lowering,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Jitter => "jitter",
            Stage::DeepestBoost => "deepest-boost",
            Stage::Descent => "descent",
            Stage::Classes => "classes",
            Stage::Settle => "settle",
            Stage::FloorRuns => "floor-runs",
            Stage::Aligned => "aligned",
            Stage::FirstPhases => "first-phases",
            Stage::Squeaky => "squeaky",
            Stage::Lowering => "lowering",
        }
    }
}

/// A set of stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stages(u32);

impl Stages {
    pub const ALL: Stages = Stages(u32::MAX);

    pub fn without(self, stage: Stage) -> Stages {
        Stages(self.0 & !(1 << stage as u32))
    }

    pub fn has(self, stage: Stage) -> bool {
        self.0 & (1 << stage as u32) != 0
    }
}

/// The stages a search may run, and, where asked, the whole plan's arena each time a part's best plan came
/// down (so the time at which the best arena was first reached).
pub(crate) struct Trace {
    pub stages: Stages,
    recording: Option<Recording>,
}

struct Recording {
    began: Instant,
    /// Each buffer's part (`component::split`), each part's best arena, and the part the search is on.
    part_of: Vec<u32>,
    arenas: Vec<u64>,
    part: usize,
    /// The whole plan's arena, each time it came down.
    reached: Vec<(Duration, u64)>,
}

impl Trace {
    /// Every stage, nothing recorded: what `plan` runs.
    pub fn all() -> Trace {
        Trace { stages: Stages::ALL, recording: None }
    }

    /// `stages`, recording from `began` on the instance's `parts`.
    pub fn recording(stages: Stages, began: Instant, inst: &Instance, parts: &[Vec<u32>]) -> Trace {
        let mut part_of = vec![0; inst.len()];
        for (k, part) in parts.iter().enumerate() {
            part.iter().for_each(|&i| part_of[i as usize] = k as u32);
        }
        let recording = Recording { began, part_of, arenas: vec![u64::MAX; parts.len()], part: 0, reached: Vec::new() };
        Trace { stages, recording: Some(recording) }
    }

    /// A whole plan found (offsets parallel to the instance's buffers): the plan the search starts from, where
    /// its arena is lower.
    pub fn plan(&mut self, inst: &Instance, offsets: &[u64]) {
        let Some(r) = &mut self.recording else { return };
        let mut arenas = vec![0; r.arenas.len()];
        for (i, &offset) in offsets.iter().enumerate() {
            let part = &mut arenas[r.part_of[i] as usize];
            *part = (*part).max(offset + inst.size[i]);
        }
        if arenas.iter().max() < r.arenas.iter().max() {
            r.arenas = arenas;
            r.note();
        }
    }

    /// The search is on the part of buffer `i` from now on.
    pub fn part_of(&mut self, i: u32) {
        if let Some(r) = &mut self.recording {
            r.part = r.part_of[i as usize] as usize;
        }
    }

    /// A plan of the current part with this arena.
    pub fn found(&mut self, arena: u64) {
        if let Some(r) = &mut self.recording {
            if arena < r.arenas[r.part] {
                r.arenas[r.part] = arena;
                r.note();
            }
        }
    }

    /// When the whole plan first had an arena of at most `arena`.
    pub fn time_to(&self, arena: u64) -> Option<Duration> {
        let r = self.recording.as_ref()?;
        r.reached.iter().find(|&&(_, a)| a <= arena).map(|&(t, _)| t)
    }
}

impl Recording {
    fn note(&mut self) {
        let whole = self.arenas.iter().copied().max().unwrap_or(0);
        if self.reached.last().is_none_or(|&(_, a)| whole < a) {
            self.reached.push((self.began.elapsed(), whole));
        }
    }
}
