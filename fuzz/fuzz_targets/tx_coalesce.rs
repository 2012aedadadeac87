//! Transmit-side coalescing (`drivers::coalesce`): a batch of frames
//! planned into messages, runs of TCP segments or UDP datagrams merged
//! into GSO super-packets.
//!
//! Input: one byte for the number of frames (1..=64), then per frame seven
//! bytes: kind (bit 0: not TCP, bit 1: PSH, bit 2: FIN, bit 3: DF clear,
//! bit 4: change a byte after the checksums are set, bit 5: before, bit 6:
//! a UDP datagram from 4500 to 4500 instead, bit 7: its checksum set), a
//! sequence step, a payload length (2 bytes), an IPv4 ID step, and the
//! offset and value of the byte to change. Frames are built from one TCP
//! flow's template (or one UDP flow's: ESP in UDP) so that merges happen.
//!
//! Checks: no panic; the messages cover every frame once, in order; each
//! super-packet stays within 64 KiB and, cut again by the driver's own GSO
//! code (standing in for the kernel's), gives back exactly the frames that
//! were merged (IDs and header checksum aside for DF packets, whose IDs
//! carry nothing, RFC 6864).
#![no_main]

use dataplane::buffer::MAX_FRAME;
use dataplane::wire::checksum::{fold, ones_sum};
use dataplane::PacketPool;
use drivers::coalesce::{plan, Plan};
use drivers::offload::{prepare, OffloadCounters};
use libfuzzer_sys::fuzz_target;

fn fix(f: &mut [u8]) {
    f[24..26].copy_from_slice(&[0, 0]);
    let s = fold(ones_sum(&f[14..34], 0));
    f[24..26].copy_from_slice(&s.to_be_bytes());
    if f[23] == 17 && f[40..42] != [0, 0] {
        f[40..42].copy_from_slice(&[0, 0]);
        let s = udp_sum(f);
        f[40..42].copy_from_slice(&s.to_be_bytes());
        return;
    }
    if f[23] != 6 {
        return;
    }
    f[50..52].copy_from_slice(&[0, 0]);
    let mut pseudo = [0u8; 12];
    pseudo[..8].copy_from_slice(&f[26..34]);
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&((f.len() - 34) as u16).to_be_bytes());
    let s = fold(ones_sum(&f[34..], ones_sum(&pseudo, 0)));
    f[50..52].copy_from_slice(&s.to_be_bytes());
}

/// The UDP checksum `f` should carry (over its UDP header with the field zero).
fn udp_sum(f: &[u8]) -> u16 {
    let mut pseudo = [0u8; 12];
    pseudo[..8].copy_from_slice(&f[26..34]);
    pseudo[9] = 17;
    pseudo[10..12].copy_from_slice(&((f.len() - 34) as u16).to_be_bytes());
    fold(ones_sum(&f[34..], ones_sum(&pseudo, 0)))
}

/// An Ethernet + IPv4 frame of `protocol` with `l4_len` bytes after the
/// IPv4 header, between `addrs`; DF unless the spec's kind says not.
fn ipv4_frame(kind: u8, id: u16, protocol: u8, l4_len: usize, addrs: [u8; 8]) -> Vec<u8> {
    let total = 20 + l4_len;
    let mut f = vec![0u8; 14 + total];
    f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&(total as u16).to_be_bytes());
    f[18..20].copy_from_slice(&id.to_be_bytes());
    f[20] = if kind & 8 != 0 { 0 } else { 0x40 };
    f[22] = 64;
    f[23] = protocol;
    f[26..34].copy_from_slice(&addrs);
    f
}

/// The checksums set, with the spec's byte changed before or after.
fn damage_and_fix(mut f: Vec<u8>, spec: &[u8]) -> Vec<u8> {
    let at = usize::from(spec[5]) % f.len();
    if spec[0] & 32 != 0 {
        f[at] = spec[6];
    }
    fix(&mut f);
    if spec[0] & 16 != 0 {
        f[at] = spec[6];
    }
    f
}

/// A UDP datagram of one ESP-in-UDP flow.
fn datagram(spec: &[u8], id: u16) -> Vec<u8> {
    let kind = spec[0];
    let payload = 1 + usize::from(u16::from_be_bytes([spec[2], spec[3]])) % 1500;
    let mut f = ipv4_frame(kind, id, 17, 8 + payload, [10, 0, 0, 1, 10, 0, 0, 2]);
    f[34..38].copy_from_slice(&[0x11, 0x94, 0x11, 0x94]);
    f[38..40].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    // Nonzero for now: `fix` computes it.
    f[40] = u8::from(kind & 128 != 0);
    for (k, b) in f[42..].iter_mut().enumerate() {
        *b = (usize::from(id) + k) as u8;
    }
    damage_and_fix(f, spec)
}

