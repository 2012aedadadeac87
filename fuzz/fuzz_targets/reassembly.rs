//! Fragment reassembly (`dataplane::reassembly::Reassembler`) driven by a
//! sequence of operations decoded from the input:
//!
//! - `0..=0xef`: a fragment, 9 more bytes: source (one of four), IP ID (one
//!   of four), protocol (ESP or UDP), header length (20 or 24..60), offset
//!   in 8-byte units (13 bits) and MF, payload length (11 bits), time step.
//!   Its payload bytes are a function of the datagram and the byte's
//!   position, so a reassembled datagram can be checked byte by byte;
//! - `0xf0..=0xfd`: raw bytes as a fragment (length byte, then the bytes);
//! - `0xfe`: time passes beyond the reassembly timeout and `expire` runs;
//! - `0xff`: `drain`.
//!
//! Checks after every operation: each datagram in progress holds exactly
//! one buffer and no other buffer is missing from the pool, there are never
//! more than `MAX_DATAGRAMS`, nor more than `MAX_PER_SOURCE` from one
//! source, and a completed datagram is a well-formed
//! IPv4 packet (offset 0, no MF, right length and checksum) whose payload is
//! exactly what its fragments carried.
#![no_main]

use std::net::Ipv4Addr;
use std::time::Duration;

use dataplane::reassembly::{Reassembled, Reassembler, MAX_DATAGRAMS, MAX_PER_SOURCE, REASSEMBLY_TIMEOUT};
use dataplane::PacketPool;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

const SOURCES: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 0, 0, 1),
    Ipv4Addr::new(10, 0, 0, 3),
    Ipv4Addr::new(192, 0, 2, 1),
    Ipv4Addr::new(198, 51, 100, 7),
];

/// The payload byte at `position` of the datagram (`src`, `id`, `proto`).
fn pattern(src: u8, id: u16, proto: u8, position: usize) -> u8 {
    (position as u8)
        .wrapping_mul(31)
        .wrapping_add((position >> 8) as u8)
        .wrapping_add(src.wrapping_mul(17))
        .wrapping_add(id as u8)
        ^ proto
}

fn fragment(op: &[u8; 10]) -> Vec<u8> {
    let src_index = op[1] & 3;
    let id = u16::from(op[1] >> 2 & 3) + 0x100;
    let proto = if op[1] & 0x10 != 0 { 17 } else { 50 };
    let header_len = match op[2] & 0x0f {
        0..=5 => 20,
        n => usize::from(n) * 4,
    };
    let word = u16::from_be_bytes([op[3], op[4]]);
    let offset = usize::from(word & 0x1fff) * 8;
    let payload_len = usize::from(u16::from_be_bytes([op[5], op[6]]) & 0x07ff);
    let total = header_len + payload_len;
    let mut p = vec![0u8; total];
    p[0] = 0x40 | (header_len / 4) as u8;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..8].copy_from_slice(&(word & 0x3fff).to_be_bytes());
    p[8] = 64;
    p[9] = proto;
    p[12..16].copy_from_slice(&SOURCES[usize::from(src_index)].octets());
    p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    for (i, b) in p[20..header_len].iter_mut().enumerate() {
        *b = if i == 0 { 1 } else { op[7] }; // options: a NOP, then anything
    }
    for (i, b) in p[header_len..].iter_mut().enumerate() {
        *b = pattern(src_index, id, proto, offset + i);
    }
    let sum = common::checksum(&p[..header_len]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p
}

fn check_complete(datagram: &[u8]) {
    assert!(datagram.len() >= 20, "short datagram");
    let header_len = usize::from(datagram[0] & 0x0f) * 4;
    assert_eq!(datagram[0] >> 4, 4);
    assert!(header_len >= 20 && header_len <= datagram.len());
    assert_eq!(
        usize::from(u16::from_be_bytes([datagram[2], datagram[3]])),
        datagram.len(),
        "total length"
    );
    assert_eq!(
        u16::from_be_bytes([datagram[6], datagram[7]]) & 0x3fff,
        0,
        "offset or MF left"
    );
    assert_eq!(common::checksum(&datagram[..header_len]), 0, "header checksum");
    let src = Ipv4Addr::new(datagram[12], datagram[13], datagram[14], datagram[15]);
    // Raw fragments can complete too; only generated ones have a pattern.
    let Some(src_index) = SOURCES.iter().position(|s| *s == src) else {
        return;
    };
    let id = u16::from_be_bytes([datagram[4], datagram[5]]);
    if !(0x100..0x104).contains(&id) || datagram[16..20] != [10, 0, 0, 2] {
        return;
    }
    let proto = datagram[9];
    for (i, b) in datagram[header_len..].iter().enumerate() {
        assert_eq!(*b, pattern(src_index as u8, id, proto, i), "payload byte {i}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut pool = PacketPool::new(2 + usize::from(data.first().copied().unwrap_or(0) % 80));
    let mut reassembler = Reassembler::default();
    let mut spent = Vec::new();
    let mut now = Duration::ZERO;
    let mut rest = data.get(1..).unwrap_or_default();
    // Raw inputs may overlap a generated datagram's key and spoil its
    // pattern: only check the payload when none was fed.
    let mut raw_seen = false;
    while let Some((&op, tail)) = rest.split_first() {
        let frame = match op {
            0xfe => {
                now += REASSEMBLY_TIMEOUT;
                reassembler.expire(now, &mut spent);
                rest = tail;
                None
            }
            0xff => {
                reassembler.drain(&mut spent);
                rest = tail;
                None
            }
            0xf0..=0xfd => {
                let Some((&len, tail)) = tail.split_first() else {
                    break;
                };
                let len = usize::from(len).min(tail.len());
                raw_seen = true;
                rest = &tail[len..];
                Some(tail[..len].to_vec())
            }
            _ => {
                let Some(bytes) = rest.get(..10) else { break };
                let bytes: [u8; 10] = bytes.try_into().unwrap();
                now += Duration::from_millis(u64::from(bytes[8]) * 50);
                rest = &rest[10..];
                Some(fragment(&bytes))
            }
        };
        if let Some(frame) = frame {
            let Some(mut buf) = pool.alloc() else {
                // A full pool is a valid situation: skip the fragment.
                continue;
            };
            if !buf.fill(&frame) {
                pool.free(buf);
                continue;
            }
            match reassembler.insert(buf, now, &mut pool, &mut spent) {
                Reassembled::Held(frag) | Reassembled::Dropped(frag, _) => pool.free(frag),
                Reassembled::Complete {
                    datagram,
                    spent: frag,
                } => {
                    if !raw_seen {
                        check_complete(datagram.data());
                    } else {
                        let _ = datagram.data();
                    }
                    pool.free(datagram);
                    pool.free(frag);
                }
            }
        }
        for (buf, _) in spent.drain(..) {
            pool.free(buf);
        }
        assert!(reassembler.in_progress() <= MAX_DATAGRAMS);
        for src in SOURCES {
            assert!(reassembler.in_progress_from(src.into()) <= MAX_PER_SOURCE);
        }
        assert_eq!(
            pool.in_use(),
            reassembler.in_progress(),
            "each datagram in progress holds one buffer, and nothing else is held"
        );
    }
    reassembler.drain(&mut spent);
    for (buf, _) in spent.drain(..) {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0);
});
