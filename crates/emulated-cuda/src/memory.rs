//! Device memory on host pages: `cuMemAlloc` allocations, reserved address ranges, physical
//! allocations (memfds) and their mappings, with real page protections, so that touching memory
//! that is reserved but not mapped, or mapped without access, faults as it does on a GPU.
//!
//! Use is counted per device against its capacity: a `cuMemAlloc` in whole granules (as a GPU
//! hands out 2 MiB pages), a physical allocation exactly (its size is a multiple of the
//! granularity). Addresses are host addresses, so tests can read and write them directly.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;

use crate::abi::{self, CuResult};

mod sharing;

/// One `cuMemAlloc` allocation, or one opened from another process's IPC handle.
struct Linear {
    size: u64,
    /// Bytes of the host mapping (whole pages) and bytes counted against the device.
    pages: u64,
    charged: u64,
    device: i32,
    share: sharing::Share,
}

/// One mapping of a physical allocation into a reservation.
struct Mapping {
    size: u64,
    handle: u64,
    device: i32,
    /// The access `cuMemSetAccess` gave: one of `MEM_ACCESS_FLAGS_*`.
    access: u32,
}

/// One `cuMemCreate` allocation, or one imported from a shareable handle.
struct Physical {
    size: u64,
    device: i32,
    fd: c_int,
    mappings: u32,
    released: bool,
    /// Bytes counted against the device: its size, or 0 for an import (the exporter's memory).
    charged: u64,
    /// Made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` asked for: it may be exported.
    shareable: bool,
}

/// What an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Inside a `cuMemAlloc` allocation or a mapping of `device`: `[base, base + size)` is it.
    Device { device: i32, base: u64, size: u64 },
    /// Inside the reservation `[base, base + size)` where nothing is mapped.
    Reserved { base: u64, size: u64 },
    /// Anything else: host memory (the caller's own).
    Host,
}

#[derive(Default)]
pub struct Memory {
    linear: BTreeMap<u64, Linear>,
    /// Reserved ranges: base -> size.
    reservations: BTreeMap<u64, u64>,
    mappings: BTreeMap<u64, Mapping>,
    physical: HashMap<u64, Physical>,
    next_handle: u64,
    /// Bytes in use on each device.
    used: Vec<u64>,
    /// `cuMemAllocHost` / `cuMemHostAlloc`: base -> bytes.
    host: BTreeMap<u64, usize>,
}

const PAGE: u64 = 4096;

impl Memory {
    pub fn new(devices: usize) -> Self {
        Self { used: vec![0; devices], next_handle: 0x10, ..Self::default() }
    }

    pub fn used(&self, device: i32) -> u64 {
        self.used[device as usize]
    }

    fn charge(&mut self, device: i32, bytes: u64, capacity: u64) -> Result<(), CuResult> {
        let used = &mut self.used[device as usize];
        match used.checked_add(bytes) {
            Some(total) if total <= capacity => {
                *used = total;
                Ok(())
            }
            _ => Err(abi::OUT_OF_MEMORY),
        }
    }

    pub fn alloc(&mut self, device: i32, size: u64, granularity: u64, capacity: u64) -> Result<u64, CuResult> {
        if size == 0 {
            return Err(abi::INVALID_VALUE);
        }
        let charged = size.checked_next_multiple_of(granularity).ok_or(abi::OUT_OF_MEMORY)?;
        let pages = size.checked_next_multiple_of(PAGE).ok_or(abi::OUT_OF_MEMORY)?;
        self.charge(device, charged, capacity)?;
        let base = match map_anonymous(pages, libc::PROT_READ | libc::PROT_WRITE) {
            Some(base) => base,
            None => {
                self.used[device as usize] -= charged;
                return Err(abi::OUT_OF_MEMORY);
            }
        };
        self.linear.insert(base, Linear { size, pages, charged, device, share: sharing::Share::Private });
        Ok(base)
    }

    /// The allocation `cuMemFree(base)` would free, as (base, size).
    pub fn linear_at(&self, base: u64) -> Option<(u64, u64)> {
        self.linear.get(&base).map(|l| (base, l.size))
    }

