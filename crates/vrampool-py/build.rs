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
        // The script is linked from OUT_DIR, not from the source: cargo reuses a build script's
        // output for the same package at another path (a shared target dir across clones), and a
        // path into the source tree would name a checkout that may be gone.
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("exports.map");
        std::fs::copy("csrc/exports.map", &out).expect("csrc/exports.map is readable");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", out.display());
    }
}
