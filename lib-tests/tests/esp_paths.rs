//! The ESP data path end to end: two gateways back to back in memory, every
//! algorithm and mode, and every way an inbound packet can be wrong.

mod common;

use accel::Algorithm;
use common::*;
use dataplane::{DropReason, Port, Verdict};
use ike_stub::builder::{LifetimeBuilder, PolicyBuilder};
use spd_sad::{IpPrefix, Ipv4Prefix, PolicyDirection, SaDirection};

const MODES: [&str; 2] = ["tunnel", "transport"];

/// A → B for one packet; asserts B forwards exactly the original (two hops).
fn assert_round_trip(pair: &mut Pair, packet: &[u8]) -> Vec<u8> {
    let (verdict, esp) = pair.encapsulate(packet);
    assert_eq!(verdict, Verdict::Forward(Port::Outside), "A must encapsulate");
    let (verdict, inner) = pair.decapsulate(&esp);
    assert_eq!(verdict, Verdict::Forward(Port::Inside), "B must decapsulate");
    assert_eq!(inner, after_hops(packet, 2));
    esp
}

#[test]
fn every_algorithm_mode_and_size_round_trips() {
    for alg in Algorithm::ALL {
        for mode in MODES {
            let mut pair = Pair::new(alg, mode, false);
            for payload in (0..=1472).step_by(if alg == Algorithm::TripleDesSha1 { 7 } else { 1 }) {
                let packet = udp_packet(HOST_A, HOST_B, payload, payload as u8);
                let esp = assert_round_trip(&mut pair, &packet);
                // Both modes keep a 20-byte IP header in front of ESP.
                let cipher_len = esp.len() - 20 - 8 - alg.iv_len() - alg.icv_len();
                let protected = if mode == "tunnel" {
                    packet.len()
                } else {
                    packet.len() - 20
                };
                let pad = cipher_len - 2 - protected;
                assert_eq!(
                    cipher_len % alg.pad_align(),
                    0,
                    "{alg} {mode} {payload}: whole blocks"
                );
                assert!(pad < alg.pad_align(), "{alg} {mode} {payload}: minimal padding");
            }
            assert!(pair.a.stats().balanced() && pair.b.stats().balanced());
            assert_eq!(pair.b.stats().drops.total(), 0);
        }
    }
}

#[test]
fn outer_header_and_sequence_numbers_are_right() {
    let mut pair = Pair::new(Algorithm::Aes128Gcm16, "tunnel", false);
    for expected_seq in 1u32..=3 {
        let mut packet = udp_packet(HOST_A, HOST_B, 100, 1);
        if expected_seq == 3 {
            // DF clear on the inner header: clear on the outer header too.
            packet[6] = 0;
            let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut packet[..]);
            ip.fill_checksum();
        }
        let (_, esp) = pair.encapsulate(&packet);
        let outer = smoltcp::wire::Ipv4Packet::new_checked(&esp[..]).unwrap();
        assert!(outer.verify_checksum());
        assert_eq!(usize::from(outer.total_len()), esp.len());
        assert_eq!(outer.src_addr().to_string(), "10.0.0.1");
        assert_eq!(outer.dst_addr().to_string(), "10.0.0.2");
        assert_eq!(u8::from(outer.next_header()), 50);
        assert_eq!(outer.dont_frag(), expected_seq != 3);
        assert_eq!(&esp[20..24], &0x1001u32.to_be_bytes());
        assert_eq!(&esp[24..28], &expected_seq.to_be_bytes());
        // RFC 4106 §3.1: the GCM IV is the 64-bit sequence number.
        assert_eq!(&esp[28..36], &u64::from(expected_seq).to_be_bytes());
    }
}

#[test]
fn cbc_ivs_are_random() {
    let mut pair = Pair::new(Algorithm::Aes128Sha1, "tunnel", false);
    let packet = udp_packet(HOST_A, HOST_B, 64, 1);
    let ivs: Vec<Vec<u8>> = (0..16)
        .map(|_| pair.encapsulate(&packet).1[28..44].to_vec())
        .collect();
    for (i, iv) in ivs.iter().enumerate() {
        assert!(ivs[..i].iter().all(|other| other != iv), "IVs repeat");
    }
}