fn frame(spec: &[u8], seq: u32, id: u16) -> Vec<u8> {
    let kind = spec[0];
    if kind & 64 != 0 {
        return datagram(spec, id);
    }
    let payload = usize::from(u16::from_be_bytes([spec[2], spec[3]])) % 1600;
    let protocol = if kind & 1 != 0 { 17 } else { 6 };
    let mut f = ipv4_frame(
        kind,
        id,
        protocol,
        32 + payload,
        [192, 168, 1, 10, 192, 168, 2, 20],
    );
    f[34..36].copy_from_slice(&5201u16.to_be_bytes());
    f[36..38].copy_from_slice(&40000u16.to_be_bytes());
    f[38..42].copy_from_slice(&seq.to_be_bytes());
    f[42..46].copy_from_slice(&7u32.to_be_bytes());
    f[46] = 8 << 4;
    f[47] = 0x10 | if kind & 2 != 0 { 0x08 } else { 0 } | if kind & 4 != 0 { 0x01 } else { 0 };
    f[48..50].copy_from_slice(&500u16.to_be_bytes());
    f[54..58].copy_from_slice(&[1, 1, 8, 10]);
    for (k, b) in f[66..].iter_mut().enumerate() {
        *b = (seq as usize + k) as u8;
    }
    damage_and_fix(f, spec)
}

fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let count = 1 + usize::from(count % 64);
    let mut frames = Vec::new();
    let (mut seq, mut id) = (1000u32, 1u16);
    for spec in rest.chunks_exact(7).take(count) {
        frames.push(frame(spec, seq, id));
        let payload = (usize::from(u16::from_be_bytes([spec[2], spec[3]])) % 1600) as u32;
        // Step 0 is the next segment in order; others leave a gap.
        seq = seq
            .wrapping_add(payload)
            .wrapping_add(u32::from(spec[1] % 4) * 1000);
        id = id.wrapping_add(u16::from(spec[4] % 3));
    }
    if frames.is_empty() {
        return;
    }
    let originals = frames.clone();
    let mut refs: Vec<&mut [u8]> = frames.iter_mut().map(|f| &mut f[..]).collect();
    let mut p = Plan::default();
    plan(&mut refs, &mut p, true);
    let mut next = 0;
    for m in p.messages() {
        assert_eq!(m.start, next, "messages in order, each frame once");
        assert!(m.count >= 1);
        next += m.count;
        let mut bytes = Vec::new();
        let range = m.start..m.start + m.count;
        for (frame, &(from, to)) in frames[range.clone()].iter().zip(&p.spans[range]) {
            assert!(from <= to && to <= frame.len());
            bytes.extend_from_slice(&frame[from..to]);
        }
        if m.count == 1 {
            assert_eq!(
                frames[m.start], originals[m.start],
                "a frame sent alone is sent as it came"
            );
            continue;
        }
        assert!(bytes.len() - 14 <= 65_535);
        let mut pool = PacketPool::new(128);
        let Some(mut buf) = pool.alloc() else { return };
        let head = bytes.len().min(MAX_FRAME);
        assert!(buf.fill(&bytes[..head]));
        let mut out = Vec::new();
        let mut counters = OffloadCounters::default();
        prepare(&m.header, buf, &bytes[head..], &mut pool, &mut out, &mut counters);
        assert_eq!(
            counters.drops_total(),
            0,
            "a super-packet the kernel would refuse: {counters:?}"
        );
        assert_eq!(out.len(), m.count, "as many segments as were merged");
        for (k, seg) in (m.start..).zip(&out) {
            let mut got = seg.data().to_vec();
            let mut want = originals[k].clone();
            if want[23] == 17 && want.get(40..42) == Some(&[0, 0]) {
                // A datagram sent without a checksum gets one when cut:
                // it must be right.
                let mut blank = got.clone();
                blank[40..42].copy_from_slice(&[0, 0]);
                // A sum of 0 is sent as 0xffff (CSUM_MANGLED_0).
                let expected = match udp_sum(&blank) {
                    0 => 0xffff,
                    sum => sum,
                };
                assert_eq!(got[40..42], expected.to_be_bytes());
                got[40..42].copy_from_slice(&[0, 0]);
            }
            if want[20] & 0x40 != 0 {
                for f in [&mut got, &mut want] {
                    f[18..20].copy_from_slice(&[0, 0]);
                    f[24..26].copy_from_slice(&[0, 0]);
                }
            }
            assert_eq!(got, want, "segment {k} cut back from its super-packet");
        }
        for b in out {
            pool.free(b);
        }
    }
    assert_eq!(next, frames.len());
});
