//! Memory another process can map. Physical allocations made shareable are exported as a
//! duplicate of their memfd and imported from one (`cuMemExportToShareableHandle` /
//! `cuMemImportFromShareableHandle`, POSIX file descriptors): both processes then map the same
//! pages. A `cuMemAlloc` allocation is moved onto a memfd of its own at its first
//! `cuIpcGetMemHandle`, and the handle names it by the exporter's pid, fd number and a serial
//! that is also in the memfd's name, so that another process opens `/proc/PID/fd/FD` and knows
//! a freed allocation (its fd closed, or the number reused) from a live one.

use std::ffi::{c_int, CString};

use super::{memfd, Memory, Physical, PAGE};
use crate::abi::{self, CuResult, IpcMemHandle};

/// How a `cuMemAlloc` allocation is shared.
pub(super) enum Share {
    Private,
    /// On a memfd of its own, for `cuIpcGetMemHandle`.
    Exported {
        fd: c_int,
        serial: u64,
    },
    /// Opened from another process's handle: closed by `cuIpcCloseMemHandle`, never freed.
    Opened {
        fd: c_int,
        pid: u32,
        serial: u64,
    },
}

impl Share {
    pub(super) fn is_opened(&self) -> bool {
        matches!(self, Share::Opened { .. })
    }

    /// Closes the memfd, if there is one.
    pub(super) fn close(self) {
        if let Share::Exported { fd, .. } | Share::Opened { fd, .. } = self {
            // SAFETY: the memfd is this record's own, closed once (the record is consumed).
            unsafe { libc::close(fd) };
        }
    }
}

const MAGIC: &[u8; 8] = b"emuipc01";

/// The memfd name of a `cuMemAlloc` allocation shared under `serial`.
fn ipc_name(serial: u64) -> CString {
    CString::new(format!("emulated-cuda-ipc-{serial}")).expect("no NUL")
}

impl Memory {
    /// `cuMemExportToShareableHandle`: a new file descriptor for the physical allocation.
    pub fn export(&self, handle: u64) -> Result<c_int, CuResult> {
        let physical = self.physical.get(&handle).filter(|p| !p.released).ok_or(abi::INVALID_VALUE)?;
        if !physical.shareable {
            // It was made without `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` in its properties.
            return Err(abi::INVALID_VALUE);
        }
        dup(physical.fd).ok_or(abi::OUT_OF_MEMORY)
    }

    /// `cuMemImportFromShareableHandle`: a handle on device `device` for the memory behind `fd`,
    /// which must be an export of this emulator (in any process). The caller keeps `fd`.
    pub fn import(&mut self, device: i32, fd: c_int, granularity: u64) -> Result<u64, CuResult> {
        if !fd_name(fd).is_some_and(|name| name.starts_with("/memfd:emulated-cuda ")) {
            return Err(abi::INVALID_VALUE);
        }
        let size = fd_size(fd).filter(|&s| s > 0 && s % granularity == 0).ok_or(abi::INVALID_VALUE)?;
        let fd = dup(fd).ok_or(abi::OUT_OF_MEMORY)?;
        Ok(self.add_physical(Physical { size, device, fd, mappings: 0, released: false, charged: 0, shareable: true }))
    }

    /// `cuIpcGetMemHandle` of the `cuMemAlloc` allocation holding `ptr`.
    pub fn ipc_get(&mut self, ptr: u64) -> Result<IpcMemHandle, CuResult> {
        let (&base, linear) = self.linear.range(..=ptr).next_back().filter(|(&b, l)| ptr < b + l.size).ok_or(abi::INVALID_VALUE)?;
        let (size, pages) = (linear.size, linear.pages);
        let (fd, serial) = match linear.share {
            Share::Exported { fd, serial } => (fd, serial),
            Share::Opened { .. } => return Err(abi::INVALID_VALUE),
            Share::Private => {
                let serial = self.next_handle;
                self.next_handle += 1;
                let fd = move_onto_memfd(base, pages, serial).ok_or(abi::OUT_OF_MEMORY)?;
                self.linear.get_mut(&base).expect("found above").share = Share::Exported { fd, serial };
                (fd, serial)
            }
        };
        let mut handle = IpcMemHandle { reserved: [0; 64] };
        let bytes = &mut handle.reserved;
        bytes[..8].copy_from_slice(MAGIC);
        // SAFETY: getpid has no preconditions.
        bytes[8..12].copy_from_slice(&(unsafe { libc::getpid() } as u32).to_le_bytes());
        bytes[12..16].copy_from_slice(&fd.to_le_bytes());
        bytes[16..24].copy_from_slice(&serial.to_le_bytes());
        bytes[24..32].copy_from_slice(&size.to_le_bytes());
        Ok(handle)
    }

