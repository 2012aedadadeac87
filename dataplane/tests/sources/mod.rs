//! The core crate's sources, read as text by the tests that check its
//! shape and its manners.

use std::collections::BTreeMap;
use std::path::Path;

/// Every source file under `src/`, by its path relative to `src/`.
pub fn sources() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path
                    .strip_prefix(&root)
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                files.insert(
                    relative,
                    std::fs::read_to_string(&path).expect("source is readable"),
                );
            }
        }
    }
    files
}