    /// `cuMemFree`; memory opened from an IPC handle is refused (`cuIpcCloseMemHandle` closes it).
    pub fn free(&mut self, base: u64) -> Result<(), CuResult> {
        if self.linear.get(&base).is_none_or(|l| l.share.is_opened()) {
            return Err(abi::INVALID_VALUE);
        }
        self.drop_linear(base);
        Ok(())
    }

    fn drop_linear(&mut self, base: u64) {
        let linear = self.linear.remove(&base).expect("the callers checked it");
        unmap(base, linear.pages);
        linear.share.close();
        self.used[linear.device as usize] -= linear.charged;
    }

    pub fn reserve(&mut self, size: u64, alignment: u64, granularity: u64) -> Result<u64, CuResult> {
        let alignment = alignment.max(granularity);
        if size == 0 || size % granularity != 0 || !alignment.is_power_of_two() {
            return Err(abi::INVALID_VALUE);
        }
        let span = size.checked_add(alignment).ok_or(abi::OUT_OF_MEMORY)?;
        let raw = map_anonymous(span, libc::PROT_NONE).ok_or(abi::OUT_OF_MEMORY)?;
        let base = raw.next_multiple_of(alignment);
        // The slack on either side goes back at once: only `[base, base + size)` stays reserved.
        if base > raw {
            unmap(raw, base - raw);
        }
        let end = base + size;
        if raw + span > end {
            unmap(end, raw + span - end);
        }
        self.reservations.insert(base, size);
        Ok(base)
    }

    pub fn address_free(&mut self, base: u64, size: u64) -> Result<(), CuResult> {
        if self.reservations.get(&base) != Some(&size) {
            return Err(abi::INVALID_VALUE);
        }
        if self.mappings.range(base..base + size).next().is_some() {
            // The driver refuses to free address space that still has memory mapped in it.
            return Err(abi::INVALID_VALUE);
        }
        self.reservations.remove(&base);
        unmap(base, size);
        Ok(())
    }

    /// `cuMemCreate`; a `shareable` allocation may be exported as a file descriptor.
    pub fn create(&mut self, device: i32, size: u64, granularity: u64, capacity: u64, shareable: bool) -> Result<u64, CuResult> {
        if size == 0 || size % granularity != 0 {
            return Err(abi::INVALID_VALUE);
        }
        self.charge(device, size, capacity)?;
        let Some(fd) = memfd(size, c"emulated-cuda") else {
            self.used[device as usize] -= size;
            return Err(abi::OUT_OF_MEMORY);
        };
        Ok(self.add_physical(Physical { size, device, fd, mappings: 0, released: false, charged: size, shareable }))
    }

