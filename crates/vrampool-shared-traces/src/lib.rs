//! `#[needs_shared_traces]`, above `#[test]`: the test runs where the shared instances
//! (`../shared/traces/static`, beside the repository) are, and is ignored where they are not, with
//! that reason, so that a run without them reports the test as ignored rather than passed (the
//! Python tests skip with the same reason).

use proc_macro::TokenStream;

const IGNORED: &str = r#"#[ignore = "../shared/traces/static is not beside the repo"]"#;

#[proc_macro_attribute]
pub fn needs_shared_traces(_args: TokenStream, test: TokenStream) -> TokenStream {
    if cfg!(shared_traces) {
        return test;
    }
    let mut ignored: TokenStream = IGNORED.parse().expect("a valid attribute");
    ignored.extend(test);
    ignored
}
