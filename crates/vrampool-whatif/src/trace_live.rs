//! Requested bytes live over a trace's events, in the replay's order: the lower bound, the
//! timeline the plan's row draws, and the pool's segments at the moment of most live bytes.
//!
//! ```
//! use vrampool_whatif::replay::TraceBuffer;
//! use vrampool_whatif::trace_live::LiveBytes;
//!
//! // Buffer 1 is born when buffer 0 dies: the free comes first, so one buffer is ever live.
//! let live = LiveBytes::new(&[TraceBuffer::new(0, 0, 2, 100), TraceBuffer::new(1, 2, 4, 100)]).unwrap();
//! assert_eq!(live.lower_bound_bytes(), 100);
//! assert_eq!(live.timeline(4), vec![(1, 100), (2, 0), (3, 100), (4, 0)]);
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use crate::replay::{events_from_buffers, sample_stride, PreparedTrace, ReplayError, TraceBuffer, TraceEvent, REPLAY_CAPACITY};
use vrampool_core::device::{SimDevice, SimMode, StreamId};
use vrampool_core::{Pool, PoolConfig, SegmentSnapshot};

/// A checked trace's events in replay order, with the requested bytes live after each.
pub struct LiveBytes {
    events: Vec<TraceEvent>,
    /// `after[i]`: bytes live once events `0..=i` have run.
    after: Vec<u64>,
}

impl LiveBytes {
    /// Orders the buffers' events as the replay does (see [`events_from_buffers`]) and checks
    /// them as the replay does (see [`PreparedTrace::new`]).
    pub fn new(buffers: &[TraceBuffer]) -> Result<Self, ReplayError> {
        let events = events_from_buffers(buffers)?;
        PreparedTrace::new(&events)?;
        // By live id, not by buffer: a trace may use an id again once its buffer is dead.
        let mut sizes = HashMap::new();
        let mut live = 0u64;
        let after = events
            .iter()
            .map(|event| {
                match *event {
                    TraceEvent::Alloc { id, size, .. } => {
                        sizes.insert(id, size);
                        live += size;
                    }
                    TraceEvent::Free { id } => live -= sizes[&id],
                }
                live
            })
            .collect();
        Ok(Self { events, after })
    }

    /// The most requested bytes live at once: no allocator can reserve less.
    pub fn lower_bound_bytes(&self) -> u64 {
        self.after.iter().copied().max().unwrap_or(0)
    }

    /// Events up to the first moment of most live bytes (0 for an empty trace).
    pub fn events_to_peak(&self) -> usize {
        let peak = self.lower_bound_bytes();
        self.after.iter().position(|&live| live == peak).map_or(0, |index| index + 1)
    }

    /// `(events run, bytes live)` at the points a replay sampling `samples` points samples.
    pub fn timeline(&self, samples: usize) -> Vec<(usize, u64)> {
        let events = self.after.len();
        if events == 0 || samples == 0 {
            return Vec::new();
        }
        let stride = sample_stride(events, samples);
        let mut points: Vec<usize> = (stride..events).step_by(stride).collect();
        points.push(events);
        points.into_iter().map(|point| (point, self.after[point - 1])).collect()
    }

    /// The segments of a pool with `config` on the address-only simulated device, once it has run
    /// the events up to the moment of most live bytes: the segment map at the peak.
    pub fn peak_segments(&self, config: PoolConfig) -> Result<Vec<SegmentSnapshot>, ReplayError> {
        let device = Arc::new(SimDevice::new(REPLAY_CAPACITY, SimMode::AddressOnly));
        let pool = Pool::new(device, config).map_err(|source| ReplayError::Pool { index: 0, source })?;
        let mut addrs = HashMap::new();
        for (index, event) in self.events[..self.events_to_peak()].iter().enumerate() {
            let result = match *event {
                TraceEvent::Alloc { id, size, stream } => pool.allocate(size, StreamId(stream)).map(|addr| {
                    addrs.insert(id, addr);
                }),
                TraceEvent::Free { id } => pool.free(addrs[&id], None, None),
            };
            result.map_err(|source| ReplayError::Pool { index, source })?;
        }
        Ok(pool.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffers(rows: &[(u64, u64, u64, u64)]) -> Vec<TraceBuffer> {
        rows.iter().map(|&(id, lower, upper, size)| TraceBuffer::new(id, lower, upper, size)).collect()
    }

    #[test]
    fn a_free_and_an_allocation_at_one_time_free_first() {
        let live = LiveBytes::new(&buffers(&[(0, 0, 5, 300), (1, 5, 9, 200), (2, 5, 6, 50)])).unwrap();
        assert_eq!(live.lower_bound_bytes(), 300);
        // 0 alive, then at time 5: free 0 (0 bytes), allocate 1 and 2 (250).
        assert_eq!(live.timeline(6), vec![(1, 300), (2, 0), (3, 200), (4, 250), (5, 200), (6, 0)]);
        assert_eq!(live.events_to_peak(), 1);
    }

    #[test]
    fn the_timeline_samples_where_the_replay_samples() {
        let live = LiveBytes::new(&buffers(&[(0, 0, 2, 1), (1, 1, 3, 2), (2, 2, 4, 4)])).unwrap();
        // Six events at most four points: a stride of two, and the end.
        assert_eq!(live.timeline(4), vec![(2, 3), (4, 6), (6, 0)]);
        assert_eq!(live.timeline(100).len(), 6);
        assert!(live.timeline(0).is_empty());
        assert_eq!(live.events_to_peak(), 4);
    }

    #[test]
    fn the_peak_is_the_first_moment_of_most_live_bytes() {
        let live = LiveBytes::new(&buffers(&[(0, 0, 1, 8), (1, 1, 2, 8), (2, 2, 3, 4)])).unwrap();
        assert_eq!((live.lower_bound_bytes(), live.events_to_peak()), (8, 1));
        let segments = live.peak_segments(PoolConfig::default()).unwrap();
        let blocks: Vec<_> =
            segments.iter().flat_map(|s| s.blocks.iter()).filter(|b| matches!(b.2, vrampool_core::BlockState::Active { .. })).collect();
        assert_eq!(blocks.len(), 1);
    }

    #[test]
    fn an_id_used_again_counts_each_buffer_its_own_size() {
        let live = LiveBytes::new(&buffers(&[(7, 0, 1, 10), (7, 1, 2, 30)])).unwrap();
        assert_eq!(live.timeline(4), vec![(1, 10), (2, 0), (3, 30), (4, 0)]);
    }

    #[test]
    fn bad_traces_are_errors_and_an_empty_one_has_nothing() {
        assert!(matches!(LiveBytes::new(&buffers(&[(0, 3, 3, 8)])), Err(ReplayError::BadBuffer { id: 0, .. })));
        let empty = LiveBytes::new(&[]).unwrap();
        assert_eq!((empty.lower_bound_bytes(), empty.events_to_peak()), (0, 0));
        assert!(empty.timeline(10).is_empty());
        assert!(empty.peak_segments(PoolConfig::default()).unwrap().is_empty());
    }
}
