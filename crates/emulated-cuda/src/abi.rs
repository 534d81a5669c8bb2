//! The driver's C types, result codes and the names and descriptions `cuGetErrorName` /
//! `cuGetErrorString` give for them (CUDA 13.0's set).
//!
//! Structs are declared with plain integer fields where CUDA has enums: a caller may pass any
//! value, and a Rust enum holding an unknown one would be undefined behaviour.

use std::ffi::{c_int, c_void};

/// A `CUresult`. The emulator only ever returns codes from `CODES`.
pub type CuResult = u32;

pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const OUT_OF_MEMORY: CuResult = 2;
pub const NOT_INITIALIZED: CuResult = 3;
pub const NO_DEVICE: CuResult = 100;
pub const INVALID_DEVICE: CuResult = 101;
pub const INVALID_CONTEXT: CuResult = 201;
pub const ALREADY_MAPPED: CuResult = 208;
pub const INVALID_HANDLE: CuResult = 400;
pub const NOT_FOUND: CuResult = 500;
pub const NOT_READY: CuResult = 600;
pub const ILLEGAL_ADDRESS: CuResult = 700;
pub const NOT_PERMITTED: CuResult = 800;
pub const NOT_SUPPORTED: CuResult = 801;

/// Stream handles with a meaning of their own.
pub const STREAM_NULL: u64 = 0;
pub const STREAM_LEGACY: u64 = 1;
pub const STREAM_PER_THREAD: u64 = 2;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
pub const STREAM_NON_BLOCKING: u32 = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    pub type_: u32,
    pub id: c_int,
}

pub const MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocationProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

pub const MEM_ALLOCATION_TYPE_PINNED: u32 = 1;

/// `CUmemAllocationHandleType` bits: the only shareable kind emulated is a POSIX file descriptor.
pub const MEM_HANDLE_TYPE_NONE: u32 = 0;
pub const MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag `cuIpcOpenMemHandle` takes.
pub const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: u32,
}

pub const MEM_ACCESS_FLAGS_PROT_NONE: u32 = 0;
pub const MEM_ACCESS_FLAGS_PROT_READ: u32 = 1;
pub const MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;

/// Device attributes with a value of their own (every other valid one reads 0).
pub mod attribute {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const WARP_SIZE: i32 = 10;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const PCI_BUS_ID: i32 = 33;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    /// One past the last attribute of CUDA 13.0.
    pub const MAX: i32 = 148;
}

/// Pointer attributes `cuPointerGetAttribute` answers.
pub mod pointer {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const DEVICE_POINTER: i32 = 3;
    pub const HOST_POINTER: i32 = 4;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
    pub const MAPPED: i32 = 13;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const IS_MANAGED: i32 = 8;
    pub const MEMORY_TYPE_DEVICE: u32 = 2;
}

