//! The per-frame log: what became of each received frame, for drivers
//! that report a verdict per input frame (`espgw pcap --verdicts`). The
//! notes it reads are `dataplane::fate`'s.
//!
//! The core hands back buffers, not frames, and not always at once: an
//! engine may complete a packet calls later, a packet may wait for ARP or
//! for the packets ahead of it on its SA, one frame may leave as several
//! fragments, and reassembly turns several frames into one datagram. So
//! the tie between an output and its input travels with the packet: the
//! driver numbers each frame in its buffer's tag ([`PacketBuf::tag`]), and
//! the core keeps the tag through everything it does to the packet in
//! place, copies it to the fragments it splits off, and gives a reassembled
//! datagram the tag of the fragment that completed it (or, if the datagram
//! is given up, of the fragment that started it). Where the core rewrites a
//! received frame into one of its own (an ARP or echo reply, an ICMP
//! error), it notes in the buffer what became of the frame itself
//! ([`PacketBuf::note`]). Tagging costs two words already in the buffer and
//! nothing on the fast path.
//!
//! A driver then folds every output into its frame's record ([`FrameLog`]):
//! a drop outweighs a transmission, which outweighs consumption (a
//! completing fragment is consumed, the datagram it completed forwarded),
//! and each drop after the first is kept too, so that over a run every drop
//! counter is accounted for by exactly one frame. A record is final once
//! the gateway holds no buffer at all (its driver's pool is whole): nothing
//! of the frame can still come back.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::Ipv4Addr;

use dataplane::buffer::{PacketBuf, UNTAGGED};
use dataplane::fate::{replaced, Fate};
use dataplane::{DropReason, Gateway, InterfaceKind, LinkLayer, Port, Verdict};
use serde::Serialize;
use spd_sad::{proto, SaDirection, SaId};

/// The fate of a packet that left the gateway with `verdict`.
fn of_verdict(verdict: Verdict) -> Fate {
    match verdict {
        Verdict::Forward(_) => Fate::Forwarded,
        Verdict::Consumed | Verdict::Control => Fate::Consumed,
        Verdict::Drop(reason) => Fate::Dropped(reason),
    }
}

/// ESP header fields of a frame, where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Esp {
    spi: u32,
    seq: u32,
    sa: Option<SaId>,
}

#[derive(Debug, Clone)]
struct Record {
    port: Port,
    fate: Option<Fate>,
    transmitted: u32,
    esp: Option<Esp>,
    /// Drops of further packets that came from this frame (extra
    /// fragments, a reply that could not be routed).
    more_drops: Vec<DropReason>,
}

/// One line of `espgw pcap --verdicts`.
#[derive(Debug, Clone, Serialize)]
pub struct FrameVerdict<'a> {
    /// The frame's index in its capture, from 0.
    pub frame: u64,
    /// The port the frame was received on.
    pub port: Port,
    /// `forwarded`, `consumed` or `dropped`.
    pub verdict: &'static str,
    /// Why it was dropped; only for `dropped`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<DropReason>,
    /// The SA that took the packet in or sent it out, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sa: Option<&'a str>,
    /// The SPI in hex (`0x` and 8 digits), when the frame came in as
    /// IPv4 ESP or went out as ESP the gateway encapsulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spi: Option<String>,
    /// The 32-bit sequence number field on the wire.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u32>,
    /// Frames the gateway transmitted because of this one: the packet
    /// itself or its fragments, or the reply or ICMP error it caused.
    pub transmitted: u32,
    /// Drops of further packets that came from this frame (extra
    /// fragments, a reply that could not be routed), besides `reason`.
    #[serde(skip_serializing_if = "<[DropReason]>::is_empty")]
    pub more_drops: &'a [DropReason],
}

/// Why a frame could not be logged.
#[derive(Debug, thiserror::Error)]
pub enum FrameLogError {
    /// The frame's index would not fit a buffer tag: a run logs at most
    /// [`UNTAGGED`] frames.
    #[error("per-frame verdicts can number at most {} frames", UNTAGGED)]
    TooManyFrames,
    /// Serializing or writing a line failed.
    #[error("cannot write the verdicts: {0}")]
    Write(#[source] io::Error),
}

/// The records of frames whose fate may not be final yet, in frame order.
#[derive(Debug, Default)]
pub struct FrameLog {
    /// The index of `records[0]`.
    base: u64,
    records: VecDeque<Record>,
}

impl FrameLog {
    /// An empty log; the first frame recorded is frame 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Frames recorded and not yet written.
    pub fn open(&self) -> usize {
        self.records.len()
    }