#[test]
fn replays_are_dropped_and_reordering_within_the_window_accepted() {
    for esn in [false, true] {
        let mut pair = Pair::new(Algorithm::Aes128Sha1, "tunnel", esn);
        let packets: Vec<Vec<u8>> = (0..100)
            .map(|i| pair.encapsulate(&udp_packet(HOST_A, HOST_B, 40, i as u8)).1)
            .collect();
        // Deliver 99 first, then the rest in reverse: 36..=98 fit the
        // 64-packet window, older ones do not.
        assert_eq!(pair.decapsulate(&packets[99]).0, Verdict::Forward(Port::Inside));
        for (i, esp) in packets.iter().enumerate().take(99).rev() {
            let verdict = pair.decapsulate(esp).0;
            if i >= 36 {
                assert_eq!(verdict, Verdict::Forward(Port::Inside), "seq {}", i + 1);
            } else if esn {
                // RFC 4303 A2.2: with ESN a low value left of the window is
                // read as the next 2^32 subspace, whose ICV cannot verify.
                assert_eq!(dropped(verdict), Some(DropReason::AuthFailed), "seq {}", i + 1);
            } else {
                assert_eq!(dropped(verdict), Some(DropReason::ReplayTooOld), "seq {}", i + 1);
            }
        }
        // Every accepted packet again: duplicates.
        for esp in &packets[36..] {
            assert_eq!(
                dropped(pair.decapsulate(esp).0),
                Some(DropReason::ReplayDuplicate)
            );
        }
        let too_old = if esn {
            DropReason::AuthFailed
        } else {
            DropReason::ReplayTooOld
        };
        assert_eq!(pair.b.stats().drops.get(too_old), 36);
        assert_eq!(pair.b.stats().drops.get(DropReason::ReplayDuplicate), 64);
        assert_eq!(
            pair.b.stats().drops.get(DropReason::ReplayTooOld),
            if esn { 0 } else { 36 }
        );
        assert_eq!(pair.b.stats().decapsulated, 64);
    }
}

/// Sets A's outbound counter and B's inbound window so the next packets
/// cross `seq`.
fn start_near(pair: &mut Pair, seq: u64) {
    let out = pair.a.sad().find("t-out").unwrap();
    pair.a.sad_mut().get_mut(out).unwrap().set_last_sequence(seq);
    let inbound = pair.b.sad().find("t-in").unwrap();
    pair.b.sad_mut().get_mut(inbound).unwrap().set_replay_top(seq);
}

#[test]
fn esn_crosses_two_to_the_32_for_every_algorithm() {
    for alg in Algorithm::ALL {
        let mut pair = Pair::new(alg, "tunnel", true);
        start_near(&mut pair, u64::from(u32::MAX) - 3);
        let mut wire = Vec::new();
        for i in 0..8 {
            wire.push(assert_round_trip(&mut pair, &udp_packet(HOST_A, HOST_B, 50, i)));
        }
        let sa = pair
            .b
            .sad()
            .find("t-in")
            .and_then(|id| pair.b.sad().get(id))
            .unwrap();
        assert_eq!(sa.replay_window().top(), (1 << 32) + 4);
        // Only the low 32 bits travel: the fourth packet (2^32) carries 0.
        assert_eq!(&wire[3][24..28], &0u32.to_be_bytes());
        // A replay across the wrap is still a replay.
        assert_eq!(
            dropped(pair.decapsulate(&wire[2]).0),
            Some(DropReason::ReplayDuplicate)
        );
        assert_eq!(
            dropped(pair.decapsulate(&wire[6]).0),
            Some(DropReason::ReplayDuplicate)
        );
    }
}

#[test]
fn without_esn_the_sa_stops_before_the_counter_wraps() {
    let mut pair = Pair::new(Algorithm::Aes128Gcm16, "tunnel", false);
    start_near(&mut pair, u64::from(u32::MAX) - 1);
    assert_round_trip(&mut pair, &udp_packet(HOST_A, HOST_B, 10, 0));
    let (verdict, _) = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 10, 1));
    assert_eq!(dropped(verdict), Some(DropReason::SeqOverflow));
    assert_eq!(
        pair.a.poll_event(),
        Some(spd_sad::SaEvent::HardExpired(pair.a.sad().find("t-out").unwrap()))
    );
    let (verdict, _) = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 10, 2));
    assert_eq!(dropped(verdict), Some(DropReason::SeqOverflow), "stays exhausted");
    assert_eq!(pair.a.stats().drops.get(DropReason::SeqOverflow), 2);
}

#[test]
fn tampering_anywhere_is_caught() {
    for alg in Algorithm::ALL.into_iter().filter(|a| *a != Algorithm::Null) {
        let mut pair = Pair::new(alg, "tunnel", false);
        let esp = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 77, 3)).1;
        for byte in 20..esp.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = esp.clone();
                bad[byte] ^= bit;
                let reason = dropped(pair.decapsulate(&bad).0);
                let expected = match byte {
                    20..=23 => DropReason::UnknownSpi,
                    _ => DropReason::AuthFailed,
                };
                // A flipped sequence number can also look replayed or be
                // read as far ahead; either way it must not be accepted.
                if (24..28).contains(&byte) {
                    assert!(
                        matches!(reason, Some(r) if r == DropReason::AuthFailed || r.is_replay()),
                        "{alg} byte {byte}: {reason:?}"
                    );
                } else {
                    assert_eq!(reason, Some(expected), "{alg} byte {byte} bit {bit:#x}");
                }
            }
        }
        // The untouched packet still verifies: failures did not move the window.
        assert_eq!(pair.decapsulate(&esp).0, Verdict::Forward(Port::Inside));
        assert_eq!(pair.b.stats().decapsulated, 1);
    }
}