    /// `cuIpcOpenMemHandle`: maps another process's allocation; its base address.
    pub fn ipc_open(&mut self, device: i32, handle: &IpcMemHandle) -> Result<u64, CuResult> {
        let bytes = &handle.reserved;
        let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if &bytes[..8] != MAGIC {
            return Err(abi::INVALID_VALUE);
        }
        let pid = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let their_fd = i32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let (serial, size) = (field(16), field(24));
        // SAFETY: getpid has no preconditions.
        if pid == unsafe { libc::getpid() } as u32 {
            // The driver does not open a process's own handles.
            return Err(abi::INVALID_CONTEXT);
        }
        let open = |s: &Share| matches!(*s, Share::Opened { pid: p, serial: n, .. } if (p, n) == (pid, serial));
        if self.linear.values().any(|l| open(&l.share)) {
            // The emulator refuses a second open of one handle rather than counting opens.
            return Err(abi::ALREADY_MAPPED);
        }
        let path = CString::new(format!("/proc/{pid}/fd/{their_fd}")).expect("no NUL");
        // SAFETY: a NUL-terminated path; the result is checked.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            // The exporter is gone, or freed the allocation.
            return Err(abi::INVALID_VALUE);
        }
        let expected = format!("/memfd:{} (deleted)", ipc_name(serial).to_str().expect("ASCII"));
        let pages = size.checked_next_multiple_of(PAGE).unwrap_or(u64::MAX);
        let fits = fd_name(fd).as_deref() == Some(&expected) && fd_size(fd).is_some_and(|s| s >= pages) && size > 0;
        let base = if fits { map_shared(fd, pages) } else { None };
        let Some(base) = base else {
            // SAFETY: the fd opened above, closed once; a number reused for another file, or a
            // freed allocation's, ends here.
            unsafe { libc::close(fd) };
            return Err(abi::INVALID_VALUE);
        };
        self.linear.insert(base, super::Linear { size, pages, charged: 0, device, share: Share::Opened { fd, pid, serial } });
        Ok(base)
    }

    /// The size of the allocation `cuIpcCloseMemHandle(base)` would close.
    pub fn opened_at(&self, base: u64) -> Option<u64> {
        self.linear.get(&base).filter(|l| l.share.is_opened()).map(|l| l.size)
    }

    /// `cuIpcCloseMemHandle`.
    pub fn ipc_close(&mut self, base: u64) -> Result<(), CuResult> {
        self.opened_at(base).ok_or(abi::INVALID_VALUE)?;
        self.drop_linear(base);
        Ok(())
    }
}

/// A duplicate of `fd`, closed on exec.
fn dup(fd: c_int) -> Option<c_int> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we hold; the result is checked.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    (new >= 0).then_some(new)
}

/// What `fd` is, as /proc names it (`/memfd:NAME (deleted)` for a memfd).
fn fd_name(fd: c_int) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?.into_os_string().into_string().ok()
}

fn fd_size(fd: c_int) -> Option<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes one `stat` into the zeroed buffer; the result is checked.
    (unsafe { libc::fstat(fd, stat.as_mut_ptr()) } == 0).then(|| unsafe { stat.assume_init() }.st_size as u64)
}

/// `pages` bytes of `fd`, shared and read-write, at an address the kernel picks.
fn map_shared(fd: c_int, pages: u64) -> Option<u64> {
    // SAFETY: a new shared mapping of a memfd at least `pages` long; touches no other mapping.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), pages as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    (ptr != libc::MAP_FAILED).then_some(ptr as u64)
}

