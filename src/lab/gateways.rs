//! The demo's two gateways, which `espgw demo` and `--soak` share: the
//! shipped `configs/demo-{a,b}.toml` edited for the flags (another
//! proposal, the `sec` engine with faults, the NAT's addresses, a short
//! lifetime), written to the run's work directory, and `espgw run` started
//! with them in gwA and gwB.
//!
//! Owns: the edited copies and the two gateway processes (handed to the
//! [`Lab`]). Must not: write a configuration of its own (the shipped files
//! are the authority; only what a flag changes is edited, with
//! `toml_edit`), send traffic or report.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread;
use std::time::Duration;

use accel::{Algorithm, EngineKind};
use anyhow::{bail, ensure, Context, Result};

use super::strongswan::KEYING;
use super::topology::{
    gateway_command, have_tool, is_root, Lab, Names, GW_A6, GW_B6, GW_B_PUBLIC, NAT_INSIDE, NAT_PUBLIC,
};
use super::{DemoArgs, DemoKeying};
use crate::status::SasReply;

fn check_prerequisites(nat: bool) -> Result<()> {
    if !is_root() {
        bail!("espgw demo needs root (network namespaces, veth pairs and raw sockets); run it with sudo");
    }
    let nft = nat.then_some(("nft", "nftables"));
    for (tool, package) in [("ip", "iproute2"), ("ping", "iputils-ping")]
        .into_iter()
        .chain(nft)
    {
        ensure!(
            have_tool(tool),
            "espgw demo needs `{tool}`; install the `{package}` package"
        );
    }
    Ok(())
}

/// The tables of the shipped demo configs that the edits below change.
/// Each edit names the value it expects to find, so that a shipped file
/// that changed under them fails the demo with the key to look at,
/// instead of the edit silently not happening.
struct Shipped<'a> {
    side: &'a str,
    doc: toml_edit::DocumentMut,
}

impl Shipped<'_> {
    /// The file's one `[[tunnel]]`.
    fn tunnel(&mut self) -> Result<&mut toml_edit::Table> {
        let side = self.side;
        self.doc
            .get_mut("tunnel")
            .and_then(toml_edit::Item::as_array_of_tables_mut)
            .and_then(|tunnels| tunnels.get_mut(0))
            .ok_or_else(|| anyhow::anyhow!("configs/demo-{side}.toml has no [[tunnel]]"))
    }

    /// A top-level table, made if the file has none.
    fn table(&mut self, name: &str) -> Result<&mut toml_edit::Table> {
        let side = self.side;
        self.doc
            .entry(name)
            .or_insert_with(toml_edit::table)
            .as_table_mut()
            .ok_or_else(|| anyhow::anyhow!("configs/demo-{side}.toml: `{name}` is not a table"))
    }

    /// The `[[name]]` entry whose `key` is `value`.
    fn entry_where(&mut self, name: &str, key: &str, value: &str) -> Result<&mut toml_edit::Table> {
        let found = self
            .doc
            .get_mut(name)
            .and_then(toml_edit::Item::as_array_of_tables_mut)
            .and_then(|all| {
                all.iter_mut()
                    .find(|t| t.get(key).and_then(|v| v.as_str()) == Some(value))
            });
        match found {
            Some(table) => Ok(table),
            None => Err(anyhow::anyhow!(
                "configs/demo-{}.toml has no [[{name}]] with {key} = \"{value}\" for the demo to edit",
                self.side
            )),
        }
    }
}

/// Sets `key` of `table` from `from` to `to`; `from` must be its value.
fn replace_value(table: &mut toml_edit::Table, key: &str, from: &str, to: &str) -> Result<()> {
    let current = table.get(key).and_then(|v| v.as_str());
    ensure!(
        current == Some(from),
        "the demo expects {key} = \"{from}\" where the shipped config has {current:?}"
    );
    table[key] = toml_edit::value(to);
    Ok(())
}

