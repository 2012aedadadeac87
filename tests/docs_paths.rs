//! The documentation names files of this repository (`src/daemon.rs`,
//! `scripts/vm/build.sh`, `[the lab](docs/lab.md#anchor)`). When one of
//! them is moved or deleted, the docs that name it must change too, so a
//! path that no longer exists fails here. The docs must also stay within
//! the repository: no path outside it and no tracker numbers.

use std::path::{Component, Path, PathBuf};

/// What a repository path starts with. Anything else in backticks (a
/// command, a Rust path, `/etc/espgw`) is not checked. `examples/` is left
/// out: the docs also name other projects' examples (DPDK's
/// `examples/ipsec-ike`).
const TOP_DIRS: &[&str] = &[
    "src/",
    "dataplane/",
    "drivers/",
    "accel/",
    "spd-sad/",
    "ike-stub/",
    "bench/",
    "testkit/",
    "lib-tests/",
    "scripts/",
    "docs/",
    "tests/",
    "fuzz/",
    "packaging/",
    ".ci/",
    "configs/",
];
const TOP_FILES: &[&str] = &[
    "README.md",
    "SECURITY.md",
    "Cargo.toml",
    "Cargo.lock",
    "rustfmt.toml",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown file under docs/.
fn doc_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut files);
    files
}

/// The text outside fenced code blocks, line for line (fenced lines become
/// empty), so that inline code spans and links are found where they are.
/// Fenced blocks hold program output and shell sessions, whose paths are
/// the run's (`/tmp/...`) rather than the repository's.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The contents of single-backtick code spans (which may cross a line).
fn code_spans(prose: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = prose;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(len) = after.find('`') else { break };
        spans.push(&after[..len]);
        rest = &after[len + 1..];
    }
    spans
}

/// The targets of inline links and images, `[text](target)`.
fn link_targets(prose: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = prose;
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(len) = after.find(')') else { break };
        let target = after[..len].split_whitespace().next().unwrap_or("");
        targets.push(target);
        rest = &after[len + 1..];
    }
    targets
}

/// Files whose names are capitals by convention, not placeholders.
const CAPITAL_NAMES: &[&str] = &["README", "SECURITY", "ARCHITECTURE", "STUDIES", "LICENSE"];

/// A placeholder segment such as `NAME`, `SECONDS` or `NAME.toml`: its name
/// before any extension is all capitals.
fn is_placeholder(segment: &str) -> bool {
    let stem = segment.split('.').next().unwrap_or(segment);
    stem.len() > 1
        && stem
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !CAPITAL_NAMES.contains(&stem)
}

/// The repository paths one word of a code span names, if it names one.
fn repo_path(word: &str) -> Option<&str> {
    let word = word.trim_start_matches(['(', '"', '\'']);
    let word = word.trim_end_matches([',', '.', ';', ':', ')', '"', '\'']);
    // `src/daemon.rs:471` names a line of the file.
    let word = match word.split_once(':') {
        Some((path, line)) if line.chars().all(|c| c.is_ascii_digit() || c == ':') => path,
        _ => word,
    };
    let known = TOP_FILES.contains(&word) || TOP_DIRS.iter().any(|d| word.starts_with(d));
    let pattern = word.contains(['*', '<', '>', '{', '}', '$', '…', '[', ']', '|'])
        || word.contains("...")
        || word.contains("::")
        || word.split('/').any(is_placeholder);
    (known && !pattern).then_some(word)
}

/// Where a relative link from `doc` points, if it is a relative link.
fn link_path(doc: &Path, target: &str) -> Option<PathBuf> {
    let target = target.split('#').next().unwrap_or("");
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let mut path = doc.parent().expect("a doc has a directory").to_path_buf();
    for part in Path::new(target).components() {
        match part {
            Component::ParentDir => {
                path.pop();
            }
            Component::Normal(name) => path.push(name),
            _ => {}
        }
    }
    Some(path)
}