#[test]
fn truncation_at_every_length_is_dropped_without_panic() {
    for alg in Algorithm::ALL {
        let mut pair = Pair::new(alg, "tunnel", false);
        let esp = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 120, 9)).1;
        for len in 0..esp.len() {
            let mut cut = esp[..len].to_vec();
            // Keep the IP header consistent so the ESP checks are reached.
            if len >= 20 {
                let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut cut[..]);
                ip.set_total_len(len as u16);
                ip.fill_checksum();
            }
            let reason = dropped(pair.decapsulate(&cut).0);
            assert!(reason.is_some(), "{alg}: truncated to {len} bytes was accepted");
            if len >= 28 && alg != Algorithm::Null {
                assert!(
                    matches!(reason, Some(DropReason::Malformed | DropReason::AuthFailed)),
                    "{alg} len {len}: {reason:?}"
                );
            }
        }
        assert!(pair.b.stats().balanced());
    }
}

/// Re-signs a null-sha1 ESP packet after its plaintext trailer was edited.
fn resign_null_sha1(esp: &mut [u8], auth_key_seed: u8) {
    let key = hex::decode(key_hex(20, auth_key_seed + 100)).unwrap();
    let session = accel::Session::new(Algorithm::NullSha1, &[], &key).unwrap();
    let body = esp.len() - 20 - 8 - 12;
    let mut desc = accel::Descriptor {
        kind: accel::DescriptorKind::MacOnly,
        direction: accel::Direction::Encrypt,
        auth_only: accel::Region::new(0, 8),
        esn_high: None,
        iv: accel::Region::new(8, 0),
        cipher: accel::Region::new(8, body),
        icv: accel::Region::new(8 + body, 12),
        status: accel::Status::Pending,
    };
    accel::primitive::process(&session, &mut desc, &mut esp[20..]);
    assert_eq!(desc.status, accel::Status::Done);
}

#[test]
fn bad_padding_and_next_header_are_malformed_even_when_authentic() {
    let mut pair = Pair::new(Algorithm::NullSha1, "tunnel", false);
    // 41 bytes of payload + 28 of headers = 69; 69 + 2 = 71 → 1 pad byte to 72.
    let packet = udp_packet(HOST_A, HOST_B, 41, 5);
    let esp = pair.encapsulate(&packet).1;
    let trailer = esp.len() - 12 - 3;
    assert_eq!(
        &esp[trailer..trailer + 3],
        &[1, 1, 4],
        "pad 1, pad length 1, next header 4"
    );
    assert_eq!(pair.decapsulate(&esp).0, Verdict::Forward(Port::Inside));
    let cases: [(&str, usize, u8, DropReason); 3] = [
        ("padding byte", trailer, 7, DropReason::Malformed),
        ("pad length", trailer + 1, 200, DropReason::Malformed),
        ("next header", trailer + 2, 41, DropReason::Malformed),
    ];
    for (what, at, value, expected) in cases {
        // A fresh packet each time: an authentic packet uses up its sequence number.
        let mut bad = pair.encapsulate(&packet).1;
        bad[at] = value;
        resign_null_sha1(&mut bad, 1);
        assert_eq!(dropped(pair.decapsulate(&bad).0), Some(expected), "{what}");
    }
    // Next header 59 marks a dummy packet: authenticated, then consumed quietly.
    let mut dummy = pair.encapsulate(&packet).1;
    dummy[trailer + 2] = 59;
    resign_null_sha1(&mut dummy, 1);
    assert_eq!(pair.decapsulate(&dummy).0, Verdict::Consumed);
    assert_eq!(pair.b.stats().dummy_packets, 1);
}

#[test]
fn inbound_policy_is_enforced_after_decapsulation() {
    let mut pair = Pair::new(Algorithm::Aes128Gcm16, "tunnel", false);
    // Plaintext from the peer's protected network must have come through ESP.
    let plain = udp_packet(HOST_B, HOST_A, 10, 0);
    let (verdict, _) = common::run(&mut pair.a, &mut pair.pool, pair.now, Port::Outside, &plain);
    assert_eq!(dropped(verdict), Some(DropReason::PolicyMismatch));

    // A peer whose outbound policy is wider than our inbound SA allows:
    // the inner packet is authentic but not allowed through that SA.
    let mut wide = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, true);
    wide.tunnels[0].remote_subnet = Some(Ipv4Prefix::ANY.into());
    wide.routes[0].destination = Ipv4Prefix::ANY.into();
    let mut wide_a = gateway_from(&wide.to_toml());
    let stray = udp_packet(HOST_A, "172.16.0.1".parse().unwrap(), 10, 0);
    let (verdict, esp) = common::run(&mut wide_a, &mut pair.pool, pair.now, Port::Inside, &stray);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_eq!(
        dropped(pair.decapsulate(&esp).0),
        Some(DropReason::PolicyMismatch)
    );
    let sa = pair.b.sad().get(pair.b.sad().find("t-in").unwrap()).unwrap();
    assert_eq!(sa.counters().get(DropReason::PolicyMismatch), 1);
}

