//! The arena: a region per stream, each one block that the pool handed out for that stream, so that
//! a region's bytes are only ever used on its stream, whatever schedule is served (the pool ordered
//! the block after earlier work when it handed it out, and orders its reuse after the region's users
//! when it goes back).

use vrampool_core::{MemoryResource, PoolError, StreamId};

/// A region's size is a multiple of this: the unit of the default pool's large blocks and mappings.
pub(crate) const REGION_UNIT: u64 = 2 << 20;

#[derive(Debug)]
pub(crate) struct Region {
    pub stream: StreamId,
    pub base: u64,
    pub bytes: u64,
    /// Streams other than `stream` that used its bytes (a free naming one, `record_stream`): the
    /// pool waits for them before the block is reused.
    pub users: Vec<StreamId>,
    /// Used on another stream: never handed out again, replaced once none of its buffers is live.
    pub retired: bool,
}

impl Region {
    pub fn contains(&self, addr: u64) -> bool {
        self.base <= addr && addr < self.base + self.bytes
    }

    /// Marks the region as used on `stream`: unless it is the region's own, retired.
    pub fn used_on(&mut self, stream: StreamId) {
        if stream != self.stream {
            if !self.users.contains(&stream) {
                self.users.push(stream);
            }
            self.retired = true;
        }
    }
}

/// Blocks taken from the pool and given back, with their bytes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RegionFigures {
    pub taken: u64,
    pub bytes_taken: u64,
    pub returned: u64,
    pub bytes_returned: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Regions {
    pub list: Vec<Region>,
    pub figures: RegionFigures,
}

impl Regions {
    pub fn find(&self, addr: u64) -> Option<usize> {
        self.list.iter().position(|r| r.contains(addr))
    }

    pub fn of_stream(&self, stream: StreamId) -> Option<usize> {
        self.list.iter().position(|r| r.stream == stream)
    }

    pub fn bytes(&self) -> u64 {
        self.list.iter().map(|r| r.bytes).sum()
    }

    /// The lowest base and the highest end, (0, 0) with no region.
    pub fn bounds(&self) -> (u64, u64) {
        let lo = self.list.iter().map(|r| r.base).min().unwrap_or(0);
        let hi = self.list.iter().map(|r| r.base + r.bytes).max().unwrap_or(0);
        (lo, hi)
    }

    /// Each region's `[lo, hi)`, in address order.
    pub fn ranges(&self) -> Box<[(u64, u64)]> {
        let mut ranges: Vec<(u64, u64)> = self.list.iter().map(|r| (r.base, r.base + r.bytes)).collect();
        ranges.sort_unstable();
        ranges.into()
    }

    /// A region on `stream` of at least `needed` bytes, not retired: kept if there is one, else taken
    /// from `backing` (`wanted` bytes, at least `needed`), the old one given back first. The
    /// caller makes sure no buffer of the old one is live. The region's index, or why not.
    pub fn ensure(&mut self, backing: &impl MemoryResource, stream: StreamId, needed: u64, wanted: u64) -> Result<usize, PoolError> {
        if let Some(at) = self.of_stream(stream) {
            let region = &self.list[at];
            if region.bytes >= needed && !region.retired {
                return Ok(at);
            }
            self.release(backing, at)?;
        }
        let bytes = round_up(wanted.max(needed))?;
        let base = backing.allocate_carved(bytes, stream)?;
        self.figures.taken += 1;
        self.figures.bytes_taken += bytes;
        self.list.push(Region { stream, base, bytes, users: Vec::new(), retired: false });
        Ok(self.list.len() - 1)
    }

    /// Gives region `at` back to the pool, after its users' work.
    pub fn release(&mut self, backing: &impl MemoryResource, at: usize) -> Result<u64, PoolError> {
        let region = &self.list[at];
        backing.free_carved(region.base, region.bytes, &region.users)?;
        let region = self.list.swap_remove(at);
        self.figures.returned += 1;
        self.figures.bytes_returned += region.bytes;
        Ok(region.bytes)
    }

    /// Gives every region back; the bytes, or the first error (the regions not given back stay).
    pub fn release_all(&mut self, backing: &impl MemoryResource) -> Result<u64, PoolError> {
        let mut bytes = 0;
        while !self.list.is_empty() {
            bytes += self.release(backing, self.list.len() - 1)?;
        }
        Ok(bytes)
    }
}

fn round_up(bytes: u64) -> Result<u64, PoolError> {
    bytes.checked_next_multiple_of(REGION_UNIT).ok_or(PoolError::InvalidSize { size: bytes, reason: "an arena region past 2^64 bytes" })
}
