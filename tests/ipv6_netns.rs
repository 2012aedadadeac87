//! The gateway's IPv6 address on a real link (root, in CI): a host
//! namespace's kernel resolves the gateway's inside `address6` by
//! neighbour discovery and pings it, over a veth pair with the kernel's
//! default offloads, and gets every reply. The host's own IPv6 chatter
//! (router solicitations, MLD reports) is counted by the gateway as
//! `unsupported`, never answered. Without root or `ip`/`ping` the test
//! shows as ignored (testkit `netns`).

use std::process::Command;

use testkit::netns::{self, ip, Lab, NETNS_PING};

mod common;

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &NETNS_PING,
        a_host_resolves_and_pings_the_gateways_ipv6_address
    )])
}

/// Names of their own, so that other netns tests may run beside this one.
const HOST: &str = "espgw-v6-host";
const GW: &str = "espgw-v6-gw";
const PEER: &str = "espgw-v6-peer";

fn a_host_resolves_and_pings_the_gateways_ipv6_address() {
    let dir = std::env::temp_dir().join(format!("espgw-v6-{}", std::process::id()));
    let mut lab = Lab::new(&[HOST, GW, PEER], dir.clone());
    netns::create(&[HOST, GW, PEER]);
    netns::veth("v6h0", HOST, "v6g-in", GW);
    netns::veth("v6g-out", GW, "v6p0", PEER);
    // `nodad`: the address is usable at once rather than after DAD's second.
    ip(&[
        "-n",
        HOST,
        "addr",
        "add",
        "2001:db8:1::10/64",
        "dev",
        "v6h0",
        "nodad",
    ]);
    let text = "[gateway]\nname = \"v6\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"v6g-in\"\naddress = \"192.168.1.1/24\"\n\
         address6 = \"2001:db8:1::1/64\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"v6g-out\"\naddress = \"10.0.0.1/24\"\n\n\
         [[policy]]\nname = \"drop-all\"\ndirection = \"out\"\naction = \"discard\"\n";
    let config = dir.join("v6.toml");
    std::fs::write(&config, text).expect("write config");
    let stats = dir.join("v6.json");
    let log_path = dir.join("v6.log");
    lab.children.push(
        common::espgw_in(GW)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--stats")
            .arg(&stats)
            .stderr(std::fs::File::create(&log_path).expect("log file"))
            .spawn()
            .expect("espgw run starts"),
    );
    common::wait_forwarding(&mut lab.children[0], &log_path);
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            HOST,
            "ping",
            "-6",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "2",
            "2001:db8:1::1",
        ])
        .output()
        .expect("ping runs");
    let said = String::from_utf8_lossy(&ping.stdout);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        ping.status.success() && said.contains("5 received"),
        "ping -6:\n{said}\n{}\ngateway log:\n{log}",
        String::from_utf8_lossy(&ping.stderr)
    );
    // The host's kernel learnt the gateway's MAC from our advertisement.
    let neigh = Command::new("ip")
        .args(["-n", HOST, "-6", "neigh", "show", "2001:db8:1::1"])
        .output()
        .expect("ip neigh");
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(neigh.contains("lladdr"), "no neighbour entry: {neigh}");
    // The gateway's own count: SIGTERM writes the stats file.
    lab.stop_all();
    let stats = common::json_file(&stats);
    let generated = stats.pointer("/generated").and_then(|v| v.as_u64());
    assert!(
        generated.is_some_and(|n| n >= 6),
        "five echo replies and at least one advertisement: {generated:?} in {stats}"
    );
}