    fn add_physical(&mut self, physical: Physical) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.physical.insert(handle, physical);
        handle
    }

    /// `cuMemRelease`: the memory goes back once its last mapping is gone.
    pub fn release(&mut self, handle: u64) -> Result<(), CuResult> {
        let physical = self.physical.get_mut(&handle).filter(|p| !p.released).ok_or(abi::INVALID_VALUE)?;
        physical.released = true;
        self.drop_if_done(handle);
        Ok(())
    }

    fn drop_if_done(&mut self, handle: u64) {
        if self.physical.get(&handle).is_some_and(|p| p.released && p.mappings == 0) {
            let physical = self.physical.remove(&handle).expect("just seen");
            // SAFETY: the memfd is ours and closed once; its pages live on in no mapping.
            unsafe { libc::close(physical.fd) };
            self.used[physical.device as usize] -= physical.charged;
        }
    }

    pub fn map(&mut self, addr: u64, size: u64, offset: u64, handle: u64, granularity: u64) -> Result<(), CuResult> {
        let end = addr.checked_add(size).ok_or(abi::INVALID_VALUE)?;
        if offset != 0 || size == 0 || addr % granularity != 0 || size % granularity != 0 {
            return Err(abi::INVALID_VALUE);
        }
        let physical = self.physical.get(&handle).filter(|p| !p.released).ok_or(abi::INVALID_HANDLE)?;
        if size > physical.size {
            return Err(abi::INVALID_VALUE);
        }
        let inside = self.reservations.range(..=addr).next_back().is_some_and(|(&base, &len)| end <= base + len);
        if !inside {
            return Err(abi::INVALID_VALUE);
        }
        if self.mappings.range(..end).next_back().is_some_and(|(&start, m)| start + m.size > addr) {
            return Err(abi::INVALID_VALUE);
        }
        let (fd, device) = (physical.fd, physical.device);
        // SAFETY: `[addr, end)` lies inside a reservation of ours (PROT_NONE pages we mapped)
        // and no mapping is there, so MAP_FIXED replaces only our own reserved pages. No access
        // until `cuMemSetAccess`, as on a GPU.
        let mapped = unsafe { libc::mmap(addr as *mut _, size as usize, libc::PROT_NONE, libc::MAP_SHARED | libc::MAP_FIXED, fd, 0) };
        if mapped == libc::MAP_FAILED {
            return Err(abi::OUT_OF_MEMORY);
        }
        self.physical.get_mut(&handle).expect("checked above").mappings += 1;
        self.mappings.insert(addr, Mapping { size, handle, device, access: abi::MEM_ACCESS_FLAGS_PROT_NONE });
        Ok(())
    }

    /// The mappings that exactly tile `[addr, addr + size)`, if they do.
    fn tiling(&self, addr: u64, size: u64) -> Option<Vec<u64>> {
        let end = addr.checked_add(size)?;
        let mut at = addr;
        let mut starts = Vec::new();
        for (&start, m) in self.mappings.range(addr..end) {
            if start != at {
                return None;
            }
            starts.push(start);
            at = start + m.size;
        }
        (at == end && !starts.is_empty()).then_some(starts)
    }

    pub fn set_access(&mut self, addr: u64, size: u64, flags: u32) -> Result<(), CuResult> {
        let prot = match flags {
            abi::MEM_ACCESS_FLAGS_PROT_NONE => libc::PROT_NONE,
            abi::MEM_ACCESS_FLAGS_PROT_READ => libc::PROT_READ,
            abi::MEM_ACCESS_FLAGS_PROT_READWRITE => libc::PROT_READ | libc::PROT_WRITE,
            _ => return Err(abi::INVALID_VALUE),
        };
        let starts = self.tiling(addr, size).ok_or(abi::INVALID_VALUE)?;
        // SAFETY: the range is exactly our own mappings (checked just above).
        if unsafe { libc::mprotect(addr as *mut _, size as usize, prot) } != 0 {
            return Err(abi::INVALID_VALUE);
        }
        for start in starts {
            self.mappings.get_mut(&start).expect("tiled").access = flags;
        }
        Ok(())
    }

    /// The range `cuMemUnmap(addr, size)` would unmap, if it is whole mappings.
    pub fn unmappable(&self, addr: u64, size: u64) -> bool {
        self.tiling(addr, size).is_some()
    }

    pub fn unmap(&mut self, addr: u64, size: u64) -> Result<(), CuResult> {
        let starts = self.tiling(addr, size).ok_or(abi::INVALID_VALUE)?;
        // Back to reserved, inaccessible pages (MAP_FIXED over our own mapping).
        if !remap_reserved(addr, size) {
            return Err(abi::INVALID_VALUE);
        }
        for start in starts {
            let m = self.mappings.remove(&start).expect("tiled");
            if let Some(p) = self.physical.get_mut(&m.handle) {
                p.mappings -= 1;
            }
            self.drop_if_done(m.handle);
        }
        Ok(())
    }

    /// Where `addr` lies.
    pub fn place(&self, addr: u64) -> Place {
        if let Some((&base, l)) = self.linear.range(..=addr).next_back() {
            if addr < base + l.size {
                return Place::Device { device: l.device, base, size: l.size };
            }
        }
        if let Some((&base, &size)) = self.reservations.range(..=addr).next_back() {
            if addr < base + size {
                if let Some((&start, m)) = self.mappings.range(..=addr).next_back().filter(|(&s, m)| addr < s + m.size) {
                    return Place::Device { device: m.device, base: start, size: m.size };
                }
                return Place::Reserved { base, size };
            }
        }
        Place::Host
    }

    /// Whether the device may touch `[addr, addr + len)`: inside one `cuMemAlloc` allocation,
    /// or wholly mapped with the access asked for. `Ok(false)` for memory that is not device
    /// memory at all (the host's), an error for device addresses it may not touch.
    pub fn device_access(&self, addr: u64, len: u64, write: bool) -> Result<bool, CuResult> {
        let end = addr.checked_add(len).ok_or(abi::INVALID_VALUE)?;
        if let Some((&base, l)) = self.linear.range(..=addr).next_back() {
            if addr < base + l.size {
                return if end <= base + l.size { Ok(true) } else { Err(abi::ILLEGAL_ADDRESS) };
            }
        }
        let reserved = self.reservations.range(..=addr).next_back().is_some_and(|(&b, &s)| addr < b + s);
        if !reserved {
            return Ok(false);
        }
        let needed = if write { abi::MEM_ACCESS_FLAGS_PROT_READWRITE } else { abi::MEM_ACCESS_FLAGS_PROT_READ };
        let mut at = addr;
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((&start, m)) if at < start + m.size && m.access & needed == needed => at = start + m.size,
                _ => return Err(abi::ILLEGAL_ADDRESS),
            }
        }
        Ok(true)
    }

    /// Whether `[addr, addr + len)` lies in page-locked host memory of ours (`cuMemAllocHost`).
    pub fn is_pinned(&self, addr: u64, len: u64) -> bool {
        self.host.range(..=addr).next_back().is_some_and(|(&base, &bytes)| addr.saturating_add(len) <= base + bytes as u64)
    }

    pub fn alloc_host(&mut self, size: usize) -> Result<u64, CuResult> {
        let bytes = (size.max(1) as u64).next_multiple_of(PAGE);
        let base = map_anonymous(bytes, libc::PROT_READ | libc::PROT_WRITE).ok_or(abi::OUT_OF_MEMORY)?;
        self.host.insert(base, bytes as usize);
        Ok(base)
    }

    pub fn free_host(&mut self, base: u64) -> Result<(), CuResult> {
        let bytes = self.host.remove(&base).ok_or(abi::INVALID_VALUE)?;
        unmap(base, bytes as u64);
        Ok(())
    }
}

