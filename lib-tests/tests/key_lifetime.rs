//! Keys die with their SA: a tunnel's keys are installed through the real
//! configuration path on two workers (the second a fork of the first, as
//! `espgw run` builds them, each on its own thread), carry traffic both
//! ways, and a reload removes the tunnel; afterwards the process's own
//! memory (every readable private mapping of /proc/self/maps, heap and
//! thread stacks included, read through /proc/self/mem) holds no copy of
//! its keys. The same scan run while the tunnel is installed must find
//! them (the key itself, and for AES the first round key, which is the
//! key), so a scan that cannot see them fails the test.
//!
//! The test never holds a key in the clear: each is kept XORed with a mask
//! and compared byte by byte while scanning, and the configuration text
//! holds it in hex.

mod common;

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use accel::{Algorithm, EngineKind, EngineSpec, Style};
use common::{engine_spec, udp_packet, HOST_A};
use dataplane::command::WorkerCommand;
use dataplane::{Gateway, LinkLayer, PacketPool, Port, Verdict};
use ike_stub::builder::{pattern_key, test_site, TunnelBuilder};
use ike_stub::{Config, ControlPlane};
use spd_sad::{Ipv4Prefix, Mode};
use testkit::memscan::{self, Needle};

/// The allocator `espgw` runs with, so that freed memory is reused (or
/// not) as in the gateway.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The four keys of the tunnel that the reload removes, masked.
struct TunnelKeys {
    enc_out: Needle,
    enc_in: Needle,
    auth_out: Needle,
    auth_in: Needle,
}

impl TunnelKeys {
    fn random(alg: Algorithm) -> TunnelKeys {
        TunnelKeys {
            enc_out: Needle::random(alg.enc_key_len()),
            enc_in: Needle::random(alg.enc_key_len()),
            auth_out: Needle::random(alg.auth_key_len()),
            auth_in: Needle::random(alg.auth_key_len()),
        }
    }

    /// What to look for: the cipher keys (without a GCM or ChaCha20 salt,
    /// which is four bytes and matches by chance), the integrity keys and
    /// the keyed HMAC states derived from them (as good as the key for
    /// forging; each packet's MAC starts from a copy).
    fn needles(&self, alg: Algorithm) -> Vec<Needle> {
        let salt = if alg.is_aead() { 4 } else { 0 };
        let mut needles = Vec::new();
        for enc in [&self.enc_out, &self.enc_in] {
            needles.push(enc.prefix(enc.len() - salt));
        }
        for auth in [&self.auth_out, &self.auth_in] {
            if !auth.is_empty() {
                needles.push(auth.prefix(auth.len()));
                needles.extend(hmac_states(alg.integrity(), auth));
            }
        }
        needles
    }
}

/// The inner and outer hash states HMAC keys with `key` (RFC 2104: the
/// key padded to a block, XORed with 0x36 or 0x5c, compressed once), as
/// the hash cores hold them: native-endian words. Computed on a thread of
/// their own whose stack is scrubbed after, so that the test leaves no
/// copy the scans would count.
fn hmac_states(integrity: accel::IntegrityKind, key: &Needle) -> Vec<Needle> {
    #[inline(never)]
    fn compute(integrity: accel::IntegrityKind, key: &Needle) -> Vec<Needle> {
        let mut states = Vec::new();
        for pad in [0x36u8, 0x5c] {
            let mut block = [0u8; 64];
            key.unmask_into(&mut block);
            for b in &mut block {
                *b ^= pad;
            }
            let mut bytes = [0u8; 32];
            let len = match integrity {
                accel::IntegrityKind::HmacSha1_96 => {
                    let mut h = [0x6745_2301u32, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476, 0xc3d2_e1f0];
                    sha1::block_api::compress(&mut h, &[block]);
                    for (out, w) in bytes.chunks_exact_mut(4).zip(h) {
                        out.copy_from_slice(&w.to_ne_bytes());
                    }
                    20
                }
                accel::IntegrityKind::HmacSha256_128 => {
                    let mut h = [
                        0x6a09_e667u32,
                        0xbb67_ae85,
                        0x3c6e_f372,
                        0xa54f_f53a,
                        0x510e_527f,
                        0x9b05_688c,
                        0x1f83_d9ab,
                        0x5be0_cd19,
                    ];
                    sha2::block_api::compress256(&mut h, &[block]);
                    for (out, w) in bytes.chunks_exact_mut(4).zip(h) {
                        out.copy_from_slice(&w.to_ne_bytes());
                    }
                    32
                }
                accel::IntegrityKind::Aead | accel::IntegrityKind::None => return Vec::new(),
            };
            states.push(Needle::of(&bytes[..len]));
            zeroize::Zeroize::zeroize(&mut bytes);
            zeroize::Zeroize::zeroize(&mut block);
        }
        states
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let states = compute(integrity, key);
                accel::scrub_stack();
                states
            })
            .join()
            .expect("the HMAC states")
    })
}

