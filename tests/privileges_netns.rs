//! `espgw run` gives up what it no longer needs once its sockets are open
//! (root, in CI): two gateways on a veth topology of their own, gwA as
//! root with two workers (so reloads re-steer its fanout groups), gwB
//! with `--user nobody`. Every thread of both holds CAP_IPC_LOCK alone
//! (for key memory), no inheritable, ambient or bounding capability, and
//! no-new-privileges; gwB runs as nobody and is not dumpable (its /proc
//! files belong to root). Each has one child, its packet socket broker
//! (`on_device_loss = "wait"`, the default), which holds CAP_NET_RAW
//! alone, as the same user, with no-new-privileges. Both still forward, reload (a tunnel added, a
//! new steering program), forward through the new tunnel, and write their
//! counters when they stop. Without root or the namespace tools the test
//! shows as ignored (testkit `netns`).

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::netns::{self, ip, Lab, NETNS_PING};

mod common;

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &NETNS_PING,
        run_keeps_only_what_it_uses_and_still_forwards_and_reloads
    )])
}

/// Names of their own, so that other namespace tests may run beside.
const HOST_A: &str = "espgw-pv-hostA";
const GW_A: &str = "espgw-pv-gwA";
const GW_B: &str = "espgw-pv-gwB";
const HOST_B: &str = "espgw-pv-hostB";

const NOBODY: u32 = 65534;
const CAP_IPC_LOCK: u64 = 1 << 14;
const CAP_NET_RAW: u64 = 1 << 13;

/// Side `a` or `b`'s configuration; with `second`, a second tunnel to
/// 192.168.3.0/24 (hostB's second network).
fn config_text(side: &str, second: bool) -> String {
    let a = side == "a";
    let (local, remote) = if a {
        ("10.0.0.1", "10.0.0.2")
    } else {
        ("10.0.0.2", "10.0.0.1")
    };
    let (local_net, remote_nets) = if a {
        ("192.168.1", ["192.168.2", "192.168.3"])
    } else {
        ("192.168.2", ["192.168.1", "192.168.1"])
    };
    let key = |first: &str| format!("{first}0102030405060708090a0b0c0d0e0f10111213");
    let mut text = format!(
        "[gateway]\nname = \"pv{side}\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"{side}-in\"\naddress = \"{local_net}.1/24\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"{side}-out\"\naddress = \"{local}/24\"\n\n"
    );
    if a {
        for net in remote_nets {
            text += &format!("[[route]]\ndestination = \"{net}.0/24\"\nvia = \"{remote}\"\n\n");
        }
    } else {
        text += &format!("[[route]]\ndestination = \"192.168.1.0/24\"\nvia = \"{remote}\"\n\n");
        // hostB's second address, behind hostB itself.
        text += "[[route]]\ndestination = \"192.168.3.0/24\"\nvia = \"192.168.2.20\"\n\n";
    }
    let tunnels: &[(&str, &str, &str, &str, &str)] = if second {
        &[
            ("t", "0x1001", "0x1002", "00", "20"),
            ("t2", "0x2001", "0x2002", "40", "60"),
        ]
    } else {
        &[("t", "0x1001", "0x1002", "00", "20")]
    };
    for (i, &(name, spi_a, spi_b, key_a, key_b)) in tunnels.iter().enumerate() {
        let (spi_out, spi_in, key_out, key_in) = if a {
            (spi_a, spi_b, key_a, key_b)
        } else {
            (spi_b, spi_a, key_b, key_a)
        };
        // gwB's second tunnel carries hostB's 192.168.3.0/24 address, on
        // its inside network's link.
        let (local_subnet, remote_subnet) = if a {
            (format!("{local_net}.0/24"), format!("{}.0/24", remote_nets[i]))
        } else if i == 0 {
            (format!("{local_net}.0/24"), "192.168.1.0/24".to_owned())
        } else {
            ("192.168.3.0/24".to_owned(), "192.168.1.0/24".to_owned())
        };
        text += &format!(
            "[[tunnel]]\nname = \"{name}\"\nlocal = \"{local}\"\nremote = \"{remote}\"\n\
             local_subnet = \"{local_subnet}\"\nremote_subnet = \"{remote_subnet}\"\n\
             proposal = \"aes128gcm16\"\nspi_out = {spi_out}\nspi_in = {spi_in}\n\
             enc_key_out = \"{}\"\nenc_key_in = \"{}\"\nreplay_window = 64\n\n",
            key(key_out),
            key(key_in),
        );
    }
    text
}