    fn next_index(&self) -> u64 {
        self.base + self.records.len() as u64
    }

    /// Records frame `frame` as received on `port` and tags `buf` (which
    /// holds it) with its number.
    pub fn received(
        &mut self,
        gateway: &Gateway,
        port: Port,
        buf: &mut PacketBuf,
    ) -> Result<(), FrameLogError> {
        let index = self.next_index();
        let tag = u32::try_from(index)
            .ok()
            .filter(|t| *t != UNTAGGED)
            .ok_or(FrameLogError::TooManyFrames)?;
        buf.set_tag(tag);
        let esp = esp_of(buf.data(), link_of(gateway, port)).map(|(spi, seq, dst)| Esp {
            spi,
            seq,
            sa: (port == Port::Outside)
                .then(|| gateway.sad().lookup_inbound(spi, dst.into()))
                .flatten(),
        });
        self.records.push_back(Record {
            port,
            fate: None,
            transmitted: 0,
            esp,
            more_drops: Vec::new(),
        });
        Ok(())
    }

    /// Records a frame the driver could not hand to the gateway.
    pub fn refused(&mut self, port: Port, reason: DropReason) -> Result<(), FrameLogError> {
        if self.next_index() >= u64::from(UNTAGGED) {
            return Err(FrameLogError::TooManyFrames);
        }
        self.records.push_back(Record {
            port,
            fate: Some(Fate::Dropped(reason)),
            transmitted: 0,
            esp: None,
            more_drops: Vec::new(),
        });
        Ok(())
    }

    /// Folds one output of the gateway into its frame's record (before the
    /// driver frees the buffer). Untagged outputs are the gateway's own
    /// frames and belong to no input.
    pub fn output(&mut self, gateway: &Gateway, buf: &PacketBuf, verdict: Verdict) {
        let tag = buf.tag();
        if tag == UNTAGGED {
            return;
        }
        let Some(i) = u64::from(tag).checked_sub(self.base) else {
            return;
        };
        let Some(record) = self.records.get_mut(i as usize) else {
            return;
        };
        let own = of_verdict(verdict);
        let (fate, extra_drop) = match replaced(buf) {
            // The frame met `frame`; the buffer went on as the gateway's own.
            Some(frame) => (frame, matches!(own, Fate::Dropped(_)).then_some(own)),
            None => (own, None),
        };
        if verdict_is_transmission(verdict) {
            record.transmitted += 1;
        }
        if record.esp.is_none() && record.port == Port::Inside {
            if let Verdict::Forward(port) = verdict {
                // An inside frame that leaves as ESP was encapsulated by us.
                record.esp = esp_of(buf.data(), link_of(gateway, port)).map(|(spi, seq, _)| Esp {
                    spi,
                    seq,
                    sa: outbound_sa(gateway, spi),
                });
            }
        }
        for fate in std::iter::once(fate).chain(extra_drop) {
            match record.fate {
                None => record.fate = Some(fate),
                Some(Fate::Dropped(_)) => {
                    if let Fate::Dropped(reason) = fate {
                        record.more_drops.push(reason);
                    }
                }
                Some(current) if fate.weight() > current.weight() => record.fate = Some(fate),
                Some(_) => {}
            }
        }
    }

    /// Writes every record as a JSON line and forgets it. Call only when
    /// the gateway holds no buffer, so that every record is final.
    pub fn flush(&mut self, gateway: &Gateway, out: &mut dyn Write) -> Result<(), FrameLogError> {
        while let Some(record) = self.records.pop_front() {
            let frame = self.base;
            self.base += 1;
            let line = line(gateway, frame, &record);
            serde_json::to_writer(&mut *out, &line).map_err(|e| FrameLogError::Write(e.into()))?;
            out.write_all(b"\n").map_err(FrameLogError::Write)?;
        }
        Ok(())
    }

    /// Each record as a line, without forgetting it (tests).
    pub fn lines<'a>(&'a self, gateway: &'a Gateway) -> impl Iterator<Item = FrameVerdict<'a>> + 'a {
        self.records
            .iter()
            .enumerate()
            .map(move |(i, r)| line(gateway, self.base + i as u64, r))
    }
}

fn verdict_is_transmission(verdict: Verdict) -> bool {
    matches!(verdict, Verdict::Forward(_))
}

