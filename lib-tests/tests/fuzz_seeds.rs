//! Writes the fuzz targets' seed corpora (`fuzz/seeds/<target>/`) from the
//! project's own vectors: real ESP from every proposal and mode, the shipped
//! configurations, captures, control requests and sealed rekey messages.
//! The seeds are committed; regenerate them with
//!
//! ```text
//! cargo test -p espgw-lib-tests --test fuzz_seeds -- --ignored
//! ```
//!
//! Seeds added later have generators of their own, which run alone
//! (`cargo test -p espgw-lib-tests --test fuzz_seeds write_ipv6_tunnel_seeds -- --ignored`,
//! `write_keying_seeds` for `rekey_message` and `control_plane`) and leave
//! the other seeds as they are (some hold random CBC IVs).
//!
//! Without `--ignored` the tests check that every target has seeds and
//! that the seeds made without randomness (`vnet_offload`'s, the IPv6
//! ones of `gateway_outbound` and `gateway_inbound`, and those of
//! `rekey_message` and `control_plane`) are what their generators make
//! now.

mod common;

use std::fs;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use accel::{Algorithm, Descriptor, DescriptorKind, Direction, Region, Session, Status};
use common::{udp_packet, Pair, HOST_A, HOST_B};
use dataplane::{DropReason, LinkLayer, PacketPool, Port, Verdict};
use ike_stub::builder::{LifetimeBuilder, LimitsSection, RekeySection};
use ike_stub::message::{Kind, Message};
use ike_stub::prf::TunnelSecrets;
use ike_stub::Config;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

const TARGETS: [&str; 16] = [
    "esp_decap",
    "gateway_inbound",
    "gateway_outbound",
    "esp_trailer",
    "reassembly",
    "config",
    "pcap_input",
    "control_request",
    "rekey_message",
    "control_plane",
    "pcap_verdicts",
    "vnet_offload",
    "shared_request",
    "udp_encap_inbound",
    "ipv6_headers",
    "xfrm_mirror",
];

/// The repository's root (this crate is its `lib-tests/`), where the
/// seeds, the shipped configurations and the recorded XFRM messages live.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lib-tests/ is in the repository")
}

fn seeds_dir() -> PathBuf {
    repo().join("fuzz/seeds")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = seeds_dir().join(target);
    fs::create_dir_all(&dir).expect("create seed directory");
    fs::write(dir.join(name), bytes).expect("write seed");
}

#[test]
fn every_fuzz_target_has_seeds() {
    for target in TARGETS {
        let dir = seeds_dir().join(target);
        let n = fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert!(
            n > 0,
            "no seeds in {}; run this test with --ignored",
            dir.display()
        );
    }
}

/// The `xfrm_mirror` seeds: every XFRM fixture of
/// `ike-stub/testdata/xfrm/`, in the fuzz target's step form.
fn xfrm_seeds() -> Vec<(String, Vec<u8>)> {
    use ike_stub::xfrm::fixtures::{encode_steps, parse_fixture};
    let dir = repo().join("ike-stub/testdata/xfrm");
    let mut seeds = Vec::new();
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("the XFRM fixtures")
        .map(|e| e.expect("a fixture").path())
        .filter(|p| p.extension().is_some_and(|e| e == "nl"))
        .collect();
    files.sort();
    for path in files {
        let text = fs::read_to_string(&path).expect("a fixture's text");
        let steps = parse_fixture(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("fixture")
            .to_owned();
        seeds.push((name, encode_steps(&steps)));
    }
    seeds
}

#[test]
#[ignore = "writes fuzz/seeds/xfrm_mirror; run with --ignored to regenerate them"]
fn write_xfrm_seeds() {
    let _ = fs::remove_dir_all(seeds_dir().join("xfrm_mirror"));
    for (name, bytes) in xfrm_seeds() {
        write("xfrm_mirror", &name, &bytes);
    }
}

#[test]
fn xfrm_seeds_are_the_fixtures() {
    for (name, bytes) in xfrm_seeds() {
        let path = seeds_dir().join("xfrm_mirror").join(&name);
        let on_disk =
            fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run write_xfrm_seeds", path.display()));
        assert!(
            on_disk == bytes,
            "{} is stale: run write_xfrm_seeds",
            path.display()
        );
    }
}

/// The (encryption, integrity) keys site A sends with in `tests/common`.
fn a_out_keys(alg: Algorithm) -> (Vec<u8>, Vec<u8>) {
    let bytes = |len: usize, seed: u8| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    };
    (bytes(alg.enc_key_len(), 1), bytes(alg.auth_key_len(), 101))
}

/// `packet` (IPv4 + ESP) decrypted in place, ICV left as it was: what the
/// fuzzing build's ICV bypass hands to the trailer checks.
fn decrypted_in_place(alg: Algorithm, esn: bool, packet: &[u8]) -> Vec<u8> {
    let (enc, auth) = a_out_keys(alg);
    let session = Session::new(alg, &enc, &auth).expect("keys");
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    let mut esp = packet[header_len..].to_vec();
    let (iv, icv) = (alg.iv_len(), alg.icv_len());
    let cipher_len = esp.len() - 8 - iv - icv;
    let mut desc = Descriptor {
        kind: DescriptorKind::SinglePass,
        direction: Direction::Decrypt,
        auth_only: Region::new(0, 8),
        esn_high: esn.then_some(0),
        iv: Region::new(8, iv),
        cipher: Region::new(8 + iv, cipher_len),
        icv: Region::new(8 + iv + cipher_len, icv),
        status: Status::Pending,
    };
    accel::primitive::process(&session, &mut desc, &mut esp);
    assert_eq!(desc.status, Status::Done, "{alg}");
    let mut out = packet[..header_len].to_vec();
    out.extend_from_slice(&esp);
    out
}

fn ipv4_fix_checksum(p: &mut [u8]) {
    smoltcp::wire::Ipv4Packet::new_unchecked(&mut p[..]).fill_checksum();
}

fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn pcap(datalink: DataLink, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let header = PcapHeader {
            datalink,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(&mut out, header).expect("pcap header");
        for (i, f) in frames.iter().enumerate() {
            let stamp = Duration::from_millis(1_700_000_000_000 + i as u64);
            w.write_packet(&PcapPacket::new(stamp, f.len() as u32, f))
                .expect("pcap packet");
        }
    }
    out
}

fn shipped_gateway(name: &str, link: LinkLayer) -> dataplane::Gateway {
    let config = Config::load(&repo().join("configs").join(name)).expect("shipped config");
    built(&config, link)
}

/// Everything `gw` sends out of `port` for `frame` arriving on `from`.
fn through(gw: &mut dataplane::Gateway, from: Port, frame: &[u8], port: Port) -> Vec<Vec<u8>> {
    let mut pool = PacketPool::new(64);
    let mut buf = pool.alloc().expect("buffer");
    assert!(buf.fill(frame));
    let mut sent = Vec::new();
    for (buf, verdict) in drivers::drive::handle_frame(gw, Duration::ZERO, from, buf, &mut pool) {
        if verdict == Verdict::Forward(port) {
            sent.push(buf.data().to_vec());
        }
        pool.free(buf);
    }
    sent
}

fn arp_request(sender_mac: [u8; 6], sender_ip: [u8; 4], target_ip: [u8; 4]) -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
    a.extend_from_slice(&sender_mac);
    a.extend_from_slice(&sender_ip);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&target_ip);
    ethernet([0xff; 6], sender_mac, 0x0806, &a)
}

/// A capture whose snaplen is `snaplen` (it picks the set-up of the
/// `pcap_verdicts` target).
fn pcap_snap(datalink: DataLink, snaplen: u32, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let header = PcapHeader {
            datalink,
            snaplen,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(&mut out, header).expect("pcap header");
        for (i, f) in frames.iter().enumerate() {
            let stamp = Duration::from_millis(1_700_000_000_000 + i as u64);
            w.write_packet(&PcapPacket::new(stamp, f.len() as u32, f))
                .expect("pcap packet");
        }
    }
    out
}