/// Writes side `side`'s configuration, owner-only, owned by `owner`.
fn write_config(path: &Path, side: &str, second: bool, owner: u32) {
    std::fs::write(path, config_text(side, second)).expect("write config");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::chown(path, Some(owner), Some(owner)).expect("chown");
}

/// A `Name:\tvalue` line of a status file.
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        .trim()
}

fn hex(status: &str, name: &str) -> u64 {
    u64::from_str_radix(field(status, name), 16).expect("a hex capability set")
}

/// Every thread of `pid` holds CAP_IPC_LOCK alone, no-new-privileges, and
/// (with `uid`) that user's ids. Returns how many threads were checked.
fn check_privileges(pid: u32, uid: u32, what: &str) -> usize {
    check_capabilities(pid, uid, what, CAP_IPC_LOCK)
}

/// The processes whose parent is `pid` and whose name is `name`.
fn children_named(pid: u32, name: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/status")).is_ok_and(|status| {
                field(&status, "Name") == name && field(&status, "PPid") == pid.to_string()
            })
        })
        .collect()
}

/// [`check_privileges`] with `caps` in place of CAP_IPC_LOCK.
fn check_capabilities(pid: u32, uid: u32, what: &str, caps: u64) -> usize {
    let tasks: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the gateway's threads")
        .map(|e| e.expect("a task").path())
        .collect();
    for task in &tasks {
        let status = std::fs::read_to_string(task.join("status")).expect("a thread's status");
        let thread = format!("{what}, thread {} ({})", task.display(), field(&status, "Name"));
        assert_eq!(hex(&status, "CapEff"), caps, "{thread}: effective");
        assert_eq!(hex(&status, "CapPrm"), caps, "{thread}: permitted");
        assert_eq!(hex(&status, "CapInh"), 0, "{thread}: inheritable");
        assert_eq!(hex(&status, "CapAmb"), 0, "{thread}: ambient");
        assert_eq!(hex(&status, "CapBnd"), 0, "{thread}: bounding");
        assert_eq!(field(&status, "NoNewPrivs"), "1", "{thread}: no_new_privs");
        let ids = |name| {
            field(&status, name)
                .split_whitespace()
                .map(|id| id.parse::<u32>().expect("an id"))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids("Uid"), [uid; 4], "{thread}: uids");
        if uid != 0 {
            assert_eq!(ids("Gid"), [uid; 4], "{thread}: gids");
            assert_eq!(ids("Groups"), [uid], "{thread}: supplementary groups");
        }
    }
    tasks.len()
}