/// Every path `doc` names that does not exist, with how it was named.
fn missing_paths(doc: &Path, text: &str) -> Vec<String> {
    let root = root();
    let prose = prose(text);
    let mut missing = Vec::new();
    for span in code_spans(&prose) {
        for word in span.split_whitespace() {
            if let Some(path) = repo_path(word) {
                if !root.join(path).exists() {
                    missing.push(format!("`{path}`"));
                }
            }
        }
    }
    for target in link_targets(&prose) {
        if let Some(path) = link_path(doc, target) {
            if !path.starts_with(&root) {
                missing.push(format!("({target}): outside the repository"));
            } else if !path.exists() {
                missing.push(format!("({target})"));
            }
        }
    }
    missing
}

/// The word "issue" followed by a number (with or without `#`): a
/// tracker the repository does not have.
fn names_an_issue(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.match_indices("issue ").any(|(at, found)| {
        let after = lower[at + found.len()..].trim_start_matches('#');
        after.starts_with(|c: char| c.is_ascii_digit())
    })
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

#[test]
fn every_path_the_docs_name_exists() {
    let mut failures = Vec::new();
    let files = doc_files();
    assert!(files.len() > 5, "README.md and docs/: {files:?}");
    for doc in &files {
        let text = std::fs::read_to_string(doc).expect("a readable doc");
        for missing in missing_paths(doc, &text) {
            failures.push(format!("{}: {missing} does not exist", relative(doc)));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_docs_point_nowhere_outside_the_repository() {
    let mut failures = Vec::new();
    for doc in doc_files() {
        let text = std::fs::read_to_string(&doc).expect("a readable doc");
        // Spelled in parts, so that this file does not name them itself.
        for outside in [concat!("..", "/shared"), concat!("/wo", "rk/")] {
            if text.contains(outside) {
                failures.push(format!("{}: names `{outside}`", relative(&doc)));
            }
        }
        if names_an_issue(&text) {
            failures.push(format!("{}: names an issue number", relative(&doc)));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn what_counts_as_a_repository_path() {
    let named: Vec<_> = "`src/daemon.rs`, `sudo scripts/soak.sh [SECONDS]`, \
         `dataplane/src/wire/`, `src/daemon.rs:471` and `scripts/vm/README.md`; not `/etc/espgw/site-a.toml`, \
         `https://example.org/src/x`, `fuzz/seeds/<target>/`, `configs/NAME.toml`, \
         `docs/*.md`, `gateway/mod.rs`, `spd_sad::inbound_owner` or `espgw run`"
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split_whitespace().filter_map(repo_path).collect::<Vec<_>>())
        .collect();
    assert_eq!(
        named,
        [
            "src/daemon.rs",
            "scripts/soak.sh",
            "dataplane/src/wire/",
            "src/daemon.rs",
            "scripts/vm/README.md"
        ]
    );

    let doc = root().join("docs/lab.md");
    let text = "See [results](results.md#scale), [the VM](../scripts/vm/README.md), \
                [a site](https://example.org/x.md) and [here](#top).\n\
                ```\n`src/not-checked-in-a-fence.rs`\n```\n";
    assert_eq!(
        link_targets(&prose(text)),
        [
            "results.md#scale",
            "../scripts/vm/README.md",
            "https://example.org/x.md",
            "#top"
        ]
    );
    assert!(
        missing_paths(&doc, text).is_empty(),
        "{:?}",
        missing_paths(&doc, text)
    );
    assert_eq!(
        missing_paths(&doc, "[gone](gone.md) and `src/gone.rs`"),
        ["`src/gone.rs`", "(gone.md)"]
    );
    assert_eq!(
        missing_paths(&doc, "[up](../../elsewhere.md)"),
        ["(../../elsewhere.md): outside the repository"]
    );

    let tracker = |n: u32, hash: &str| format!("{}{hash}{n}", "Issue ");
    assert!(names_an_issue(&format!("fixed in {}.", tracker(99, "#"))));
    assert!(names_an_issue(&format!("see {}", tracker(7, "").to_lowercase())));
    assert!(!names_an_issue("the issue is the copy, 2 of them"));
}
