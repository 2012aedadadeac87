//! Checked IPv6 views of a packet buffer and the walk over its extension
//! headers (RFC 8200 §4) to the upper-layer header: where it starts, what
//! it is, its ports for the SPD, and where transport-mode ESP would go
//! (RFC 4303 §3.1.1). The views check again when they are taken, as the
//! IPv4 ones do (`wire::ipv4`), so that no accessor can panic whatever
//! happened to the bytes since; `smoltcp`'s `new_checked` does the length
//! work. Owns no state, allocates nothing; parses only: it must not
//! rewrite headers (hop limit, next header) or build them from nothing.

use smoltcp::wire::Ipv6Packet;
use spd_sad::proto;

use crate::stats::DropReason;

/// Bytes of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// Extension headers the walk passes over (RFC 8200 §4.1).
mod next {
    pub(crate) const HOP_BY_HOP: u8 = 0;
    pub(crate) const ROUTING: u8 = 43;
    pub(crate) const FRAGMENT: u8 = 44;
    pub(crate) const DEST_OPTIONS: u8 = 60;
}

/// The most extension headers the walk reads before it gives up. RFC 8200
/// §4.1 recommends at most one of each, destination options twice: five;
/// a few more leave room for what a sender may legitimately repeat, and
/// the bound keeps the per-packet cost fixed whatever the chain.
const MAX_EXTENSION_HEADERS: usize = 8;

/// A whole datagram: the 40-byte header, version 6, and the payload length
/// the header gives within `data`. Bytes after the payload (Ethernet
/// padding) are allowed: the caller truncates. Anything else is
/// `Malformed`. A payload length of zero with a Jumbo Payload option
/// (RFC 2675) reads as an empty payload: no link espgw serves carries
/// jumbograms.
pub fn view(data: &[u8]) -> Result<Ipv6Packet<&[u8]>, DropReason> {
    let ip = Ipv6Packet::new_checked(data).map_err(|_| DropReason::Malformed)?;
    if ip.version() != 6 {
        return Err(DropReason::Malformed);
    }
    Ok(ip)
}

/// [`view`], to change.
pub fn view_mut(data: &mut [u8]) -> Result<Ipv6Packet<&mut [u8]>, DropReason> {
    let ip = Ipv6Packet::new_checked(data).map_err(|_| DropReason::Malformed)?;
    if ip.version() != 6 {
        return Err(DropReason::Malformed);
    }
    Ok(ip)
}

/// The fields of a fragment header (RFC 8200 §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// Offset of this fragment's data, in 8-octet units.
    pub offset: u16,
    /// The M flag: more fragments follow.
    pub more: bool,
    /// The Identification that, with source and destination, names the
    /// datagram the fragment belongs to.
    pub ident: u32,
}

/// Where the extension-header chain of a datagram ends, and what follows.
/// Every index is into the `packet` given to [`upper_layer`] and lies
/// within its payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upper {
    /// The first next-header value that is not an extension header the
    /// walk passes over: TCP 6, UDP 17, ICMPv6 58, ESP 50, AH 51, no next
    /// header 59, Mobility 135, ... For a non-first fragment, the next
    /// header of its fragment header (what the rest of the datagram starts
    /// with, not in this fragment).
    pub protocol: u8,
    /// Where that header starts (for a non-first fragment: where the
    /// fragment's data starts).
    pub offset: usize,
    /// The byte that holds `protocol`: 6 when there are no extension
    /// headers.
    pub next_header_at: usize,
    /// Where a transport-mode ESP header goes (RFC 4303 §3.1.1): after
    /// hop-by-hop, routing and fragment headers, and after destination
    /// options that come before a routing header (they are for the
    /// intermediate destinations, which must read them). Destination
    /// options after the routing header, or with none, are for the final
    /// destination and go inside ESP.
    pub esp_insert_at: usize,
    /// The next-header byte that names the header at `esp_insert_at`: the
    /// one transport-mode ESP sets to 50.
    pub esp_next_header_at: usize,
    /// The fragment header, if the datagram is a fragment.
    pub fragment: Option<Fragment>,
    /// TCP, UDP or SCTP source and destination ports, when this is not a
    /// non-first fragment and the four bytes are there; otherwise none
    /// (OPAQUE, RFC 4301 §4.4.1.1), as `wire::flow` has it for IPv4.
    pub ports: Option<(u16, u16)>,
}

