//! The AF_PACKET driver's offload handling (`drivers::offload`): a
//! virtio-net header and the frame after it, as `PACKET_VNET_HDR` hands
//! them over, made into complete packets.
//!
//! Input: one byte for the pool's size (1..=128 buffers), up to 10 bytes of
//! virtio-net header (fewer is a short header), then the frame, split as
//! the driver receives it: the first `MAX_FRAME` bytes in a pool buffer,
//! the rest as the tail.
//!
//! Checks: no panic; every buffer is either handed out or back in the pool;
//! exactly one counter moves per frame; every segment fits a buffer, has a
//! right IPv4 header checksum and L4 checksum (IPv6: the L4 checksum over
//! the RFC 8200 §8.1 pseudo-header) and the IPv4 total length (IPv6:
//! payload length) of its bytes; the segments' payloads are the
//! super-packet's, in order.
#![no_main]

use dataplane::buffer::MAX_FRAME;
use dataplane::wire::checksum::{fold, ones_sum};
use dataplane::PacketPool;
use drivers::offload::{prepare, OffloadCounters};
use libfuzzer_sys::fuzz_target;

/// The IP header's length, the datagram's length (from its header) and
/// the L4 protocol of the IPv4 or IPv6 packet (by the EtherType) in
/// `frame`; IPv6 with TCP or UDP right after the fixed header, as the
/// driver cuts only those.
fn layout(frame: &[u8]) -> (usize, usize, u8) {
    let ip = &frame[14..];
    if frame[12..14] == [0x86, 0xdd] {
        (40, 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]])), ip[6])
    } else {
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        (ihl, usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip[9])
    }
}

fn checksums_ok(frame: &[u8]) -> bool {
    let ip = &frame[14..];
    let (ihl, total, protocol) = layout(frame);
    if total != ip.len() {
        return false;
    }
    let addresses = if frame[12..14] == [0x86, 0xdd] {
        &ip[8..40]
    } else {
        if fold(ones_sum(&ip[..ihl], 0)) != 0 {
            return false;
        }
        &ip[12..20]
    };
    let l4 = &ip[ihl..total];
    // The pseudo-header: the addresses, the protocol (IPv6: next header)
    // and the L4 length, in 16-bit words.
    let mut pseudo = addresses.to_vec();
    pseudo.extend_from_slice(&[0, protocol]);
    pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    fold(ones_sum(l4, ones_sum(&pseudo, 0))) == 0
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, rest)) = data.split_first() else {
        return;
    };
    let mut pool = PacketPool::new(1 + usize::from(size % 128));
    let (header, frame) = rest.split_at(rest.len().min(10));
    let Some(mut buf) = pool.alloc() else { return };
    let split = frame.len().min(MAX_FRAME);
    assert!(buf.fill(&frame[..split]));
    let mut out = Vec::new();
    let mut counters = OffloadCounters::default();
    prepare(header, buf, &frame[split..], &mut pool, &mut out, &mut counters);
    assert_eq!(pool.in_use(), out.len(), "a buffer went missing");
    let moved = counters.csum_completed + counters.gso_segmented + counters.drops_total();
    assert!(moved <= 1, "one frame, one outcome: {counters:?}");
    if counters.gso_segmented == 1 {
        assert_eq!(counters.gso_segments as usize, out.len());
        let ip = &frame[14..];
        let (ihl, total, protocol) = layout(frame);
        let l4_len = if protocol == 6 {
            usize::from(ip[ihl + 12] >> 4) * 4
        } else {
            8
        };
        let headers = 14 + ihl + l4_len;
        let mut joined = Vec::new();
        for seg in &out {
            assert!(seg.len() <= MAX_FRAME);
            assert!(checksums_ok(seg.data()), "segment checksums");
            joined.extend_from_slice(&seg.data()[headers..]);
        }
        assert_eq!(joined, frame[headers..14 + total], "payload in order");
    } else {
        assert!(out.len() <= 1);
    }
    for buf in out {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0);
});
