//! The virtio-net header (`struct virtio_net_hdr`, linux/virtio_net.h;
//! virtio spec 1.2 §5.1.6) that an AF_PACKET socket with `PACKET_VNET_HDR`
//! puts before every frame it reads and expects before every frame it
//! sends. On receive it carries the offload state the kernel left: a
//! checksum still to be filled (`VIRTIO_NET_HDR_F_NEEDS_CSUM` with
//! `csum_start`/`csum_offset`) and whether the frame is a GSO super-packet
//! (`gso_type`, `gso_size`).
//!
//! AF_PACKET writes the legacy header in the host's byte order
//! (`vio_le()` is `virtio_legacy_is_little_endian()`), so fields are read
//! in native order.

/// Bytes of `struct virtio_net_hdr` (without `num_buffers`).
pub const HEADER_LEN: usize = 10;

mod field {
    use core::ops::Range;
    pub(crate) const FLAGS: usize = 0;
    pub(crate) const GSO_TYPE: usize = 1;
    pub(crate) const HDR_LEN: Range<usize> = 2..4;
    pub(crate) const GSO_SIZE: Range<usize> = 4..6;
    pub(crate) const CSUM_START: Range<usize> = 6..8;
    pub(crate) const CSUM_OFFSET: Range<usize> = 8..10;
}

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum from `csum_start` to the end
/// is still to be computed and stored at `csum_start + csum_offset`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was already verified.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_ECN`: ORed into `gso_type` when the TCP segments
/// carry CWR/ECE.
pub const GSO_ECN: u8 = 0x80;

/// What `gso_type` says the frame is (without the ECN bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gso {
    /// `VIRTIO_NET_HDR_GSO_NONE`: an ordinary frame.
    None,
    /// `VIRTIO_NET_HDR_GSO_TCPV4`: TCP over IPv4, to be cut into
    /// `gso_size`-byte segments.
    TcpV4,
    /// `VIRTIO_NET_HDR_GSO_UDP`: UDP fragmentation offload (one datagram,
    /// IP fragments).
    Ufo,
    /// `VIRTIO_NET_HDR_GSO_TCPV6`.
    TcpV6,
    /// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation, `gso_size` bytes of
    /// payload per datagram.
    UdpL4,
    /// A value this code does not know.
    Other(u8),
}

impl Gso {
    fn from_byte(b: u8) -> Gso {
        match b & !GSO_ECN {
            0 => Gso::None,
            1 => Gso::TcpV4,
            3 => Gso::Ufo,
            4 => Gso::TcpV6,
            5 => Gso::UdpL4,
            other => Gso::Other(other),
        }
    }
}

/// Why bytes are not a virtio-net header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VnetError {
    /// Fewer than [`HEADER_LEN`] bytes (how many there were).
    #[error("a virtio-net header is {HEADER_LEN} bytes, got {0}")]
    Truncated(usize),
}

/// A view over a virtio-net header.
#[derive(Debug, Clone, Copy)]
pub struct VnetHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VnetHeader<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        VnetHeader { buffer }
    }

    /// Wraps `buffer` once it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<Self, VnetError> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(VnetError::Truncated(len));
        }
        Ok(VnetHeader { buffer })
    }

    fn u16_at(&self, range: core::ops::Range<usize>) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_ne_bytes([b[range.start], b[range.start + 1]])
    }

    /// The `flags` byte: [`F_NEEDS_CSUM`], [`F_DATA_VALID`].
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The `gso_type` byte as it is, [`GSO_ECN`] bit included.
    pub fn gso_type_raw(&self) -> u8 {
        self.buffer.as_ref()[field::GSO_TYPE]
    }

    /// What `gso_type` says the frame is.
    pub fn gso_type(&self) -> Gso {
        Gso::from_byte(self.gso_type_raw())
    }

    /// Bytes of headers before the payload (a hint only: AF_PACKET reports
    /// the linear part of the buffer).
    pub fn hdr_len(&self) -> u16 {
        self.u16_at(field::HDR_LEN)
    }

    /// Payload bytes per segment of a GSO frame.
    pub fn gso_size(&self) -> u16 {
        self.u16_at(field::GSO_SIZE)
    }

    /// Where checksumming starts, from the start of the frame.
    pub fn csum_start(&self) -> u16 {
        self.u16_at(field::CSUM_START)
    }

    /// Where the checksum goes, from `csum_start`.
    pub fn csum_offset(&self) -> u16 {
        self.u16_at(field::CSUM_OFFSET)
    }

    /// True when the frame's checksum is still to be filled in
    /// ([`csum_start`](Self::csum_start), [`csum_offset`](Self::csum_offset)).
    pub fn needs_csum(&self) -> bool {
        self.flags() & F_NEEDS_CSUM != 0
    }

    /// The buffer the view was over.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VnetHeader<T> {
    fn set_u16_at(&mut self, range: core::ops::Range<usize>, value: u16) {
        self.buffer.as_mut()[range].copy_from_slice(&value.to_ne_bytes());
    }

    /// Sets the `flags` byte.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::FLAGS] = value;
    }

    /// Sets the `gso_type` byte, [`GSO_ECN`] bit included.
    pub fn set_gso_type_raw(&mut self, value: u8) {
        self.buffer.as_mut()[field::GSO_TYPE] = value;
    }

    /// Sets [`hdr_len`](Self::hdr_len).
    pub fn set_hdr_len(&mut self, value: u16) {
        self.set_u16_at(field::HDR_LEN, value);
    }

    /// Sets [`gso_size`](Self::gso_size).
    pub fn set_gso_size(&mut self, value: u16) {
        self.set_u16_at(field::GSO_SIZE, value);
    }

    /// Sets [`csum_start`](Self::csum_start).
    pub fn set_csum_start(&mut self, value: u16) {
        self.set_u16_at(field::CSUM_START, value);
    }

    /// Sets [`csum_offset`](Self::csum_offset).
    pub fn set_csum_offset(&mut self, value: u16) {
        self.set_u16_at(field::CSUM_OFFSET, value);
    }
}

