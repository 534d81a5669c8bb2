//! `#[needs_shared_traces]`, above `#[test]`: the test runs where `somas-resnet50.csv`, the one instance the
//! repository does not carry (its source names no licence, see `tests/data/static/README.md`), is in
//! `../shared/traces/static` beside the repository, and is ignored where it is not, with that reason, so that
//! a run without it reports the test as ignored rather than passed (the Python tests skip with the same reason).

use proc_macro::TokenStream;

const IGNORED: &str =
    r#"#[ignore = "somas-resnet50.csv is not carried in the repo (no licence named) and ../shared/traces/static is not beside it"]"#;

#[proc_macro_attribute]
pub fn needs_shared_traces(_args: TokenStream, test: TokenStream) -> TokenStream {
    if cfg!(shared_traces) {
        return test;
    }
    let mut ignored: TokenStream = IGNORED.parse().expect("a valid attribute");
    ignored.extend(test);
    ignored
}