fn line<'a>(gateway: &'a Gateway, frame: u64, record: &'a Record) -> FrameVerdict<'a> {
    // Every frame handed in comes back; a record without a fate would be
    // a buffer the gateway lost, which the drivers refuse to end with.
    let fate = record.fate.unwrap_or(Fate::Dropped(DropReason::EngineError));
    let sa = record
        .esp
        .and_then(|e| e.sa)
        .and_then(|id| gateway.sad().get(id))
        .map(|sa| sa.name());
    FrameVerdict {
        frame,
        port: record.port,
        verdict: fate.name(),
        reason: match fate {
            Fate::Dropped(reason) => Some(reason),
            _ => None,
        },
        sa,
        spi: record.esp.map(|e| format!("{:#010x}", e.spi)),
        seq: record.esp.map(|e| e.seq),
        transmitted: record.transmitted,
        more_drops: &record.more_drops,
    }
}

fn link_of(gateway: &Gateway, port: Port) -> LinkLayer {
    if port == Port::Inside && gateway.interface(port).kind == InterfaceKind::Tun {
        LinkLayer::RawIp
    } else {
        gateway.link()
    }
}

/// The outbound SA with `spi`.
fn outbound_sa(gateway: &Gateway, spi: u32) -> Option<SaId> {
    gateway
        .sad()
        .iter()
        .find(|(_, sa)| sa.params().direction == SaDirection::Outbound && sa.spi() == spi)
        .map(|(id, _)| id)
}

/// SPI, sequence number and destination of an ESP packet (the first
/// fragment of one included) in `frame`.
fn esp_of(frame: &[u8], link: LinkLayer) -> Option<(u32, u32, Ipv4Addr)> {
    let ip = match link {
        LinkLayer::RawIp => frame,
        LinkLayer::Ethernet => {
            let header = frame.get(..14)?;
            if header[12..14] != [0x08, 0x00] {
                return None;
            }
            &frame[14..]
        }
    };
    let version_ihl = *ip.first()?;
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    let offset = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x1fff;
    if version_ihl >> 4 != 4 || header_len < 20 || *ip.get(9)? != proto::ESP || offset != 0 {
        return None;
    }
    // A frame may be cut anywhere: nothing is indexed before it is known
    // to be there (the fuzzer found a 19-byte header).
    let Some(&[a, b, c, d]) = ip.get(16..20) else {
        return None;
    };
    let dst = Ipv4Addr::new(a, b, c, d);
    let esp = ip.get(header_len..header_len + 8)?;
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((word(&esp[..4]), word(&esp[4..8]), dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_esp_header_is_not_read_past_its_end() {
        // IPv4, IHL 5, protocol ESP, first fragment, 19 bytes only.
        let mut ip = vec![0u8; 19];
        ip[0] = 0x45;
        ip[9] = proto::ESP;
        assert_eq!(esp_of(&ip, LinkLayer::RawIp), None);
        let mut whole = vec![0u8; 28];
        whole[0] = 0x45;
        whole[9] = proto::ESP;
        whole[16..20].copy_from_slice(&[10, 0, 0, 1]);
        whole[20..28].copy_from_slice(&[0, 0, 0x10, 0x01, 0, 0, 0, 7]);
        assert_eq!(
            esp_of(&whole, LinkLayer::RawIp),
            Some((0x1001, 7, Ipv4Addr::new(10, 0, 0, 1)))
        );
    }

    #[test]
    fn esp_headers_are_found_behind_ethernet_and_bare() {
        let mut ip = vec![0u8; 28];
        ip[0] = 0x45;
        ip[9] = 50;
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        ip[20..24].copy_from_slice(&0x1001u32.to_be_bytes());
        ip[24..28].copy_from_slice(&7u32.to_be_bytes());
        let expected = Some((0x1001, 7, Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(esp_of(&ip, LinkLayer::RawIp), expected);
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&ip);
        assert_eq!(esp_of(&frame, LinkLayer::Ethernet), expected);
        // Not the first fragment, not ESP, cut short: nothing.
        let mut later = ip.clone();
        later[7] = 1;
        assert_eq!(esp_of(&later, LinkLayer::RawIp), None);
        ip[9] = 17;
        assert_eq!(esp_of(&ip, LinkLayer::RawIp), None);
        assert_eq!(esp_of(&frame[..20], LinkLayer::Ethernet), None);
    }
}