/// Every `CUresult` of CUDA 13.0, with its name.
pub const CODES: &[(CuResult, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (5, "CUDA_ERROR_PROFILER_DISABLED"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"),
    (205, "CUDA_ERROR_MAP_FAILED"),
    (206, "CUDA_ERROR_UNMAP_FAILED"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED"),
    (208, "CUDA_ERROR_ALREADY_MAPPED"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED"),
    (211, "CUDA_ERROR_NOT_MAPPED"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"),
    (226, "CUDA_ERROR_CONTAINED"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (402, "CUDA_ERROR_LOSSY_QUERY"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"),
    (907, "CUDA_ERROR_CAPTURED_EVENT"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"),
    (909, "CUDA_ERROR_TIMEOUT"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
    (916, "CUDA_ERROR_KEY_ROTATION"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// The name of `code` (`CUDA_ERROR_OUT_OF_MEMORY`), if CUDA 13.0 has it.
pub fn code_name(code: CuResult) -> Option<&'static str> {
    CODES.iter().find(|&&(c, _)| c == code).map(|&(_, name)| name)
}

/// The code named `name`, with or without its `CUDA_ERROR_` prefix, or given as a number.
pub fn code_by_name(name: &str) -> Option<CuResult> {
    if let Ok(number) = name.parse::<CuResult>() {
        return code_name(number).map(|_| number);
    }
    let full = if name.starts_with("CUDA_") { name.to_string() } else { format!("CUDA_ERROR_{name}") };
    CODES.iter().find(|&&(_, n)| n == full).map(|&(c, _)| c)
}

/// The description of `code`, NUL-terminated (what `cuGetErrorString` hands out).
pub fn code_string(code: CuResult) -> Option<&'static [u8]> {
    let text: &'static [u8] = match code {
        SUCCESS => b"no error\0",
        INVALID_VALUE => b"invalid argument\0",
        OUT_OF_MEMORY => b"out of memory\0",
        NOT_INITIALIZED => b"initialization error\0",
        NO_DEVICE => b"no CUDA-capable device is detected\0",
        INVALID_DEVICE => b"invalid device ordinal\0",
        INVALID_CONTEXT => b"invalid device context\0",
        INVALID_HANDLE => b"invalid resource handle\0",
        NOT_FOUND => b"named symbol not found\0",
        NOT_READY => b"device not ready\0",
        ILLEGAL_ADDRESS => b"an illegal memory access was encountered\0",
        NOT_PERMITTED => b"operation not permitted\0",
        NOT_SUPPORTED => b"operation not supported\0",
        999 => b"unknown error\0",
        _ => return described(code),
    };
    Some(text)
}

/// "peer access unsupported" for `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`: made once per code and
/// kept for the life of the process, as the driver's strings are static.
fn described(code: CuResult) -> Option<&'static [u8]> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MADE: OnceLock<Mutex<HashMap<CuResult, &'static [u8]>>> = OnceLock::new();
    let name = code_name(code)?;
    let mut made = MADE.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    Some(made.entry(code).or_insert_with(|| {
        let words = name.trim_start_matches("CUDA_ERROR_").to_lowercase().replace('_', " ");
        Box::leak(format!("{words}\0").into_bytes().into_boxed_slice())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_names_and_strings() {
        assert_eq!(code_name(OUT_OF_MEMORY), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(code_string(NOT_SUPPORTED), Some(&b"operation not supported\0"[..]));
        assert_eq!(code_string(217), Some(&b"peer access unsupported\0"[..]));
        assert_eq!(code_name(12345), None);
        assert_eq!(code_string(12345), None);
        assert!(CODES.iter().all(|&(c, _)| code_string(c).is_some_and(|s| s.ends_with(b"\0"))));
    }

    #[test]
    fn codes_are_found_by_name() {
        assert_eq!(code_by_name("OUT_OF_MEMORY"), Some(OUT_OF_MEMORY));
        assert_eq!(code_by_name("CUDA_ERROR_NOT_SUPPORTED"), Some(NOT_SUPPORTED));
        assert_eq!(code_by_name("2"), Some(OUT_OF_MEMORY));
        assert_eq!(code_by_name("12345"), None);
        assert_eq!(code_by_name("NO_SUCH_ERROR"), None);
    }

    #[test]
    fn layouts_match_cudas_headers() {
        use cudarc::driver::sys;
        use std::mem::{align_of, size_of};
        assert_eq!(size_of::<MemLocation>(), size_of::<sys::CUmemLocation>());
        assert_eq!(size_of::<MemAllocationProp>(), size_of::<sys::CUmemAllocationProp>());
        assert_eq!(align_of::<MemAllocationProp>(), align_of::<sys::CUmemAllocationProp>());
        assert_eq!(size_of::<MemAccessDesc>(), size_of::<sys::CUmemAccessDesc>());
        assert_eq!(std::mem::offset_of!(MemAllocationProp, location), std::mem::offset_of!(sys::CUmemAllocationProp, location));
        assert_eq!(std::mem::offset_of!(MemAccessDesc, flags), std::mem::offset_of!(sys::CUmemAccessDesc, flags));
        let vmm = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
        assert_eq!(vmm as i32, attribute::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
        assert_eq!(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX as i32, attribute::MAX);
        assert_eq!(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as i32, pointer::DEVICE_ORDINAL);
        assert_eq!(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE as i32, pointer::RANGE_SIZE);
        use sys::cudaError_enum as E;
        for (code, ours) in [
            (E::CUDA_ERROR_NOT_SUPPORTED, NOT_SUPPORTED),
            (E::CUDA_ERROR_ILLEGAL_ADDRESS, ILLEGAL_ADDRESS),
            (E::CUDA_ERROR_KEY_ROTATION, 916),
        ] {
            assert_eq!(code as u32, ours);
            assert_eq!(code_name(ours), Some(format!("{code:?}").as_str()));
        }
    }
}
