//! `espgw demo --keying strongswan`: the demo's gateways keyed by
//! strongSwan instead of their own exchange. Each gateway mirrors a keying
//! namespace (`espgw-keyA`, `espgw-keyB`) where an unmodified charon runs
//! IKEv2 with a pre-shared key, reached through espgw's IKE relay, and
//! writes its SAs and policies into that namespace's XFRM tables.
//!
//! Owns the daemons' side: the check that this host can run them (a kernel
//! with ESP, since charon's SAs must be accepted by the kernel of the
//! keying namespace, and strongSwan's programs), their configuration
//! (`/etc/netns/NAME/`, which `ip netns exec` lays over `/etc`, removed
//! with the namespaces), starting charon with a `/run` of its own (two
//! charons on one host would share a pid file and a vici socket), loading
//! the connection, and asking charon what it sees. Must not touch the
//! gateways' configuration beyond the keying source (`gateways.rs` edits
//! it) or the traffic (`traffic.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::topology::have_tool;
use super::DemoArgs;
use crate::status::StatsReply;
use accel::Algorithm;

/// The keying namespaces of gwA and gwB.
pub const KEYING: [&str; 2] = ["espgw-keyA", "espgw-keyB"];

/// Where Debian and most distributions put charon.
const CHARON: [&str; 2] = ["/usr/lib/ipsec/charon", "/usr/libexec/ipsec/charon"];

/// The pre-shared key of the demo's IKE SA: published, like the demo's own
/// secret.
const PSK: &str = "demo psk: published, never use it for real traffic";

/// Whether this kernel has ESP (`esp4`): loaded, built in, or a module it
/// can load. Reads only files; changes nothing.
pub fn kernel_esp() -> std::result::Result<(), String> {
    if Path::new("/sys/module/esp4").exists() {
        return Ok(());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_owned())
        .unwrap_or_default();
    let modules = PathBuf::from(format!("/lib/modules/{release}"));
    let listed = |file: &str| {
        std::fs::read_to_string(modules.join(file))
            .is_ok_and(|text| text.lines().any(|l| l.contains("/esp4.ko")))
    };
    if listed("modules.builtin") || listed("modules.dep") {
        return Ok(());
    }
    if let Ok(config) = std::fs::read_to_string(format!("/boot/config-{release}")) {
        if config
            .lines()
            .any(|l| l == "CONFIG_INET_ESP=y" || l == "CONFIG_INET_ESP=m")
        {
            return Ok(());
        }
    }
    Err(format!(
        "this kernel ({release}) has no ESP: no esp4 module loaded, none built in or in {}, and no \
         CONFIG_INET_ESP in /boot/config-{release}. charon installs its SAs in the keying namespaces' \
         kernel, which refuses them without ESP (espgw then never sees them); run the demo on a kernel \
         with CONFIG_INET_ESP (any distribution's), or without --keying strongswan",
        modules.display()
    ))
}

/// What `--keying strongswan` needs of the host and of the other flags:
/// checked before anything is built.
pub fn check(args: &DemoArgs) -> Result<()> {
    let incompatible = [
        ("--nat", args.nat),
        ("--ipv6", args.ipv6),
        ("--flood-check", args.flood_check),
        ("--reload-check", args.reload_check),
        ("--soak", args.soak.is_some()),
    ];
    for (flag, set) in incompatible {
        ensure!(!set, "--keying strongswan does not combine with {flag} yet");
    }
    ensure!(
        proposal(args.algorithm).is_some(),
        "--keying strongswan: charon has no ESP proposal for {}",
        args.algorithm
    );
    if let Err(why) = kernel_esp() {
        bail!("--keying strongswan: {why}");
    }
    ensure!(
        charon().is_some(),
        "--keying strongswan needs charon ({} or {}): install the `strongswan-charon` package",
        CHARON[0],
        CHARON[1]
    );
    ensure!(
        have_tool("swanctl"),
        "--keying strongswan needs `swanctl`: install the `strongswan-swanctl` package"
    );
    Ok(())
}

fn charon() -> Option<&'static str> {
    CHARON.into_iter().find(|p| Path::new(p).exists())
}

