//! The lab's topology: network namespaces hostA — gwA — gwB — hostB (and,
//! for the demo's `--nat`, a NAT between the gateways) joined by veth
//! pairs, the hosts' addresses and routes, plain kernel forwarding for the
//! reference row of `bench --veth`, and the command that starts `espgw run`
//! in a gateway namespace. Everything it makes is removed when the [`Lab`]
//! guard is dropped, also on failure or Ctrl-C.
//!
//! Owns: the namespaces named by a [`Names`] and what is inside them.
//! Must not: touch a namespace or device a [`Names`] does not name (the
//! veth ends are created inside the namespaces, so that they cannot clash
//! with the root namespace's devices or another lab's), send traffic
//! (`traffic`), or choose a gateway's configuration or flags (its callers).

use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

pub const HOST_A: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(192, 168, 2, 20);
/// `--ipv6`: the hosts' IPv6 addresses, and the gateways' (`address6`).
pub const HOST_A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);
pub const HOST_B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x20);
pub const GW_A6: &str = "2001:db8:1::1/64";
pub const GW_B6: &str = "2001:db8:2::1/64";
/// `--nat`: gwA keeps 10.0.0.1 behind the NAT's inside address; gwB and
/// the NAT's outside address are on 172.16.0.0/24.
pub const NAT_INSIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
pub const NAT_PUBLIC: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 1);
pub const GW_B_PUBLIC: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 2);
/// The source ports the NAT maps gwA's 4500 to: never 4500 itself, so gwB
/// has a port to learn as well as an address.
const NAT_PORTS: &str = "40000-40999";

/// The namespaces of one lab.
#[derive(Debug, Clone)]
pub struct Names {
    pub host_a: String,
    pub gw_a: String,
    pub gw_b: String,
    pub host_b: String,
    /// The NAT's namespace, for labs that may have one (made only when
    /// built with `nat`, but always removed: an earlier run's may be left).
    pub nat: Option<String>,
    /// Keying namespaces (`--keying strongswan`), made by their user and
    /// removed with the rest, with their `/etc/netns/NAME` files.
    pub keying: Vec<String>,
}

impl Names {
    /// `PREFIX-hostA`, `PREFIX-gwA`, `PREFIX-gwB`, `PREFIX-hostB`.
    pub fn new(prefix: &str) -> Names {
        Names {
            host_a: format!("{prefix}-hostA"),
            gw_a: format!("{prefix}-gwA"),
            gw_b: format!("{prefix}-gwB"),
            host_b: format!("{prefix}-hostB"),
            nat: None,
            keying: Vec::new(),
        }
    }

    /// The demo's: `espgw-*`, with `espgw-nat`.
    pub fn demo() -> Names {
        Names {
            nat: Some("espgw-nat".into()),
            ..Names::new("espgw")
        }
    }

    /// Every namespace this lab may make.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        [&self.host_a, &self.gw_a, &self.gw_b, &self.host_b]
            .into_iter()
            .chain(&self.nat)
            .chain(&self.keying)
            .map(String::as_str)
    }
}

