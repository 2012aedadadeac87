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
    /// A `proposal` no algorithm has.
    #[error(transparent)]
    UnknownProposal(#[from] accel::UnknownAlgorithm),
    /// Proposal `null` without `allow_insecure_null = true`.
    #[error("proposal `null` encrypts and authenticates nothing; it exists only as a benchmark baseline. Set `allow_insecure_null = true` under [gateway] to use it")]
    InsecureNull,
    /// A key or secret that is malformed, of the wrong length, missing,
    /// not wanted, or shared with another SA.
    #[error("{0}")]
    Key(String),
    /// A value out of its range or not of its kind (an address, a port, a
    /// route's next hop, a lifetime).
    #[error("{0}")]
    Value(String),
    #[error("policy `{policy}` protects with SA `{sa}`, but no SA has that name; define it with [[sa]] or [[tunnel]]")]
    /// A `protect` policy names an SA the file lacks.
    MissingSa {
        /// The policy's name.
        policy: String,
        /// The SA it names.
        sa: String,
    },
    #[error("policy `{policy}` is an {direction} policy but SA `{sa}` is not an {direction} SA; an `out` policy needs an `out` SA and an `in` policy an `in` SA")]
    /// A `protect` policy names an SA of the other direction.
    WrongSaDirection {
        /// The policy's name.
        policy: String,
        /// The SA it names.
        sa: String,
        /// The policy's direction (`in` or `out`), which the SA lacks.
        direction: String,
    },
    #[error(
        "inbound SPI {spi:#x} is used by both `{first}` and `{second}`; every inbound SA needs its own SPI"
    )]
    /// Two inbound SAs with one SPI, which finds the SA of a packet.
    DuplicateSpi {
        /// The SPI.
        spi: u32,
        /// The SA that has it first in the file.
        first: String,
        /// The SA that has it again.
        second: String,
    },
    /// RFC 4301 §5.2: what arrives through an inbound SA must match its
    /// selectors, and an SA that no policy names has none.
    #[error("inbound SA `{sa}` is named by no inbound `protect` policy, so nothing says which inner packets may arrive through it (RFC 4301 §5.2); add a [[policy]] with direction = \"in\", action = \"protect\", sa = \"{sa}\" and the source and destination it carries, or write selectors = \"any\" in the SA to admit every inner packet")]
    UnselectedSa {
        /// The inbound SA's name.
        sa: String,
    },
    #[error("SA `{sa}` has selectors = \"any\" but inbound policy `{policy}` names it too, which would admit more than the policy selects; remove `selectors` to admit what the policies select, or remove the policy")]
    /// An SA with `selectors = "any"` that an inbound policy names too.
    AnySaWithPolicy {
        /// The SA's name.
        sa: String,
        /// An inbound policy that names it.
        policy: String,
    },
    /// A name given to two SAs or to two policies (a tunnel's SAs and
    /// policies are named after it, with `-out` and `-in`).
    #[error("the name `{0}` is used twice; SA, policy and tunnel names must be unique")]
    DuplicateName(String),
    /// Not exactly one `inside` and one `outside` interface, or a TUN
    /// device outside.
    #[error("{0}")]
    Interfaces(String),
    /// A file with keys that users other than the gateway's could write.
    #[error("{0}")]
    Exposed(String),
}

/// A configuration error with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The configuration file.
    pub file: PathBuf,
    /// 1-based line of the offending value (1 for what the file lacks);
    /// 0 when the file could not be read or was refused whole
    /// ([`Io`](ConfigErrorKind::Io), [`Exposed`](ConfigErrorKind::Exposed)).
    pub line: usize,
    /// 1-based column, in characters; 0 with line 0.
    pub column: usize,
    /// What is wrong.
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