/// The parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VnetRepr {
    /// `Some((csum_start, csum_offset))` when the checksum is left to fill.
    pub partial_csum: Option<(u16, u16)>,
    /// The kernel already verified the frame's checksum
    /// ([`F_DATA_VALID`]).
    pub data_valid: bool,
    /// Whether, and how, the frame is a GSO super-packet to be cut up.
    pub gso: Gso,
    /// The ECN bit of `gso_type`.
    pub gso_ecn: bool,
    /// Payload bytes per segment of a GSO frame; 0 for an ordinary one.
    pub gso_size: u16,
    /// Bytes of headers before the payload (a hint only).
    pub hdr_len: u16,
}

impl VnetRepr {
    /// Nothing for anyone to do: what espgw writes before a frame it sends.
    pub const COMPLETE: VnetRepr = VnetRepr {
        partial_csum: None,
        data_valid: false,
        gso: Gso::None,
        gso_ecn: false,
        gso_size: 0,
        hdr_len: 0,
    };

    /// Reads every field of `header`.
    pub fn parse<T: AsRef<[u8]>>(header: &VnetHeader<T>) -> VnetRepr {
        VnetRepr {
            partial_csum: header
                .needs_csum()
                .then(|| (header.csum_start(), header.csum_offset())),
            data_valid: header.flags() & F_DATA_VALID != 0,
            gso: header.gso_type(),
            gso_ecn: header.gso_type_raw() & GSO_ECN != 0,
            gso_size: header.gso_size(),
            hdr_len: header.hdr_len(),
        }
    }

    /// Parses the first [`HEADER_LEN`] bytes of `bytes`.
    pub fn parse_bytes(bytes: &[u8]) -> Result<VnetRepr, VnetError> {
        VnetHeader::new_checked(bytes).map(|h| VnetRepr::parse(&h))
    }

    /// Writes this header into `header`, every field of it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut VnetHeader<T>) {
        let mut flags = 0;
        if self.partial_csum.is_some() {
            flags |= F_NEEDS_CSUM;
        }
        if self.data_valid {
            flags |= F_DATA_VALID;
        }
        header.set_flags(flags);
        let gso = match self.gso {
            Gso::None => 0,
            Gso::TcpV4 => 1,
            Gso::Ufo => 3,
            Gso::TcpV6 => 4,
            Gso::UdpL4 => 5,
            Gso::Other(v) => v & !GSO_ECN,
        };
        header.set_gso_type_raw(gso | if self.gso_ecn { GSO_ECN } else { 0 });
        header.set_hdr_len(self.hdr_len);
        header.set_gso_size(self.gso_size);
        let (start, offset) = self.partial_csum.unwrap_or((0, 0));
        header.set_csum_start(start);
        header.set_csum_offset(offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ne(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }

    /// A TSO frame of a local TCP sender on veth, as AF_PACKET reports
    /// it (see `headers_captured_from_linux`): NEEDS_CSUM, TCPV4, hdr_len
    /// 66 (Ethernet + IPv4 + TCP with timestamps), gso_size 1448,
    /// csum_start 34 (Ethernet + IPv4), csum_offset 16 (the TCP checksum).
    fn tso_bytes() -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = 0x01;
        b[1] = 0x01;
        b[2..4].copy_from_slice(&ne(66));
        b[4..6].copy_from_slice(&ne(1448));
        b[6..8].copy_from_slice(&ne(34));
        b[8..10].copy_from_slice(&ne(16));
        b
    }