/// Seeds of `pcap_verdicts`, and a `config` seed with `[limits]`, alone
/// (they came later; regenerating every target's seeds would change the
/// committed ones, whose CBC IVs are random): site A's ESP for site B with
/// duplicates, a packet left of the window, sequence number zero, a
/// forgery and fragments, on both engines; plaintext, a TTL-1 packet, an
/// ARP request, a ping and fragments for site A.
#[test]
#[ignore = "writes fuzz/seeds/pcap_verdicts; run with --ignored to regenerate them"]
fn write_verdict_and_limit_seeds() {
    let text = common::tunnel_config_edited(Algorithm::Aes128Gcm16, "tunnel", false, true, |c| {
        c.limits = LimitsSection {
            neighbors_per_interface: Some(64),
            icmp_errors_per_second: Some(10),
            icmp_burst: Some(3),
            icmp_per_source_ms: Some(0),
            icmp_per_source_burst: Some(2),
            icmp_sources: Some(16),
        };
    });
    write("config", "generated-limits.toml", text.as_bytes());
    let mut a = shipped_gateway("site-a.toml", LinkLayer::Ethernet);
    let a_mac = [0x02, 0, 0, 0, 1, 1];
    let host_a_mac = [0x02, 0, 0, 0, 1, 0x10];
    let to_a = |packet: &[u8]| ethernet(a_mac, host_a_mac, 0x0800, packet);
    let mut esp = Vec::new();
    for i in 0..80u8 {
        let packet = udp_packet(HOST_A, HOST_B, usize::from(i) * 7, i);
        esp.extend(through(&mut a, Port::Inside, &to_a(&packet), Port::Outside));
    }
    let mut big = udp_packet(HOST_A, HOST_B, 1460, 99);
    big[6] = 0;
    ipv4_fix_checksum(&mut big);
    let fragments = through(&mut a, Port::Inside, &to_a(&big), Port::Outside);
    assert!(fragments.len() >= 2);
    let mut frames = esp.clone();
    frames.push(esp[78].clone());
    frames.push(esp[3].clone());
    let mut zero = esp[79].clone();
    zero[14 + 24..14 + 28].copy_from_slice(&[0; 4]);
    frames.push(zero);
    let mut forged = esp[79].clone();
    *forged.last_mut().expect("bytes") ^= 1;
    frames.push(forged);
    frames.extend(fragments.iter().rev().cloned());
    let raw: Vec<Vec<u8>> = frames.iter().map(|f| f[14..].to_vec()).collect();
    for (engine, bit) in [("soft", 0), ("sec", 2)] {
        let snaplen = 65535 & !2 | bit | 1;
        write(
            "pcap_verdicts",
            &format!("b-esp-eth-{engine}"),
            &pcap_snap(DataLink::ETHERNET, snaplen, &frames),
        );
        write(
            "pcap_verdicts",
            &format!("b-esp-raw-{engine}"),
            &pcap_snap(DataLink::IPV4, snaplen, &raw),
        );
    }
    let mut ttl1 = udp_packet(HOST_A, HOST_B, 30, 7);
    ttl1[8] = 1;
    ipv4_fix_checksum(&mut ttl1);
    let mut ping = udp_packet(HOST_A, "192.168.1.1".parse().unwrap(), 0, 0);
    ping[9] = 1;
    ping.truncate(20);
    ping.extend_from_slice(&[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
    ping[2..4].copy_from_slice(&28u16.to_be_bytes());
    ipv4_fix_checksum(&mut ping);
    let inside = vec![
        to_a(&udp_packet(HOST_A, HOST_B, 64, 1)),
        to_a(&ttl1),
        to_a(&ping),
        arp_request(host_a_mac, [192, 168, 1, 10], [192, 168, 1, 1]),
        to_a(&big),
        vec![0xff; 5],
    ];
    for (engine, bit) in [("soft", 0), ("sec", 2)] {
        let snaplen = 65534 & !2 | bit;
        write(
            "pcap_verdicts",
            &format!("a-inside-{engine}"),
            &pcap_snap(DataLink::ETHERNET, snaplen, &inside),
        );
    }
}

/// Reassembly op: a generated fragment (see fuzz_targets/reassembly.rs).
fn frag_op(src: u8, id: u8, offset_units: u16, more: bool, len: u16, step: u8) -> Vec<u8> {
    let word = offset_units | if more { 0x2000 } else { 0 };
    let w = word.to_be_bytes();
    let l = len.to_be_bytes();
    vec![0x00, src | id << 2, 0, w[0], w[1], l[0], l[1], 0, step, 0]
}

/// An Ethernet + IPv4 + TCP/UDP frame as a local sender with checksum
/// offload leaves it: the L4 checksum field holds the pseudo-header sum.
fn partial_l4_frame(protocol: u8, payload: usize) -> Vec<u8> {
    let l4_len = if protocol == 6 { 32 } else { 8 };
    let total = 20 + l4_len + payload;
    let mut ip = vec![0u8; total];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0x4d2u16.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = protocol;
    ip[12..16].copy_from_slice(&HOST_A.octets());
    ip[16..20].copy_from_slice(&HOST_B.octets());
    ipv4_fix_checksum(&mut ip);
    partial_l4(&mut ip, 20, 12..20, protocol);
    ethernet([2, 0, 0, 0, 1, 1], [2, 0, 0, 0, 1, 10], 0x0800, &ip)
}

/// The TCP or UDP header and payload after an IP header of `ip_len`
/// bytes, port 40000 to 5201, as a sender with checksum offload leaves
/// them: the checksum field holds the pseudo-header sum over the
/// addresses at `addresses`, the protocol and the L4 length.
fn partial_l4(ip: &mut [u8], ip_len: usize, addresses: std::ops::Range<usize>, protocol: u8) {
    let l4_len = if protocol == 6 { 32 } else { 8 };
    let l4_total = ip.len() - ip_len;
    let l4 = &mut ip[ip_len..];
    l4[0..2].copy_from_slice(&40000u16.to_be_bytes());
    l4[2..4].copy_from_slice(&5201u16.to_be_bytes());
    if protocol == 6 {
        l4[4..8].copy_from_slice(&1_000_000u32.to_be_bytes());
        l4[12] = 8 << 4;
        l4[13] = 0x18;
    } else {
        l4[4..6].copy_from_slice(&(l4_total as u16).to_be_bytes());
    }
    for (i, b) in l4[l4_len..].iter_mut().enumerate() {
        *b = (i * 13) as u8;
    }
    let mut sum = u32::from(protocol) + l4_total as u32;
    for pair in ip[addresses].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let at = ip_len + if protocol == 6 { 16 } else { 6 };
    ip[at..at + 2].copy_from_slice(&(sum as u16).to_be_bytes());
}

/// [`partial_l4_frame`] over IPv6, 2001:db8:1::10 to 2001:db8:2::20 (the
/// sites' hosts), as Linux leaves it: the L4 checksum field holds the RFC
/// 8200 §8.1 pseudo-header sum, `trailer` bytes of link padding after the
/// datagram.
fn partial_l4_frame6(protocol: u8, payload: usize, trailer: usize) -> Vec<u8> {
    let l4_len = if protocol == 6 { 32 } else { 8 };
    let mut ip = vec![0u8; 40 + l4_len + payload];
    ip[0] = 0x60;
    ip[1..4].copy_from_slice(&[0x0a, 0xbc, 0xde]);
    ip[4..6].copy_from_slice(&((l4_len + payload) as u16).to_be_bytes());
    ip[6] = protocol;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&six_in_four::HOST6_A.octets());
    ip[24..40].copy_from_slice(&six_in_four::HOST6_B.octets());
    partial_l4(&mut ip, 40, 8..40, protocol);
    ip.resize(ip.len() + trailer, 0);
    ethernet([2, 0, 0, 0, 1, 1], [2, 0, 0, 0, 1, 10], 0x86dd, &ip)
}

/// vnet_offload: headers as Linux gave them on veth (x86-64 byte order)
/// before the frames they describe; over IPv6: TSO (`gso_type` 4, TCPv6),
/// UDP GSO (5) and partial checksums (`csum_start` 54, the end of the
/// fixed header), one with link padding after the datagram. Deterministic:
/// [`deterministic_seeds_are_current`] checks the committed ones.
fn vnet_offload_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let seeds: [(&str, u8, [u8; 10], Vec<u8>); 10] = [
        (
            "udp-partial",
            8,
            [1, 0, 0, 0, 0, 0, 0x22, 0, 0x06, 0],
            partial_l4_frame(17, 100),
        ),
        (
            "tcp-syn-partial",
            8,
            [1, 0, 0, 0, 0, 0, 0x22, 0, 0x10, 0],
            partial_l4_frame(6, 0),
        ),
        (
            "tcp-tso",
            16,
            [1, 1, 0x42, 0, 0xa8, 0x05, 0x22, 0, 0x10, 0],
            partial_l4_frame(6, 3 * 1448 + 100),
        ),
        (
            "udp-gso",
            16,
            [1, 5, 0x2a, 0, 0xe8, 0x03, 0x22, 0, 0x06, 0],
            partial_l4_frame(17, 5001),
        ),
        ("complete", 4, [0; 10], partial_l4_frame(17, 20)),
        // hdr_len 86 (14 + 40 + 32), gso_size 1428 (1500 - 40 - 32).
        (
            "tcp6-tso",
            16,
            [1, 4, 0x56, 0, 0x94, 0x05, 0x36, 0, 0x10, 0],
            partial_l4_frame6(6, 3 * 1428 + 100, 0),
        ),
        // hdr_len 62 (14 + 40 + 8), gso_size 1000.
        (
            "udp6-gso",
            16,
            [1, 5, 0x3e, 0, 0xe8, 0x03, 0x36, 0, 0x06, 0],
            partial_l4_frame6(17, 5001, 0),
        ),
        (
            "udp6-partial",
            8,
            [1, 0, 0, 0, 0, 0, 0x36, 0, 0x06, 0],
            partial_l4_frame6(17, 100, 0),
        ),
        (
            "tcp6-partial",
            8,
            [1, 0, 0, 0, 0, 0, 0x36, 0, 0x10, 0],
            partial_l4_frame6(6, 200, 0),
        ),
        (
            "udp6-partial-padded",
            8,
            [1, 0, 0, 0, 0, 0, 0x36, 0, 0x06, 0],
            partial_l4_frame6(17, 4, 6),
        ),
    ];
    seeds
        .into_iter()
        .map(|(name, pool, header, frame)| {
            let mut bytes = vec![pool];
            bytes.extend_from_slice(&header);
            bytes.extend_from_slice(&frame);
            ("vnet_offload", name.to_owned(), bytes)
        })
        .collect()
}