#[test]
fn outbound_policy_routing_and_ttl() {
    let net = |text: &str| Some(text.parse::<IpPrefix>().expect("a prefix"));
    let no_telnet = PolicyBuilder {
        name: "no-telnet".into(),
        direction: PolicyDirection::Out,
        priority: Some(5),
        source: None,
        destination: net("192.168.2.0/24"),
        protocol: Some("tcp".into()),
        source_ports: None,
        destination_ports: Some("23".into()),
        action: "discard".into(),
        sa: None,
    };
    let clear_dns = PolicyBuilder {
        name: "clear-dns".into(),
        direction: PolicyDirection::Out,
        priority: Some(6),
        source: None,
        destination: net("192.168.3.0/24"),
        protocol: Some("udp".into()),
        source_ports: None,
        destination_ports: Some("5000".into()),
        action: "bypass".into(),
        sa: None,
    };
    let mut pair = Pair::edited(Algorithm::Aes128Gcm16, "tunnel", false, |c| {
        c.policies.extend([no_telnet.clone(), clear_dns.clone()]);
    });
    let mut telnet = udp_packet(HOST_A, HOST_B, 10, 0);
    telnet[9] = 6;
    telnet[22..24].copy_from_slice(&23u16.to_be_bytes());
    let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut telnet[..]);
    ip.fill_checksum();
    assert_eq!(
        dropped(pair.encapsulate(&telnet).0),
        Some(DropReason::PolicyDiscard)
    );
    // Nothing matches traffic to 10.9.9.9: the default is discard.
    let stray = udp_packet(HOST_A, "10.9.9.9".parse().unwrap(), 10, 0);
    assert_eq!(dropped(pair.encapsulate(&stray).0), Some(DropReason::NoPolicy));
    // Bypassed, but there is no route to 192.168.3.0/24.
    let clear = udp_packet(HOST_A, "192.168.3.3".parse().unwrap(), 10, 0);
    assert_eq!(dropped(pair.encapsulate(&clear).0), Some(DropReason::NoRoute));
    // TTL 1 cannot be forwarded.
    let ttl1 = {
        let mut p = udp_packet(HOST_A, HOST_B, 10, 0);
        let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut p[..]);
        ip.set_hop_limit(1);
        ip.fill_checksum();
        p
    };
    // TTL 1 cannot be forwarded: the packet is dropped and an ICMP
    // time-exceeded goes back to its source from the inside address.
    let (verdict, icmp) = pair.encapsulate(&ttl1);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let reply = smoltcp::wire::Ipv4Packet::new_checked(&icmp[..]).unwrap();
    assert!(reply.verify_checksum());
    assert_eq!(reply.src_addr().to_string(), "192.168.1.1");
    assert_eq!(reply.dst_addr(), HOST_A);
    assert_eq!(u8::from(reply.next_header()), 1);
    assert_eq!(icmp[20], 11, "time exceeded");
    assert_eq!(&icmp[28..48], &ttl1[..20], "quotes the original header");
    let stats = pair.a.stats();
    assert_eq!(stats.drops.get(DropReason::TtlExpired), 1);
    assert_eq!(stats.drops.total(), 4);
    assert_eq!(stats.generated, 1);
    assert!(stats.balanced());
}

