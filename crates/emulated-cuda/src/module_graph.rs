//! Test only: the crate's modules use each other without a circle (issue 58).
//!
//! A module is a file of `src/`, or a folder of them (`driver/*.rs` are all `driver`); the crate
//! root, `lib.rs`, is `lib`; this test's own file is left out. Module `a` uses module `b` when
//! `a` writes a path `crate::b...` (or `$crate::b...`, or `crate::{b...}`); a path to an item of
//! the root itself (`crate::emulator`) is a use of `lib`, and the root's own paths to its
//! children (`calls::Calls`) are its uses of them. Paths within one folder (`super::`) stay
//! inside a module. Comment lines are skipped; `cargo test -p emulated-cuda module_graph --
//! --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn leading_ident(text: &str) -> &str {
    let text = text.trim_start();
    &text[..text.find(|c: char| !is_ident(c)).unwrap_or(text.len())]
}

/// The first names of the paths that follow each `prefix` in `code` (a prefix that does not
/// continue an identifier or a path): `crate::{a, b::c}` gives `a` and `b`.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        if code[..at].ends_with(|c: char| is_ident(c) || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            names.push(leading_ident(rest));
            continue;
        };
        let (mut depth, mut start) = (0, 0);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    names.push(leading_ident(&group[start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    names.push(leading_ident(&group[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module and the modules it uses.
fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let module_of = |file: &Path| {
        let first = file.strip_prefix(&src).unwrap().components().next().unwrap().as_os_str().to_str().unwrap();
        first.trim_end_matches(".rs").to_string()
    };
    files.retain(|f| module_of(f) != "module_graph");
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let module = module_of(file);
        let text = std::fs::read_to_string(file).unwrap();
        let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).map(|l| format!("{l}\n")).collect();
        let mut uses: Vec<String> = paths_after(&code, "crate::")
            .into_iter()
            .map(|name| if modules.contains(name) { name.to_string() } else { "lib".to_string() })
            .collect();
        if module == "lib" {
            uses.extend(modules.iter().filter(|m| !paths_after(&code, &format!("{m}::")).is_empty()).cloned());
        }
        let entry = graph.entry(module.clone()).or_default();
        entry.extend(uses.into_iter().filter(|u| *u != module));
    }
    graph
}

/// A circle of modules, if there is one.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(module: &str, graph: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            return Some(path[at..].iter().cloned().chain([module.to_string()]).collect());
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_use_each_other_without_a_circle() {
    let graph = graph();
    for (module, uses) in &graph {
        println!("{module} -> {}", uses.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    assert!(graph.len() > 10 && graph["driver"].contains("abi"), "the graph was not read: {graph:?}");
    if let Some(circle) = circle(&graph) {
        panic!("a circle of modules: {}", circle.join(" -> "));
    }
}

#[test]
fn paths_are_read_with_their_groups() {
    let code = "use crate::abi::{self, CuResult};\nuse crate::{calls, emulator::x};\n$crate::entry::run(); mycrate::no; a::crate::no;";
    assert_eq!(paths_after(code, "crate::"), ["abi", "calls", "emulator", "entry"]);
    assert_eq!(circle(&Graph::from([("a".into(), ["b".into()].into()), ("b".into(), ["a".into()].into())])).unwrap(), ["a", "b", "a"]);
    assert_eq!(circle(&Graph::from([("a".into(), ["b".into()].into()), ("b".into(), BTreeSet::new())])), None);
}
