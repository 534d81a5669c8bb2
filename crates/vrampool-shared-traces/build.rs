//! Looks for `somas-resnet50.csv` in the shared instances, `../shared/traces/static` beside the repository.

use std::path::PathBuf;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = PathBuf::from(manifest).join("../../../shared/traces/static");
    if dir.join("somas-resnet50.csv").is_file() {
        // Rerun when the folder changes or goes (a missing path is always stale).
        println!("cargo::rerun-if-changed={}", dir.display());
        println!("cargo::rustc-cfg=shared_traces");
    } else {
        // A path that never exists: rerun at every build until the folder is there (its own
        // time may be older than the last build when it is moved or linked in). Only this small
        // crate and the tests that use it are rebuilt.
        println!("cargo::rerun-if-changed={}", dir.join(".never").display());
    }
}