/// Fresh zeroed pages with `prot`, reserved lazily (nothing is committed until touched).
fn map_anonymous(bytes: u64, prot: c_int) -> Option<u64> {
    let len = usize::try_from(bytes).ok()?;
    // SAFETY: a new private anonymous mapping at an address the kernel picks; touches nothing.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
    (ptr != libc::MAP_FAILED).then_some(ptr as u64)
}

/// Replaces `[addr, addr + len)`, a mapping of ours, with inaccessible reserved pages.
fn remap_reserved(addr: u64, len: u64) -> bool {
    // SAFETY: the callers pass only ranges they mapped themselves; MAP_FIXED swaps those pages
    // for PROT_NONE ones and leaves every other mapping of the process alone.
    let ptr = unsafe {
        libc::mmap(
            addr as *mut _,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    ptr != libc::MAP_FAILED
}

fn unmap(addr: u64, len: u64) {
    // SAFETY: the callers pass only ranges they mapped themselves and no longer hand out.
    unsafe { libc::munmap(addr as *mut _, len as usize) };
}

/// A memfd of `size` bytes named `name` (sparse: pages exist once touched).
fn memfd(size: u64, name: &std::ffi::CStr) -> Option<c_int> {
    // SAFETY: the name is NUL-terminated; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is the memfd just made.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        // SAFETY: closes the memfd just made, once.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    #[test]
    fn allocations_are_counted_in_granules_and_given_back() {
        let mut m = Memory::new(1);
        let a = m.alloc(0, 100, G, 8 * G).unwrap();
        assert_eq!(m.used(0), G);
        assert_eq!(m.place(a + 99), Place::Device { device: 0, base: a, size: 100 });
        assert_eq!(m.device_access(a, 100, true), Ok(true));
        assert_eq!(m.device_access(a, 101, true), Err(abi::ILLEGAL_ADDRESS));
        assert_eq!(m.alloc(0, 8 * G, G, 8 * G), Err(abi::OUT_OF_MEMORY));
        assert_eq!(m.used(0), G, "a refused allocation counts nothing");
        m.free(a).unwrap();
        assert_eq!(m.used(0), 0);
        assert_eq!(m.free(a), Err(abi::INVALID_VALUE));
        assert_eq!(m.alloc(0, 0, G, 8 * G), Err(abi::INVALID_VALUE));
    }

    #[test]
    fn virtual_memory_needs_map_and_access() {
        let mut m = Memory::new(1);
        let base = m.reserve(4 * G, 0, G).unwrap();
        assert_eq!(base % G, 0);
        assert_eq!(m.device_access(base, 8, true), Err(abi::ILLEGAL_ADDRESS), "reserved only");
        let h = m.create(0, 2 * G, G, 8 * G, false).unwrap();
        assert_eq!(m.used(0), 2 * G);
        assert_eq!(m.map(base + 3 * G, 2 * G, 0, h, G), Err(abi::INVALID_VALUE), "past the reservation");
        assert_eq!(m.map(base, 2 * G, 4096, h, G), Err(abi::INVALID_VALUE), "offset must be 0");
        m.map(base, 2 * G, 0, h, G).unwrap();
        assert_eq!(m.map(base + G, G, 0, h, G), Err(abi::INVALID_VALUE), "overlap");
        assert_eq!(m.device_access(base, 8, false), Err(abi::ILLEGAL_ADDRESS), "mapped, no access yet");
        m.set_access(base, 2 * G, abi::MEM_ACCESS_FLAGS_PROT_READWRITE).unwrap();
        assert_eq!(m.device_access(base, 2 * G, true), Ok(true));
        assert_eq!(m.device_access(base + G, 2 * G, true), Err(abi::ILLEGAL_ADDRESS), "runs past the mapping");
        // SAFETY: the range is mapped read-write just above.
        unsafe { std::ptr::write_bytes(base as *mut u8, 7, 16) };
        assert_eq!(m.address_free(base, 4 * G), Err(abi::INVALID_VALUE), "still mapped");
        assert_eq!(m.unmap(base, G), Err(abi::INVALID_VALUE), "part of a mapping");
        m.release(h).unwrap();
        assert_eq!(m.used(0), 2 * G, "released but still mapped");
        m.unmap(base, 2 * G).unwrap();
        assert_eq!(m.used(0), 0, "the last mapping took the memory with it");
        assert_eq!(m.device_access(base, 8, true), Err(abi::ILLEGAL_ADDRESS));
        m.address_free(base, 4 * G).unwrap();
        assert_eq!(m.place(base), Place::Host);
    }

    #[test]
    fn physical_memory_is_capacity_limited() {
        let mut m = Memory::new(2);
        assert_eq!(m.create(1, 3 * G, G, 4 * G, false).map(|_| ()), Ok(()));
        assert_eq!(m.create(1, 2 * G, G, 4 * G, false), Err(abi::OUT_OF_MEMORY));
        assert_eq!(m.create(0, 2 * G, G, 4 * G, false).map(|_| ()), Ok(()), "each device has its own");
        assert_eq!(m.create(0, G + 1, G, 4 * G, false), Err(abi::INVALID_VALUE));
        assert_eq!(m.release(12345), Err(abi::INVALID_VALUE));
    }

    #[test]
    fn unmap_takes_whole_adjacent_mappings() {
        let mut m = Memory::new(1);
        let base = m.reserve(4 * G, 0, G).unwrap();
        let (a, b) = (m.create(0, G, G, 8 * G, false).unwrap(), m.create(0, G, G, 8 * G, false).unwrap());
        m.map(base, G, 0, a, G).unwrap();
        m.map(base + G, G, 0, b, G).unwrap();
        m.set_access(base, 2 * G, abi::MEM_ACCESS_FLAGS_PROT_READWRITE).unwrap();
        assert!(m.unmappable(base, 2 * G));
        assert!(!m.unmappable(base, 3 * G));
        m.unmap(base, 2 * G).unwrap();
        m.release(a).unwrap();
        m.release(b).unwrap();
        assert_eq!(m.used(0), 0);
    }
}
