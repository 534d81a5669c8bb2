//! The device mappings an expandable model holds, as ranges: one device call and one record per
//! run of pages the model maps, however many pages the run has, so that a model's cost follows
//! its requests and not their bytes.

use std::collections::BTreeMap;

use vrampool_core::device::Device;

/// Mapped ranges of a model's reservations: start -> end.
#[derive(Debug, Default)]
pub(super) struct Mappings {
    runs: BTreeMap<u64, u64>,
}

impl Mappings {
    /// Maps `[addr, addr + size)` with one device call; false (nothing mapped) when the device
    /// has no room for it.
    pub fn map(&mut self, device: &dyn Device, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else { return false };
        if device.map(addr, size).is_err() {
            return false;
        }
        self.runs.insert(addr, end);
        true
    }

    /// Unmaps `[begin, end)`, which lies inside mapped runs. A device unmaps only whole mappings,
    /// so a run that reaches outside the range is unmapped whole and its parts outside mapped
    /// again: they fit, as the whole run did a moment before.
    pub fn unmap(&mut self, device: &dyn Device, begin: u64, end: u64) {
        let first = self.runs.range(..=begin).next_back().map_or(begin, |(&start, _)| start);
        let overlapping: Vec<(u64, u64)> = self.runs.range(first..end).map(|(&s, &e)| (s, e)).filter(|&(_, e)| e > begin).collect();
        for (start, stop) in overlapping {
            self.runs.remove(&start);
            let _ = device.unmap(start, stop - start);
            for (keep_start, keep_end) in [(start, begin), (end, stop)] {
                if keep_start < keep_end {
                    self.map(device, keep_start, keep_end - keep_start);
                }
            }
        }
    }

    /// Runs held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrampool_core::device::{SimDevice, SimMode};
    use vrampool_core::sizes::MIB;

    #[test]
    fn a_range_inside_a_run_is_cut_out_and_the_rest_stays_mapped() {
        let device = SimDevice::new(1 << 30, SimMode::AddressOnly);
        let base = device.reserve(64 * MIB).unwrap();
        let mut mappings = Mappings::default();
        assert!(mappings.map(&device, base, 20 * MIB));
        assert!(mappings.map(&device, base + 20 * MIB, 20 * MIB));
        // Across both runs: each keeps its part outside the range.
        mappings.unmap(&device, base + 10 * MIB, base + 30 * MIB);
        assert_eq!(mappings.len(), 2);
        assert_eq!(device.counters().used, 20 * MIB);
        // Mapping the hole again fits between them; unmapping everything leaves nothing.
        assert!(mappings.map(&device, base + 10 * MIB, 20 * MIB));
        mappings.unmap(&device, base, base + 40 * MIB);
        assert_eq!((mappings.len(), device.counters().used), (0, 0));
        device.unreserve(base, 64 * MIB).unwrap();
    }

    #[test]
    fn a_run_the_device_has_no_room_for_is_not_kept() {
        let device = SimDevice::new(8 * MIB, SimMode::AddressOnly);
        let base = device.reserve(1 << 40).unwrap();
        let mut mappings = Mappings::default();
        assert!(!mappings.map(&device, base, 1 << 40));
        assert!(!mappings.map(&device, u64::MAX - MIB, 4 * MIB), "past the end of the address space");
        assert_eq!((mappings.len(), device.counters().map_calls), (0, 1));
    }
}