/// What the driver's offload code does with a `vnet_offload` seed is what
/// its name says: a super-packet cut into its segments, a partial checksum
/// completed, a complete frame passed on; every L4 checksum that comes out
/// verifies (smoltcp's check, over IPv4 or IPv6).
fn check_vnet_offload_seed(name: &str, bytes: &[u8]) {
    use dataplane::buffer::MAX_FRAME;
    use drivers::offload::{prepare, OffloadCounters};
    use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, Ipv6Packet};
    use smoltcp::wire::{TcpPacket, UdpPacket};
    let mut pool = PacketPool::new(1 + usize::from(bytes[0] % 128));
    let (header, frame) = bytes[1..].split_at(10);
    let mut buf = pool.alloc().expect("buffer");
    let split = frame.len().min(MAX_FRAME);
    assert!(buf.fill(&frame[..split]));
    let mut out = Vec::new();
    let mut counters = OffloadCounters::default();
    prepare(header, buf, &frame[split..], &mut pool, &mut out, &mut counters);
    assert_eq!(counters.drops_total(), 0, "{name}: {counters:?}");
    let segments = match name {
        "tcp-tso" | "tcp6-tso" => 4,
        "udp-gso" | "udp6-gso" => 6,
        _ => 0,
    };
    let partial = name.contains("partial");
    assert_eq!(
        (counters.gso_segments, counters.csum_completed),
        (segments, u64::from(partial)),
        "{name}"
    );
    for buf in out {
        let eth = EthernetFrame::new_checked(buf.data()).expect("Ethernet");
        let (src, dst, protocol, l4) = match eth.ethertype() {
            EthernetProtocol::Ipv4 => {
                let ip = Ipv4Packet::new_checked(eth.payload()).expect("IPv4");
                let (src, dst) = (IpAddress::Ipv4(ip.src_addr()), IpAddress::Ipv4(ip.dst_addr()));
                (src, dst, ip.next_header(), ip.payload().to_vec())
            }
            _ => {
                let ip = Ipv6Packet::new_checked(eth.payload()).expect("IPv6");
                let (src, dst) = (IpAddress::Ipv6(ip.src_addr()), IpAddress::Ipv6(ip.dst_addr()));
                (src, dst, ip.next_header(), ip.payload().to_vec())
            }
        };
        let ok = match protocol {
            IpProtocol::Tcp => TcpPacket::new_checked(&l4[..])
                .expect("TCP")
                .verify_checksum(&src, &dst),
            _ => UdpPacket::new_checked(&l4[..])
                .expect("UDP")
                .verify_checksum(&src, &dst),
        };
        assert!(ok || name == "complete", "{name}: an L4 checksum is wrong");
        pool.free(buf);
    }
}

fn write_vnet_offload_seeds() {
    for (target, name, bytes) in vnet_offload_seeds() {
        write(target, &name, &bytes);
    }
}

#[test]
#[ignore = "writes fuzz/seeds; run with --ignored to regenerate them"]
fn write_fuzz_seeds() {
    let _ = fs::remove_dir_all(seeds_dir());
    write_vnet_offload_seeds();

    // esp_decap: per proposal, mode and ESN, real ESP from site A, as the
    // bypass sees it (decrypted in place), at a few sizes; also as sent.
    for (index, alg) in Algorithm::ALL.into_iter().enumerate() {
        for (m, mode) in ["tunnel", "transport"].into_iter().enumerate() {
            for (e, esn) in [false, true].into_iter().enumerate() {
                let selector = (index + m * 7 + e * 14) as u8;
                let mut pair = Pair::new(alg, mode, esn);
                for len in [0, 33, 1000] {
                    let (verdict, esp) = pair.encapsulate(&udp_packet(HOST_A, HOST_B, len, 9));
                    assert_eq!(verdict, Verdict::Forward(Port::Outside), "{alg} {mode}");
                    let mut seed = vec![selector];
                    seed.extend_from_slice(&decrypted_in_place(alg, esn, &esp));
                    write("esp_decap", &format!("{alg}-{mode}-esn{e}-{len}"), &seed);
                    if len == 33 {
                        let mut sent = vec![selector];
                        sent.extend_from_slice(&esp);
                        write("esp_decap", &format!("{alg}-{mode}-esn{e}-sealed"), &sent);
                    }
                }
            }
        }
    }

    // gateway_inbound / pcap_input: site A's real output on Ethernet, ARP,
    // pings, plaintext for the inside, fragmented ESP.
    let mut a = shipped_gateway("site-a.toml", LinkLayer::Ethernet);
    let a_mac = [0x02, 0, 0, 0, 1, 1];
    let host_a_mac = [0x02, 0, 0, 0, 1, 0x10];
    let b_in_mac = [0x02, 0, 0, 0, 2, 1];
    let b_out_mac = [0x02, 0, 0, 0, 0, 2];
    let peer_mac = [0x02, 0, 0, 0, 0, 1];
    let mut esp_frames = Vec::new();
    for len in [0, 100, 1400] {
        let packet = udp_packet(HOST_A, HOST_B, len, 3);
        esp_frames.extend(through(
            &mut a,
            Port::Inside,
            &ethernet(a_mac, host_a_mac, 0x0800, &packet),
            Port::Outside,
        ));
    }
    // Too big for the outside MTU once protected, DF clear: fragments.
    let mut big = udp_packet(HOST_A, HOST_B, 1460, 4);
    big[6] = 0;
    ipv4_fix_checksum(&mut big);
    let fragments = through(
        &mut a,
        Port::Inside,
        &ethernet(a_mac, host_a_mac, 0x0800, &big),
        Port::Outside,
    );
    assert!(fragments.len() >= 2, "{} fragments", fragments.len());
    let raw = |frame: &[u8]| frame[14..].to_vec();
    for (i, f) in esp_frames.iter().enumerate() {
        write(
            "gateway_inbound",
            &format!("esp-eth-{i}"),
            &[&[0u8][..], f].concat(),
        );
        write(
            "gateway_inbound",
            &format!("esp-raw-{i}"),
            &[&[0x80u8][..], &raw(f)].concat(),
        );
    }
    let joined = |frames: &[Vec<u8>], strip: bool| -> Vec<u8> {
        let mut out = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"FRAG");
            }
            out.extend_from_slice(if strip { &f[14..] } else { f });
        }
        out
    };
    write(
        "gateway_inbound",
        "fragments-eth",
        &[&[0u8][..], &joined(&fragments, false)].concat(),
    );
    let mut reversed = fragments.clone();
    reversed.reverse();
    write(
        "gateway_inbound",
        "fragments-raw-reversed",
        &[&[0x80u8][..], &joined(&reversed, true)].concat(),
    );
    let mut ping = udp_packet(common::HOST_A, "10.0.0.2".parse().unwrap(), 0, 0);
    ping[9] = 1;
    ping.truncate(20);
    ping.extend_from_slice(&[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
    ping[2..4].copy_from_slice(&28u16.to_be_bytes());
    ping[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ipv4_fix_checksum(&mut ping);
    write(
        "gateway_inbound",
        "ping-outside",
        &[&[0u8][..], &ethernet(b_out_mac, peer_mac, 0x0800, &ping)].concat(),
    );
    write(
        "gateway_inbound",
        "arp-outside",
        &[&[0u8][..], &arp_request(peer_mac, [10, 0, 0, 1], [10, 0, 0, 2])].concat(),
    );
    let plain = udp_packet(HOST_B, HOST_A, 64, 5);
    write(
        "gateway_inbound",
        "plain-inside",
        &[
            &[0x40u8][..],
            &ethernet(b_in_mac, [2, 0, 0, 0, 2, 0x20], 0x0800, &plain),
        ]
        .concat(),
    );
    write(
        "gateway_inbound",
        "plain-inside-raw",
        &[&[0xc0u8][..], &plain].concat(),
    );
    let mut ttl1 = plain.clone();
    ttl1[8] = 1;
    ipv4_fix_checksum(&mut ttl1);
    write(
        "gateway_inbound",
        "ttl1-inside-raw",
        &[&[0xc0u8][..], &ttl1].concat(),
    );
    for (name, frames) in [("esp", &esp_frames), ("fragments", &fragments)] {
        write(
            "pcap_input",
            &format!("{name}-eth"),
            &pcap(DataLink::ETHERNET, frames),
        );
        let raws: Vec<Vec<u8>> = frames.iter().map(|f| raw(f)).collect();
        write("pcap_input", &format!("{name}-raw"), &pcap(DataLink::IPV4, &raws));
    }
    let inside: Vec<Vec<u8>> = [0, 64, 1400]
        .into_iter()
        .map(|n| ethernet(a_mac, host_a_mac, 0x0800, &udp_packet(HOST_A, HOST_B, n, 6)))
        .collect();
    write("pcap_input", "plain-eth", &pcap(DataLink::ETHERNET, &inside));

    // gateway_outbound: packets from site A's hosts.
    for len in [0, 64, 1000, 1472] {
        write(
            "gateway_outbound",
            &format!("udp-{len}"),
            &udp_packet(HOST_A, HOST_B, len, 7),
        );
    }
    write("gateway_outbound", "udp-no-df", &big);
    let mut options = udp_packet(HOST_A, HOST_B, 16, 8);
    options.splice(20..20, [1, 1, 1, 0]);
    options[0] = 0x46;
    let total = options.len() as u16;
    options[2..4].copy_from_slice(&total.to_be_bytes());
    ipv4_fix_checksum(&mut options);
    write("gateway_outbound", "udp-options", &options);
    let mut icmp = ping.clone();
    icmp[12..16].copy_from_slice(&HOST_A.octets());
    icmp[16..20].copy_from_slice(&HOST_B.octets());
    ipv4_fix_checksum(&mut icmp);
    write("gateway_outbound", "icmp", &icmp);

    // esp_trailer: plaintext tails.
    write(
        "esp_trailer",
        "tunnel",
        &[&[0x45u8; 20][..], &[1, 2, 0x02, 4]].concat(),
    );
    write("esp_trailer", "no-padding", &[0x45, 0, 0x00, 4]);
    write("esp_trailer", "dummy", &[1, 2, 3, 3, 59]);

    // reassembly: in order, reversed, overlapping, too large, timeout.
    let ops = |list: &[Vec<u8>]| -> Vec<u8> { [&[8u8][..], &list.concat()].concat() };
    write(
        "reassembly",
        "in-order",
        &ops(&[frag_op(0, 0, 0, true, 64, 1), frag_op(0, 0, 8, false, 30, 1)]),
    );
    write(
        "reassembly",
        "reversed-three",
        &ops(&[
            frag_op(1, 2, 16, false, 5, 0),
            frag_op(1, 2, 8, true, 64, 0),
            frag_op(1, 2, 0, true, 64, 0),
        ]),
    );
    write(
        "reassembly",
        "overlap",
        &ops(&[frag_op(2, 1, 0, true, 64, 0), frag_op(2, 1, 4, false, 64, 0)]),
    );
    write(
        "reassembly",
        "interleaved-timeout",
        &ops(&[
            frag_op(0, 1, 0, true, 1480, 0),
            frag_op(3, 1, 0, true, 8, 0),
            vec![0xfe],
            frag_op(0, 1, 185, false, 100, 0),
            frag_op(3, 1, 1, false, 8, 0),
        ]),
    );
    write(
        "reassembly",
        "too-large",
        &ops(&[
            frag_op(0, 3, 8000, false, 800, 0),
            frag_op(0, 3, 0, true, 8, 0),
            vec![0xff],
        ]),
    );
    let mut raw_ops = vec![4u8];
    for f in &fragments {
        raw_ops.push(0xf0);
        let ip = raw(f);
        raw_ops.push(ip.len().min(255) as u8);
        raw_ops.extend_from_slice(&ip[..ip.len().min(255)]);
    }
    write("reassembly", "raw", &raw_ops);

    // config: the shipped configurations, and generated ones with secrets.
    let configs = repo().join("configs");
    for dir in [configs.clone(), configs.join("algorithms")] {
        for entry in fs::read_dir(&dir).expect("configs") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                write("config", &name, &fs::read(&path).expect("read config"));
            }
        }
    }
    let generated = common::tunnel_config_edited(Algorithm::Aes256Sha256, "transport", true, true, |c| {
        c.tunnels[0] = c.tunnels[0]
            .clone()
            .secret("a fuzzing secret, longer than sixteen bytes");
        let tunnel = &mut c.tunnels[0];
        tunnel.lifetime = Some(LifetimeBuilder {
            soft_packets: Some(1000),
            hard_packets: Some(2000),
            ..LifetimeBuilder::default()
        });
        c.rekey = RekeySection {
            grace_ms: Some(300),
            retransmit_ms: Some(20),
            ..RekeySection::default()
        };
    });
    write("config", "generated-secret.toml", generated.as_bytes());

    // control_request.
    for (name, line) in [
        ("stats", "stats\n"),
        ("sa-list", "sa list"),
        ("sa-show", "sa show a-b\n"),
        ("reload", "reload"),
        ("unknown", "\x1b[2Jsa  delete\tall"),
    ] {
        write("control_request", name, line.as_bytes());
    }

    // rekey_message and control_plane.
    for (target, name, bytes) in keying_seeds() {
        write(target, &name, &bytes);
    }

    // IPv6 through the sites' 6-in-4 tunnel (gateway_outbound, gateway_inbound).
    for (target, name, bytes) in ipv6_tunnel_seeds() {
        write(target, &name, &bytes);
    }

    every_fuzz_target_has_seeds();
}