    #[test]
    fn deconstruct() {
        let bytes = tso_bytes();
        let h = VnetHeader::new_checked(&bytes[..]).expect("whole header");
        assert_eq!(h.flags(), F_NEEDS_CSUM);
        assert_eq!(h.gso_type(), Gso::TcpV4);
        assert_eq!(h.hdr_len(), 66);
        assert_eq!(h.gso_size(), 1448);
        assert_eq!(h.csum_start(), 34);
        assert_eq!(h.csum_offset(), 16);
        assert!(h.needs_csum());
    }

    #[test]
    fn construct() {
        let mut bytes = [0xffu8; HEADER_LEN];
        let mut h = VnetHeader::new_unchecked(&mut bytes[..]);
        h.set_flags(F_NEEDS_CSUM);
        h.set_gso_type_raw(1);
        h.set_hdr_len(66);
        h.set_gso_size(1448);
        h.set_csum_start(34);
        h.set_csum_offset(16);
        assert_eq!(bytes, tso_bytes());
    }

    #[test]
    fn check_len() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                VnetHeader::new_checked(&tso_bytes()[..len]).err(),
                Some(VnetError::Truncated(len))
            );
        }
        assert!(VnetHeader::new_checked(&[0u8; 12][..]).is_ok());
    }

    #[test]
    fn parse_and_emit() {
        let repr = VnetRepr::parse_bytes(&tso_bytes()).expect("whole header");
        assert_eq!(
            repr,
            VnetRepr {
                partial_csum: Some((34, 16)),
                data_valid: false,
                gso: Gso::TcpV4,
                gso_ecn: false,
                gso_size: 1448,
                hdr_len: 66,
            }
        );
        let mut out = [0u8; HEADER_LEN];
        repr.emit(&mut VnetHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, tso_bytes());
    }

    /// Headers AF_PACKET (`PACKET_VNET_HDR`) gave on the receiving end of
    /// a veth pair, Linux 6.18, x86-64, for a local TCP sender's SYN, one
    /// of its TSO frames (7306 bytes), a UDP datagram, and a UDP_SEGMENT
    /// send of 5001 bytes in 1000-byte datagrams (one 5043-byte frame).
    #[cfg(target_endian = "little")]
    #[test]
    fn headers_captured_from_linux() {
        let syn = [0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x22, 0x00, 0x10, 0x00];
        let tso = [0x01, 0x01, 0x42, 0x00, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00];
        let udp = [0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x22, 0x00, 0x06, 0x00];
        let udp_gso = [0x01, 0x05, 0x2a, 0x00, 0xe8, 0x03, 0x22, 0x00, 0x06, 0x00];
        assert_eq!(tso, tso_bytes());
        let p = |b: &[u8]| VnetRepr::parse_bytes(b).expect("whole header");
        assert_eq!((p(&syn).partial_csum, p(&syn).gso), (Some((34, 16)), Gso::None));
        assert_eq!(
            (p(&tso).gso, p(&tso).gso_size, p(&tso).hdr_len),
            (Gso::TcpV4, 1448, 66)
        );
        assert_eq!((p(&udp).partial_csum, p(&udp).gso), (Some((34, 6)), Gso::None));
        let g = p(&udp_gso);
        assert_eq!(
            (g.partial_csum, g.gso, g.gso_size, g.hdr_len),
            (Some((34, 6)), Gso::UdpL4, 1000, 42)
        );
    }

    #[test]
    fn complete_is_all_zero() {
        let mut out = [0xaau8; HEADER_LEN];
        VnetRepr::COMPLETE.emit(&mut VnetHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, [0u8; HEADER_LEN]);
    }

    #[test]
    fn udp_partial_and_gso_types() {
        // A UDP datagram from a local socket on veth: NEEDS_CSUM, no GSO,
        // csum_start 34, csum_offset 6 (the UDP checksum field).
        let mut b = [0u8; HEADER_LEN];
        b[0] = 0x01;
        b[6..8].copy_from_slice(&ne(34));
        b[8..10].copy_from_slice(&ne(6));
        let repr = VnetRepr::parse_bytes(&b).expect("whole header");
        assert_eq!(repr.partial_csum, Some((34, 6)));
        assert_eq!(repr.gso, Gso::None);
        for (byte, gso, ecn) in [
            (0u8, Gso::None, false),
            (1, Gso::TcpV4, false),
            (0x81, Gso::TcpV4, true),
            (3, Gso::Ufo, false),
            (4, Gso::TcpV6, false),
            (5, Gso::UdpL4, false),
            (9, Gso::Other(9), false),
        ] {
            b[1] = byte;
            let repr = VnetRepr::parse_bytes(&b).expect("whole header");
            assert_eq!((repr.gso, repr.gso_ecn), (gso, ecn), "gso_type {byte:#x}");
        }
    }
}