/// `--nat`: the shipped demo config rewritten for the NAT between the
/// gateways. gwA reaches gwB's public address through the NAT; gwB knows
/// gwA only by its private address (as a peer behind a NAT is configured),
/// which it cannot reach: it learns the NAT's address and port.
fn nat_config(config: &mut Shipped<'_>) -> Result<()> {
    let (destination, via) = if config.side == "a" {
        replace_value(
            config.entry_where("route", "via", "10.0.0.2")?,
            "via",
            "10.0.0.2",
            &NAT_INSIDE.to_string(),
        )?;
        replace_value(config.tunnel()?, "remote", "10.0.0.2", &GW_B_PUBLIC.to_string())?;
        ("172.16.0.0/24", NAT_INSIDE)
    } else {
        replace_value(
            config.entry_where("interface", "name", "outside")?,
            "address",
            "10.0.0.2/24",
            &format!("{GW_B_PUBLIC}/24"),
        )?;
        replace_value(
            config.entry_where("route", "via", "10.0.0.1")?,
            "via",
            "10.0.0.1",
            &NAT_PUBLIC.to_string(),
        )?;
        replace_value(config.tunnel()?, "local", "10.0.0.2", &GW_B_PUBLIC.to_string())?;
        ("10.0.0.0/24", NAT_PUBLIC)
    };
    let mut route = toml_edit::Table::new();
    route["destination"] = toml_edit::value(destination);
    route["via"] = toml_edit::value(via.to_string());
    let routes = config
        .doc
        .get_mut("route")
        .and_then(toml_edit::Item::as_array_of_tables_mut)
        .ok_or_else(|| anyhow::anyhow!("configs/demo-{}.toml has no [[route]]", config.side))?;
    routes.push(route);
    config.tunnel()?["encap"] = toml_edit::value("udp");
    Ok(())
}

/// `--ipv6`: the inside interface gets its `address6`, and a second
/// tunnel, a copy of the first between the IPv6 networks (6-in-4), keyed
/// by exchanges of its own.
fn ipv6_config(config: &mut Shipped<'_>) -> Result<()> {
    let side = config.side;
    let (own, far) = if side == "a" {
        (GW_A6, GW_B6)
    } else {
        (GW_B6, GW_A6)
    };
    let network = |address: &str| -> String {
        // 2001:db8:N::1/64 is on 2001:db8:N::/64.
        address.replacen("::1/", "::/", 1)
    };
    config.entry_where("interface", "name", "inside")?["address6"] = toml_edit::value(own);
    let mut six = config.tunnel()?.clone();
    ensure!(
        six.contains_key("secret"),
        "configs/demo-{side}.toml: its [[tunnel]] has no `secret` for --ipv6's second tunnel to be keyed with"
    );
    let name = six
        .get("name")
        .and_then(toml_edit::Item::as_str)
        .map(|n| format!("{n}-v6"))
        .ok_or_else(|| anyhow::anyhow!("configs/demo-{side}.toml: its [[tunnel]] has no name"))?;
    six["name"] = toml_edit::value(name);
    six["local_subnet"] = toml_edit::value(network(own));
    six["remote_subnet"] = toml_edit::value(network(far));
    config
        .doc
        .get_mut("tunnel")
        .and_then(toml_edit::Item::as_array_of_tables_mut)
        .ok_or_else(|| anyhow::anyhow!("configs/demo-{side}.toml has no [[tunnel]]"))?
        .push(six);
    Ok(())
}

