//! The core's shape, as docs/ARCHITECTURE.md states it, checked from its
//! sources: the `Gateway` front is the only `impl Gateway` and keeps its
//! fields private, every module of the gateway is a stage or a leaf, no
//! stage or leaf names another stage, even through an item the front
//! re-exports (so that every call into a stage returns to the front), and
//! no two modules of the crate import each other, directly or round a
//! circle.

mod sources;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use sources::sources;

/// The module path of a file (`gateway/ingress/v6.rs` is
/// `gateway::ingress::v6`, `gateway/mod.rs` is `gateway`, `lib.rs` the root).
fn module_of(file: &str) -> Vec<String> {
    let path = PathBuf::from(file.trim_end_matches(".rs"));
    let mut parts: Vec<String> = path.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Code without comments, so that prose naming a path is no import.
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path of a file's `use` trees (which may span lines), braces
/// expanded, relative ones (`use ingress::Classified`) included.
fn use_paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before_ok = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
        rest = &rest[at + 4..];
        if !before_ok {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
        expand(&tree, &mut Vec::new(), &mut found);
        rest = &rest[end..];
    }
    found
}

/// The `crate::`/`super::` paths a file names, braces of `use` trees
/// expanded.
fn paths(text: &str) -> Vec<Vec<String>> {
    let code = code(text);
    let mut found = use_paths(&code);
    // Paths written inline.
    for (start, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        let before_ok = start == 0 || {
            let c = code.as_bytes()[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':' || c == b'{' || c == b',')
        };
        if !before_ok {
            continue;
        }
        let path: Vec<String> = code[start..]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .next()
            .unwrap_or_default()
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        found.push(path);
    }
    found
        .into_iter()
        .filter(|p| p.first().is_some_and(|s| s == "crate" || s == "super"))
        .collect()
}

/// Expands a `use` tree (whitespace removed) into its paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut from = 0;
        let mut items = Vec::new();
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[from..i]);
                    from = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[from..]);
        let len = prefix.len();
        prefix.extend(head);
        for item in items.into_iter().filter(|i| !i.is_empty()) {
            expand(item, prefix, out);
        }
        prefix.truncate(len);
    } else {
        let mut path = prefix.clone();
        let tree = tree.split(" as ").next().unwrap_or(tree);
        path.extend(
            tree.split("::")
                .filter(|s| !s.is_empty() && *s != "self")
                .map(str::to_owned),
        );
        out.push(path);
    }
}

/// The module a path leads to: the deepest module with a file that it
/// names, from the file's own module.
fn resolve(from: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut base: Vec<String> = from.to_vec();
    let mut segments = path.iter().peekable();
    match segments.peek().map(|s| s.as_str()) {
        Some("crate") => {
            base.clear();
            segments.next();
        }
        Some("super") => {
            while segments.peek().is_some_and(|s| *s == "super") {
                base.pop()?;
                segments.next();
            }
        }
        _ => return None,
    }
    for segment in segments {
        let mut next = base.clone();
        next.push(segment.clone());
        if !modules.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// A submodule that implements its parent's type in a file of its own
/// (the parent's IPv6 half): it refers to its parent by design.
const PART_OF_PARENT: &[&str] = &["gateway::ingress::v6"];

/// The items the front imports from its own child modules (`use
/// ingress::Classified`, `pub use jobs::BACKLOG_LIMIT`), by name, with the
/// module each comes from: a `super::NAME` naming one of them reaches that
/// module through the front.
fn front_imports(front: &str, modules: &BTreeSet<Vec<String>>) -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    for path in use_paths(&code(front)) {
        let (Some(first), Some(name)) = (path.first(), path.last()) else {
            continue;
        };
        let child = vec!["gateway".to_owned(), first.clone()];
        if path.len() >= 2 && modules.contains(&child) {
            found.insert(name.clone(), child);
        }
    }
    found
}

fn import_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = sources();
    let modules: BTreeSet<Vec<String>> = files.keys().map(|f| module_of(f)).collect();
    let through_front = front_imports(&files["gateway/mod.rs"], &modules);
    let front = vec!["gateway".to_owned()];
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (file, text) in &files {
        let from = module_of(file);
        let part_of_parent = PART_OF_PARENT.contains(&from.join("::").as_str());
        for path in paths(text) {
            let Some(mut to) = resolve(&from, &path, &modules) else {
                continue;
            };
            if to == front {
                if let Some(via) = path.last().and_then(|name| through_front.get(name)) {
                    to = via.clone();
                }
            }
            // The crate root only declares and re-exports; a module's own
            // items are no edge; nor is a part's reference to its whole.
            let to_parent = to.len() + 1 == from.len() && from.starts_with(&to);
            if to.is_empty() || to == from || (part_of_parent && to_parent) {
                continue;
            }
            graph.entry(from.clone()).or_default().insert(to);
        }
    }
    graph
}

