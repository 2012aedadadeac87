//! `espgw pcap --verdicts`: one line per input frame, whatever the engine
//! does with the frame's packet (completes it later, holds it, splits it,
//! reassembles it with others), with the distinct anti-replay reasons, and
//! lines whose drop reasons add up to the final counters.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, EngineKind, Style};
use common::*;
use dataplane::{DropReason, Gateway, PacketPool, Port, Verdict};
use drivers::pcap;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;
use serde_json::Value;
use smoltcp::wire::Ipv4Packet;

const ALG: Algorithm = Algorithm::Aes128Sha1;

/// What the capture's frames are meant to meet, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Forwarded(u32),
    Dropped(&'static str, Option<u32>),
    /// A fragment that only started or continued a datagram.
    Absorbed,
}

/// ESP from site A to site B, raw IPv4, with one of everything.
fn capture() -> (Vec<Vec<u8>>, Vec<Expect>) {
    // Site A with a small outside MTU, so that big packets leave as fragments.
    let mut a_config = tunnel_builder(ALG, "tunnel", false, true);
    interface(&mut a_config, "outside").mtu = Some(600);
    let mut a = gateway_from(&a_config.to_toml());
    let mut pool = PacketPool::new(16);
    let mut esp = Vec::new();
    let mut encapsulate = |a: &mut Gateway, inner: &[u8]| -> Vec<Vec<u8>> {
        let mut buf = pool.alloc().unwrap();
        assert!(buf.fill(inner));
        let outputs = drivers::drive::handle_frame(a, Duration::ZERO, Port::Inside, buf, &mut pool);
        outputs
            .into_iter()
            .map(|(buf, verdict)| {
                assert_eq!(verdict, Verdict::Forward(Port::Outside));
                let bytes = buf.data().to_vec();
                pool.free(buf);
                bytes
            })
            .collect()
    };
    // Sequence numbers 1..=100.
    for i in 0..100u32 {
        let frames = encapsulate(&mut a, &udp_packet(HOST_A, HOST_B, 30 + i as usize, i as u8));
        esp.push(frames.into_iter().next().unwrap());
    }
    let mut frames = Vec::new();
    let mut expect = Vec::new();
    for (i, e) in esp.iter().enumerate().take(100) {
        frames.push(e.clone());
        expect.push(Expect::Forwarded(i as u32 + 1));
    }
    // Again: seq 99 is a duplicate, seq 5 left of the 64-packet window.
    frames.push(esp[98].clone());
    expect.push(Expect::Dropped("replay_duplicate", Some(99)));
    frames.push(esp[4].clone());
    expect.push(Expect::Dropped("replay_too_old", Some(5)));
    // Seq 101 with its sequence number zeroed.
    let mut next = encapsulate(&mut a, &udp_packet(HOST_A, HOST_B, 40, 101));
    let mut zero = next.remove(0);
    zero[24..28].copy_from_slice(&[0; 4]);
    frames.push(zero);
    expect.push(Expect::Dropped("seq_zero", Some(0)));
    // Seq 102 with a flipped ICV bit, then seq 102 intact.
    let good = encapsulate(&mut a, &udp_packet(HOST_A, HOST_B, 50, 102)).remove(0);
    let mut forged = good.clone();
    *forged.last_mut().unwrap() ^= 1;
    frames.push(forged);
    expect.push(Expect::Dropped("auth_failed", Some(102)));
    frames.push(good.clone());
    expect.push(Expect::Forwarded(102));
    // A duplicate of that one, and an unknown SPI.
    frames.push(good.clone());
    expect.push(Expect::Dropped("replay_duplicate", Some(102)));
    let mut stranger = good.clone();
    stranger[20..24].copy_from_slice(&0x0bad_0badu32.to_be_bytes());
    frames.push(stranger);
    expect.push(Expect::Dropped("unknown_spi", Some(102)));
    // Seq 103: an inner packet whose TTL runs out at B (A takes one).
    let mut dying = udp_packet(HOST_A, HOST_B, 60, 103);
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut dying[..]);
        ip.set_hop_limit(2);
        ip.fill_checksum();
    }
    frames.push(encapsulate(&mut a, &dying).remove(0));
    expect.push(Expect::Dropped("ttl_expired", Some(103)));
    // Seq 104: a packet that leaves A in fragments, delivered last first.
    let mut big = udp_packet(HOST_A, HOST_B, 1200, 104);
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut big[..]);
        ip.set_dont_frag(false);
        ip.fill_checksum();
    }
    let mut pieces = encapsulate(&mut a, &big);
    assert!(pieces.len() >= 3, "{} fragments", pieces.len());
    pieces.reverse();
    let completing = pieces.len() - 1;
    for (i, piece) in pieces.into_iter().enumerate() {
        frames.push(piece);
        // The first fragment, delivered last, completes the datagram.
        expect.push(if i == completing {
            Expect::Forwarded(104)
        } else {
            Expect::Absorbed
        });
    }
    // Seq 105 normal, and a frame that is no packet at all.
    frames.push(encapsulate(&mut a, &udp_packet(HOST_A, HOST_B, 70, 105)).remove(0));
    expect.push(Expect::Forwarded(105));
    frames.push(vec![0x45, 0, 0]);
    expect.push(Expect::Dropped("malformed", None));
    (frames, expect)
}