fn ping(from: &str, to: &str) -> bool {
    // The first answers wait for ARP on three links.
    (0..5).any(|_| {
        Command::new("ip")
            .args([
                "netns", "exec", from, "ping", "-c", "2", "-i", "0.2", "-W", "1", to,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn run_keeps_only_what_it_uses_and_still_forwards_and_reloads() {
    let dir = std::env::temp_dir().join(format!("espgw-pv-{}", std::process::id()));
    let mut lab = Lab::new(&[HOST_A, GW_A, GW_B, HOST_B], dir.clone());
    // nobody reads its configuration at reload, through this directory.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    netns::demo_topology([HOST_A, GW_A, GW_B, HOST_B]);
    ip(&["-n", HOST_B, "addr", "add", "192.168.3.20/24", "dev", "hb0"]);

    let configs = [dir.join("pva.toml"), dir.join("pvb.toml")];
    let sockets = [dir.join("pva.sock"), dir.join("pvb.sock")];
    let stats = [dir.join("pva.json"), dir.join("pvb.json")];
    let logs = [dir.join("pva.log"), dir.join("pvb.log")];
    let state_dirs = [dir.join("pva-state"), dir.join("pvb-state")];
    write_config(&configs[0], "a", false, 0);
    write_config(&configs[1], "b", false, NOBODY);
    for (i, (ns, extra)) in [(GW_A, &["--workers", "2"][..]), (GW_B, &["--user", "nobody"][..])]
        .into_iter()
        .enumerate()
    {
        let child = common::espgw_in(ns)
            .arg("run")
            .args(extra)
            .arg("--config")
            .arg(&configs[i])
            .arg("--control")
            .arg(&sockets[i])
            .arg("--stats")
            .arg(&stats[i])
            // Its static AEAD keys need a sequence ledger; gwB's is handed
            // to nobody, who writes it once root is gone.
            .arg("--state-dir")
            .arg(&state_dirs[i])
            .stderr(File::create(&logs[i]).expect("log file"))
            .spawn()
            .expect("espgw run starts");
        lab.children.push(child);
    }
    let log = |i: usize| std::fs::read_to_string(&logs[i]).unwrap_or_default();
    let pids = [lab.children[0].id(), lab.children[1].id()];
    common::wait_forwarding(&mut lab.children[0], &logs[0]);
    let threads_a = check_privileges(pids[0], 0, "gwA");
    assert!(threads_a >= 3, "two workers and the control thread: {threads_a}");
    common::wait_forwarding(&mut lab.children[1], &logs[1]);
    check_privileges(pids[1], NOBODY, "gwB (--user nobody)");
    for name in ["", "ledger", "lock"] {
        let path = state_dirs[1].join(name);
        let owner = std::fs::metadata(&path).map(|m| m.uid());
        assert_eq!(
            owner.ok(),
            Some(NOBODY),
            "{} is handed to nobody, who writes it",
            path.display()
        );
    }
    for (i, uid) in [0, NOBODY].into_iter().enumerate() {
        let brokers = children_named(pids[i], "espgw-sockets");
        assert_eq!(
            brokers.len(),
            1,
            "gateway {i}'s packet socket broker:\n{}",
            log(i)
        );
        check_capabilities(brokers[0], uid, "a packet socket broker", CAP_NET_RAW);
    }
    let status_owner = std::fs::metadata(format!("/proc/{}/status", pids[1]))
        .expect("gwB's status")
        .uid();
    assert_eq!(status_owner, 0, "gwB is not dumpable: its /proc files are root's");

    assert!(
        ping(HOST_A, "192.168.2.20"),
        "hostA reaches hostB through the tunnel:\n{}\n{}",
        log(0),
        log(1)
    );

    // A reload adds a second tunnel: SAs installed by the workers, a new
    // steering program on gwA's fanout groups, gwB's file read as nobody.
    write_config(&configs[0], "a", true, 0);
    write_config(&configs[1], "b", true, NOBODY);
    for socket in &sockets {
        let out = common::espgw()
            .args(["reload", "--json", "--socket"])
            .arg(socket)
            .output()
            .expect("espgw reload");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("\"t2\""),
            "reload through {}: {text}{}\n{}\n{}",
            socket.display(),
            String::from_utf8_lossy(&out.stderr),
            log(0),
            log(1)
        );
    }
    assert!(
        ping(HOST_A, "192.168.3.20"),
        "hostA reaches hostB's second network through the new tunnel:\n{}\n{}",
        log(0),
        log(1)
    );
    assert!(ping(HOST_A, "192.168.2.20"), "the first tunnel still forwards");
    for (i, what) in ["gwA", "gwB"].iter().enumerate() {
        assert!(
            !log(i).contains("ERROR"),
            "{what} logged an error (a step that lacked a privilege?):\n{}",
            log(i)
        );
    }
    // Threads started after the drop (control clients) inherit it.
    check_privileges(pids[0], 0, "gwA after the reload");
    check_privileges(pids[1], NOBODY, "gwB after the reload");

    lab.stop_all();
    for (i, path) in stats.iter().enumerate() {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}: {text:?}\n{}", path.display(), log(i)));
        assert!(json["sas"].is_array() || json.is_object(), "{json}");
    }
}
