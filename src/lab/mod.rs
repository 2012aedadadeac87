//! The lab: network namespaces on this host in which `espgw demo`, `espgw
//! demo --soak` and `espgw bench --veth` run real gateways between two
//! hosts. It owns the parts they share, so that none of them calls another:
//!
//! - `topology`: namespaces, veth pairs, addresses, the NAT, kernel
//!   forwarding, starting `espgw run` in a namespace, and removing it all;
//! - `traffic`: ping, numbered UDP streams, UDP echo and TCP, floods of
//!   bad ESP, iperf3;
//! - `capture`: watching a link between the gateways and counting what
//!   crosses it;
//! - `gateways`: the demo's two gateways from the shipped configs, edited
//!   for the flags below.
//!
//! Its work directories (configurations with keys, logs, counters) are
//! fresh and private ([`work_dir`]), and files are created in them without
//! following a link ([`write_new`]): a name in /tmp that another user
//! could guess and plant first is never used.
//!
//! Must not: print a report or decide whether a run passed (`demo`, `soak`
//! and `veth_bench` do), or hold dataplane logic (the gateways are `espgw
//! run` processes, driven from outside like a user's).

pub mod capture;
pub mod gateways;
pub mod strongswan;
pub mod topology;
pub mod traffic;

use std::path::{Path, PathBuf};

use accel::{Algorithm, BufferPolicy, EngineKind, Style};
use anyhow::{Context, Result};

/// A fresh work directory in the temporary directory, named `prefix` and
/// six random characters and made owner-only by mkdtemp(3): nothing can
/// be there before it, and no one else can enter it.
pub fn work_dir(prefix: &str) -> Result<PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut template = std::env::temp_dir()
        .join(format!("{prefix}XXXXXX"))
        .into_os_string()
        .into_vec();
    template.push(0);
    // SAFETY: mkdtemp rewrites the X's of the NUL-terminated template in
    // place and creates the directory with mode 0700.
    if unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) }.is_null() {
        return Err(std::io::Error::last_os_error()).with_context(|| {
            format!(
                "creating a work directory {}",
                std::ffi::OsStr::from_bytes(&template).to_string_lossy()
            )
        });
    }
    template.pop();
    Ok(PathBuf::from(std::ffi::OsString::from_vec(template)))
}

/// Writes `text` into a new owner-only file at `path`: never through a
/// symbolic link, never into a file that is already there.
pub fn write_new(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

// The flags of `espgw demo`. `--soak` shares them; the lab reads those that
// shape the topology and the gateways (`--nat`, `--algorithm`, the engine,
// `--rekey-every`, faults, `--keep`). Not a doc comment: clap would take it
// for the command's help text, which main.rs gives.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// ESP proposal for the tunnel.
    #[arg(long, default_value_t = Algorithm::Aes128Gcm16)]
    pub(crate) algorithm: Algorithm,
    /// Crypto engine of both gateways.
    #[arg(long, default_value_t = EngineKind::Soft)]
    pub(crate) engine: EngineKind,
    /// Submission style of both gateways.
    #[arg(long, default_value_t = Style::Async)]
    pub(crate) style: Style,
    /// Buffer policy of both gateways.
    #[arg(long, default_value_t = BufferPolicy::Registered)]
    pub(crate) buffers: BufferPolicy,
    /// Bytes sent over the TCP connection.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) tcp_bytes: usize,
    /// Keep the work directory (configs, stats, gateway logs).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Give the tunnel a soft byte lifetime of this size (e.g. 200kB, 1MB,
    /// 64KiB), so that the gateways rekey over and over while traffic flows.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) rekey_every: Option<u64>,
    /// While traffic flows, make gwA reload a broken configuration and one
    /// with an inbound SA that no policy names (by `espgw reload` and by
    /// SIGHUP), which it must refuse without losing a packet, then a valid
    /// one with one more tunnel, which it must take.
    #[arg(long)]
    pub(crate) reload_check: bool,
    /// Also measure what floods of bad ESP into gwB (unknown SPI, and the
    /// tunnel's SPI with sequence numbers that force an ICV check) cost the
    /// numbered UDP traffic, against a run without a flood.
    #[arg(long)]
    pub(crate) flood_check: bool,
    /// Frames per second of the flood check's floods (default: as fast as
    /// one thread can send).
    #[arg(long, value_name = "FRAMES_PER_SECOND")]
    pub(crate) flood_rate: Option<u64>,
    /// Instead of one round, run mixed traffic for this many seconds and
    /// check for leaks and unexplained loss (see scripts/soak.sh).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) soak: Option<u64>,
    /// Run both gateways on the `sec` engine model with every N-th
    /// descriptor failing (fault injection).
    #[arg(long, value_name = "N")]
    pub(crate) fail_every: Option<u64>,
    /// Run both gateways on the `sec` engine model with every N-th
    /// completion lost (reclaimed after the job timeout).
    #[arg(long, value_name = "N")]
    pub(crate) lose_completion_every: Option<u64>,
    /// Put gwA behind a masquerading NAT (a fifth namespace, nftables) and
    /// run the tunnel as RFC 3948 ESP in UDP on both gateways: gwB knows
    /// only gwA's private address and must learn the NAT's address and
    /// port from gwA's authenticated packets.
    #[arg(long, conflicts_with_all = ["flood_check", "soak"])]
    pub(crate) nat: bool,
    /// Also give the hosts and the gateways' inside interfaces IPv6
    /// (2001:db8:1::/64 and 2001:db8:2::/64) and carry it through a second
    /// tunnel over the same IPv4 path (6-in-4): ping, UDP and TCP over
    /// IPv6 too, with the hosts' kernels resolving the gateways by
    /// neighbour discovery and learning the tunnel's MTU from its
    /// packet-too-big errors.
    #[arg(long, conflicts_with_all = ["flood_check", "soak"])]
    pub(crate) ipv6: bool,
    /// Where the gateways' keys come from: their own exchange, or an
    /// unmodified strongSwan charon in a keying namespace per gateway
    /// (`espgw-keyA`, `espgw-keyB`), IKEv2 with a pre-shared key through
    /// espgw's IKE relay, its SAs mirrored from the kernel's XFRM tables.
    /// strongSwan needs a kernel with ESP there (CONFIG_INET_ESP); without
    /// one the demo stops before it changes anything.
    #[arg(long, value_enum, default_value_t = DemoKeying::Exchange)]
    pub(crate) keying: DemoKeying,
}