/// The seeds of the keying exchange's targets, made without randomness.
///
/// `rekey_message`: messages of every kind sealed with the key the target
/// opens with, and field bytes (kind, flags, SPIs, message ID, child, SPI,
/// nonce, then the name) with a short name, the longest and one cut
/// inside a character.
///
/// `control_plane`: operation sequences for its driver (see the target's
/// module doc for the operations), each taking site B through one path:
/// connecting as the initiator then rekeying as either end, connecting as
/// the responder then rekeying as either end, both connecting at once,
/// INIT requests past the half-open bound and replayed, an INIT request
/// carried in raw bytes (the fuzzer cannot seal one) then confirmed,
/// B's INIT unanswered until it gives up and tries again, and the inputs
/// of the target's crashes (`regression-*`). They hold only
/// A's choices: what B chose the driver reads from what B sends, so they
/// stay good when the plane's randomness changes.
fn keying_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use ike_stub::prf::{Side, NONCE_LEN};
    let mut seeds = Vec::new();
    let key = [0x5c; 32];
    let message = |kind, response: bool, from_initiator: bool, id: u32, child: u32, name: &str| Message {
        kind,
        response,
        from_initiator,
        spi_i: [0x11; 8],
        spi_r: if kind == Kind::Init && !response {
            [0; 8]
        } else {
            [0x22; 8]
        },
        message_id: id,
        tunnel: name.into(),
        child,
        spi: 0xc0ff_ee01,
        nonce: [0x5a; NONCE_LEN],
    };
    for (name, sealed) in [
        ("init-request", message(Kind::Init, false, true, 0, 0, "t")),
        ("init-response", message(Kind::Init, true, false, 0, 0, "t")),
        ("rekey-request", message(Kind::Rekey, false, false, 1, 1, "a-b")),
        (
            "switched-response",
            message(Kind::Switched, true, true, 2, 1, "t"),
        ),
    ] {
        seeds.push(("rekey_message", name.to_owned(), sealed.seal(&key)));
    }
    let fields = |kind: u8, flags: u8, name: &[u8]| {
        let mut f = vec![kind, flags];
        f.extend_from_slice(&[0x11; 8]);
        f.extend_from_slice(&[0x22; 8]);
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0xc0, 0xff, 0xee, 0x01]);
        f.extend_from_slice(&[0x5a; NONCE_LEN]);
        f.extend_from_slice(name);
        f
    };
    seeds.push(("rekey_message", "fields".into(), fields(1, 2, b"t")));
    seeds.push((
        "rekey_message",
        "fields-longest-name".into(),
        fields(2, 1, &[b'n'; 64]),
    ));
    let mut cut = vec![b'n'; 63];
    cut.extend_from_slice("é".as_bytes());
    seeds.push(("rekey_message", "fields-name-cut".into(), fields(0, 3, &cut)));

    // control_plane. Operations: 2 sealed under a control SA, 3 time,
    // 4 SA event, 5 reflect, 7 A's INIT, 8 A answers B's INIT, 9 A answers
    // B's request, 10 A's next step, 11 replay.
    let time = |step: u8| vec![3, step];
    let soft_expiry = vec![4, 0];
    let a_init = |spi: u8, nonce: u8| vec![7, spi, nonce, 0xc0, 0xff, 0xee, spi, 0];
    let answer_init = |spi: u8, nonce: u8| vec![8, spi, nonce, 0xc0, 0xff, 0xee, spi, 0];
    let answer = |spi: u8| vec![9, 0xc0, 0xff, 0xee, spi, spi];
    let step = |spi: u8| vec![10, 0xc0, 0xff, 0xee, spi, spi];
    let control_plane = [
        (
            // B connects (its first timeout), A answers and acknowledges
            // B's switch; B rekeys (a soft expiry), then A does.
            "connect-as-initiator",
            [
                time(0),
                answer_init(0x44, 0x55),
                answer(0),
                soft_expiry.clone(),
                answer(0x13),
                answer(0),
                step(0x14),
                step(0),
                time(40),
            ]
            .concat(),
        ),
        (
            // A connects and confirms; A rekeys, then (once the replaced
            // SAs are gone) B does.
            "connect-as-responder",
            [
                a_init(0x21, 0x22),
                step(0),
                step(0x23),
                step(0),
                time(40),
                soft_expiry.clone(),
                answer(0x24),
                answer(0),
                time(40),
            ]
            .concat(),
        ),
        (
            // Both connect at once: B (the higher address) goes on.
            "collision",
            [
                time(0),
                a_init(0x31, 0x32),
                time(1),
                answer_init(0x33, 0x34),
                answer(0),
                time(40),
            ]
            .concat(),
        ),
        (
            // Connected, then more INIT requests than B keeps half-open,
            // replays of them, a rekey under a half-open control SA (op 2)
            // and B's own message reflected.
            "half-open-and-replays",
            [
                a_init(0x41, 0x42),
                step(0),
                a_init(0x43, 0x43),
                a_init(0x44, 0x44),
                a_init(0x45, 0x45),
                a_init(0x46, 0x46),
                a_init(0x47, 0x47),
                vec![11, 0, 11, 5, 11, 6],
                vec![2, 0xc0, 0, 1, 0xc0, 0xff, 0xee, 0x48, 0x48],
                vec![5],
                time(100),
                time(200),
            ]
            .concat(),
        ),
        (
            // B's INIT goes unanswered until it gives up, tries again
            // (after `retry_after`) and is reflected.
            "give-up-and-retry",
            [
                time(0),
                vec![5],
                time(10),
                time(100),
                time(100),
                time(100),
                vec![5],
                answer_init(0x51, 0x52),
            ]
            .concat(),
        ),
        (
            // A peer's inbound SPI in the reserved range (0): the plane
            // issued an outbound SA every gateway refuses, and switched to
            // it (ike-stub's tests/fuzz_regressions.rs).
            "regression-reserved-spi",
            [vec![7, 0x4a, 0x4a, 0, 0, 0, 0, 0], step(0)].concat(),
        ),
    ];
    for (name, ops) in control_plane {
        seeds.push(("control_plane", name.to_owned(), ops));
    }
    // A's INIT request as raw bytes, an IPv4/UDP packet (operation 0) and a
    // UDP payload (operation 1), confirmed by A's next step.
    let init_key =
        TunnelSecrets::derive(b"a fuzzing secret, longer than sixteen bytes", "t").init_key(Side::Low);
    let mut request = message(Kind::Init, false, true, 0, 0, "t");
    request.spi_i = [0x61; 8];
    let request = request.seal(&init_key[..]);
    let packet = common::udp_packet("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), 0, 0);
    let mut raw_request = packet[..28].to_vec();
    // From and to IKE's port: other ports would take it for a NAT-T
    // tunnel's message without the non-ESP marker.
    raw_request[20..24].copy_from_slice(&[0x01, 0xf4, 0x01, 0xf4]);
    raw_request.extend_from_slice(&request);
    let total = raw_request.len() as u16;
    raw_request[2..4].copy_from_slice(&total.to_be_bytes());
    raw_request[24..26].copy_from_slice(&(total - 20).to_be_bytes());
    ipv4_fix_checksum(&mut raw_request);
    let mut raw_op = vec![0u8, raw_request.len() as u8];
    raw_op.extend_from_slice(&raw_request);
    raw_op.extend_from_slice(&step(0));
    seeds.push(("control_plane", "raw-request".into(), raw_op));
    let mut payload_op = vec![1u8, request.len() as u8];
    payload_op.extend_from_slice(&request);
    payload_op.extend_from_slice(&step(0));
    seeds.push(("control_plane", "payload-request".into(), payload_op));
    seeds
}