/// A port may also be written as a bare integer (`destination_ports =
/// 23`), which means what the text `"23"` the builder writes means. The
/// integer is put in the builder's text by hand: which form the parser
/// takes is the point.
#[test]
fn a_port_written_as_an_integer_selects_like_its_text() {
    let built = tunnel_edited(Algorithm::Aes128Gcm16, "tunnel", false, true, |c| {
        c.policies.push(PolicyBuilder {
            name: "no-telnet".into(),
            direction: PolicyDirection::Out,
            priority: Some(5),
            source: None,
            destination: None,
            protocol: Some("tcp".into()),
            source_ports: None,
            destination_ports: Some("23".into()),
            action: "discard".into(),
            sa: None,
        });
    });
    let text = built.to_toml();
    let integer = text.replace("destination_ports = \"23\"", "destination_ports = 23");
    assert_ne!(integer, text, "the builder writes ports as text");
    let policy = |text: &str| {
        let config = ike_stub::Config::parse(std::path::Path::new("ports.toml"), text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        config
            .policies
            .into_iter()
            .find(|p| p.name == "no-telnet")
            .expect("the policy")
    };
    assert_eq!(policy(&integer), policy(&text));
}

#[test]
fn hard_lifetime_stops_the_sa() {
    let mut pair = Pair::edited(Algorithm::Aes256Sha256, "tunnel", false, |c| {
        c.tunnels[0].lifetime = Some(LifetimeBuilder {
            soft_packets: Some(3),
            hard_packets: Some(5),
            ..LifetimeBuilder::default()
        });
    });
    for i in 0..5 {
        assert_round_trip(&mut pair, &udp_packet(HOST_A, HOST_B, 10, i));
    }
    let out = pair.a.sad().find("t-out").unwrap();
    assert_eq!(pair.a.poll_event(), Some(spd_sad::SaEvent::SoftExpired(out)));
    assert_eq!(pair.a.poll_event(), Some(spd_sad::SaEvent::HardExpired(out)));
    assert_eq!(
        dropped(pair.encapsulate(&udp_packet(HOST_A, HOST_B, 10, 9)).0),
        Some(DropReason::SaExpired)
    );
    let inbound = pair.b.sad().get(pair.b.sad().find("t-in").unwrap()).unwrap();
    assert_eq!(inbound.params().direction, SaDirection::Inbound);
    assert_eq!(inbound.counters().packets, 5);
}

#[test]
fn wrong_keys_and_unknown_spis_are_refused() {
    let mut pair = Pair::new(Algorithm::Aes128Sha1, "tunnel", false);
    // B configured with A's SPIs but other keys.
    let mut other = tunnel_builder(Algorithm::Aes128Sha1, "tunnel", false, false);
    other.tunnels[0].auth_key_in = Some(key(20, 55));
    let mut wrong_b = gateway_from(&other.to_toml());
    let esp = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 30, 0)).1;
    let (verdict, _) = common::run(&mut wrong_b, &mut pair.pool, pair.now, Port::Outside, &esp);
    assert_eq!(dropped(verdict), Some(DropReason::AuthFailed));
    let mut unknown = esp.clone();
    unknown[20..24].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    assert_eq!(
        dropped(pair.decapsulate(&unknown).0),
        Some(DropReason::UnknownSpi)
    );
}

/// Next header 59 marks a dummy packet, which the peer discards: a packet
/// of IP protocol 59 cannot travel in transport mode and is refused.
#[test]
fn transport_mode_refuses_protocol_59() {
    let mut pair = Pair::new(Algorithm::Aes128Gcm16, "transport", false);
    let mut packet = udp_packet(HOST_A, HOST_B, 32, 9);
    {
        let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut packet[..]);
        ip.set_next_header(smoltcp::wire::IpProtocol::from(59));
        ip.fill_checksum();
    }
    assert_eq!(
        dropped(pair.encapsulate(&packet).0),
        Some(DropReason::Unsupported)
    );
    let mut tunnel = Pair::new(Algorithm::Aes128Gcm16, "tunnel", false);
    let (verdict, esp) = tunnel.encapsulate(&packet);
    assert_eq!(
        verdict,
        Verdict::Forward(Port::Outside),
        "tunnel mode carries it (next header 4)"
    );
    assert_eq!(tunnel.decapsulate(&esp).0, Verdict::Forward(Port::Inside));
}