/// strongSwan's name for an ESP proposal espgw supports.
fn proposal(algorithm: Algorithm) -> Option<&'static str> {
    Some(match algorithm {
        Algorithm::Aes128Gcm16 => "aes128gcm16",
        Algorithm::Aes256Gcm16 => "aes256gcm16",
        Algorithm::ChaCha20Poly1305 => "chacha20poly1305",
        Algorithm::Aes128Sha1 => "aes128-sha1",
        Algorithm::Aes256Sha256 => "aes256-sha256",
        Algorithm::TripleDesSha1 => "3des-sha1",
        _ => return None,
    })
}

/// One side of the demo: its keying namespace and addresses.
struct Side {
    ns: &'static str,
    label: &'static str,
    local: &'static str,
    remote: &'static str,
    local_ts: &'static str,
    remote_ts: &'static str,
    /// gwA's charon starts the tunnel; gwB's answers.
    start: &'static str,
}

const SIDES: [Side; 2] = [
    Side {
        ns: KEYING[0],
        label: "A",
        local: "10.0.0.1",
        remote: "10.0.0.2",
        local_ts: "192.168.1.0/24",
        remote_ts: "192.168.2.0/24",
        start: "start",
    },
    Side {
        ns: KEYING[1],
        label: "B",
        local: "10.0.0.2",
        remote: "10.0.0.1",
        local_ts: "192.168.2.0/24",
        remote_ts: "192.168.1.0/24",
        start: "none",
    },
];

/// The namespace's own `/etc` files, as `ip netns exec` lays them over
/// `/etc`.
fn etc(ns: &str) -> PathBuf {
    PathBuf::from(format!("/etc/netns/{ns}"))
}

/// The directory bound over `/run` for side `label`'s charon: its pid
/// file and vici socket.
fn run_dir(dir: &Path, label: &str) -> PathBuf {
    dir.join(format!("run-{label}"))
}

fn vici(dir: &Path, label: &str) -> String {
    format!("unix://{}/charon.vici", run_dir(dir, label).display())
}