/// Writes the seeds of [`keying_seeds`] alone (also written by
/// `write_fuzz_seeds`' run), leaving every other seed as it is.
#[test]
#[ignore = "writes fuzz/seeds/{rekey_message,control_plane}; run with --ignored to regenerate them"]
fn write_keying_seeds() {
    for target in ["rekey_message", "control_plane"] {
        let _ = fs::remove_dir_all(seeds_dir().join(target));
    }
    for (target, name, bytes) in keying_seeds() {
        write(target, &name, &bytes);
    }
}

/// The shared engine's requests (`shared_request`): one of each message,
/// a burst with data, and ring entries, written by the protocol's own
/// encoders. Run with `--ignored` (also written by `write_seeds`' run).
#[test]
#[ignore]
fn write_shared_request_seeds() {
    use accel::shared::wire::{self, op, RequestEntry, Transport, REQUEST_LEN};
    let mut m = Vec::new();
    wire::attach(&mut m, Transport::Shm, 256, 2464);
    write("shared_request", "attach-shm", &m);
    m.clear();
    wire::attach(&mut m, Transport::Socket, 64, 8448);
    write("shared_request", "attach-socket", &m);
    m.clear();
    wire::register(&mut m, Algorithm::Aes128Sha1, true, &[0x11; 16], &[0x22; 20]);
    write("shared_request", "register", &m);
    m.clear();
    wire::release(
        &mut m,
        accel::SessionHandle {
            index: 3,
            generation: 2,
        },
        17,
    );
    write("shared_request", "release", &m);
    write("shared_request", "stats", &[op::STATS]);
    write("shared_request", "detach", &[op::DETACH]);
    let entry = |payload: usize, data_offset: u32| RequestEntry {
        user: 5,
        session: accel::SessionHandle {
            index: 0,
            generation: 1,
        },
        desc: Descriptor {
            kind: DescriptorKind::SinglePass,
            direction: Direction::Encrypt,
            auth_only: Region::new(0, 8),
            esn_high: Some(1),
            iv: Region::new(8, 16),
            cipher: Region::new(24, payload),
            icv: Region::new(24 + payload, 12),
            status: Status::Pending,
        },
        data_offset,
        data_len: (36 + payload) as u32,
    };
    wire::start_burst(&mut m, op::SUBMIT);
    for payload in [16usize, 64] {
        let at = m.len();
        m.resize(at + REQUEST_LEN, 0);
        entry(payload, 0).encode(&mut m[at..]);
        m.extend((0..36 + payload).map(|i| i as u8));
    }
    wire::set_count(&mut m, 2);
    write("shared_request", "submit-burst", &m);
    let mut raw = [0u8; REQUEST_LEN];
    entry(1400, 8192).encode(&mut raw);
    write("shared_request", "ring-entry", &raw);
}

/// Seeds of `udp_encap_inbound`: site A's UDP-encapsulated ESP for B (AES-GCM
/// and ChaCha20-Poly1305, ESN off and on, small and fragmented), a
/// keepalive, IKE behind the non-ESP marker, the same ESP from another
/// address and port (a NAT's new mapping), and raw ESP to the UDP SA. Run
/// with `--ignored`.
#[test]
#[ignore = "writes fuzz/seeds/udp_encap_inbound; run with --ignored to regenerate them"]
fn write_udp_encap_seeds() {
    let udp = |src: [u8; 4], sport: u16, payload: &[u8]| -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&4500u16.to_be_bytes());
        p[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        ipv4_fix_checksum(&mut p);
        p
    };
    for (selector, alg, esn) in [
        (0u8, Algorithm::Aes128Gcm16, false),
        (1, Algorithm::ChaCha20Poly1305, false),
        (2, Algorithm::Aes128Gcm16, true),
    ] {
        // A small outside MTU, so that a large packet leaves in fragments.
        let mut a_config = common::tunnel_builder(alg, "tunnel", esn, true);
        a_config.tunnels[0].encap = Some(ike_stub::builder::Encap::Udp);
        common::interface(&mut a_config, "outside").mtu = Some(1000);
        let mut a = common::gateway_from(&a_config.to_toml());
        let mut frames = Vec::new();
        for len in [0, 100, 900] {
            frames.extend(through(
                &mut a,
                Port::Inside,
                &udp_packet(HOST_A, HOST_B, len, 3),
                Port::Outside,
            ));
        }
        assert!(frames.iter().all(|f| f[9] == 17), "ESP in UDP");
        let mut big = udp_packet(HOST_A, HOST_B, 1400, 4);
        big[6] = 0;
        ipv4_fix_checksum(&mut big);
        let fragments = through(&mut a, Port::Inside, &big, Port::Outside);
        let joined = |frames: &[Vec<u8>]| frames.join(&b"FRAG"[..]);
        write(
            "udp_encap_inbound",
            &format!("esp-{selector}"),
            &[&[selector][..], &joined(&frames)].concat(),
        );
        if fragments.len() > 1 {
            write(
                "udp_encap_inbound",
                &format!("fragments-{selector}"),
                &[&[selector][..], &joined(&fragments)].concat(),
            );
        }
        // The NAT's new mapping: the same packets from 10.0.0.99:40001.
        let moved: Vec<Vec<u8>> = frames
            .iter()
            .map(|f| {
                let mut f = f.clone();
                f[12..16].copy_from_slice(&[10, 0, 0, 99]);
                f[20..22].copy_from_slice(&40001u16.to_be_bytes());
                ipv4_fix_checksum(&mut f);
                f
            })
            .collect();
        write(
            "udp_encap_inbound",
            &format!("moved-{selector}"),
            &[&[selector][..], &joined(&moved)].concat(),
        );
        // Raw ESP to the UDP SA: the UDP header cut out.
        let mut raw = [&frames[1][..20], &frames[1][28..]].concat();
        raw[9] = 50;
        let len = raw.len() as u16;
        raw[2..4].copy_from_slice(&len.to_be_bytes());
        ipv4_fix_checksum(&mut raw);
        write(
            "udp_encap_inbound",
            &format!("raw-esp-{selector}"),
            &[&[selector][..], &raw].concat(),
        );
    }
    let keepalive = udp([10, 0, 0, 1], 4500, &[0xff]);
    let ike = udp(
        [10, 0, 0, 1],
        4500,
        &[0, 0, 0, 0, b'E', b'S', b'P', b'G', 1, 2, 3, 4],
    );
    write(
        "udp_encap_inbound",
        "keepalive-ike",
        &[&[0u8][..], &[keepalive, ike].join(&b"FRAG"[..])].concat(),
    );
}