/// `espgw demo --keying`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoKeying {
    /// The gateways' own exchange (a `secret` in their configuration).
    Exchange,
    /// strongSwan's charon in keying namespaces, mirrored through XFRM.
    Strongswan,
}

/// "200kB", "1MB", "64KiB", "5000": a size in bytes.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write e.g. 200kB, 1MB or 65536"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        other => return Err(format!("unknown unit `{other}`; use B, kB, KiB, MB, MiB or GB")),
    };
    number
        .checked_mul(scale)
        .filter(|n| *n >= 1000)
        .ok_or_else(|| format!("`{text}` is out of range; rekey every 1kB or more"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    /// The directories `espgw demo` and `espgw bench --veth` used to take,
    /// /tmp/espgw-demo-PID and /tmp/espgw-bench-veth-PID, planted as links
    /// to a directory another user controls: the work directories and the
    /// configurations written in them (as the demo and the bench write
    /// theirs) go elsewhere, owner-only, and nothing reaches the target.
    #[test]
    fn work_dirs_are_fresh_and_private_and_no_planted_link_is_followed() {
        let pid = std::process::id();
        let target = std::env::temp_dir().join(format!("espgw-planted-target-{pid}"));
        let _ = std::fs::remove_dir_all(&target);
        std::fs::create_dir(&target).expect("the target");
        let planted: Vec<PathBuf> = [gateways::DEMO_DIR, crate::veth_bench::WORK_DIR]
            .iter()
            .map(|prefix| std::env::temp_dir().join(format!("{prefix}{pid}")))
            .collect();
        for link in &planted {
            let _ = std::fs::remove_file(link);
            std::os::unix::fs::symlink(&target, link).expect("plant a link");
        }
        let demo = gateways::demo_work_dir().expect("the demo's work dir");
        let demo_config = gateways::write_demo_config("a", &demo).expect("a demo config");
        let bench = crate::veth_bench::work_dir().expect("the bench's work dir");
        let bench_config = crate::veth_bench::write_gateway_config("a", &bench).expect("a bench config");
        let in_target: Vec<_> = std::fs::read_dir(&target)
            .expect("the target")
            .map(|e| e.map(|e| e.file_name()))
            .collect();
        for link in &planted {
            let _ = std::fs::remove_file(link);
        }
        let _ = std::fs::remove_dir_all(&target);
        assert!(
            in_target.is_empty(),
            "written through a planted link: {in_target:?}"
        );
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        for (dir, config) in [(&demo, &demo_config), (&bench, &bench_config)] {
            assert!(!planted.contains(dir), "{} is a predictable name", dir.display());
            let meta = std::fs::symlink_metadata(dir).expect("the work dir");
            assert!(meta.is_dir() && meta.uid() == euid, "{}", dir.display());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{}", dir.display());
            let meta = std::fs::symlink_metadata(config).expect("the config");
            assert!(meta.is_file() && config.starts_with(dir), "{}", config.display());
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", config.display());
            std::fs::remove_dir_all(dir).expect("remove the work dir");
        }
    }

    #[test]
    fn write_new_follows_no_link_and_replaces_nothing() {
        let dir = work_dir("espgw-write-new-").expect("a work dir");
        let target = dir.join("target");
        std::fs::write(&target, "kept").expect("write");
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(write_new(&link, "keys").is_err());
        assert!(write_new(&target, "keys").is_err());
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "kept");
        std::fs::remove_dir_all(&dir).expect("remove");
    }
}