/// A tunnel of site A (10.0.0.1, 192.168.1.0/24) to a peer at 10.0.0.`n`
/// (192.168.`n`.0/24), named `name`.
struct Remote<'k> {
    name: &'static str,
    n: u8,
    keys: &'k TunnelKeys,
}

impl Remote<'_> {
    fn host(&self) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, self.n, 20)
    }
}

const A_NET: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 0);
const A_GW: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn net(addr: Ipv4Addr) -> Ipv4Prefix {
    Ipv4Prefix::new(addr, 24).unwrap()
}

/// Site A's configuration text: the shared test tunnel `t` and the
/// tunnels to `remotes`, keyed with their keys; or, with `mirror`, the
/// peer's end of the one tunnel in `remotes`. Every configuration of site
/// A routes to peers 8 and 9, so that a reload may add or remove them.
fn config_text(alg: Algorithm, remotes: &[Remote<'_>], mirror: bool) -> String {
    let mut site = test_site(alg, Mode::Tunnel, false, true);
    for n in [8, 9] {
        site = site.route_via(net(Ipv4Addr::new(192, 168, n, 0)), Ipv4Addr::new(10, 0, 0, n));
    }
    if mirror {
        let n = remotes[0].n;
        site.tunnels.clear();
        site.routes.clear();
        site = site.route_via(net(A_NET), A_GW);
        site.interfaces[0].address = smoltcp::wire::Ipv4Cidr::new(Ipv4Addr::new(192, 168, n, 1), 24);
        site.interfaces[1].address = smoltcp::wire::Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, n), 24);
    }
    // Placeholders of the right lengths, replaced by the keys' hex below so
    // that the keys never exist in the clear outside the code under test.
    let placeholder = |n: u8, dir: &str, len: usize, auth: bool| {
        let seed = match (dir, auth) {
            ("out", false) => 0x40,
            ("in", false) => 0x80,
            ("out", true) => 0xc0,
            _ => 0x10,
        };
        pattern_key(len, n, seed)
    };
    for remote in remotes {
        let (n, peer) = (remote.n, Ipv4Addr::new(10, 0, 0, remote.n));
        let spis = (0x9000 + u32::from(n) * 2, 0x9001 + u32::from(n) * 2);
        let (ends, spis, nets) = if mirror {
            (
                (peer, A_GW),
                (spis.1, spis.0),
                (net(Ipv4Addr::new(192, 168, n, 0)), net(A_NET)),
            )
        } else {
            (
                (A_GW, peer),
                spis,
                (net(A_NET), net(Ipv4Addr::new(192, 168, n, 0))),
            )
        };
        site = site.tunnel(
            TunnelBuilder::new(remote.name, ends, alg, spis)
                .subnets(nets.0, nets.1)
                .keys_with(|dir, len, auth| placeholder(n, dir, len, auth))
                .replay_window(64),
        );
    }
    let mut text = site.to_toml();
    let hex = |key: Vec<u8>| key.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for remote in remotes {
        let keys = remote.keys;
        let (out, inbound) = if mirror {
            (&keys.enc_in, &keys.enc_out)
        } else {
            (&keys.enc_out, &keys.enc_in)
        };
        let (auth_out, auth_in) = if mirror {
            (&keys.auth_in, &keys.auth_out)
        } else {
            (&keys.auth_out, &keys.auth_in)
        };
        for (dir, auth, key) in [
            ("out", false, out),
            ("in", false, inbound),
            ("out", true, auth_out),
            ("in", true, auth_in),
        ] {
            if key.is_empty() {
                continue;
            }
            let placeholder = hex(placeholder(remote.n, dir, key.len(), auth));
            assert_eq!(text.matches(&placeholder).count(), 1, "{placeholder}\n{text}");
            text = text.replace(&placeholder, &key.hex());
        }
    }
    text
}