/// Stops child processes: SIGTERM to all, up to 5 s for each to exit,
/// then SIGKILL.
pub fn stop_children(children: &mut [Child]) {
    for child in children.iter() {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }
    for child in children.iter_mut() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The namespaces, the processes started in them and a work directory,
/// all removed on drop (also on failure).
pub struct Lab {
    pub names: Names,
    /// Gateways and servers in the namespaces (`ip netns exec` execs the
    /// child, so a pid is the gateway's).
    pub children: Vec<Child>,
    /// Removed on drop.
    work_dir: Option<PathBuf>,
}

impl Lab {
    /// The guard of the lab `names` names (nothing built yet), which also
    /// removes `work_dir` on drop.
    pub fn new(names: Names, work_dir: Option<PathBuf>) -> Lab {
        Lab {
            names,
            children: Vec::new(),
            work_dir,
        }
    }

    /// Removes what an earlier run left, then builds the four namespaces
    /// and three veth pairs, the hosts addressed; with `nat`, the NAT's
    /// namespace between the gateways and one more pair. The gateway
    /// namespaces get no addresses: espgw answers ARP and ICMP for its
    /// addresses itself (or [`kernel_forwarding`] gives them the kernel's).
    pub fn build(&self, nat: bool, ipv6: bool) -> Result<()> {
        remove(&self.names);
        build(&self.names, nat, ipv6)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        stop_children(&mut self.children);
        remove(&self.names);
        if let Some(dir) = &self.work_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Deletes the lab's namespaces (and with them their veth ends), and
/// the keying namespaces' `/etc/netns` files.
pub fn remove(names: &Names) {
    for ns in names.all() {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    for ns in &names.keying {
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
    }
}

/// Runs `ip ARGS`; its error output goes into the error.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running `ip {}`", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Runs `cmd` in namespace `ns`.
pub fn in_ns(ns: &str, cmd: &[&str]) -> Result<()> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(cmd);
    ip(&all)
}

/// Whether this process runs as root (namespaces and veth pairs need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `tool` is on the PATH.
pub fn have_tool(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn build(names: &Names, nat: bool, ipv6: bool) -> Result<()> {
    let nat_ns = names.nat.as_deref().filter(|_| nat);
    let made = [&names.host_a, &names.gw_a, &names.gw_b, &names.host_b]
        .into_iter()
        .map(String::as_str)
        .chain(nat_ns);
    let hosts = [names.host_a.as_str(), names.host_b.as_str()];
    for ns in made {
        ip(&["netns", "add", ns])?;
        in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
        // IPv4 only, but for the hosts with --ipv6: no router
        // solicitations or ND noise. The gateways' kernels never take
        // IPv6 (espgw answers for the inside `address6` itself).
        if !(ipv6 && hosts.contains(&ns)) {
            in_ns(ns, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
        }
    }
    let mut pairs = vec![("ha0", names.host_a.as_str(), "a-in", names.gw_a.as_str())];
    match nat_ns {
        Some(nat) => {
            pairs.push(("a-out", &names.gw_a, "n-in", nat));
            pairs.push(("n-out", nat, "b-out", &names.gw_b));
        }
        None => pairs.push(("a-out", &names.gw_a, "b-out", &names.gw_b)),
    }
    pairs.push(("b-in", &names.gw_b, "hb0", &names.host_b));
    for (left, left_ns, right, right_ns) in pairs {
        // Created inside the namespaces, so that the names cannot clash
        // with the root namespace's or another lab's devices.
        in_ns(
            left_ns,
            &[
                "ip", "link", "add", left, "type", "veth", "peer", "name", right, "netns", right_ns,
            ],
        )?;
        // The kernel's default offloads stay on: the hosts' TCP and UDP
        // reach the gateways with partial checksums and as GSO
        // super-packets, which espgw's driver completes and segments.
        in_ns(left_ns, &["ip", "link", "set", left, "up"])?;
        in_ns(right_ns, &["ip", "link", "set", right, "up"])?;
    }
    in_ns(
        &names.host_a,
        &["ip", "addr", "add", "192.168.1.10/24", "dev", "ha0"],
    )?;
    in_ns(
        &names.host_a,
        &["ip", "route", "add", "default", "via", "192.168.1.1"],
    )?;
    in_ns(
        &names.host_b,
        &["ip", "addr", "add", "192.168.2.20/24", "dev", "hb0"],
    )?;
    in_ns(
        &names.host_b,
        &["ip", "route", "add", "default", "via", "192.168.2.1"],
    )?;
    if ipv6 {
        for (ns, dev, own, gateway) in [
            (&names.host_a, "ha0", HOST_A6, GW_A6),
            (&names.host_b, "hb0", HOST_B6, GW_B6),
        ] {
            // `nodad`: usable at once, not after duplicate detection's second.
            in_ns(
                ns,
                &["ip", "addr", "add", &format!("{own}/64"), "dev", dev, "nodad"],
            )?;
            let via = gateway.split('/').next().unwrap_or(gateway);
            in_ns(ns, &["ip", "-6", "route", "add", "default", "via", via])?;
        }
    }
    if let Some(nat) = nat_ns {
        build_nat(nat)?;
    }
    Ok(())
}

/// The NAT in namespace `ns`: a router that masquerades what leaves on
/// `n-out` (source address and port rewritten), and lets in from there only
/// what answers a mapping gwA opened, as a home router does. gwB therefore
/// cannot reach gwA's private address at all, and must send to the mapping.
fn build_nat(ns: &str) -> Result<()> {
    let inside = format!("{NAT_INSIDE}/24");
    let public = format!("{NAT_PUBLIC}/24");
    in_ns(ns, &["ip", "addr", "add", &inside, "dev", "n-in"])?;
    in_ns(ns, &["ip", "addr", "add", &public, "dev", "n-out"])?;
    in_ns(ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    let rules = format!(
        "table ip espgw_demo_nat {{
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname \"n-out\" meta l4proto {{ tcp, udp }} masquerade to :{NAT_PORTS}
        oifname \"n-out\" masquerade
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
        iifname \"n-in\" oifname \"n-out\" accept
        iifname \"n-out\" oifname \"n-in\" ct state established,related accept
    }}
}}
"
    );
    let mut nft = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("running `nft -f -` in {ns}"))?;
    nft.stdin
        .take()
        .context("nft's standard input")?
        .write_all(rules.as_bytes())?;
    let status = nft.wait()?;
    ensure!(status.success(), "nft refused the NAT rules:\n{rules}");
    Ok(())
}

/// Plain kernel forwarding in the gateway namespaces (the reference row of
/// `bench --veth`): addresses on both ends, the route to the far network,
/// `ip_forward`.
pub fn kernel_forwarding(names: &Names) -> Result<()> {
    for (ns, inside, outside, inside_addr, outside_addr, remote_net, via) in [
        (
            &names.gw_a,
            "a-in",
            "a-out",
            "192.168.1.1/24",
            "10.0.0.1/24",
            "192.168.2.0/24",
            "10.0.0.2",
        ),
        (
            &names.gw_b,
            "b-in",
            "b-out",
            "192.168.2.1/24",
            "10.0.0.2/24",
            "192.168.1.0/24",
            "10.0.0.1",
        ),
    ] {
        in_ns(ns, &["ip", "addr", "add", inside_addr, "dev", inside])?;
        in_ns(ns, &["ip", "addr", "add", outside_addr, "dev", outside])?;
        in_ns(ns, &["ip", "route", "add", remote_net, "via", via])?;
        in_ns(ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    }
    Ok(())
}

/// `espgw run --config CONFIG` in namespace `ns`, logging at `info`, with
/// a state directory of its own beside the config (`NAME.state`, made
/// 0700 by espgw), so that its static keys' sequence numbers go on from
/// one start to the next within the run; the caller adds its flags,
/// environment and output and spawns it.
pub fn gateway_command(ns: &str, config: &Path) -> Result<Command> {
    let exe = std::env::current_exe().context("locating the espgw binary")?;
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ns])
        .arg(exe)
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(config.with_extension("state"))
        .env("RUST_LOG", "info");
    Ok(command)
}

/// Moves the calling thread into network namespace `ns`.
pub fn enter(ns: &str) -> Result<()> {
    let file =
        File::open(format!("/var/run/netns/{ns}")).with_context(|| format!("opening namespace {ns}"))?;
    // SAFETY: setns on a namespace file we opened; affects only this thread.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    ensure!(
        r == 0,
        "entering namespace {ns}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}
