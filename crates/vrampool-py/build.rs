//! Builds csrc/malloc.c (`vrampool_torch_malloc` and the C++ exception it throws; why in C: see the
//! file) into the module, and exports its entry from the extension module.

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    cc::Build::new()
        .file("csrc/malloc.c")
        // An unwind table for the C frame that a C++ exception passes through.
        .flag("-fexceptions")
        .warnings(true)
        .extra_warnings(true)
        .compile("vrampool_torch_malloc");
    println!("cargo:rustc-link-lib=dl");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/csrc/exports.map");
    }
}