/// Moves the private pages `[base, base + pages)` of a `cuMemAlloc` allocation onto a new memfd,
/// contents and address kept; the memfd. The caller holds the memory lock for writing, so no
/// queued work touches the pages meanwhile (workers read the map under it).
fn move_onto_memfd(base: u64, pages: u64, serial: u64) -> Option<c_int> {
    let fd = memfd(pages, &ipc_name(serial))?;
    let Some(staging) = map_shared(fd, pages) else {
        // SAFETY: the memfd just made, closed once.
        unsafe { libc::close(fd) };
        return None;
    };
    // SAFETY: both ranges are `pages` long, ours, and distinct mappings. The copy commits every
    // page of the allocation: acceptable for an emulator, which shares few allocations.
    unsafe { std::ptr::copy_nonoverlapping(base as *const u8, staging as *mut u8, pages as usize) };
    super::unmap(staging, pages);
    // SAFETY: MAP_FIXED over the allocation's own pages (ours), replacing them with the memfd's,
    // which now hold the same bytes.
    let ptr = unsafe {
        libc::mmap(base as *mut _, pages as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED, fd, 0)
    };
    if ptr == libc::MAP_FAILED {
        // SAFETY: as above; the allocation keeps its private pages.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

#[cfg(test)]
mod tests {
    use super::super::{Memory, Place};
    use crate::abi;

    const G: u64 = 2 << 20;

    #[test]
    fn only_shareable_allocations_export_and_an_import_shares_the_bytes() {
        let mut m = Memory::new(1);
        let plain = m.create(0, G, G, 8 * G, false).unwrap();
        assert_eq!(m.export(plain), Err(abi::INVALID_VALUE), "not made shareable");
        let shared = m.create(0, G, G, 8 * G, true).unwrap();
        let fd = m.export(shared).unwrap();
        let imported = m.import(0, fd, G).unwrap();
        // SAFETY: our own descriptor, closed once: the import holds a duplicate.
        unsafe { libc::close(fd) };
        assert_eq!(m.used(0), 2 * G, "an import counts nothing");
        let (a, b) = (m.reserve(G, 0, G).unwrap(), m.reserve(G, 0, G).unwrap());
        for (addr, h) in [(a, shared), (b, imported)] {
            m.map(addr, G, 0, h, G).unwrap();
            m.set_access(addr, G, abi::MEM_ACCESS_FLAGS_PROT_READWRITE).unwrap();
        }
        // SAFETY: both ranges are mapped read-write just above.
        unsafe {
            (a as *mut u8).write(42);
            assert_eq!((b as *const u8).read(), 42, "one memory, two mappings");
        }
        for (addr, h) in [(a, shared), (b, imported)] {
            m.unmap(addr, G).unwrap();
            m.release(h).unwrap();
            m.address_free(addr, G).unwrap();
        }
        m.release(plain).unwrap();
        assert_eq!(m.used(0), 0);
        assert_eq!(m.export(shared), Err(abi::INVALID_VALUE), "released");
    }

    #[test]
    fn imports_refuse_what_is_not_an_export() {
        let mut m = Memory::new(1);
        assert_eq!(m.import(0, -1, G), Err(abi::INVALID_VALUE));
        assert_eq!(m.import(0, 0, G), Err(abi::INVALID_VALUE), "stdin");
        let h = m.create(0, G, G, 8 * G, true).unwrap();
        let fd = m.export(h).unwrap();
        assert_eq!(m.import(0, fd, 4 * G), Err(abi::INVALID_VALUE), "not a multiple of the granularity");
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
        m.release(h).unwrap();
    }

    #[test]
    fn an_ipc_handle_keeps_the_bytes_and_refuses_its_own_process() {
        let mut m = Memory::new(1);
        let a = m.alloc(0, 100, G, 8 * G).unwrap();
        // SAFETY: the allocation is 100 bytes of ours.
        unsafe { (a as *mut u8).add(5).write(9) };
        let handle = m.ipc_get(a + 5).unwrap();
        assert_eq!(m.ipc_get(a).unwrap().reserved, handle.reserved, "one handle per allocation");
        // SAFETY: as above: the pages moved, the address and the bytes stayed.
        assert_eq!(unsafe { (a as *const u8).add(5).read() }, 9);
        assert_eq!(m.place(a), Place::Device { device: 0, base: a, size: 100 });
        assert_eq!(m.ipc_open(0, &handle), Err(abi::INVALID_CONTEXT));
        let mut bad = handle;
        bad.reserved[0] ^= 1;
        assert_eq!(m.ipc_open(0, &bad), Err(abi::INVALID_VALUE));
        assert_eq!(m.ipc_close(a), Err(abi::INVALID_VALUE), "not opened");
        m.free(a).unwrap();
        assert_eq!(m.used(0), 0);
    }
}