/// How the manual inbound SA `m-in` of [`manual_inbound`] gets its
/// selectors.
#[derive(Clone, Copy)]
enum Selected {
    /// Neither a policy nor `selectors`: the parser refuses it.
    Nothing,
    /// `selectors = "any"`.
    Any,
    /// An inbound `protect` policy from this source network to site B.
    ByPolicyFrom(&'static str),
}

/// Site B's configuration without its tunnel, plus an inbound manual SA
/// `m-in` for what site A's tunnel sends (SPI 0x1001, A's outbound keys),
/// selected as `selected` says.
fn manual_inbound(alg: Algorithm, selected: Selected) -> String {
    let ends = (
        std::net::Ipv4Addr::new(10, 0, 0, 2),
        std::net::Ipv4Addr::new(10, 0, 0, 1),
    );
    let mut sa = ike_stub::builder::SaBuilder::new("m-in", SaDirection::Inbound, 0x1001, ends, alg);
    sa.enc_key = Some(key(alg.enc_key_len(), 1));
    let network = |text: &str| -> Ipv4Prefix { text.parse().unwrap() };
    tunnel_edited(alg, "tunnel", false, false, |c| {
        c.tunnels.clear();
        match selected {
            Selected::Nothing => {}
            Selected::Any => sa.selectors = Some("any".to_owned()),
            Selected::ByPolicyFrom(source) => c.policies.push(PolicyBuilder::protect(
                "m-in",
                PolicyDirection::In,
                (network(source), network("192.168.2.0/24")),
                "m-in",
            )),
        }
        c.sas.push(sa);
    })
    .to_toml()
}

/// Inner sources of the packets [`send_from_anywhere`] sends.
const SOURCES: [&str; 7] = [
    "192.168.1.10",
    "192.168.1.77",
    "10.9.9.9",
    "172.16.0.1",
    "8.8.8.8",
    "192.168.3.3",
    "192.168.2.99",
];

/// Site A with a tunnel that sends anything from anywhere through its SA.
fn wide_sender(alg: Algorithm) -> dataplane::Gateway {
    let mut wide = tunnel_builder(alg, "tunnel", false, true);
    wide.tunnels[0].local_subnet = Some(Ipv4Prefix::ANY.into());
    wide.tunnels[0].remote_subnet = Some(Ipv4Prefix::ANY.into());
    gateway_from(&wide.to_toml())
}

/// 14 ESP packets from `a`: each of [`SOURCES`] to two hosts behind B,
/// with the inner source of each.
fn send_from_anywhere(a: &mut dataplane::Gateway) -> Vec<(std::net::Ipv4Addr, Vec<u8>)> {
    let mut pool = dataplane::PacketPool::new(8);
    let mut frames = Vec::new();
    for (i, src) in SOURCES.iter().enumerate() {
        let src = src.parse().unwrap();
        for dst in ["192.168.2.20", "192.168.2.5"] {
            let packet = udp_packet(src, dst.parse().unwrap(), 40, i as u8);
            let (verdict, esp) = run(a, &mut pool, std::time::Duration::ZERO, Port::Inside, &packet);
            assert_eq!(verdict, Verdict::Forward(Port::Outside), "A sends {src} -> {dst}");
            frames.push((src, esp));
        }
    }
    frames
}

/// B's verdict on each frame.
fn receive(b: &mut dataplane::Gateway, frames: &[(std::net::Ipv4Addr, Vec<u8>)]) -> Vec<Verdict> {
    let mut pool = dataplane::PacketPool::new(8);
    frames
        .iter()
        .map(|(_, esp)| run(b, &mut pool, std::time::Duration::ZERO, Port::Outside, esp).0)
        .collect()
}

/// Asserts that exactly the frames whose inner source `admitted` were
/// forwarded and the rest dropped as policy mismatches.
fn assert_admitted(
    frames: &[(std::net::Ipv4Addr, Vec<u8>)],
    verdicts: &[Verdict],
    admitted: impl Fn(std::net::Ipv4Addr) -> bool,
) {
    assert_eq!(frames.len(), verdicts.len());
    for ((src, _), verdict) in frames.iter().zip(verdicts) {
        let expected = if admitted(*src) {
            Verdict::Forward(Port::Inside)
        } else {
            Verdict::Drop(DropReason::PolicyMismatch)
        };
        assert_eq!(*verdict, expected, "inner source {src}");
    }
}

fn in_prefix(prefix: &str) -> impl Fn(std::net::Ipv4Addr) -> bool {
    let prefix: spd_sad::Ipv4Prefix = prefix.parse().unwrap();
    move |addr| prefix.contains(addr)
}

/// RFC 4301 §5.2 for a manually keyed inbound SA: without a policy the
/// configuration is refused; with `selectors = "any"` every authentic
/// inner packet gets through (and `warnings` says so); with a policy
/// only what it selects does, the rest counted as `policy_mismatch`.
#[test]
fn an_inbound_sa_admits_only_what_its_policy_selects() {
    let alg = Algorithm::Aes128Gcm16;
    let mut a = wide_sender(alg);

    // No policy and no `selectors`: refused where the SA is defined.
    let bare = manual_inbound(alg, Selected::Nothing);
    let err = ike_stub::Config::parse(std::path::Path::new("test.toml"), &bare).unwrap_err();
    let line = bare.lines().position(|l| l == "name = \"m-in\"").unwrap() + 1;
    assert_eq!((err.line, err.column), (line, 8), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "test.toml:{line}:8: inbound SA `m-in` is named by no inbound `protect` policy"
        )),
        "{err}"
    );

    // Explicitly any: all 14 through, and a warning.
    let any = manual_inbound(alg, Selected::Any);
    let config = ike_stub::Config::parse(std::path::Path::new("test.toml"), &any).unwrap();
    assert!(config
        .warnings()
        .iter()
        .any(|w| w.contains("`m-in` has selectors = \"any\"")));
    let mut b = gateway_from(&any);
    let frames = send_from_anywhere(&mut a);
    assert_admitted(&frames, &receive(&mut b, &frames), |_| true);
    assert_eq!(b.stats().decapsulated, 14);

    // With a policy: what it selects through, the rest policy_mismatch.
    let mut b = gateway_from(&manual_inbound(alg, Selected::ByPolicyFrom("192.168.1.0/24")));
    let frames = send_from_anywhere(&mut a);
    assert_admitted(&frames, &receive(&mut b, &frames), in_prefix("192.168.1.0/24"));
    let sa = b.sad().get(b.sad().find("m-in").unwrap()).unwrap();
    assert_eq!(sa.counters().get(DropReason::PolicyMismatch), 10);
    assert_eq!(b.stats().drops.get(DropReason::PolicyMismatch), 10);
    assert!(b.stats().balanced());
}