fn write_config(side: &Side, args: &DemoArgs, dir: &Path) -> Result<()> {
    let etc = etc(side.ns);
    for sub in [
        "swanctl/conf.d",
        "swanctl/x509",
        "swanctl/x509ca",
        "swanctl/private",
    ] {
        std::fs::create_dir_all(etc.join(sub)).with_context(|| format!("creating {}", etc.display()))?;
    }
    std::fs::create_dir_all(run_dir(dir, side.label))?;
    let log = dir.join(format!("charon-{}.log", side.label));
    std::fs::write(
        etc.join("strongswan.conf"),
        format!(
            "# espgw demo: charon of the keying namespace {ns}.
charon {{
    # The traffic is espgw's: routes in this namespace would lead nowhere.
    install_routes = no
    load_modular = yes
    plugins {{
        include /etc/strongswan.d/charon/*.conf
    }}
    filelog {{
        demo {{
            path = {log}
            time_format = %H:%M:%S
            flush_line = yes
            default = 1
            knl = 2
        }}
    }}
}}
include /etc/strongswan.d/*.conf
",
            ns = side.ns,
            log = log.display()
        ),
    )?;
    // The hard limit far beyond the soft one, as the exchange's demo has
    // it: charon's default (10 % more) is 20 kB at 200 kB, which a
    // numbered stream passes before an exchange under emulation is done.
    // The random part charon takes off the soft limit stays a tenth (its
    // default, the whole gap up to `life_bytes`, would wrap below zero).
    let rekey = args
        .rekey_every
        .map(|bytes| {
            format!(
                "\n                rekey_bytes = {bytes}\n                life_bytes = {}\n                rand_bytes = {}",
                bytes * 50,
                bytes / 10
            )
        })
        .unwrap_or_default();
    let esp = proposal(args.algorithm).unwrap_or("aes128gcm16");
    let swanctl = etc.join("swanctl/swanctl.conf");
    // The file holds the pre-shared key: owner-only from its creation.
    super::write_new(
        &swanctl,
        &format!(
            "connections {{
    demo {{
        version = 2
        local_addrs = {local}
        remote_addrs = {remote}
        proposals = aes128gcm16-prfsha256-ecp256
        local {{
            auth = psk
            id = {local}
        }}
        remote {{
            auth = psk
            id = {remote}
        }}
        children {{
            a-b {{
                local_ts = {local_ts}
                remote_ts = {remote_ts}
                mode = tunnel
                # As the demo's own tunnel: gwA's two workers may reorder a
                # batch's worth of one SA's packets while its owner moves.
                replay_window = 1024
                esp_proposals = {esp}
                start_action = {start}{rekey}
            }}
        }}
    }}
}}
secrets {{
    ike-demo {{
        id-a = 10.0.0.1
        id-b = 10.0.0.2
        secret = \"{PSK}\"
    }}
}}
",
            local = side.local,
            remote = side.remote,
            local_ts = side.local_ts,
            remote_ts = side.remote_ts,
            start = side.start,
        ),
    )
}

/// Writes both charons' configuration, starts them in their keying
/// namespaces (each with its own `/run`) and loads the connection; gwB's
/// first, so that gwA's charon finds an answer. The gateways must be
/// running: their relays carry the IKE.
pub fn start(args: &DemoArgs, dir: &Path) -> Result<Vec<Child>> {
    let charon = charon().context("no charon")?;
    let mut children = Vec::new();
    for side in SIDES.iter().rev() {
        write_config(side, args, dir)?;
        let out = std::fs::File::create(dir.join(format!("charon-{}.out", side.label)))?;
        let child = Command::new("ip")
            .args(["netns", "exec", side.ns, "sh", "-c"])
            .arg(r#"mount --bind "$0" /run && exec "$@""#)
            .arg(run_dir(dir, side.label))
            .arg(charon)
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting charon in {}", side.ns))?;
        children.push(child);
        let socket = run_dir(dir, side.label).join("charon.vici");
        let deadline = Instant::now() + Duration::from_secs(15);
        while !socket.exists() {
            ensure!(
                Instant::now() < deadline,
                "charon in {} did not open its vici socket in 15 s (see {})",
                side.ns,
                dir.join(format!("charon-{}.log", side.label)).display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let loaded = swanctl(side.ns, dir, side.label, &["--load-all", "--noprompt"])?;
        ensure!(
            loaded.contains("loaded connection 'demo'"),
            "swanctl --load-all in {} did not load the connection:\n{loaded}",
            side.ns
        );
    }
    Ok(children)
}

/// Runs swanctl against side `label`'s charon.
fn swanctl(ns: &str, dir: &Path, label: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "swanctl"])
        .args(args)
        .args(["--uri", &vici(dir, label)])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running swanctl in {ns}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "swanctl {} in {ns} failed: {}{}",
        args.join(" "),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// What each charon says of its SAs (`swanctl --list-sas`), for the
/// report: the counts it shows come from espgw, through the kernel.
pub fn list_sas(dir: &Path) -> Vec<(String, String)> {
    SIDES
        .iter()
        .map(|side| {
            let text =
                swanctl(side.ns, dir, side.label, &["--list-sas"]).unwrap_or_else(|e| format!("{e:#}"));
            (format!("charon {} ({})", side.label, side.ns), text)
        })
        .collect()
}

/// Waits until both gateways mirror an SA pair from their charons.
pub fn wait_until_keyed(dir: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for (name, side) in [("demo-a", &SIDES[0]), ("demo-b", &SIDES[1])] {
        let socket = crate::control::default_path(name);
        loop {
            let mirrored = crate::control::ask::<StatsReply>(&socket, "stats")
                .ok()
                .and_then(|doc| doc.xfrm)
                .map_or(0, |x| x.sas_mirrored);
            if mirrored >= 2 {
                break;
            }
            if Instant::now() >= deadline {
                let tail = |file: String, lines: usize| {
                    let log = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                };
                let gateway = if side.label == "A" { "gwA" } else { "gwB" };
                bail!(
                    "{name} mirrors {mirrored} SAs after 30 s; {gateway}'s log ends:\n{}\ncharon {}'s log ends:\n{}",
                    tail(format!("{gateway}.log"), 12),
                    side.label,
                    tail(format!("charon-{}.log", side.label), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}
