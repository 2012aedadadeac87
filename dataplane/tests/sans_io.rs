//! The gateway core is sans-IO (docs/ARCHITECTURE.md): it takes `now` from its caller
//! and never reads a clock, sleeps, parks, blocks on a lock or waits on the
//! engine. Waiting lives in the drivers (the `drivers` crate). This reads
//! the core's sources and refuses any of those calls.

mod sources;

/// Files of the core: everything under `src/` (the drivers are a crate of
/// their own).
fn core_sources() -> Vec<(String, String)> {
    sources::sources().into_iter().collect()
}

#[test]
fn the_core_reads_no_clock_and_never_waits() {
    let forbidden = [
        "Instant",
        "SystemTime",
        "sleep",
        "thread::park",
        "park_timeout",
        ".wait(",
        "Condvar",
        "Mutex",
        "RwLock",
        "spin_loop",
        "libc::poll",
    ];
    let sources = core_sources();
    assert!(
        sources.iter().any(|(name, _)| name == "gateway/jobs.rs"),
        "the scan must see the job machine: {:?}",
        sources.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let mut found = Vec::new();
    for (name, text) in &sources {
        for (line_no, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                if code.contains(word) {
                    found.push(format!(
                        "src/{name}:{}: `{word}` in: {}",
                        line_no + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core must not wait or read a clock:\n{}",
        found.join("\n")
    );
}