/// Seeds of `ipv6_headers` (first byte: bit 0 set when an Ethernet header
/// comes first): an echo request, a neighbour solicitation bare and in its
/// Ethernet frame, and a fragment of UDP behind hop-by-hop, routing and
/// destination-options headers, built with smoltcp's wire types. Run with
/// `--ignored`.
#[test]
#[ignore = "writes fuzz/seeds/ipv6_headers; run with --ignored to regenerate them"]
fn write_ipv6_headers_seeds() {
    use smoltcp::wire::{Icmpv6Repr, IpProtocol, Ipv6Packet, Ipv6Repr, NdiscRepr, RawHardwareAddress};
    use std::net::Ipv6Addr;
    let host = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x10);
    let gw = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
    let packet = common::icmpv6_packet;
    let data = [0x5a; 16];
    let echo = packet(
        host,
        gw,
        64,
        &Icmpv6Repr::EchoRequest {
            ident: 1,
            seq_no: 1,
            data: &data,
        },
    );
    write("ipv6_headers", "echo", &[&[0u8][..], &echo].concat());
    let group = dataplane::icmp6::solicited_node(gw);
    let ns = packet(
        host,
        group,
        255,
        &Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
            target_addr: gw,
            lladdr: Some(RawHardwareAddress::from_bytes(&[2, 0, 0, 0, 2, 0x10])),
        }),
    );
    write("ipv6_headers", "ns", &[&[0u8][..], &ns].concat());
    let frame = ethernet(
        dataplane::icmp6::multicast_mac(group).0,
        [2, 0, 0, 0, 2, 0x10],
        0x86dd,
        &ns,
    );
    write("ipv6_headers", "ns-link", &[&[1u8][..], &frame].concat());
    // Hop-by-hop (PadN), routing (type 0 segments left 0), destination
    // options (PadN), fragment (offset 0, more), then UDP.
    let mut chain = vec![
        43, 0, 1, 4, 0, 0, 0, 0, // hop-by-hop -> routing
        60, 0, 0, 0, 0, 0, 0, 0, // routing -> destination options
        44, 0, 1, 4, 0, 0, 0, 0, // destination options -> fragment
        17, 0, 0, 1, 0, 0, 0, 9, // fragment -> UDP
    ];
    chain.extend_from_slice(&[0x12, 0x34, 0x00, 0x35, 0x00, 0x0c, 0, 0, 1, 2, 3, 4]);
    let mut udp = vec![0u8; 40];
    Ipv6Repr {
        src_addr: host,
        dst_addr: gw,
        next_header: IpProtocol::HopByHop,
        payload_len: chain.len(),
        hop_limit: 64,
    }
    .emit(&mut Ipv6Packet::new_unchecked(&mut udp[..]));
    udp.extend_from_slice(&chain);
    write(
        "ipv6_headers",
        "udp-fragment-behind-extensions",
        &[&[0u8][..], &udp].concat(),
    );
    // What RFC 8200 §4.2 and §4.4 have a node refuse, in front of ESP:
    // unrecognised options whose bits say discard (0x5e), discard and
    // answer (0x9e, 0xde), and a routing header of an unknown type with a
    // segment left.
    for (name, first, header) in [
        ("dest-option-discard", 60u8, [50u8, 0, 0x5e, 2, 0, 0, 1, 0]),
        ("hop-option-problem", 0, [50, 0, 0x9e, 2, 0, 0, 1, 0]),
        ("dest-option-problem", 60, [50, 0, 0xde, 4, 0, 0, 0, 0]),
        ("routing-segments-left", 43, [50, 0, 253, 1, 0, 0, 0, 0]),
    ] {
        let esp = [0x00, 0x00, 0x10, 0x01, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd];
        let mut p = vec![0u8; 40];
        Ipv6Repr {
            src_addr: host,
            dst_addr: gw,
            next_header: IpProtocol::from(first),
            payload_len: header.len() + esp.len(),
            hop_limit: 64,
        }
        .emit(&mut Ipv6Packet::new_unchecked(&mut p[..]));
        p.extend_from_slice(&header);
        p.extend_from_slice(&esp);
        write("ipv6_headers", name, &[&[0u8][..], &p].concat());
    }
}

// IPv6 over the IPv4 tunnel (6-in-4): the sites as the gateway targets
// build them, with `a-b-v6` (fuzz/fuzz_targets/six_in_four.rs, shared).
#[path = "../../fuzz/fuzz_targets/six_in_four.rs"]
mod six_in_four;

/// Site A (`a`) or site B as `gateway_outbound` and `gateway_inbound`
/// build it (`common::site` in fuzz/fuzz_targets/common.rs): the shipped
/// file with [`six_in_four::with_ipv6`].
fn site6_config(a: bool) -> Config {
    let name = if a { "site-a.toml" } else { "site-b.toml" };
    let path = repo().join("configs").join(name);
    let text = fs::read_to_string(&path).expect("shipped config");
    Config::parse(&path, &six_in_four::with_ipv6(&text, a)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn built(config: &Config, link: LinkLayer) -> dataplane::Gateway {
    common::soft_gateway(config, config.setup(link, accel::Style::Async))
}

/// What `gw` does with `frame` arriving on `from`: every output and its
/// verdict. `pool` is the gateway's for good (it may hold a buffer, a
/// fragment, until a later frame).
fn outcome(
    gw: &mut dataplane::Gateway,
    pool: &mut PacketPool,
    from: Port,
    frame: &[u8],
) -> Vec<(Verdict, Vec<u8>)> {
    let mut buf = pool.alloc().expect("buffer");
    assert!(buf.fill(frame));
    let mut out = Vec::new();
    for (buf, verdict) in drivers::drive::handle_frame(gw, Duration::ZERO, from, buf, pool) {
        out.push((verdict, buf.data().to_vec()));
        pool.free(buf);
    }
    out
}

/// A bare IPv6 packet: the fixed header (flow label set) and `upper`.
fn ipv6_packet(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, next_header: u8, upper: &[u8]) -> Vec<u8> {
    use smoltcp::wire::{IpProtocol, Ipv6Packet, Ipv6Repr};
    let mut p = vec![0u8; 40];
    Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::from(next_header),
        payload_len: upper.len(),
        hop_limit,
    }
    .emit(&mut Ipv6Packet::new_unchecked(&mut p[..]));
    Ipv6Packet::new_unchecked(&mut p[..]).set_flow_label(0x12345);
    p.extend_from_slice(upper);
    p
}

/// An IPv6/UDP packet with `payload_len` bytes of payload, its checksum
/// right (IPv6 requires one).
fn udp6_packet(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, payload_len: usize, seed: u8) -> Vec<u8> {
    use smoltcp::wire::{IpAddress, UdpPacket};
    let mut udp = vec![0u8; 8 + payload_len];
    for (i, b) in udp[8..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_add(seed);
    }
    {
        let mut u = UdpPacket::new_unchecked(&mut udp[..]);
        u.set_src_port(4000);
        u.set_dst_port(5000);
        u.set_len((8 + payload_len) as u16);
        u.fill_checksum(&IpAddress::Ipv6(src), &IpAddress::Ipv6(dst));
    }
    ipv6_packet(src, dst, hop_limit, 17, &udp)
}

/// A TCPv6 SYN, checksum right.
fn tcp6_syn(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    use smoltcp::wire::{IpAddress, TcpPacket, TcpSeqNumber};
    let mut tcp = vec![0u8; 20];
    {
        let mut t = TcpPacket::new_unchecked(&mut tcp[..]);
        t.set_src_port(40000);
        t.set_dst_port(5201);
        t.set_seq_number(TcpSeqNumber(1_000_000));
        t.set_header_len(20);
        t.set_syn(true);
        t.set_window_len(64240);
        t.fill_checksum(&IpAddress::Ipv6(src), &IpAddress::Ipv6(dst));
    }
    ipv6_packet(src, dst, 64, 6, &tcp)
}

/// `packet` (IPv6/UDP) as the first fragment of a larger datagram: a
/// fragment header (offset 0, more fragments) between the fixed header
/// and UDP.
fn first_fragment6(packet: &[u8]) -> Vec<u8> {
    let mut p = packet[..40].to_vec();
    p[6] = 44;
    p.extend_from_slice(&[17, 0, 0x00, 0x01, 0x12, 0x34, 0x56, 0x78]);
    p.extend_from_slice(&packet[40..]);
    let payload = (p.len() - 40) as u16;
    p[4..6].copy_from_slice(&payload.to_be_bytes());
    p
}

fn echo6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    common::icmpv6_packet(
        src,
        dst,
        hop_limit,
        &smoltcp::wire::Icmpv6Repr::EchoRequest {
            ident: 0x77,
            seq_no: 1,
            data: &[0xa5; 24],
        },
    )
}

