//! The lab's captures: a thread that watches one link between the
//! gateways on an AF_PACKET socket and counts each frame by what it is
//! (ESP raw or in UDP, ARP, the rekey exchange, NAT keepalives, plaintext
//! IPv4, other), keeping a sample ESP frame and the flows of ESP in UDP
//! it saw, in order.
//!
//! Owns: its capture socket and the counters it fills ([`Wire`]).
//! Must not: send anything or decide what a count means for a run (the
//! demo's report does).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::Result;

use super::topology::{enter, GW_B_PUBLIC, NAT_PUBLIC};

/// A UDP flow of ESP between the gateways as one link shows it: source
/// address and port, destination address and port.
pub type UdpFlow = (Ipv4Addr, u16, Ipv4Addr, u16);

#[derive(Default)]
pub struct Wire {
    pub frames: AtomicU64,
    pub esp: AtomicU64,
    pub arp: AtomicU64,
    pub plaintext: AtomicU64,
    /// The gateways' rekey exchange (UDP port 500 between them, or behind
    /// the non-ESP marker on an encapsulation port).
    pub control: AtomicU64,
    /// RFC 3948 NAT keepalives.
    pub keepalives: AtomicU64,
    pub other: AtomicU64,
    /// A large ESP frame and where its ESP header starts.
    pub sample: std::sync::Mutex<Option<(Vec<u8>, usize)>>,
    /// The distinct flows of ESP in UDP seen (a handful: one each way, one
    /// more per NAT mapping), in order of their first frame.
    pub udp_flows: std::sync::Mutex<Vec<FlowSeen>>,
}

/// One flow of ESP in UDP on a link, by frame number on that link.
#[derive(Debug, Clone, Copy)]
pub struct FlowSeen {
    pub flow: UdpFlow,
    pub frames: u64,
    pub first: u64,
    pub last: u64,
}

/// What a frame on the link between the gateways is.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Arp,
    /// ESP, raw or in UDP (with where the ESP header starts), or a
    /// later fragment of either.
    Esp(Option<(usize, UdpFlow)>),
    Control,
    Keepalive,
    Plaintext,
    Other,
}

/// The gateways' outer addresses, with and without `--nat`: only the
/// gateways (and the NAT on their behalf) send from them, so a packet
/// between two of them is never a host's plaintext.
const OUTER: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 0, 0, 1),
    Ipv4Addr::new(10, 0, 0, 2),
    NAT_PUBLIC,
    GW_B_PUBLIC,
];

fn classify(frame: &[u8]) -> Seen {
    match frame.get(12..14) {
        Some([0x08, 0x06]) => return Seen::Arp,
        Some([0x08, 0x00]) => {}
        _ => return Seen::Other,
    }
    let Some(ip) = frame.get(14..).filter(|ip| ip.len() >= 20) else {
        return Seen::Other;
    };
    let header = usize::from(ip[0] & 0x0f) * 4;
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    let (src, dst) = (addr(12), addr(16));
    let between_gateways = OUTER.contains(&src) && OUTER.contains(&dst);
    let later_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0;
    match ip[9] {
        50 => Seen::Esp(None),
        // A later fragment carries no UDP header to look at; between the
        // gateways' outer addresses it is part of an encapsulated packet.
        17 if later_fragment && between_gateways => Seen::Esp(None),
        17 if between_gateways => {
            let Some(udp) = ip.get(header..header + dataplane::nat::UDP_HEADER_LEN) else {
                return Seen::Plaintext;
            };
            let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
            let (sport, dport) = (port(0), port(2));
            let payload = ip
                .get(header + dataplane::nat::UDP_HEADER_LEN..)
                .unwrap_or_default();
            if sport == dataplane::CONTROL_PORT || dport == dataplane::CONTROL_PORT {
                return Seen::Control;
            }
            let nat_t = spd_sad::UdpEncap::NAT_T.local_port;
            if sport != nat_t && dport != nat_t {
                return Seen::Plaintext;
            }
            match dataplane::nat::Payload::of(payload) {
                dataplane::nat::Payload::Esp => Seen::Esp(Some((
                    14 + header + dataplane::nat::UDP_HEADER_LEN,
                    (src, sport, dst, dport),
                ))),
                dataplane::nat::Payload::Ike => Seen::Control,
                dataplane::nat::Payload::Keepalive => Seen::Keepalive,
                dataplane::nat::Payload::Malformed => Seen::Other,
            }
        }
        _ => Seen::Plaintext,
    }
}

