//! Every other function of CUDA 13.0's driver API (the list in `names`): each exists, so that a
//! caller looking it up never fails to load, and returns `CUDA_ERROR_NOT_SUPPORTED`, saying so
//! on stderr the first time. Callers that pass arguments to a stub are safe: C callers clean up
//! their own arguments, and a stub reads none.
#![allow(non_snake_case)]

use crate::abi::{self, CuResult};
use crate::{emulator, entry};

fn not_supported(name: &'static str) -> CuResult {
    entry::run(name, || {
        if emulator().calls.note_unsupported(name) {
            eprintln!("emulated CUDA driver: {name} is not implemented: CUDA_ERROR_NOT_SUPPORTED");
        }
        Err(abi::NOT_SUPPORTED)
    })
}

macro_rules! stubs {
    ($($name:ident,)*) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> CuResult {
                not_supported(stringify!($name))
            }
        )*
    };
}

crate::names::with_unsupported!(stubs);