/// A neighbour solicitation for `target` from `src` (with its link-layer
/// option, unless `src` is unspecified: a DAD probe), to the target's
/// solicited-node group.
fn ns6(src: Ipv6Addr, target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    use smoltcp::wire::{Icmpv6Repr, NdiscRepr, RawHardwareAddress};
    let lladdr = (!src.is_unspecified()).then(|| RawHardwareAddress::from_bytes(&mac));
    let ns = NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr,
    };
    let group = dataplane::icmp6::solicited_node(target);
    common::icmpv6_packet(src, group, 255, &Icmpv6Repr::Ndisc(ns))
}

/// A neighbour advertisement of `src` (its own address, with its
/// link-layer option) to `dst`: solicited to a unicast address, else
/// unsolicited.
fn na6(src: Ipv6Addr, dst: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    use smoltcp::wire::{Icmpv6Repr, NdiscNeighborFlags, NdiscRepr, RawHardwareAddress};
    let flags = if dst.is_multicast() {
        NdiscNeighborFlags::OVERRIDE
    } else {
        NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE
    };
    let na = NdiscRepr::NeighborAdvert {
        flags,
        target_addr: src,
        lladdr: Some(RawHardwareAddress::from_bytes(&mac)),
    };
    common::icmpv6_packet(src, dst, 255, &Icmpv6Repr::Ndisc(na))
}

/// The Ethernet destination of an IPv6 packet to `dst`: its group's MAC,
/// or `unicast`.
fn mac6(dst: Ipv6Addr, unicast: [u8; 6]) -> [u8; 6] {
    if dst.is_multicast() {
        dataplane::icmp6::multicast_mac(dst).0
    } else {
        unicast
    }
}