/// Walks the extension headers of the IPv6 datagram `packet` (starting at
/// its fixed header) to the upper-layer header. Hop-by-hop options must
/// come first (RFC 8200 §4.3); a header that runs past the payload length,
/// a second fragment header, or more than `MAX_EXTENSION_HEADERS` (8)
/// headers make the datagram `Malformed`. A non-first fragment ends the
/// walk at its fragment header: what follows is data, not headers.
pub fn upper_layer(packet: &[u8]) -> Result<Upper, DropReason> {
    let ip = view(packet)?;
    // The payload length bounds the walk, not the buffer: padding after
    // the datagram is not part of it.
    let end = ip.total_len();
    let packet = &packet[..end];

    let mut protocol = packet[6];
    let mut next_header_at = 6;
    let mut offset = HEADER_LEN;
    let mut esp_insert_at = HEADER_LEN;
    let mut esp_next_header_at = 6;
    let mut fragment = None;
    let mut non_first_fragment = false;

    for count in 0..=MAX_EXTENSION_HEADERS {
        let is_extension = matches!(
            protocol,
            next::HOP_BY_HOP | next::ROUTING | next::FRAGMENT | next::DEST_OPTIONS
        );
        if !is_extension || non_first_fragment {
            break;
        }
        if count == MAX_EXTENSION_HEADERS {
            return Err(DropReason::Malformed);
        }
        if protocol == next::HOP_BY_HOP && offset != HEADER_LEN {
            return Err(DropReason::Malformed);
        }
        // Every extension header starts with its next header and, except
        // the fragment header's reserved byte, its length in 8-octet units
        // not counting the first 8.
        let header = packet.get(offset..offset + 2).ok_or(DropReason::Malformed)?;
        let len = if protocol == next::FRAGMENT {
            8
        } else {
            (usize::from(header[1]) + 1) * 8
        };
        let body = packet.get(offset..offset + len).ok_or(DropReason::Malformed)?;
        match protocol {
            next::FRAGMENT => {
                if fragment.is_some() {
                    return Err(DropReason::Malformed);
                }
                let word = u16::from_be_bytes([body[2], body[3]]);
                let frag = Fragment {
                    offset: word >> 3,
                    more: word & 1 != 0,
                    ident: u32::from_be_bytes([body[4], body[5], body[6], body[7]]),
                };
                non_first_fragment = frag.offset != 0;
                fragment = Some(frag);
                esp_insert_at = offset + len;
                esp_next_header_at = offset;
            }
            next::HOP_BY_HOP | next::ROUTING => {
                // A routing header also moves the insertion point past
                // the destination options before it.
                esp_insert_at = offset + len;
                esp_next_header_at = offset;
            }
            // Destination options: ESP goes after them only if a routing
            // header follows, which then moves the point itself.
            _ => {}
        }
        next_header_at = offset;
        protocol = body[0];
        offset += len;
    }

    let ports = match protocol {
        proto::TCP | proto::UDP | proto::SCTP if !non_first_fragment => packet
            .get(offset..offset + 4)
            .map(|p| (u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]]))),
        _ => None,
    };
    Ok(Upper {
        protocol,
        offset,
        next_header_at,
        esp_insert_at,
        esp_next_header_at,
        fragment,
        ports,
    })
}

/// Which extension headers a node processes (RFC 8200 §4): a router on
/// the packet's path reads the hop-by-hop options only (§4.3); the
/// destination (of the packet, or the node that terminates the ESP it
/// carries) reads the routing header (§4.4) and the destination options
/// (§4.6) too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Forwarding the packet: hop-by-hop options only.
    Router,
    /// Its destination, or the end of the ESP it carries: hop-by-hop
    /// options, routing header and destination options.
    Destination,
}