fn pcap_bytes(frames: &[Vec<u8>]) -> Vec<u8> {
    let header = PcapHeader {
        datalink: DataLink::RAW,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(Vec::new(), header).unwrap();
    for (i, frame) in frames.iter().enumerate() {
        let packet = PcapPacket::new(Duration::from_micros(i as u64 * 10), frame.len() as u32, frame);
        writer.write_packet(&packet).unwrap();
    }
    writer.into_writer()
}

/// Runs the capture into site B on `kind`/`style`; the verdict lines and
/// B's counters.
fn verdicts(frames: &[Vec<u8>], kind: EngineKind, style: Style) -> (Vec<Value>, Gateway) {
    let b_text = tunnel_config(ALG, "tunnel", false, false);
    let mut b = gateway_on(&b_text, &engine_spec(kind, BufferPolicy::Registered), style);
    let bytes = pcap_bytes(frames);
    let (reader, _) = pcap::open(&bytes[..]).unwrap();
    let mut lines = Vec::new();
    let run = pcap::run_with_verdicts(&mut b, Port::Outside, reader, Vec::new(), &mut lines).unwrap();
    assert_eq!(run.frames_in, frames.len() as u64);
    let text = String::from_utf8(lines).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (lines, b)
}

/// Drop reasons over all lines, `more_drops` included.
fn reasons(lines: &[Value]) -> BTreeMap<String, u64> {
    let mut tally = BTreeMap::new();
    for line in lines {
        if let Some(r) = line["reason"].as_str() {
            *tally.entry(r.to_owned()).or_default() += 1;
        }
        for r in line["more_drops"].as_array().into_iter().flatten() {
            *tally.entry(r.as_str().unwrap().to_owned()).or_default() += 1;
        }
    }
    tally
}

#[test]
fn every_frame_gets_one_line_and_the_lines_add_up_to_the_counters() {
    let (frames, expect) = capture();
    let mut reference: Option<Vec<Value>> = None;
    for (kind, style) in [
        (EngineKind::Soft, Style::Async),
        (EngineKind::Sec, Style::Async),
        (EngineKind::Sec, Style::DualPass),
        (EngineKind::Sec, Style::Sync),
    ] {
        let label = format!("{kind}/{style}");
        let (lines, b) = verdicts(&frames, kind, style);
        assert_eq!(lines.len(), frames.len(), "{label}: one line per frame");
        for (i, (line, want)) in lines.iter().zip(&expect).enumerate() {
            assert_eq!(line["frame"], i as u64, "{label}: lines in frame order");
            assert_eq!(line["port"], "outside");
            match *want {
                Expect::Forwarded(seq) => {
                    assert_eq!(line["verdict"], "forwarded", "{label} frame {i}: {line}");
                    assert_eq!(line["transmitted"], 1, "{label} frame {i}");
                    assert_eq!(line["sa"], "t-in", "{label} frame {i}: {line}");
                    assert_eq!(line["spi"], "0x00001001");
                    assert_eq!(line["seq"], seq, "{label} frame {i}");
                }
                Expect::Dropped(reason, seq) => {
                    assert_eq!(line["verdict"], "dropped", "{label} frame {i}: {line}");
                    assert_eq!(line["reason"], reason, "{label} frame {i}: {line}");
                    // A packet that expires at B after decryption gets its
                    // time exceeded back through the tunnel.
                    let errors = u64::from(reason == "ttl_expired");
                    assert_eq!(line["transmitted"], errors, "{label} frame {i}: {line}");
                    if let Some(seq) = seq {
                        assert_eq!(line["seq"], seq, "{label} frame {i}");
                    }
                    if reason == "unknown_spi" {
                        assert!(line.get("sa").is_none(), "{line}");
                    } else if seq.is_some() {
                        assert_eq!(line["sa"], "t-in", "{label} frame {i}: {line}");
                    }
                }
                Expect::Absorbed => {
                    assert_eq!(line["verdict"], "consumed", "{label} frame {i}: {line}");
                    assert_eq!(line["transmitted"], 0);
                }
            }
        }
        // The bar: per reason, the lines' count is the counter.
        let stats = b.stats();
        let counted: BTreeMap<String, u64> = stats
            .drops
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (r.name().to_owned(), n))
            .collect();
        assert_eq!(reasons(&lines), counted, "{label}");
        for reason in ["replay_duplicate", "replay_too_old", "seq_zero", "auth_failed"] {
            assert!(counted.contains_key(reason), "{label}: the capture has {reason}");
        }
        assert_eq!(stats.drops.get(DropReason::ReplayDuplicate), 2);
        let transmitted: u64 = lines.iter().map(|l| l["transmitted"].as_u64().unwrap()).sum();
        assert_eq!(transmitted, stats.tx_packets, "{label}");
        let forwarded = lines.iter().filter(|l| l["verdict"] == "forwarded").count() as u64;
        assert_eq!(
            forwarded,
            stats.decapsulated - 1,
            "{label}: all but the TTL-expired one"
        );
        // Per SA, the split is the same.
        let sa = b.sad().get(b.sad().find("t-in").unwrap()).unwrap().counters();
        assert_eq!(
            (
                sa.get(DropReason::ReplayDuplicate),
                sa.get(DropReason::ReplayTooOld),
                sa.get(DropReason::SeqZero)
            ),
            (2, 1, 1),
            "{label}"
        );
        // And the verdicts do not depend on the engine.
        match &reference {
            None => reference = Some(lines),
            Some(r) => assert_eq!(r, &lines, "{label} differs from soft/async"),
        }
    }
}