/// The shipped demo config of `side` (its text), with another proposal
/// and fitting keys if asked, the `sec` engine with faults, the NAT's
/// addresses, and a short byte lifetime for `--rekey-every`. The shipped
/// file stays the authority: only what a flag changes is edited, through
/// `toml_edit`, and the rest (comments included) is kept as shipped.
fn edited_demo_config(side: &str, args: &DemoArgs, shipped: &str) -> Result<String> {
    let doc = shipped
        .parse::<toml_edit::DocumentMut>()
        .with_context(|| format!("configs/demo-{side}.toml is not TOML"))?;
    let mut config = Shipped { side, doc };
    if args.keying == DemoKeying::Strongswan {
        // The tunnel comes from charon through the keying namespace: the
        // file keeps its interfaces and routes, and says where to look.
        ensure!(
            config.doc.remove("tunnel").is_some(),
            "configs/demo-{side}.toml has no [[tunnel]] for --keying strongswan to replace"
        );
        let mut keying = toml_edit::Table::new();
        keying["source"] = toml_edit::value("xfrm");
        let ns = if side == "a" { KEYING[0] } else { KEYING[1] };
        keying["netns"] = toml_edit::value(ns);
        config.doc.insert("keying", toml_edit::Item::Table(keying));
        return Ok(config.doc.to_string());
    }
    let algorithm = args.algorithm;
    if algorithm != Algorithm::Aes128Gcm16 {
        // The keys come from the exchange: the proposal is all there is.
        let tunnel = config.tunnel()?;
        ensure!(
            tunnel.contains_key("proposal"),
            "configs/demo-{side}.toml: its [[tunnel]] has no proposal for --algorithm to replace"
        );
        tunnel["proposal"] = toml_edit::value(algorithm.to_string());
        if algorithm.is_insecure() {
            config.table("gateway")?["allow_insecure_null"] = toml_edit::value(true);
        }
    }
    if args.fail_every.is_some() || args.lose_completion_every.is_some() {
        let accel = config.table("accel")?;
        accel["engine"] = toml_edit::value("sec");
        if let Some(n) = args.fail_every {
            accel["fail_every"] = toml_edit::value(i64::try_from(n).context("--fail-every")?);
        }
        if let Some(n) = args.lose_completion_every {
            accel["lose_completion_every"] =
                toml_edit::value(i64::try_from(n).context("--lose-completion-every")?);
        }
    }
    if args.nat {
        nat_config(&mut config)?;
    }
    if args.ipv6 {
        ipv6_config(&mut config)?;
    }
    if let Some(bytes) = args.rekey_every {
        let mut lifetime = toml_edit::Table::new();
        lifetime["soft_bytes"] = toml_edit::value(i64::try_from(bytes).context("--rekey-every")?);
        // Far beyond the soft limit: a rekey takes a few milliseconds, in
        // which a TCP burst through two workers moves megabytes.
        lifetime["hard_bytes"] = toml_edit::value(i64::try_from(bytes * 50).context("--rekey-every")?);
        config
            .tunnel()?
            .insert("lifetime", toml_edit::Item::Table(lifetime));
        let rekey = config.table("rekey")?;
        rekey["grace_ms"] = toml_edit::value(500);
        rekey["retransmit_ms"] = toml_edit::value(100);
    }
    Ok(config.doc.to_string())
}

/// What the demo's work directories are called, before their random part.
pub const DEMO_DIR: &str = "espgw-demo-";

/// The demo's work directory: fresh and private (see [`super::work_dir`]).
pub fn demo_work_dir() -> Result<PathBuf> {
    super::work_dir(DEMO_DIR)
}

/// [`edited_demo_config`] of the shipped file, written to `dir`.
fn demo_config(side: &str, args: &DemoArgs, dir: &Path) -> Result<PathBuf> {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("configs/demo-{side}.toml"));
    let text = std::fs::read_to_string(&shipped).with_context(|| format!("reading {}", shipped.display()))?;
    let text = edited_demo_config(side, args, &text)?;
    let path = dir.join(format!("demo-{side}.toml"));
    // The file holds keys: owner-only from its creation, as for a real
    // gateway.
    super::write_new(&path, &text)?;
    Ok(path)
}