/// Why a packet's extension headers cannot be obeyed, as RFC 8200 §4.2 and
/// §4.4 have the node answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// What the packet is dropped as: an unrecognised option or routing
    /// type, or `Malformed` for options that run past their header.
    pub reason: DropReason,
    /// The ICMPv6 parameter problem the rules ask for: its code (0 for
    /// the routing type, 2 for an option) and pointer (the offending byte's
    /// offset from the start of the IPv6 header); `None`: discard silently.
    pub problem: Option<(u8, u32)>,
}

impl Refusal {
    const MALFORMED: Refusal = Refusal {
        reason: DropReason::Malformed,
        problem: None,
    };
}

/// Pad1 and PadN (RFC 8200 §4.2), the only options this node recognises:
/// every other option is acted on by the two high bits of its type.
const PAD1: u8 = 0;
const PADN: u8 = 1;

/// Applies RFC 8200's rules for the extension headers of the datagram
/// `packet` that a node in `role` processes, up to the upper-layer header
/// or a fragment header (what follows one is the reassembled datagram's
/// to obey):
/// - each option of a hop-by-hop or destination options header (§4.2):
///   Pad1 and PadN skipped; any other by its type's two high bits: 00
///   skipped, 01 discard, 10 discard and a parameter problem (code 2,
///   pointing at the option's type), 11 the same but the problem only
///   when the destination is not multicast;
/// - a routing header (§4.4): with segments left, its type is one this
///   node does not implement (none is: type 0 is deprecated, RFC 5095),
///   so discard and a parameter problem (code 0, pointing at the routing
///   type); with none left, ignored.
///
/// A chain that does not parse is `Malformed` here too ([`upper_layer`]
/// says more). Allocates nothing; a packet without extension headers
/// costs one comparison.
pub fn obey(packet: &[u8], role: Role) -> Result<(), Refusal> {
    let ip = view(packet).map_err(|_| Refusal::MALFORMED)?;
    let packet = &packet[..ip.total_len()];
    let multicast = ip.dst_addr().is_multicast();
    let mut protocol = packet[6];
    let mut offset = HEADER_LEN;
    for count in 0..=MAX_EXTENSION_HEADERS {
        let processed = match protocol {
            next::HOP_BY_HOP => true,
            next::DEST_OPTIONS | next::ROUTING => role == Role::Destination,
            _ => false,
        };
        if !processed {
            return Ok(());
        }
        if count == MAX_EXTENSION_HEADERS {
            return Err(Refusal::MALFORMED);
        }
        let header = packet.get(offset..offset + 2).ok_or(Refusal::MALFORMED)?;
        let len = (usize::from(header[1]) + 1) * 8;
        let body = packet.get(offset..offset + len).ok_or(Refusal::MALFORMED)?;
        if protocol == next::ROUTING {
            if body[3] > 0 {
                return Err(Refusal {
                    reason: DropReason::Ipv6UnknownRouting,
                    problem: Some((0, (offset + 2) as u32)),
                });
            }
        } else {
            options(body, offset, multicast)?;
        }
        protocol = body[0];
        offset += len;
    }
    Ok(())
}