/// Outbound: the SA and sequence number come from the ESP that left, a
/// frame answered with an ICMP error is dropped with one transmission, and
/// a packet split in fragments is one forwarded line.
#[test]
fn outbound_lines_name_the_sa_and_count_what_left() {
    let mut a_config = tunnel_builder(ALG, "tunnel", false, true);
    interface(&mut a_config, "outside").mtu = Some(600);
    let mut a = gateway_from(&a_config.to_toml());
    let mut dying = udp_packet(HOST_A, HOST_B, 20, 1);
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut dying[..]);
        ip.set_hop_limit(1);
        ip.fill_checksum();
    }
    let mut big = udp_packet(HOST_A, HOST_B, 1200, 2);
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut big[..]);
        ip.set_dont_frag(false);
        ip.fill_checksum();
    }
    let too_big_df = udp_packet(HOST_A, HOST_B, 1200, 3);
    let frames = vec![
        udp_packet(HOST_A, HOST_B, 20, 0),
        dying,
        big,
        too_big_df,
        udp_packet(HOST_A, std::net::Ipv4Addr::new(8, 8, 8, 8), 20, 4),
    ];
    let bytes = pcap_bytes(&frames);
    let (reader, _) = pcap::open(&bytes[..]).unwrap();
    let mut out = Vec::new();
    pcap::run_with_verdicts(&mut a, Port::Inside, reader, Vec::new(), &mut out).unwrap();
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["verdict"], "forwarded");
    assert_eq!(
        (&lines[0]["sa"], &lines[0]["spi"], &lines[0]["seq"]),
        (&"t-out".into(), &"0x00001001".into(), &1.into())
    );
    assert_eq!(
        (&lines[1]["verdict"], &lines[1]["reason"]),
        (&"dropped".into(), &"ttl_expired".into())
    );
    assert_eq!(lines[1]["transmitted"], 1, "the time-exceeded error");
    assert_eq!(lines[2]["verdict"], "forwarded");
    assert_eq!(lines[2]["seq"], 2);
    assert!(lines[2]["transmitted"].as_u64().unwrap() >= 3, "{}", lines[2]);
    assert_eq!(
        (&lines[3]["reason"], &lines[3]["transmitted"]),
        (&"frag_needed".into(), &1.into())
    );
    assert_eq!(lines[4]["reason"], "no_policy");
    let counted: BTreeMap<String, u64> = a
        .stats()
        .drops
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| (r.name().to_owned(), n))
        .collect();
    assert_eq!(reasons(&lines), counted);
    let transmitted: u64 = lines.iter().map(|l| l["transmitted"].as_u64().unwrap()).sum();
    assert_eq!(transmitted, a.stats().tx_packets);
}