/// Side `side`'s demo configuration, with no flag, written to `dir`.
#[cfg(test)]
pub fn write_demo_config(side: &str, dir: &Path) -> Result<PathBuf> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }
    let args = <Cli as clap::Parser>::parse_from(["demo"]).demo;
    demo_config(side, &args, dir)
}

fn start_gateway(ns: &str, config: &Path, stats: &Path, log: &Path, args: &DemoArgs) -> Result<Child> {
    let log = File::create(log)?;
    let faults = args.fail_every.is_some() || args.lose_completion_every.is_some();
    let engine = if faults { EngineKind::Sec } else { args.engine };
    gateway_command(ns, config)?
        .arg("--stats")
        .arg(stats)
        .args([
            "--engine",
            engine.name(),
            "--style",
            args.style.name(),
            "--buffers",
            args.buffers.name(),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting the gateway in {ns}"))
}

/// Builds the demo's topology and starts both gateways; everything goes
/// away when the returned `Lab` is dropped. Returns the lab, its work
/// directory and where gwA and gwB write their final counters.
pub fn start_lab(args: &DemoArgs) -> Result<(Lab, PathBuf, [PathBuf; 2])> {
    check_prerequisites(args.nat)?;
    let strongswan = args.keying == DemoKeying::Strongswan;
    if strongswan {
        super::strongswan::check(args)?;
    }
    let dir = demo_work_dir()?;
    let mut names = Names::demo();
    if strongswan {
        names.keying = KEYING.map(String::from).to_vec();
    }
    let mut lab = Lab::new(names, (!args.keep).then(|| dir.clone()));
    eprintln!("building hostA — gwA — gwB — hostB ...");
    lab.build(args.nat, args.ipv6)?;
    for ns in &lab.names.keying {
        super::topology::ip(&["netns", "add", ns])?;
        super::topology::in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
    }
    let (config_a, config_b) = (demo_config("a", args, &dir)?, demo_config("b", args, &dir)?);
    let (stats_a, stats_b) = (dir.join("gwA.json"), dir.join("gwB.json"));
    let (gw_a, gw_b) = (lab.names.gw_a.clone(), lab.names.gw_b.clone());
    lab.children.push(start_gateway(
        &gw_a,
        &config_a,
        &stats_a,
        &dir.join("gwA.log"),
        args,
    )?);
    lab.children.push(start_gateway(
        &gw_b,
        &config_b,
        &stats_b,
        &dir.join("gwB.log"),
        args,
    )?);
    thread::sleep(Duration::from_millis(500));
    for (child, name) in lab.children.iter_mut().zip(["gwA", "gwB"]) {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            bail!("gateway {name} exited ({status}):\n{log}");
        }
    }
    if strongswan {
        eprintln!("starting charon in {} and {} ...", KEYING[0], KEYING[1]);
        let daemons = super::strongswan::start(args, &dir)?;
        lab.children.extend(daemons);
        super::strongswan::wait_until_keyed(&dir)?;
    } else {
        wait_until_connected(&dir)?;
    }
    Ok((lab, dir, [stats_a, stats_b]))
}

/// Waits until both gateways' tunnels are keyed: each connects at start
/// with an exchange (a few round trips), and what it is asked to protect
/// before then is dropped.
fn wait_until_connected(dir: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    for (name, gw) in [("demo-a", "gwA"), ("demo-b", "gwB")] {
        let socket = crate::control::default_path(name);
        loop {
            let states = crate::control::ask::<SasReply>(&socket, "sa list")
                .map(|doc| doc.tunnels().iter().map(|t| t.state.clone()).collect::<Vec<_>>());
            match states {
                Ok(states) if !states.is_empty() && states.iter().all(|s| s == "established") => break,
                _ if std::time::Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                states => {
                    let log = std::fs::read_to_string(dir.join(format!("{gw}.log"))).unwrap_or_default();
                    bail!("{gw}'s tunnels did not connect in 15 s ({states:?}):\n{log}");
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    fn edited(side: &str, flags: &[&str]) -> ike_stub::Config {
        let args =
            <Cli as clap::Parser>::parse_from(std::iter::once("demo").chain(flags.iter().copied())).demo;
        let shipped =
            std::fs::read_to_string(format!("{}/configs/demo-{side}.toml", env!("CARGO_MANIFEST_DIR")))
                .expect("the shipped config");
        let text = edited_demo_config(side, &args, &shipped).unwrap_or_else(|e| panic!("{e:#}"));
        ike_stub::Config::parse(Path::new("demo.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// Every flag's edit takes on the shipped files and gives what the
    /// demo relies on: the gateways would otherwise run a config the demo
    /// did not mean.
    #[test]
    fn the_shipped_demo_configs_take_every_edit() {
        for side in ["a", "b"] {
            let plain = edited(side, &[]);
            let tunnel = plain.tunnel("a-b").expect("the shipped tunnel");
            assert_eq!(tunnel.algorithm, Algorithm::Aes128Gcm16);
            assert!(tunnel.secret.is_some() && tunnel.encap.is_none());

            let null = edited(side, &["--algorithm", "null"]);
            assert!(null.allow_insecure_null && !plain.allow_insecure_null);
            let hmac = edited(side, &["--algorithm", "aes128-sha1"]);
            assert_eq!(hmac.tunnel("a-b").unwrap().algorithm, Algorithm::Aes128Sha1);
            let sa = hmac.sa("a-b-out").expect("the outbound SA's template");
            assert_eq!(sa.keys, ike_stub::KeySource::Exchange);

            let faults = edited(side, &["--fail-every", "7", "--lose-completion-every", "9"]);
            assert_eq!(faults.engine.kind, EngineKind::Sec);
            assert_eq!(faults.engine.sec.faults.fail_every, Some(7));
            assert_eq!(faults.engine.sec.faults.drop_completion_every, Some(9));

            let rekey = edited(side, &["--rekey-every", "200kB"]);
            let life = rekey.tunnel("a-b").unwrap().lifetime;
            assert_eq!(
                (life.soft.bytes, life.hard.bytes),
                (Some(200_000), Some(10_000_000))
            );
            assert_eq!(rekey.rekey.grace, Duration::from_millis(500));
            assert_eq!(rekey.rekey.retransmit, Duration::from_millis(100));

            let six = edited(side, &["--ipv6"]);
            let (own, far) = if side == "a" { (1, 2) } else { (2, 1) };
            assert_eq!(
                six.inside.address6.map(|(a, p)| (a.to_string(), p.to_string())),
                Some((format!("2001:db8:{own}::1"), format!("2001:db8:{own}::/64")))
            );
            let v6 = six.tunnel("a-b-v6").expect("the IPv6 tunnel");
            assert!(six.tunnel("a-b").is_some(), "the IPv4 tunnel stays");
            assert!(v6.secret.is_some(), "keyed by exchanges of its own");
            let selectors = six.inbound_selectors("a-b-v6-in");
            assert_eq!(selectors[0].src.to_string(), format!("2001:db8:{far}::/64"));

            let nat = edited(side, &["--nat", "--rekey-every", "200kB"]);
            let tunnel = nat.tunnel("a-b").unwrap();
            assert!(tunnel.encap.is_some());
            assert!(tunnel.lifetime.soft.bytes.is_some());
            let vias: Vec<_> = nat.routes.iter().map(|r| r.via).collect();
            if side == "a" {
                assert_eq!(tunnel.remote, GW_B_PUBLIC);
                assert_eq!(vias, [Some(NAT_INSIDE), Some(NAT_INSIDE)]);
            } else {
                assert_eq!(
                    (tunnel.local, nat.outside.address),
                    (GW_B_PUBLIC.into(), GW_B_PUBLIC)
                );
                assert_eq!(vias, [Some(NAT_PUBLIC), Some(NAT_PUBLIC)]);
            }
        }
    }
}
