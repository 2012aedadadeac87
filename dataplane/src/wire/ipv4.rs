//! Checked IPv4 views of a packet buffer. Classification checks every
//! datagram once (`gateway::classify`), but the buffer changes afterwards:
//! headers are rewritten, trailers cut, fragments made. These views check
//! again when they are taken, so that no accessor of the view can panic
//! whatever happened to the bytes since; `smoltcp`'s `new_checked` does the
//! work. Owns no state; must not be used to build headers from nothing
//! (the builders write fixed-size headers of their own).

use smoltcp::wire::Ipv4Packet;

use crate::stats::DropReason;

/// A whole datagram: a header of at least 20 bytes and a total length that
/// the buffer holds. Anything else is `Malformed`.
pub fn view(data: &[u8]) -> Result<Ipv4Packet<&[u8]>, DropReason> {
    Ipv4Packet::new_checked(data).map_err(|_| DropReason::Malformed)
}

/// [`view`], to change.
pub fn view_mut(data: &mut [u8]) -> Result<Ipv4Packet<&mut [u8]>, DropReason> {
    Ipv4Packet::new_checked(data).map_err(|_| DropReason::Malformed)
}

/// A header whose total length is about to be rewritten (a fragment, a
/// reassembled or re-framed datagram): the header itself must lie in
/// `data`, its total length need not match yet. The setters and
/// `fill_checksum` touch no byte past the header.
pub fn header_mut(data: &mut [u8]) -> Result<Ipv4Packet<&mut [u8]>, DropReason> {
    let header_len = usize::from(data.first().ok_or(DropReason::Malformed)? & 0x0f) * 4;
    if header_len < 20 || header_len > data.len() {
        return Err(DropReason::Malformed);
    }
    Ok(Ipv4Packet::new_unchecked(data))
}

/// The header length of a datagram that [`view`] accepts.
pub fn header_len(data: &[u8]) -> Result<usize, DropReason> {
    view(data).map(|ip| usize::from(ip.header_len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_refuse_what_would_make_an_accessor_panic() {
        let mut header = [0u8; 24];
        header[0] = 0x45;
        header[3] = 24;
        assert!(view(&header).is_ok());
        assert_eq!(header_len(&header), Ok(20));
        // Total length past the buffer, header length past it or short.
        header[3] = 25;
        assert_eq!(view(&header).err(), Some(DropReason::Malformed));
        assert!(
            header_mut(&mut header).is_ok(),
            "a header to rewrite needs only itself"
        );
        header[0] = 0x47;
        assert!(header_mut(&mut header).is_err());
        header[0] = 0x44;
        assert!(header_mut(&mut header).is_err());
        assert!(header_mut(&mut []).is_err());
        assert!(view(&header[..19]).is_err());
    }
}