fn parse(text: &str) -> Config {
    Config::parse(Path::new("test.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// What a worker thread owns: its gateway and pool, and on worker 0 the
/// control plane, as in `espgw run`.
struct State {
    gw: Gateway,
    pool: PacketPool,
    plane: Option<ControlPlane>,
}

type Work = Box<dyn FnOnce(&mut State) + Send>;

/// A worker thread running what it is sent.
struct Worker {
    work: mpsc::Sender<Work>,
    done: mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn start(gw: Gateway, plane: Option<ControlPlane>) -> Worker {
        let (work, inbox) = mpsc::channel::<Work>();
        let (finished, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            memscan::mark_stack();
            let mut state = State {
                gw,
                pool: PacketPool::new(64),
                plane,
            };
            for job in inbox {
                job(&mut state);
                finished.send(()).unwrap();
            }
        });
        Worker {
            work,
            done,
            thread: Some(thread),
        }
    }

    fn run(&self, job: impl FnOnce(&mut State) + Send + 'static) {
        self.work.send(Box::new(job)).unwrap();
        self.done.recv().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let (work, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.work, work));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs every frame through `gw` from `port` and returns what it sent.
fn through(
    gw: &mut Gateway,
    pool: &mut PacketPool,
    port: Port,
    frames: &[Vec<u8>],
) -> Vec<(Verdict, Vec<u8>)> {
    let mut bufs = Vec::new();
    for frame in frames {
        let mut buf = pool.alloc().expect("a buffer");
        assert!(buf.fill(frame));
        bufs.push(buf);
    }
    let mut out = Vec::new();
    let mut now = Duration::ZERO;
    gw.handle_batch(now, port, &mut bufs, &mut out, pool);
    // The `sec` model completes in modelled time.
    while out.len() < frames.len() && now < Duration::from_secs(1) {
        now += Duration::from_micros(100);
        gw.poll(now, &mut out, pool);
    }
    out.into_iter()
        .map(|(buf, verdict)| {
            let data = buf.data().to_vec();
            pool.free(buf);
            (verdict, data)
        })
        .collect()
}

/// How many of `results` went out of `to`; the others must have been
/// refused as `not_owner` (each inbound SA is one worker's).
fn forwarded(results: &[(Verdict, Vec<u8>)], to: Port) -> usize {
    results
        .iter()
        .filter(|(verdict, _)| {
            assert!(
                matches!(
                    verdict,
                    Verdict::Forward(_) | Verdict::Drop(dataplane::DropReason::NotOwner)
                ),
                "{verdict:?}"
            );
            *verdict == Verdict::Forward(to)
        })
        .count()
}

/// Reloads worker 0's control plane with `text` as `espgw run` does (on
/// worker 0, which applies the commands and hands worker 1 its copies).
fn reload(workers: &[Worker; 2], text: String) -> ike_stub::ReloadReport {
    let (copies_tx, copies_rx) = mpsc::channel::<(ike_stub::ReloadReport, Vec<WorkerCommand>)>();
    workers[0].run(move |state| {
        let plane = state.plane.as_mut().expect("worker 0 has the plane");
        let report = plane.reload(parse(&text)).unwrap();
        let mut commands = Vec::new();
        plane.take_commands(&mut commands);
        let mut copies = Vec::new();
        for command in commands {
            copies.extend(state.gw.apply_first(command, Duration::ZERO, 1).unwrap());
        }
        copies_tx.send((report, copies)).unwrap();
    });
    let (report, copies) = copies_rx.recv().unwrap();
    workers[1].run(move |state| {
        for command in copies {
            state.gw.apply_worker(command, Duration::ZERO).unwrap();
        }
    });
    report
}

/// One algorithm on one engine: a tunnel configured at start and one a
/// reload added carry traffic; a reload removes both; their keys are
/// found while installed and nowhere after.
fn keys_die_with_their_sa(alg: Algorithm, engine: &EngineSpec) -> (usize, memscan::Scan) {
    memscan::mark_stack();
    let (first_keys, added_keys) = (TunnelKeys::random(alg), TunnelKeys::random(alg));
    let needles: Vec<Needle> = first_keys
        .needles(alg)
        .into_iter()
        .chain(added_keys.needles(alg))
        .collect();
    let needles: Vec<&Needle> = needles.iter().collect();
    let first = Remote {
        name: "first",
        n: 9,
        keys: &first_keys,
    };
    let added = Remote {
        name: "added",
        n: 8,
        keys: &added_keys,
    };

    // The peer's ESP for the first tunnel, from its own gateway, dropped
    // after.
    let inbound: Vec<Vec<u8>> = {
        let config = parse(&config_text(alg, std::slice::from_ref(&first), true));
        let mut peer = Gateway::with_commands(
            config.setup(LinkLayer::RawIp, Style::Async),
            accel::build_engine(engine).unwrap(),
            &config.commands(),
            Duration::ZERO,
        )
        .unwrap();
        let mut pool = PacketPool::new(64);
        let packets: Vec<Vec<u8>> = (0..8).map(|i| udp_packet(first.host(), HOST_A, 200, i)).collect();
        through(&mut peer, &mut pool, Port::Inside, &packets)
            .into_iter()
            .map(|(verdict, frame)| {
                assert_eq!(verdict, Verdict::Forward(Port::Outside), "the peer encrypts");
                frame
            })
            .collect()
    };

    // As `espgw run` starts, on a thread that then waits (as its main
    // thread waits for the workers): load, install on worker 0's gateway,
    // fork worker 1's.
    let start_text = config_text(alg, std::slice::from_ref(&first), false);
    let engine_for_start = engine.clone();
    let (started_tx, started_rx) = mpsc::channel();
    let (finish_tx, finish_rx) = mpsc::channel::<()>();
    let starter = std::thread::spawn(move || {
        memscan::mark_stack();
        let config = parse(&start_text);
        let mut gw0 = Gateway::with_commands(
            config.setup(LinkLayer::RawIp, Style::Async),
            accel::build_engine(&engine_for_start).unwrap(),
            &config.commands(),
            Duration::ZERO,
        )
        .unwrap();
        let mut gw1 = gw0.fork(accel::build_engine(&engine_for_start).unwrap()).unwrap();
        gw0.place(0, 2);
        gw1.place(1, 2);
        let plane = ControlPlane::new(config.clone());
        drop(config);
        started_tx.send((gw0, gw1, plane)).unwrap();
        let _ = finish_rx.recv();
    });
    let (gw0, gw1, plane) = started_rx.recv().unwrap();
    let workers = [Worker::start(gw0, Some(plane)), Worker::start(gw1, None)];

    // A reload adds the second tunnel, on the workers' threads.
    let report = reload(&workers, config_text(alg, &[first, added], false));
    assert_eq!(report.added, vec!["added".to_owned()], "{report:?}");

    let (counts_tx, counts_rx) = mpsc::channel();
    for worker in &workers {
        let inbound = inbound.clone();
        let counts_tx = counts_tx.clone();
        let hosts = [Ipv4Addr::new(192, 168, 9, 20), Ipv4Addr::new(192, 168, 8, 20)];
        worker.run(move |state| {
            let outbound: Vec<Vec<u8>> = (0..8)
                .map(|i| udp_packet(HOST_A, hosts[i % 2], 200, i as u8))
                .collect();
            let sent = forwarded(
                &through(&mut state.gw, &mut state.pool, Port::Inside, &outbound),
                Port::Outside,
            );
            let received = forwarded(
                &through(&mut state.gw, &mut state.pool, Port::Outside, &inbound),
                Port::Inside,
            );
            counts_tx.send((sent, received)).unwrap();
        });
    }
    let (sent, received) = counts_rx.try_iter().fold((0, 0), |(s, r), (a, b)| (s + a, r + b));
    // Outbound, both workers encrypt (the driver steers, not the core).
    assert!(
        sent >= 8 && received == 8,
        "the tunnels carried traffic: {sent} out, {received} in"
    );
    drop(inbound);
    let before = memscan::scan(&needles);
    println!("scanned {} MiB in {:?}", before.bytes >> 20, before.time);
    let before = before.hits.len();

    // A reload removes both.
    let report = reload(&workers, config_text(alg, &[], false));
    assert_eq!(report.removed.len(), 2, "{report:?}");
    for worker in &workers {
        worker.run(|state| {
            assert!(state.gw.sad().iter().all(|(_, sa)| sa.name().starts_with("t-")));
        });
    }
    // The workers, the plane and the starting thread live on, with the
    // tunnel that stays.
    let after = memscan::scan(&needles);
    drop(workers);
    let _ = finish_tx.send(());
    let _ = starter.join();
    (before, after)
}

#[test]
fn a_removed_tunnels_keys_are_nowhere_in_memory() {
    let mut failures = Vec::new();
    // Every crate's key types on the soft engine (ring's GCM and ChaCha20,
    // AWS-LC's AES and 3DES, RustCrypto's HMACs); the `sec` model keeps
    // the same sessions in its own table.
    let cases = [
        (EngineKind::Soft, Algorithm::Aes128Gcm16),
        (EngineKind::Soft, Algorithm::ChaCha20Poly1305),
        (EngineKind::Soft, Algorithm::Aes128Sha1),
        (EngineKind::Soft, Algorithm::Aes256Sha256),
        (EngineKind::Soft, Algorithm::TripleDesSha1),
        (EngineKind::Sec, Algorithm::Aes256Gcm16),
    ];
    for (kind, alg) in cases {
        let (before, after) =
            keys_die_with_their_sa(alg, &engine_spec(kind, accel::BufferPolicy::Registered));
        println!(
            "{kind} {alg}: {before} copies while installed, {} after removal",
            after.hits.len()
        );
        assert!(
            before > 0,
            "{kind} {alg}: the scan found no copy while the tunnel was installed"
        );
        if !after.hits.is_empty() {
            let hits: Vec<String> = after.hits.iter().map(|h| h.to_string()).collect();
            failures.push(format!(
                "{kind} {alg}: {} copies after removal:\n  {}",
                hits.len(),
                hits.join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