/// A cycle through `start`, if there is one.
fn cycle_from(
    graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    start: &Vec<String>,
) -> Option<Vec<Vec<String>>> {
    let mut stack = vec![(start.clone(), vec![start.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((node, trail)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                let mut cycle = trail.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut trail = trail.clone();
                trail.push(next.clone());
                stack.push((next.clone(), trail));
            }
        }
    }
    None
}

#[test]
fn no_two_modules_import_each_other() {
    let graph = import_graph();
    assert!(
        graph
            .get(&vec!["gateway".to_owned()])
            .is_some_and(|to| to.len() > 5),
        "the scan must see the front's imports of its stages: {graph:?}"
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|start| cycle_from(&graph, start))
        .map(|cycle| {
            cycle
                .iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" -> ")
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "modules that import each other:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_front_is_the_only_impl_gateway_and_keeps_its_fields() {
    let files = sources();
    let outside: Vec<&String> = files
        .iter()
        .filter(|(file, text)| {
            file.as_str() != "gateway/mod.rs"
                && code(text)
                    .lines()
                    .any(|l| l.trim_start().starts_with("impl Gateway"))
        })
        .map(|(file, _)| file)
        .collect();
    assert!(
        outside.is_empty(),
        "`impl Gateway` outside the front's file: {outside:?}"
    );
    let front = code(&files["gateway/mod.rs"]);
    let body = front
        .split("pub struct Gateway {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("gateway/mod.rs defines the Gateway struct");
    let public: Vec<&str> = body
        .lines()
        .filter(|l| l.trim_start().starts_with("pub"))
        .collect();
    assert!(
        public.is_empty(),
        "fields of the front that are not private: {public:?}"
    );
}

/// The front's stages: each owns its state, and hands what it found for
/// another stage back to the front rather than calling it.
const STAGES: &[&str] = &[
    "gateway::ingress",
    "gateway::outbound",
    "gateway::jobs",
    "gateway::inbound",
    "gateway::egress",
    "gateway::local",
    "gateway::encap",
];

/// What the front and the stages share: vocabulary, and state that is
/// fixed for the gateway's life or that the front owns and lends. A leaf
/// calls no stage.
const LEAVES: &[&str] = &[
    "gateway::addressing",
    "gateway::ipid",
    "gateway::output",
    "gateway::own_packets",
    "gateway::setup",
    "gateway::transit",
];

/// The stage or leaf a module belongs to (`gateway::ingress::v6` is
/// ingress's).
fn room_of(module: &[String], rooms: &[&'static str]) -> Option<&'static str> {
    let name = module.join("::");
    rooms
        .iter()
        .copied()
        .find(|room| name == *room || name.starts_with(&format!("{room}::")))
}

/// Stage and leaf modules that import a stage other than their own: calls
/// that would return to a stage, not to the front.
fn stage_to_stage(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let mut found = Vec::new();
    for (from, targets) in graph {
        let own = room_of(from, STAGES);
        if own.is_none() && room_of(from, LEAVES).is_none() {
            continue;
        }
        for to in targets {
            if let Some(other) = room_of(to, STAGES).filter(|other| Some(*other) != own) {
                found.push(format!("{} -> {other}", from.join("::")));
            }
        }
    }
    found
}

#[test]
fn every_module_of_the_gateway_is_a_stage_or_a_leaf() {
    let files = sources();
    let children: BTreeSet<String> = files
        .keys()
        .map(|f| module_of(f))
        .filter(|m| m.len() == 2 && m[0] == "gateway")
        .map(|m| m.join("::"))
        .collect();
    let unplaced: Vec<&String> = children
        .iter()
        .filter(|c| STAGES.contains(&c.as_str()) == LEAVES.contains(&c.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "gateway modules that are not exactly one of a stage or a leaf (add each to STAGES or LEAVES): {unplaced:?}"
    );
    for room in STAGES.iter().chain(LEAVES) {
        assert!(children.contains(*room), "{room} is listed but has no file");
    }
}

#[test]
fn no_stage_names_another_stage() {
    let graph = import_graph();
    for stage in STAGES {
        let module: Vec<String> = stage.split("::").map(str::to_owned).collect();
        assert!(
            graph.contains_key(&module),
            "the scan must see the stage {stage}'s imports: {graph:?}"
        );
    }
    let found = stage_to_stage(&graph);
    assert!(
        found.is_empty(),
        "stages or leaves that name a stage (what one finds for another goes back to the front):\n{}",
        found.join("\n")
    );
    // The check itself sees such edges: a stage's part naming another
    // stage, and a leaf naming a stage.
    let mut planted = graph.clone();
    let module = |path: &str| -> Vec<String> { path.split("::").map(str::to_owned).collect() };
    planted
        .entry(module("gateway::ingress::v6"))
        .or_default()
        .insert(module("gateway::egress"));
    planted
        .entry(module("gateway::own_packets"))
        .or_default()
        .insert(module("gateway::jobs"));
    assert_eq!(
        stage_to_stage(&planted),
        vec![
            "gateway::ingress::v6 -> gateway::egress",
            "gateway::own_packets -> gateway::jobs"
        ]
    );
}

/// A stage item the front re-exports is still the stage's: `super::NAME`
/// from another stage is an edge to the stage it came from.
#[test]
fn an_item_the_front_imports_from_a_stage_is_that_stage_s() {
    let files = sources();
    let modules: BTreeSet<Vec<String>> = files.keys().map(|f| module_of(f)).collect();
    let through_front = front_imports(&files["gateway/mod.rs"], &modules);
    let jobs = vec!["gateway".to_owned(), "jobs".to_owned()];
    assert_eq!(
        through_front.get("BACKLOG_LIMIT"),
        Some(&jobs),
        "{through_front:?}"
    );
}

#[test]
fn the_scan_sees_a_circle_when_there_is_one() {
    let mut graph = BTreeMap::new();
    let (a, b, c) = (vec!["a".to_owned()], vec!["b".to_owned()], vec!["c".to_owned()]);
    graph.insert(a.clone(), BTreeSet::from([b.clone()]));
    graph.insert(b.clone(), BTreeSet::from([c.clone()]));
    assert!(cycle_from(&graph, &a).is_none());
    graph.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(cycle_from(&graph, &a), Some(vec![a.clone(), b, c, a]));
    let mut tree = Vec::new();
    expand(
        "super::{egress::Egress,output::{IcmpError,Next}}",
        &mut Vec::new(),
        &mut tree,
    );
    assert_eq!(
        tree,
        vec![
            vec!["super", "egress", "Egress"],
            vec!["super", "output", "IcmpError"],
            vec!["super", "output", "Next"]
        ]
    );
}