/// Reloads as `espgw run` does them (the file read again, then handed to
/// the control plane): one with a policy-less SA is refused and the
/// running SA keeps filtering; one that changes only the policy narrows or
/// widens the running SA in place, its sequence state and counters kept.
#[test]
fn reloads_keep_inbound_sas_selected() {
    let alg = Algorithm::Aes128Gcm16;
    let dir = std::env::temp_dir().join(format!("espgw-reload-selectors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("b.toml");
    std::fs::write(
        &path,
        manual_inbound(alg, Selected::ByPolicyFrom("192.168.1.0/24")),
    )
    .unwrap();
    let config = ike_stub::Config::load(&path).unwrap();
    let mut b = soft_gateway(
        &config,
        config.setup(dataplane::LinkLayer::RawIp, accel::Style::Async),
    );
    let mut plane = ike_stub::ControlPlane::new(config.clone());
    let mut a = wide_sender(alg);
    let frames = send_from_anywhere(&mut a);
    assert_admitted(&frames, &receive(&mut b, &frames), in_prefix("192.168.1.0/24"));

    // The file loses its policy: the reload stops at reading it.
    let bare = manual_inbound(alg, Selected::Nothing);
    std::fs::write(&path, &bare).unwrap();
    let err = ike_stub::Config::load(&path).unwrap_err();
    let line = bare.lines().position(|l| l == "name = \"m-in\"").unwrap() + 1;
    assert!(
        err.to_string().starts_with(&format!(
            "{}:{line}:8: inbound SA `m-in` is named by no",
            path.display()
        )),
        "{err}"
    );
    // A configuration built around the file's checks is refused too.
    let mut unselected = config.clone();
    unselected.policies.clear();
    for sa in &mut unselected.sas {
        sa.params.selectors.clear();
    }
    assert_eq!(
        plane.reload(unselected),
        Err(ike_stub::ReloadError::UnselectedSa("m-in".into()))
    );
    assert_eq!(plane.counters().reloads_rejected, 1);
    let mut commands = Vec::new();
    plane.take_commands(&mut commands);
    assert!(commands.is_empty(), "{commands:?}");
    // The old configuration is still in force.
    let frames = send_from_anywhere(&mut a);
    assert_admitted(&frames, &receive(&mut b, &frames), in_prefix("192.168.1.0/24"));
    let packets = |b: &dataplane::Gateway| {
        b.sad()
            .get(b.sad().find("m-in").unwrap())
            .unwrap()
            .counters()
            .packets
    };
    // Authenticated packets count, admitted or not.
    assert_eq!(packets(&b), 28);

    // Only the policy changes: the running SA takes its selectors.
    let wider = manual_inbound(alg, Selected::ByPolicyFrom("192.168.0.0/16"));
    std::fs::write(&path, wider).unwrap();
    let report = plane.reload(ike_stub::Config::load(&path).unwrap()).unwrap();
    assert_eq!(
        report.manual_changes, 3,
        "policy out, selectors changed, policy in"
    );
    let mut commands = Vec::new();
    plane.take_commands(&mut commands);
    assert!(
        commands
            .iter()
            .any(|c| matches!(c, dataplane::command::SaCommand::SetSelectors { sa, .. } if sa == "m-in")),
        "{commands:?}"
    );
    assert!(
        !commands.iter().any(|c| matches!(
            c,
            dataplane::command::SaCommand::RemoveSa(_) | dataplane::command::SaCommand::InstallSa(_)
        )),
        "{commands:?}"
    );
    for command in &commands {
        b.apply(command, std::time::Duration::ZERO).unwrap();
    }
    let frames = send_from_anywhere(&mut a);
    assert_admitted(&frames, &receive(&mut b, &frames), in_prefix("192.168.0.0/16"));
    assert_eq!(packets(&b), 42, "the SA kept its counters");

    // And to `any`, explicitly.
    std::fs::write(&path, manual_inbound(alg, Selected::Any)).unwrap();
    let config = ike_stub::Config::load(&path).unwrap();
    assert_eq!(
        config.warnings().len(),
        1 + usize::from(config.exposed_keys_warning().is_some())
    );
    let _ = plane.reload(config).unwrap();
    drop(service(&mut plane, std::time::Duration::ZERO, &mut b, []));
    let frames = send_from_anywhere(&mut a);
    assert_admitted(&frames, &receive(&mut b, &frames), |_| true);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// ESP in UDP (RFC 3948) and its UDP checksum: zero (none computed, as
/// espgw and Linux send it over IPv4) and right ones are accepted, a wrong
/// non-zero one is dropped as `udp_checksum` (RFC 1122 §4.1.3.4; it used to
/// be accepted), and frames whose checksum the kernel left to finish
/// (`NEEDS_CSUM`, completed by the driver) or already verified
/// (`DATA_VALID`) are not dropped whatever their field held.
#[test]
fn esp_in_udp_checksums_are_verified_unless_none_or_the_kernel_did() {
    use dataplane::wire::checksum;
    use dataplane::wire::vnet::{Gso, VnetRepr};
    use smoltcp::wire::{IpAddress, UdpPacket};

    let mut pair = Pair::edited(Algorithm::Aes128Gcm16, "tunnel", false, |c| {
        c.tunnels[0].encap = Some(ike_stub::builder::Encap::Udp);
    });
    let (a, b) = (IpAddress::v4(10, 0, 0, 1), IpAddress::v4(10, 0, 0, 2));
    let with_checksum = |mut p: Vec<u8>| {
        UdpPacket::new_unchecked(&mut p[20..]).fill_checksum(&a, &b);
        assert_ne!(&p[26..28], &[0, 0]);
        p
    };
    let wrong = |mut p: Vec<u8>| {
        p[27] ^= 0x40;
        p
    };
    let frames = [
        esp_in_udp(&mut pair),
        with_checksum(esp_in_udp(&mut pair)),
        wrong(with_checksum(esp_in_udp(&mut pair))),
    ];
    let verdicts: Vec<Verdict> = frames.iter().map(|f| pair.decapsulate(f).0).collect();
    assert_eq!(verdicts[..2], [Verdict::Forward(Port::Inside); 2]);
    assert_eq!(
        dropped(verdicts[2]).map(DropReason::name),
        Some("udp_checksum"),
        "a wrong checksum is not ignored"
    );

    let complete = VnetRepr {
        partial_csum: None,
        data_valid: false,
        gso: Gso::None,
        gso_ecn: false,
        gso_size: 0,
        hdr_len: 0,
    };
    // DATA_VALID: the kernel vouched for it, whatever the field says.
    let verified = VnetRepr {
        data_valid: true,
        ..complete
    };
    let packet = wrong(with_checksum(esp_in_udp(&mut pair)));
    assert_eq!(
        through_driver(&mut pair, &packet, verified),
        Verdict::Forward(Port::Inside)
    );
    // NEEDS_CSUM: the field holds the pseudo-header sum, the rest is the
    // driver's to add (RFC 1071 from csum_start).
    let mut partial = esp_in_udp(&mut pair);
    let sum = checksum::pseudo_header_sum(&partial[..20], 17, partial.len() - 20);
    partial[26..28].copy_from_slice(&(!checksum::fold(sum)).to_be_bytes());
    let needs = VnetRepr {
        partial_csum: Some((14 + 20, 6)),
        ..complete
    };
    assert_eq!(
        through_driver(&mut pair, &partial, needs),
        Verdict::Forward(Port::Inside)
    );
    // Without either flag, that field is a wrong checksum.
    let partial = {
        let mut p = esp_in_udp(&mut pair);
        let sum = checksum::pseudo_header_sum(&p[..20], 17, p.len() - 20);
        p[26..28].copy_from_slice(&(!checksum::fold(sum)).to_be_bytes());
        p
    };
    assert_eq!(
        dropped(through_driver(&mut pair, &partial, complete)).map(DropReason::name),
        Some("udp_checksum")
    );
    assert!(pair.b.stats().balanced(), "{:?}", pair.b.stats());
    assert_eq!(pair.pool.in_use(), 0);
}

/// What A sends for a fresh UDP packet from host A to host B: ESP in UDP,
/// without a UDP checksum.
fn esp_in_udp(pair: &mut Pair) -> Vec<u8> {
    let (verdict, esp) = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 64, 1));
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_eq!(esp[9], 17, "ESP in UDP");
    assert_eq!(&esp[26..28], &[0, 0], "sent without a checksum");
    esp
}

/// `packet` (bare IPv4) into B as AF_PACKET hands a frame over: in an
/// Ethernet frame behind a virtio-net header saying `repr`, made whole by
/// the driver's offload step first.
fn through_driver(pair: &mut Pair, packet: &[u8], repr: dataplane::wire::vnet::VnetRepr) -> Verdict {
    use dataplane::wire::vnet::{VnetHeader, HEADER_LEN};
    use drivers::offload::{self, OffloadCounters};
    let mut header = [0u8; HEADER_LEN];
    repr.emit(&mut VnetHeader::new_unchecked(&mut header[..]));
    let mut frame = vec![0u8; 14];
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(packet);
    let mut buf = pair.pool.alloc().unwrap();
    assert!(buf.fill(&frame));
    let mut ready = Vec::new();
    let mut counters = OffloadCounters::default();
    offload::prepare(&header, buf, &[], &mut pair.pool, &mut ready, &mut counters);
    let mut buf = ready.pop().expect("the frame, made whole");
    // The gateway's port is raw IP here.
    buf.trim_front(14);
    let outputs = drivers::drive::handle_frame(&mut pair.b, pair.now, Port::Outside, buf, &mut pair.pool);
    let verdict = outputs[0].1;
    for (buf, _) in outputs {
        pair.pool.free(buf);
    }
    verdict
}