/// Seeds of IPv6 through the sites' 6-in-4 tunnel `a-b-v6`, each checked
/// to do what its name says on the gateways the targets build:
/// - `gateway_outbound` (bare packets from site A's hosts): UDP across
///   the tunnel at sizes up to the tunnel's IPv6 MTU (1446), with link
///   padding, behind a fragment header, TCP, echo across and to the
///   gateway; hop limit 1 (time exceeded) and 2 (runs out at B), a
///   link-local source and destination, no policy, too big for the tunnel
///   (packet too big); a solicitation for the gateway's address6 and a DAD
///   probe, advertisements solicited and not.
/// - `gateway_inbound` (site B; first byte as the target reads it): site
///   A's ESP with IPv6 inside on Ethernet and raw IP, a run with a
///   replayed packet, an echo, a packet whose hop limit runs out at B, the
///   outer fragments of a 1280-byte packet through a 1300-byte link (A's
///   outside MTU lowered: the same SAs), plaintext IPv6 from the outside;
///   from B's hosts, neighbour discovery and echo for B's address6 then
///   traffic for the tunnel, and the router's checks.
///
/// Deterministic (AES-GCM's IV is the sequence number, outer IDs count
/// from 1 on a fresh gateway): [`deterministic_seeds_are_current`] checks
/// the committed ones.
fn ipv6_tunnel_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use six_in_four::{GW6_A, GW6_B, HOST6_A, HOST6_B};
    use DropReason as D;
    let mut seeds: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let a_mac = [0x02, 0, 0, 0, 1, 1];
    let host_a_mac = [0x02, 0, 0, 0, 1, 0x10];
    let b_in_mac = [0x02, 0, 0, 0, 2, 1];
    let b_out_mac = [0x02, 0, 0, 0, 0, 2];
    let host_b_mac = [0x02, 0, 0, 0, 2, 0x20];
    let peer_mac = [0x02, 0, 0, 0, 0, 1];
    let link_local = |n: u16| Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, n);
    let elsewhere = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1);
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let joined = |frames: &[Vec<u8>]| frames.join(&b"FRAG"[..]);

    // gateway_outbound: what each does at A (raw IP, as the target runs it).
    enum Expect {
        /// Encapsulated for B, which delivers it to its inside.
        Crosses,
        /// Encapsulated; its hop limit runs out at B, which drops it (the
        /// decapsulation path sends no time exceeded, for IPv4 neither).
        Expires,
        /// Answered by A to its inside.
        Answered,
        Consumed,
        Dropped(DropReason),
    }
    let mut padded = udp6_packet(HOST6_A, HOST6_B, 64, 30, 5);
    padded.extend_from_slice(&[0; 12]);
    let outbound: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("udp6-0", udp6_packet(HOST6_A, HOST6_B, 64, 0, 1), Expect::Crosses),
        (
            "udp6-64",
            udp6_packet(HOST6_A, HOST6_B, 64, 64, 2),
            Expect::Crosses,
        ),
        (
            "udp6-1000",
            udp6_packet(HOST6_A, HOST6_B, 64, 1000, 3),
            Expect::Crosses,
        ),
        // 1446 bytes: the largest the tunnel takes whole.
        (
            "udp6-1398",
            udp6_packet(HOST6_A, HOST6_B, 64, 1398, 4),
            Expect::Crosses,
        ),
        ("udp6-padded", padded, Expect::Crosses),
        (
            "udp6-fragment-header",
            first_fragment6(&udp6_packet(HOST6_A, HOST6_B, 64, 64, 6)),
            Expect::Crosses,
        ),
        ("tcp6-syn", tcp6_syn(HOST6_A, HOST6_B), Expect::Crosses),
        ("echo6-across", echo6(HOST6_A, HOST6_B, 64), Expect::Crosses),
        ("echo6-gateway", echo6(HOST6_A, GW6_A, 64), Expect::Answered),
        (
            "udp6-hop-limit-1",
            udp6_packet(HOST6_A, HOST6_B, 1, 20, 7),
            Expect::Answered,
        ),
        (
            "udp6-hop-limit-2",
            udp6_packet(HOST6_A, HOST6_B, 2, 20, 8),
            Expect::Expires,
        ),
        (
            "udp6-link-local-source",
            udp6_packet(link_local(0x10), HOST6_B, 64, 20, 9),
            Expect::Dropped(D::NoRoute),
        ),
        (
            "udp6-link-local-destination",
            udp6_packet(HOST6_A, link_local(0x20), 64, 20, 10),
            Expect::Dropped(D::NoRoute),
        ),
        (
            "udp6-no-policy",
            udp6_packet(HOST6_A, elsewhere, 64, 20, 11),
            Expect::Dropped(D::NoPolicy),
        ),
        // 1500 bytes: fits the inside link, not the tunnel.
        (
            "udp6-too-big",
            udp6_packet(HOST6_A, HOST6_B, 64, 1452, 12),
            Expect::Answered,
        ),
        ("ns6-gateway", ns6(HOST6_A, GW6_A, host_a_mac), Expect::Answered),
        // Defended: an advertisement to all nodes (RFC 4861 §7.2.4).
        (
            "ns6-dad",
            ns6(Ipv6Addr::UNSPECIFIED, GW6_A, host_a_mac),
            Expect::Answered,
        ),
        ("na6-solicited", na6(HOST6_A, GW6_A, host_a_mac), Expect::Consumed),
        (
            "na6-unsolicited",
            na6(HOST6_A, all_nodes, host_a_mac),
            Expect::Consumed,
        ),
    ];
    for (name, packet, expect) in outbound {
        let mut a = built(&site6_config(true), LinkLayer::RawIp);
        let mut b = built(&site6_config(false), LinkLayer::RawIp);
        let mut pool = PacketPool::new(64);
        let out = outcome(&mut a, &mut pool, Port::Inside, &packet);
        let verdicts: Vec<Verdict> = out.iter().map(|(v, _)| *v).collect();
        match expect {
            Expect::Crosses | Expect::Expires => {
                assert_eq!(verdicts, [Verdict::Forward(Port::Outside)], "{name}");
                let at_b = outcome(&mut b, &mut pool, Port::Outside, &out[0].1);
                let at_b: Vec<Verdict> = at_b.iter().map(|(v, _)| *v).collect();
                // A packet that expires at B gets its time exceeded back
                // through the tunnel (RFC 4443 §3.3).
                let want = match expect {
                    Expect::Crosses => Verdict::Forward(Port::Inside),
                    _ => Verdict::Forward(Port::Outside),
                };
                assert_eq!(at_b, [want], "{name} at B");
            }
            Expect::Answered => assert_eq!(verdicts, [Verdict::Forward(Port::Inside)], "{name}"),
            Expect::Consumed => assert_eq!(verdicts, [Verdict::Consumed], "{name}"),
            Expect::Dropped(reason) => assert_eq!(verdicts, [Verdict::Drop(reason)], "{name}"),
        }
        seeds.push(("gateway_outbound", name.to_owned(), packet));
    }

    // gateway_inbound: site A's real 6-in-4 output (Ethernet).
    let mut a = built(&site6_config(true), LinkLayer::Ethernet);
    let to_a = |packet: &[u8]| ethernet(a_mac, host_a_mac, 0x86dd, packet);
    let mut esp = Vec::new();
    for (len, seed) in [(0, 1), (100, 2), (1200, 3)] {
        let sent = through(
            &mut a,
            Port::Inside,
            &to_a(&udp6_packet(HOST6_A, HOST6_B, 64, len, seed)),
            Port::Outside,
        );
        assert_eq!(sent.len(), 1, "6-in-4 of {len} bytes");
        esp.push(sent.into_iter().next().expect("one frame"));
    }
    let echo = through(
        &mut a,
        Port::Inside,
        &to_a(&echo6(HOST6_A, HOST6_B, 64)),
        Port::Outside,
    );
    let expiring = through(
        &mut a,
        Port::Inside,
        &to_a(&udp6_packet(HOST6_A, HOST6_B, 2, 20, 4)),
        Port::Outside,
    );
    assert_eq!((echo.len(), expiring.len()), (1, 1));
    let mut narrow_config = site6_config(true);
    narrow_config.outside.mtu = 1300;
    let mut narrow = built(&narrow_config, LinkLayer::Ethernet);
    let fragments = through(
        &mut narrow,
        Port::Inside,
        &to_a(&udp6_packet(HOST6_A, HOST6_B, 64, 1280 - 48, 5)),
        Port::Outside,
    );
    assert_eq!(fragments.len(), 2, "a 1280-byte packet through a 1300-byte link");
    let raw = |frame: &Vec<u8>| frame[14..].to_vec();
    let mut inbound: Vec<(String, u8, Vec<Vec<u8>>)> = Vec::new();
    for (i, f) in esp.iter().enumerate() {
        inbound.push((format!("esp6-eth-{i}"), 0x00, vec![f.clone()]));
        inbound.push((format!("esp6-raw-{i}"), 0x80, vec![raw(f)]));
    }
    inbound.push((
        "esp6-replayed-eth".into(),
        0x00,
        vec![esp[0].clone(), esp[2].clone(), esp[1].clone(), esp[2].clone()],
    ));
    inbound.push(("esp6-echo-eth".into(), 0x00, echo));
    inbound.push(("esp6-hop-limit-1-eth".into(), 0x00, expiring));
    inbound.push(("fragments6-eth".into(), 0x00, fragments.clone()));
    inbound.push((
        "fragments6-raw-reversed".into(),
        0x80,
        fragments.iter().rev().map(raw).collect(),
    ));
    let plain = ethernet(
        b_out_mac,
        peer_mac,
        0x86dd,
        &udp6_packet(HOST6_A, HOST6_B, 64, 20, 6),
    );
    inbound.push(("plain6-outside".into(), 0x00, vec![plain]));
    // From B's hosts (Ethernet inside): resolve B, ping it, then traffic.
    let to_b = |packet: Vec<u8>| {
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&packet[24..40]).expect("16 bytes"));
        ethernet(mac6(dst, b_in_mac), host_b_mac, 0x86dd, &packet)
    };
    inbound.push((
        "ndp6-then-tunnel-inside".into(),
        0x40,
        vec![
            to_b(ns6(HOST6_B, GW6_B, host_b_mac)),
            to_b(echo6(HOST6_B, GW6_B, 64)),
            to_b(na6(HOST6_B, all_nodes, host_b_mac)),
            to_b(udp6_packet(HOST6_B, HOST6_A, 64, 100, 7)),
            to_b(tcp6_syn(HOST6_B, HOST6_A)),
        ],
    ));
    inbound.push((
        "dad6-inside".into(),
        0x40,
        vec![to_b(ns6(Ipv6Addr::UNSPECIFIED, GW6_B, host_b_mac))],
    ));
    inbound.push((
        "udp6-inside-raw".into(),
        0xc0,
        vec![udp6_packet(HOST6_B, HOST6_A, 64, 64, 8)],
    ));
    inbound.push((
        "hop-limit-1-inside-raw".into(),
        0xc0,
        vec![udp6_packet(HOST6_B, HOST6_A, 1, 20, 9)],
    ));
    inbound.push((
        "too-big-inside".into(),
        0x40,
        vec![to_b(udp6_packet(HOST6_B, HOST6_A, 64, 1452, 10))],
    ));
    inbound.push((
        "link-local-inside".into(),
        0x40,
        vec![to_b(udp6_packet(link_local(0x20), HOST6_A, 64, 20, 11))],
    ));
    // Each as the target runs it: what B does with every frame.
    for (name, selector, frames) in inbound {
        let link = if selector & 0x80 != 0 {
            LinkLayer::RawIp
        } else {
            LinkLayer::Ethernet
        };
        let port = if selector & 0x40 != 0 {
            Port::Inside
        } else {
            Port::Outside
        };
        let mut b = built(&site6_config(false), link);
        let mut pool = PacketPool::new(64);
        let mut verdicts = Vec::new();
        for frame in &frames {
            verdicts.extend(
                outcome(&mut b, &mut pool, port, frame)
                    .into_iter()
                    .map(|(v, _)| v),
            );
        }
        let expected: Vec<Verdict> = match name.as_str() {
            n if n.starts_with("esp6-eth") || n.starts_with("esp6-raw") || n == "esp6-echo-eth" => {
                vec![Verdict::Forward(Port::Inside)]
            }
            "esp6-replayed-eth" => vec![
                Verdict::Forward(Port::Inside),
                Verdict::Forward(Port::Inside),
                Verdict::Forward(Port::Inside),
                Verdict::Drop(D::ReplayDuplicate),
            ],
            // Dropped without a time exceeded (as IPv4 is after decapsulation).
            "esp6-hop-limit-1-eth" => vec![Verdict::Forward(Port::Outside)],
            // Each fragment consumed, the reassembled packet delivered.
            "fragments6-eth" | "fragments6-raw-reversed" => vec![
                Verdict::Consumed,
                Verdict::Consumed,
                Verdict::Forward(Port::Inside),
            ],
            "plain6-outside" => vec![Verdict::Drop(D::Unsupported)],
            "ndp6-then-tunnel-inside" => vec![
                Verdict::Forward(Port::Inside),
                Verdict::Forward(Port::Inside),
                Verdict::Consumed,
                Verdict::Forward(Port::Outside),
                Verdict::Forward(Port::Outside),
            ],
            "dad6-inside" => vec![Verdict::Forward(Port::Inside)],
            "udp6-inside-raw" => vec![Verdict::Forward(Port::Outside)],
            "hop-limit-1-inside-raw" | "too-big-inside" => vec![Verdict::Forward(Port::Inside)],
            "link-local-inside" => vec![Verdict::Drop(D::NoRoute)],
            other => unreachable!("{other}"),
        };
        assert_eq!(verdicts, expected, "gateway_inbound seed {name}");
        seeds.push((
            "gateway_inbound",
            name,
            [&[selector][..], &joined(&frames)].concat(),
        ));
    }
    seeds
}

/// The committed seeds made without randomness ([`vnet_offload_seeds`],
/// [`ipv6_tunnel_seeds`], [`keying_seeds`]) are what their generators make
/// from the code as it is now; regenerate them, alone, with the generator
/// the failure names.
#[test]
fn deterministic_seeds_are_current() {
    for (_, name, bytes) in vnet_offload_seeds() {
        check_vnet_offload_seed(&name, &bytes);
    }
    let generated = vnet_offload_seeds()
        .into_iter()
        .chain(ipv6_tunnel_seeds())
        .map(|seed| ("write_ipv6_tunnel_seeds", seed))
        .chain(
            keying_seeds()
                .into_iter()
                .map(|seed| ("write_keying_seeds", seed)),
        );
    for (generator, (target, name, bytes)) in generated {
        let path = seeds_dir().join(target).join(&name);
        let committed = fs::read(&path).unwrap_or_default();
        assert!(
            committed == bytes,
            "{} is not what the generator makes now; regenerate with \
             `cargo test -p espgw-lib-tests --test fuzz_seeds {generator} -- --ignored`",
            path.display()
        );
    }
}

/// Writes the seeds of [`vnet_offload_seeds`] and [`ipv6_tunnel_seeds`]
/// alone (also written by `write_fuzz_seeds`' run), leaving every other
/// seed as it is.
#[test]
#[ignore = "writes fuzz/seeds/{gateway_outbound,gateway_inbound,vnet_offload} IPv6 seeds; run with --ignored"]
fn write_ipv6_tunnel_seeds() {
    write_vnet_offload_seeds();
    for (target, name, bytes) in ipv6_tunnel_seeds() {
        write(target, &name, &bytes);
    }
}
