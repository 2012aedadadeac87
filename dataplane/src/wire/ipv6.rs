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
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const DEST_OPTIONS: u8 = 60;
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
/// a second fragment header, or more than [`MAX_EXTENSION_HEADERS`]
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
}
