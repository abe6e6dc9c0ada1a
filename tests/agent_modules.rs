//! The pulling agent's parts (`src/agent/*.rs`) form a graph that reads one
//! way: no part names the agent itself (`agent.rs`) and no two parts import
//! each other in a circle. Read from the `super::…` and `crate::agent::…`
//! paths in each file. The edge's tailer is owned one way too: its table
//! holds it, and it never names the table.

use std::collections::BTreeMap;
use std::path::Path;

/// The first segment of every path after `prefix` in `text`
/// (`super::pump::Io` → `pump`; `super::{a::X, b}` → `a`, `b`).
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let rest = &text[at + prefix.len()..];
        let group = match rest.strip_prefix('{') {
            Some(inner) => inner.split('}').next().unwrap_or_default().split(',').map(str::trim).collect(),
            None => vec![rest],
        };
        for path in group {
            let name: String = path.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

fn graph() -> BTreeMap<String, Vec<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("src/agent is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().expect("a file name").to_string_lossy().into_owned();
            files.insert(name, std::fs::read_to_string(&path).expect("a readable source file"));
        }
    }
    let mut graph = BTreeMap::new();
    for (name, text) in &files {
        let mut deps: Vec<String> = named_after(text, "super::");
        deps.extend(named_after(text, "crate::agent::"));
        for dep in &deps {
            assert!(
                files.contains_key(dep),
                "agent/{name}.rs names `{dep}` of the agent module itself; a part must not reach back into agent.rs"
            );
        }
        deps.sort();
        deps.dedup();
        deps.retain(|d| d != name);
        graph.insert(name.clone(), deps);
    }
    graph
}

/// A circle in `graph` as a path, if there is one.
fn find_cycle(graph: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, Vec<String>>,
        done: &mut Vec<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.iter().any(|n| n == node) {
            return None;
        }
        path.push(node.to_string());
        for dep in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(dep, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(node.to_string());
        None
    }
    let mut done = Vec::new();
    graph.keys().find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_agent_parts_import_one_way() {
    let graph = graph();
    assert!(graph.len() >= 5, "the agent's parts are found: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the agent's parts import each other in a circle: {}", cycle.join(" → "));
    }
}

#[test]
fn the_checks_see_circles_and_reaching_back() {
    let names = named_after("use super::{pump::Io, streams};\nuse super::AgentMsg;", "super::");
    assert_eq!(names, ["pump", "streams", "AgentMsg"]);
    let circle: BTreeMap<String, Vec<String>> =
        [("a".into(), vec!["b".into()]), ("b".into(), vec!["a".into()])].into_iter().collect();
    assert!(find_cycle(&circle).is_some());
    let line: BTreeMap<String, Vec<String>> =
        [("a".into(), vec!["b".into()]), ("b".into(), vec![])].into_iter().collect();
    assert!(find_cycle(&line).is_none());
}

/// The code of `text` without comments and without the lines that declare
/// or re-export the table's module (`mod runs;`, `use runs::Runs;`).
fn code_naming(text: &str, word: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("//") && *line != "mod runs;" && !line.ends_with("use runs::Runs;"))
        .filter(|line| line.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == word))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_tailer_knows_nothing_of_the_table_that_owns_it() {
    // The table (`edge/tailer/runs.rs`) holds its tailers and frees their
    // slots; the tailer and its other parts never reach back to it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/edge");
    let mut checked = 0;
    for file in ["tailer.rs", "tailer/lifecycle.rs", "tailer/consumer.rs"] {
        let text = std::fs::read_to_string(root.join(file)).expect("a readable source file");
        for word in ["Runs", "runs"] {
            let lines = code_naming(&text, word);
            assert!(lines.is_empty(), "edge/{file} names the tailers' table: {lines:?}");
        }
        checked += 1;
    }
    assert_eq!(checked, 3);
    let sample = "mod runs;\npub(crate) use runs::Runs;\n/// the Runs table\nruns: Weak<Runs>,";
    assert_eq!(code_naming(sample, "Runs"), ["runs: Weak<Runs>,"], "the check sees a reference back");
}