/// Watches device `dev` in namespace `ns` (a link between the gateways)
/// until `stop`.
pub fn capture(
    ns: String,
    dev: &'static str,
    wire: Arc<Wire>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Result<()>> {
    thread::spawn(move || {
        enter(&ns)?;
        let socket = drivers::afpacket::AfPacket::open_capture(dev)?;
        let mut pool = dataplane::PacketPool::new(64);
        let mut bufs = Vec::new();
        let mut scratch = drivers::afpacket::RxScratch::new();
        while !stop.load(Ordering::Relaxed) {
            if socket.recv_batch(&mut pool, &mut bufs, 64, &mut scratch)? == 0 {
                thread::sleep(Duration::from_millis(2));
            }
            for buf in bufs.drain(..) {
                let frame = buf.data();
                let number = wire.frames.fetch_add(1, Ordering::Relaxed);
                let counter = match classify(frame) {
                    Seen::Arp => &wire.arp,
                    Seen::Esp(udp) => {
                        let (offset, flow) = udp.map_or((34, None), |(at, flow)| (at, Some(flow)));
                        if let Ok(mut sample) = wire.sample.lock() {
                            if sample.is_none() && frame.len() > 200 && frame.len() >= offset + 24 {
                                *sample = Some((frame.to_vec(), offset));
                            }
                        }
                        if let (Some(flow), Ok(mut flows)) = (flow, wire.udp_flows.lock()) {
                            match flows.iter_mut().find(|f| f.flow == flow) {
                                Some(seen) => {
                                    seen.frames += 1;
                                    seen.last = number;
                                }
                                None => flows.push(FlowSeen {
                                    flow,
                                    frames: 1,
                                    first: number,
                                    last: number,
                                }),
                            }
                        }
                        &wire.esp
                    }
                    Seen::Control => &wire.control,
                    Seen::Keepalive => &wire.keepalives,
                    Seen::Plaintext => &wire.plaintext,
                    Seen::Other => &wire.other,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                pool.free(buf);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::topology::{HOST_A, HOST_B};

    /// An Ethernet frame with an IPv4 header from `src` to `dst` carrying
    /// `proto` and `payload`.
    fn frame(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0];
        ip.extend(src.octets());
        ip.extend(dst.octets());
        f.extend(ip);
        f.extend(payload);
        f
    }

    fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend(sport.to_be_bytes());
        u.extend(dport.to_be_bytes());
        u.extend((8 + payload.len() as u16).to_be_bytes());
        u.extend([0, 0]);
        u.extend(payload);
        u
    }

    #[test]
    fn the_wire_watch_tells_esp_in_udp_from_plaintext() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let esp = [0, 0, 0x10, 0x01, 0, 0, 0, 7, 0xaa, 0xbb];
        assert_eq!(classify(&frame(a, b, 50, &esp)), Seen::Esp(None));
        let mapped = frame(NAT_PUBLIC, GW_B_PUBLIC, 17, &udp(40_123, 4500, &esp));
        assert_eq!(
            classify(&mapped),
            Seen::Esp(Some((42, (NAT_PUBLIC, 40_123, GW_B_PUBLIC, 4500))))
        );
        assert_eq!(
            classify(&frame(a, GW_B_PUBLIC, 17, &udp(4500, 4500, &[0xff]))),
            Seen::Keepalive
        );
        assert_eq!(
            classify(&frame(
                GW_B_PUBLIC,
                NAT_PUBLIC,
                17,
                &udp(4500, 40_123, &[0, 0, 0, 0, 1, 2, 3, 4])
            )),
            Seen::Control
        );
        assert_eq!(
            classify(&frame(a, b, 17, &udp(500, 500, &[1; 40]))),
            Seen::Control
        );
        // A host's datagram, even to 4500, is plaintext on this link; so is
        // one between the gateways on another port.
        assert_eq!(
            classify(&frame(HOST_A, HOST_B, 17, &udp(4500, 4500, &esp))),
            Seen::Plaintext
        );
        assert_eq!(
            classify(&frame(a, b, 17, &udp(7000, 7000, &esp))),
            Seen::Plaintext
        );
        assert_eq!(classify(&frame(HOST_A, HOST_B, 6, &[0; 20])), Seen::Plaintext);
        // A later fragment of ESP in UDP has no UDP header of its own.
        let mut later = frame(NAT_PUBLIC, GW_B_PUBLIC, 17, &[0x5a; 100]);
        later[14 + 6..14 + 8].copy_from_slice(&185u16.to_be_bytes());
        assert_eq!(classify(&later), Seen::Esp(None));
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(classify(&arp), Seen::Arp);
    }
}
