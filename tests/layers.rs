//! The library's module graph reads one way: from `server` down to
//! `stream.rs`.
//!
//! Reads every `src/*.rs` and `src/*/**.rs`, maps each `crate::x` it names
//! to its top-level module, and checks
//! two things: the graph of top-level modules has no cycle, and every edge
//! goes down the layer order that `docs/architecture.md` states under
//! "Layers". A new module must be placed in that list.
//!
//! Unit tests in files of their own (`x/tests.rs`) and the fixtures
//! (`testing`, `fixtures`) are left out: like the tests under `tests/`, they drive a
//! module from above, through any module of the crate.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules: `src/x.rs` and `src/x/` (not `lib.rs`, `main.rs`,
/// nor the tests' fixtures, `testing` and `fixtures`).
fn top_level_modules() -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src()).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let is_module = path.is_dir() || path.extension().is_some_and(|e| e == "rs");
        if is_module && !["lib", "main", "testing", "fixtures"].contains(&name.as_str()) {
            modules.insert(name);
        }
    }
    modules
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a source directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text without `//` comments (doc links are not dependencies).
fn code_of(text: &str) -> String {
    text.lines().map(|line| line.find("//").map_or(line, |at| &line[..at])).collect::<Vec<_>>().join("\n")
}

/// The first path segments named after `root::`, including each one of a
/// group `root::{a::x, b::{y, z}}`.
fn named_modules(code: &str, root: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut names = BTreeSet::new();
    let pattern = format!("{root}::");
    let mut rest = code;
    while let Some(at) = rest.find(&pattern) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + pattern.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.insert(ident(group[start..i].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(group[start..i].trim()));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names
}

/// Which top-level module uses which.
fn module_graph() -> Graph {
    let modules = top_level_modules();
    let mut graph: Graph = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for file in files {
        let relative = file.strip_prefix(src()).expect("under src/");
        let first = relative.components().next().expect("a path").as_os_str().to_string_lossy().to_string();
        let from = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&from) || file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let code = code_of(&fs::read_to_string(&file).expect("a source file is readable"));
        for to in named_modules(&code, "crate") {
            if to != from && modules.contains(&to) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// A cycle of the graph, if it has one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = path.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = path[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, state, path) {
                        return Some(cycle);
                    }
                }
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str())
            && let Some(cycle) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

/// The layers `docs/architecture.md` states, top first: each item of the
/// numbered list under `## Layers` names its modules in backticks before
/// its colon.
fn documented_layers() -> Vec<Vec<String>> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    let text = fs::read_to_string(doc).expect("docs/architecture.md is readable");
    let section = text.split("\n## Layers\n").nth(1).expect("docs/architecture.md has a `## Layers` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut layers = Vec::new();
    for line in section.lines() {
        let Some((number, item)) = line.split_once(". ") else { continue };
        if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let names = item.split_once(':').map_or(item, |(names, _)| names);
        layers.push(names.split('`').skip(1).step_by(2).map(str::to_string).collect());
    }
    layers
}

#[test]
fn the_top_level_modules_form_no_cycle() {
    let graph = module_graph();
    assert!(graph.contains_key("stream") && graph.contains_key("server"), "the scan found no modules: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the modules of src/ import each other in a circle: {}", cycle.join(" -> "));
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let layers = documented_layers();
    let mut layer_of = BTreeMap::new();
    for (depth, layer) in layers.iter().enumerate() {
        for module in layer {
            assert!(layer_of.insert(module.clone(), depth).is_none(), "`{module}` is listed twice under Layers");
        }
    }
    let graph = module_graph();
    let unplaced: Vec<_> = graph.keys().filter(|m| !layer_of.contains_key(*m)).collect();
    assert!(unplaced.is_empty(), "docs/architecture.md's Layers do not place {unplaced:?}");
    let stale: Vec<_> = layer_of.keys().filter(|m| !graph.contains_key(*m)).collect();
    assert!(stale.is_empty(), "docs/architecture.md's Layers name modules that do not exist: {stale:?}");
    let mut upward = Vec::new();
    for (from, uses) in &graph {
        for to in uses {
            if layer_of[to] <= layer_of[from] {
                upward.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(upward.is_empty(), "these uses do not go down the documented layers: {upward:?}");
}

#[test]
fn the_scan_sees_groups_and_ignores_comments() {
    let code = code_of("use crate::{a::X, b::{c, d}};\n// crate::e\nlet x = crate::f::g(); my_crate::h");
    let names: Vec<_> = named_modules(&code, "crate").into_iter().collect();
    assert_eq!(names, ["a", "b", "f"]);
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&graph), Some(vec!["a".to_string(), "b".into(), "a".into()]));
}
