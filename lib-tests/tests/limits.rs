//! Limits: frames of every odd size are counted, never fatal, and the
//! queues that hold packets are bounded and count what they refuse.

mod common;

use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, Style};
use common::{interface, tunnel_builder, tunnel_config, udp_packet, HOST_A, HOST_B};
use dataplane::{DropReason, Gateway, LinkLayer, Output, PacketPool, Port, Verdict};
use ike_stub::Config;
use smoltcp::wire::EthernetAddress;

/// Site A on Ethernet; `resolve` turns ARP on (no static neighbours).
fn site_a(resolve: bool) -> Gateway {
    let text = tunnel_config(Algorithm::Aes128Gcm16, "tunnel", false, true);
    let config = Config::parse(Path::new("a.toml"), &text).unwrap_or_else(|e| panic!("{e}"));
    let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
    setup.resolve_neighbors = resolve;
    common::soft_gateway(&config, setup)
}

fn ethernet(payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0x01, 0x01, 0x02, 0, 0, 0, 0x01, 0x10, 0x08, 0x00];
    frame.extend_from_slice(payload);
    frame
}

fn feed(gw: &mut Gateway, pool: &mut PacketPool, from: Port, frames: &[Vec<u8>]) -> Vec<Output> {
    let mut bufs = Vec::new();
    for f in frames {
        let mut buf = pool.alloc().expect("pool has room");
        assert!(buf.fill(f), "{} bytes fit a buffer", f.len());
        bufs.push(buf);
    }
    let mut out = Vec::new();
    gw.handle_batch(Duration::ZERO, from, &mut bufs, &mut out, pool);
    drivers::drive::flush(gw, Duration::ZERO, &mut out, pool);
    out
}

#[test]
fn zero_length_tiny_cut_and_maximal_frames_are_counted_not_fatal() {
    let mut gw = site_a(false);
    let mut pool = PacketPool::new(64);
    let max = dataplane::buffer::MAX_FRAME;
    let mut frames: Vec<Vec<u8>> = (0..=64).map(|len| vec![0u8; len]).collect();
    frames.extend((0..=64).map(|len| (0..len).map(|i| (i * 37 + 11) as u8).collect()));
    // An Ethernet header and nothing after it; a header cut short.
    frames.push(ethernet(&[]));
    frames.push(ethernet(&[0x45, 0, 0]));
    // A jumbo frame the driver cut to the buffer: its IPv4 header claims
    // 9000 bytes. And a frame filling the buffer exactly.
    let mut jumbo = ethernet(&udp_packet(HOST_A, HOST_B, max - 14 - 28, 1));
    jumbo[16..18].copy_from_slice(&9000u16.to_be_bytes());
    frames.push(jumbo);
    let mut handled = 0;
    for from in [Port::Inside, Port::Outside] {
        for chunk in frames.chunks(32) {
            for (buf, verdict) in feed(&mut gw, &mut pool, from, chunk) {
                assert!(
                    !matches!(verdict, Verdict::Forward(_) | Verdict::Control),
                    "{verdict:?}"
                );
                handled += 1;
                pool.free(buf);
            }
        }
    }
    assert_eq!(handled, frames.len() * 2);
    let stats = gw.stats();
    assert!(stats.balanced(), "{stats:?}");
    assert_eq!(stats.rx_packets, (frames.len() * 2) as u64);
    assert_eq!(stats.tx_packets, 0);
    assert!(stats.drops.get(DropReason::Malformed) > 0);
    // A valid packet filling the buffer exactly is protected: the ESP
    // overhead goes into the buffer's headroom and tailroom.
    let full = ethernet(&udp_packet(HOST_A, HOST_B, max - 14 - 28, 2));
    let out = feed(&mut gw, &mut pool, Port::Inside, &[full]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1, Verdict::Forward(Port::Outside));
    assert!(out[0].0.len() > max, "{} bytes of ESP", out[0].0.len());
    for (buf, _) in out {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0, "every buffer came back");
}

#[test]
fn the_arp_queue_is_bounded_and_counts_what_it_refuses() {
    let mut gw = site_a(true);
    let mut pool = PacketPool::new(1024);
    // No neighbour is known: everything waits for ARP until the queue is full.
    let frames: Vec<Vec<u8>> = (0..200)
        .map(|i| ethernet(&udp_packet(HOST_A, HOST_B, 64, i as u8)))
        .collect();
    let mut out = Vec::new();
    for chunk in frames.chunks(50) {
        out.extend(feed(&mut gw, &mut pool, Port::Inside, chunk));
    }
    let full = gw.stats().drops.get(DropReason::NeighborQueueFull);
    assert!(full > 0, "the per-hop share of the queue filled up");
    let waiting = 200 - full;
    assert!(waiting <= 256, "{waiting} packets held");
    for (buf, _) in out {
        pool.free(buf);
    }
    // Nobody answers: the held packets drop as unreachable, all accounted for.
    let mut out = Vec::new();
    gw.handle_timeout(Duration::from_secs(10), &mut out, &mut pool);
    for (buf, _) in out {
        pool.free(buf);
    }
    let stats = gw.stats();
    assert_eq!(stats.drops.get(DropReason::NeighborUnreachable), waiting);
    assert!(stats.balanced(), "{stats:?}");
    assert_eq!(pool.in_use(), 0);
}

/// Live sockets are promiscuous: frames for other hosts on a shared link
/// are counted as `other_host`, never forwarded.
#[test]
fn frames_for_other_hosts_are_not_ours() {
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, true);
    interface(&mut built, "inside").mac = Some(EthernetAddress([0x02, 0, 0, 0, 1, 1]));
    let config = common::parsed(&built);
    let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
    setup.only_own_mac = true;
    let mut gw = common::soft_gateway(&config, setup);
    let mut pool = PacketPool::new(8);
    let ours = ethernet(&udp_packet(HOST_A, HOST_B, 64, 1));
    let mut theirs = ours.clone();
    theirs[..6].copy_from_slice(&[0x02, 0, 0, 0, 0x09, 0x09]);
    let out = feed(&mut gw, &mut pool, Port::Inside, &[theirs, ours]);
    let verdicts: Vec<Verdict> = out.iter().map(|(_, v)| *v).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Drop(DropReason::OtherHost),
            Verdict::Forward(Port::Outside)
        ]
    );
    for (buf, _) in out {
        pool.free(buf);
    }
    assert!(gw.stats().balanced());
}
