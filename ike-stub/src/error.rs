//! Configuration errors that say where (file, line, column) and what to do.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What is wrong with a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    #[error("cannot read the file: {0}")]
    Io(String),
    /// TOML syntax or a field of the wrong type or name.
    #[error("{0}")]
    Syntax(String),
    #[error(transparent)]
    UnknownProposal(#[from] accel::UnknownAlgorithm),
    #[error("proposal `null` encrypts and authenticates nothing; it exists only as a benchmark baseline. Set `allow_insecure_null = true` under [gateway] to use it")]
    InsecureNull,
    #[error("{0}")]
    Key(String),
    #[error("{0}")]
    Value(String),
    #[error("policy `{policy}` protects with SA `{sa}`, but no SA has that name; define it with [[sa]] or [[tunnel]]")]
    MissingSa { policy: String, sa: String },
    #[error("policy `{policy}` is an {direction} policy but SA `{sa}` is not an {direction} SA; an `out` policy needs an `out` SA and an `in` policy an `in` SA")]
    WrongSaDirection {
        policy: String,
        sa: String,
        direction: String,
    },
    #[error(
        "inbound SPI {spi:#x} is used by both `{first}` and `{second}`; every inbound SA needs its own SPI"
    )]
    DuplicateSpi { spi: u32, first: String, second: String },
    /// RFC 4301 §5.2: what arrives through an inbound SA must match its
    /// selectors, and an SA that no policy names has none.
    #[error("inbound SA `{sa}` is named by no inbound `protect` policy, so nothing says which inner packets may arrive through it (RFC 4301 §5.2); add a [[policy]] with direction = \"in\", action = \"protect\", sa = \"{sa}\" and the source and destination it carries, or write selectors = \"any\" in the SA to admit every inner packet")]
    UnselectedSa { sa: String },
    #[error("SA `{sa}` has selectors = \"any\" but inbound policy `{policy}` names it too, which would admit more than the policy selects; remove `selectors` to admit what the policies select, or remove the policy")]
    AnySaWithPolicy { sa: String, policy: String },
    #[error("the name `{0}` is used twice; SA, policy and tunnel names must be unique")]
    DuplicateName(String),
    #[error("{0}")]
    Interfaces(String),
    /// A file with keys that users other than the gateway's could write.
    #[error("{0}")]
    Exposed(String),
}

/// A configuration error with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub kind: ConfigErrorKind,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.kind
        )
    }
}

impl std::error::Error for ConfigError {}

/// Turns byte offsets into 1-based line and column numbers.
pub(crate) struct Locator<'a> {
    file: &'a Path,
    text: &'a str,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(file: &'a Path, text: &'a str) -> Self {
        Locator { file, text }
    }

    pub(crate) fn error(&self, span: Option<Range<usize>>, kind: ConfigErrorKind) -> ConfigError {
        let offset = span.map_or(0, |s| s.start.min(self.text.len()));
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before
            .rfind('\n')
            .map_or(before.chars().count(), |nl| before[nl + 1..].chars().count())
            + 1;
        ConfigError {
            file: self.file.to_path_buf(),
            line,
            column,
            kind,
        }
    }
}