/// The options of one hop-by-hop or destination options header `body`,
/// which starts `at` bytes into the packet.
fn options(body: &[u8], at: usize, multicast: bool) -> Result<(), Refusal> {
    let mut i = 2;
    while i < body.len() {
        let kind = body[i];
        if kind == PAD1 {
            i += 1;
            continue;
        }
        let len = usize::from(*body.get(i + 1).ok_or(Refusal::MALFORMED)?);
        let next = i + 2 + len;
        if next > body.len() {
            return Err(Refusal::MALFORMED);
        }
        if kind != PADN {
            let problem = Some((2, (at + i) as u32));
            let refusal = |problem| {
                Err(Refusal {
                    reason: DropReason::Ipv6UnknownOption,
                    problem,
                })
            };
            match kind >> 6 {
                0b00 => {}
                0b01 => return refusal(None),
                0b10 => return refusal(problem),
                _ => return refusal(if multicast { None } else { problem }),
            }
        }
        i = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv6 datagram: the fixed header naming `first`, then `rest`.
    fn datagram(first: u8, rest: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(rest.len() as u16).to_be_bytes());
        p[6] = first;
        p[7] = 64;
        p[8..24].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p[24..40].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(rest);
        p
    }

    /// An options or routing header of `units` 8-octet units.
    fn ext(next: u8, units: usize) -> Vec<u8> {
        let mut h = vec![0u8; units * 8];
        h[0] = next;
        h[1] = (units - 1) as u8;
        h
    }

    fn frag(next: u8, offset: u16, more: bool, ident: u32) -> Vec<u8> {
        let mut h = vec![next, 0];
        h.extend_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
        h.extend_from_slice(&ident.to_be_bytes());
        h
    }

    const UDP: &[u8] = &[0x12, 0x34, 0x00, 0x35, 0, 8, 0, 0];

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn views_check_version_and_payload_length() {
        let mut p = datagram(17, UDP);
        assert!(view(&p).is_ok());
        p.push(0);
        assert!(view(&p).is_ok(), "padding after the payload is the caller's");
        p[5] += 2;
        assert_eq!(view(&p).err(), Some(DropReason::Malformed));
        p[5] -= 2;
        p[0] = 0x40;
        assert_eq!(view(&p).err(), Some(DropReason::Malformed));
        assert!(view_mut(&mut p).is_err());
        assert!(view(&p[..39]).is_err());
    }

    #[test]
    fn no_extension_headers() {
        let p = datagram(17, UDP);
        let u = upper_layer(&p).unwrap();
        assert_eq!(
            u,
            Upper {
                protocol: 17,
                offset: 40,
                next_header_at: 6,
                esp_insert_at: 40,
                esp_next_header_at: 6,
                fragment: None,
                ports: Some((0x1234, 53)),
            }
        );
    }

    #[test]
    fn hop_by_hop_goes_before_esp() {
        let p = datagram(0, &cat(&[&ext(6, 1), &[0, 80, 1, 187]]));
        let u = upper_layer(&p).unwrap();
        assert_eq!((u.protocol, u.offset, u.next_header_at), (6, 48, 40));
        assert_eq!((u.esp_insert_at, u.esp_next_header_at), (48, 40));
        assert_eq!(u.ports, Some((80, 443)));
    }

    #[test]
    fn hop_by_hop_only_first() {
        let p = datagram(60, &cat(&[&ext(0, 1), &ext(17, 1), UDP]));
        assert_eq!(upper_layer(&p), Err(DropReason::Malformed));
    }

    #[test]
    fn destination_options_alone_go_inside_esp() {
        let p = datagram(60, &cat(&[&ext(17, 2), UDP]));
        let u = upper_layer(&p).unwrap();
        assert_eq!((u.protocol, u.offset, u.next_header_at), (17, 56, 40));
        assert_eq!((u.esp_insert_at, u.esp_next_header_at), (40, 6));
        assert_eq!(u.ports, Some((0x1234, 53)));
    }

    #[test]
    fn destination_options_before_routing_stay_outside_esp() {
        // HbH, DestOpts, Routing, DestOpts, UDP (RFC 8200 §4.1 order).
        let p = datagram(
            0,
            &cat(&[&ext(60, 1), &ext(43, 1), &ext(60, 3), &ext(17, 1), UDP]),
        );
        let u = upper_layer(&p).unwrap();
        // Routing at 56..80, the final destination's options at 80..88.
        assert_eq!((u.protocol, u.offset, u.next_header_at), (17, 88, 80));
        assert_eq!((u.esp_insert_at, u.esp_next_header_at), (80, 56));
        assert!(u.ports.is_some());
    }

    #[test]
    fn first_fragment_has_ports() {
        let p = datagram(44, &cat(&[&frag(17, 0, true, 0xdead_beef), UDP]));
        let u = upper_layer(&p).unwrap();
        assert_eq!(
            u.fragment,
            Some(Fragment {
                offset: 0,
                more: true,
                ident: 0xdead_beef
            })
        );
        assert_eq!((u.protocol, u.offset, u.next_header_at), (17, 48, 40));
        assert_eq!((u.esp_insert_at, u.esp_next_header_at), (48, 40));
        assert_eq!(u.ports, Some((0x1234, 53)));
    }

    #[test]
    fn non_first_fragment_has_no_ports_and_ends_the_walk() {
        // The data of a non-first fragment may look like anything,
        // here a hop-by-hop header that would otherwise be refused.
        let p = datagram(44, &cat(&[&frag(60, 185, false, 7), &ext(0, 1)]));
        let u = upper_layer(&p).unwrap();
        assert_eq!(u.protocol, 60);
        assert_eq!(u.offset, 48);
        assert_eq!(u.ports, None);
        assert_eq!(u.fragment.map(|f| (f.offset, f.more)), Some((185, false)));
    }

    #[test]
    fn second_fragment_header_is_malformed() {
        let p = datagram(44, &cat(&[&frag(44, 0, true, 1), &frag(17, 0, true, 1), UDP]));
        assert_eq!(upper_layer(&p), Err(DropReason::Malformed));
    }

    #[test]
    fn esp_and_ah_and_none_end_the_walk() {
        for protocol in [50u8, 51, 59, 58, 135] {
            let p = datagram(43, &cat(&[&ext(protocol, 1), &[0; 8]]));
            let u = upper_layer(&p).unwrap();
            assert_eq!((u.protocol, u.offset, u.ports), (protocol, 48, None));
        }
    }

    #[test]
    fn truncated_chains_are_malformed() {
        // The header's length runs past the payload.
        let p = datagram(60, &ext(17, 2)[..8]);
        assert_eq!(upper_layer(&p), Err(DropReason::Malformed));
        // Not even the two bytes of next header and length.
        let p = datagram(43, &[17]);
        assert_eq!(upper_layer(&p), Err(DropReason::Malformed));
        // A short fragment header.
        let p = datagram(44, &frag(17, 0, false, 1)[..6]);
        assert_eq!(upper_layer(&p), Err(DropReason::Malformed));
        // Present in the buffer but past the payload length.
        let mut p = datagram(60, &cat(&[&ext(17, 1), UDP]));
        p[5] = 4;
        assert_eq!(upper_layer(&p), Err(DropReason::Malformed));
    }

    #[test]
    fn short_transport_header_has_no_ports() {
        let p = datagram(17, &UDP[..3]);
        let u = upper_layer(&p).unwrap();
        assert_eq!((u.protocol, u.ports), (17, None));
    }

    #[test]
    fn long_chains_are_refused() {
        let mut rest = Vec::new();
        for _ in 0..MAX_EXTENSION_HEADERS {
            rest.extend_from_slice(&ext(60, 1));
        }
        let last = rest.len() - 8;
        rest[last] = 17;
        rest.extend_from_slice(UDP);
        assert!(upper_layer(&datagram(60, &rest)).is_ok(), "at the bound");
        rest[last] = 60;
        let mut longer = rest[..rest.len() - UDP.len()].to_vec();
        longer.extend_from_slice(&ext(17, 1));
        longer.extend_from_slice(UDP);
        assert_eq!(upper_layer(&datagram(60, &longer)), Err(DropReason::Malformed));
    }

    /// An options header of one unit naming `next`, holding `option` then
    /// PadN to the end of its 8 bytes.
    fn opts(next: u8, option: &[u8]) -> Vec<u8> {
        let mut h = vec![next, 0];
        h.extend_from_slice(option);
        let pad = 8 - h.len();
        match pad {
            0 => {}
            1 => h.push(PAD1),
            n => {
                h.extend_from_slice(&[PADN, (n - 2) as u8]);
                h.resize(8, 0);
            }
        }
        h
    }

    fn routing(next: u8, kind: u8, segments_left: u8) -> Vec<u8> {
        let mut h = ext(next, 1);
        h[2] = kind;
        h[3] = segments_left;
        h
    }

    fn refusal(reason: DropReason, problem: Option<(u8, u32)>) -> Result<(), Refusal> {
        Err(Refusal { reason, problem })
    }

    #[test]
    fn options_are_obeyed_by_their_action_bits() {
        let esp = &[0u8; 16];
        // Pad1, PadN and an unrecognised option with 00: skipped.
        for option in [&[PAD1][..], &[PADN, 2, 0, 0], &[0x1e, 2, 1, 2], &[5, 2, 0, 0]] {
            let p = datagram(60, &cat(&[&opts(50, option), esp]));
            assert_eq!(obey(&p, Role::Destination), Ok(()), "{option:?}");
        }
        // 01: discarded silently; 10: a problem pointing at the option
        // (40 bytes of fixed header and the option header's 2).
        let p = datagram(60, &cat(&[&opts(50, &[0x5e, 0]), esp]));
        assert_eq!(
            obey(&p, Role::Destination),
            refusal(DropReason::Ipv6UnknownOption, None)
        );
        let p = datagram(0, &cat(&[&opts(50, &[PAD1, 0x9e, 1, 0]), esp]));
        assert_eq!(
            obey(&p, Role::Router),
            refusal(DropReason::Ipv6UnknownOption, Some((2, 43)))
        );
        // 11: the problem only to a unicast destination.
        let mut p = datagram(0, &cat(&[&opts(50, &[0xc2, 4, 0, 0, 0, 0]), esp]));
        assert_eq!(
            obey(&p, Role::Router),
            refusal(DropReason::Ipv6UnknownOption, Some((2, 42)))
        );
        p[24] = 0xff;
        assert_eq!(
            obey(&p, Role::Router),
            refusal(DropReason::Ipv6UnknownOption, None)
        );
        // An option that runs past its header.
        let p = datagram(60, &cat(&[&opts(50, &[0x1e, 9]), esp]));
        assert_eq!(obey(&p, Role::Destination), Err(Refusal::MALFORMED));
    }

    #[test]
    fn a_router_reads_hop_by_hop_only() {
        let esp = &[0u8; 16];
        let bad_dest = opts(50, &[0x9e, 0]);
        let p = datagram(60, &cat(&[&bad_dest, esp]));
        assert_eq!(obey(&p, Role::Router), Ok(()));
        assert!(obey(&p, Role::Destination).is_err());
        let p = datagram(43, &cat(&[&routing(50, 253, 1), esp]));
        assert_eq!(obey(&p, Role::Router), Ok(()));
        // Behind a good hop-by-hop header too.
        let p = datagram(0, &cat(&[&opts(60, &[]), &bad_dest, esp]));
        assert_eq!(obey(&p, Role::Router), Ok(()));
        assert_eq!(
            obey(&p, Role::Destination),
            refusal(DropReason::Ipv6UnknownOption, Some((2, 50)))
        );
    }

    #[test]
    fn unknown_routing_types_with_segments_left_are_refused() {
        let esp = &[0u8; 16];
        for kind in [0u8, 2, 3, 4, 253] {
            let p = datagram(43, &cat(&[&routing(50, kind, 1), esp]));
            assert_eq!(
                obey(&p, Role::Destination),
                refusal(DropReason::Ipv6UnknownRouting, Some((0, 42))),
                "type {kind}"
            );
            let p = datagram(43, &cat(&[&routing(50, kind, 0), esp]));
            assert_eq!(obey(&p, Role::Destination), Ok(()), "type {kind}, none left");
        }
        // After destination options, which are read first.
        let p = datagram(60, &cat(&[&opts(43, &[]), &routing(50, 0, 2), esp]));
        assert_eq!(
            obey(&p, Role::Destination),
            refusal(DropReason::Ipv6UnknownRouting, Some((0, 50)))
        );
    }

    #[test]
    fn what_follows_a_fragment_header_is_not_read() {
        let p = datagram(
            44,
            &cat(&[&frag(60, 0, true, 1), &opts(50, &[0x9e, 0]), &[0; 16]]),
        );
        assert_eq!(obey(&p, Role::Destination), Ok(()));
        let p = datagram(17, UDP);
        assert_eq!(obey(&p, Role::Destination), Ok(()));
    }
}
