//! ESP encapsulation and decapsulation (RFC 4303), split into *prepare* and
//! *finish* halves around the offload boundary, working in place in a
//! [`PacketBuf`] whose data is an IP packet: IPv4 or, in tunnel mode, IPv6
//! (next header 41), always behind an IPv4 outer header.
//!
//! Prepare writes every header, the sequence number, IV, padding and trailer
//! and returns the descriptor; the engine runs it over the bytes from the
//! ESP header on; finish checks the status and, inbound, updates the replay
//! window (only now that the ICV has verified), checks the trailer and
//! strips ESP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use accel::{Algorithm, CipherKind, Descriptor, Direction, SessionHandle, SessionSpec, Status};
use rand::Rng;
use smoltcp::wire::{IpProtocol, Ipv4Packet};
use spd_sad::{
    proto, Mode, ReplayError, SaDirection, SaId, SaState, Sad, SecurityAssociation, SequenceError, UdpEncap,
};

use crate::buffer::PacketBuf;
use crate::stats::DropReason;
use crate::wire::esp::{self, EspPacket, EspTrailer};
use crate::wire::ipv4;

/// RFC 4303 §2.6: next header 59 marks a dummy packet to be discarded.
pub const NEXT_HEADER_NONE: u8 = 59;
/// IP-in-IP: the next header of a tunnel-mode IPv4 payload.
pub const NEXT_HEADER_IPV4: u8 = 4;
/// The next header of a tunnel-mode IPv6 payload (RFC 2473).
pub const NEXT_HEADER_IPV6: u8 = 41;
/// IPv4 header length without options.
pub const IPV4_HEADER_LEN: usize = 20;

/// What the gateway keeps of an SA's crypto: the handle its engine issued
/// and the algorithm (which lays the packet out). The keys are kept, in
/// wiped memory shared by every worker's copy, only so that a fork can
/// register the SA with its own engine; no packet touches them.
#[derive(Clone)]
pub struct SaCrypto {
    /// The session this SA's keys have in this worker's engine; every job
    /// of the SA names it.
    pub handle: SessionHandle,
    /// The ESP transform, which fixes the IV, padding and ICV lengths.
    pub algorithm: Algorithm,
    /// Tunnel mode: the outer header, built once.
    pub outer: OuterHeader,
    pub(crate) keys: Arc<SessionSpec>,
    /// UDP-encapsulated SAs: where the peer is now, shared by every SA of
    /// its tunnel on every worker, and the address this copy last used or
    /// saw (so that a packet compares with a plain field, and the shared
    /// cell is read only when something moved).
    pub(crate) peer: Option<Arc<crate::nat::Peer>>,
    pub(crate) seen_peer: Option<crate::nat::PeerAddr>,
    /// How this SA's packets are laid out, chosen at install.
    pub(crate) plan: EspPlan,
}

/// How an SA's packets are wrapped and unwrapped, chosen once when the SA
/// is installed (as DPDK's `rte_ipsec_session_prepare` picks an SA's
/// prepare and process functions from its type), so that the per-packet
/// path takes the SA's plan instead of deciding from its mode, its ends'
/// family and its cipher. The plan is a shape matched at each step rather
/// than function pointers: the same branch for every packet of the SA, and
/// each function inlined where it is called, which function pointers
/// prevent.
#[derive(Clone, Copy)]
pub struct EspPlan {
    /// Which functions the SA's packets take (chosen here, once).
    shape: Shape,
    iv: IvSource,
}

/// The SA's mode and, in transport mode, its packets' family: which
/// layout, room, wrap and unwrap functions its packets take. A match on
/// it is one branch the SA's packets always take the same way, and lets
/// the compiler inline each function where a function pointer would not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Tunnel,
    Transport4,
    Transport6,
}

impl EspPlan {
    /// The plan of an SA in `mode` with `outer` (whose family, in
    /// transport mode, is the packets' own) and `algorithm`.
    pub fn new(mode: Mode, outer: &OuterHeader, algorithm: Algorithm) -> EspPlan {
        let iv = match algorithm.cipher() {
            // RFC 4106 §3.1, RFC 7634 §2: the IV must not repeat under one
            // key; the 64-bit sequence number never does.
            CipherKind::AesGcm | CipherKind::ChaCha20Poly1305 => IvSource::Sequence,
            // RFC 3602 §3 / RFC 2451: CBC IVs must be unpredictable.
            CipherKind::AesCbc | CipherKind::TripleDesCbc => IvSource::Random,
            CipherKind::Null => IvSource::None,
        };
        let shape = match (mode, outer.is_ipv6()) {
            (Mode::Tunnel, _) => Shape::Tunnel,
            (Mode::Transport, false) => Shape::Transport4,
            (Mode::Transport, true) => Shape::Transport6,
        };
        EspPlan { shape, iv }
    }

    /// Where the protected part starts, the next header ESP names, and the
    /// bytes in front of ESP, from the packet's own fields.
    #[inline]
    fn layout(&self, inner: &Inner, outer: &OuterHeader) -> Result<Layout, DropReason> {
        match self.shape {
            Shape::Tunnel => tunnel_layout(inner, outer),
            Shape::Transport4 => transport_layout::<4>(inner, outer),
            Shape::Transport6 => transport_layout::<6>(inner, outer),
        }
    }

    /// Makes room for ESP's header and IV in front of the protected part.
    #[inline]
    fn make_room(&self, buf: &mut PacketBuf, layout: &Layout, overhead: usize) -> bool {
        match self.shape {
            Shape::Tunnel => tunnel_room(buf, layout, overhead),
            Shape::Transport4 | Shape::Transport6 => transport_room(buf, layout, overhead),
        }
    }

    /// Writes the bytes in front of ESP (the outer header, or the
    /// transport-mode packet's own, updated).
    #[inline]
    fn wrap(&self, header: &mut [u8], wrap: &Wrap<'_>) -> Result<(), DropReason> {
        match self.shape {
            Shape::Tunnel => tunnel_wrap(header, wrap),
            Shape::Transport4 => transport4_wrap(header, wrap),
            Shape::Transport6 => transport6_wrap(header, wrap),
        }
    }

    /// Puts the inner packet back together once ESP is read.
    #[inline]
    fn unwrap(&self, buf: &mut PacketBuf, unwrap: &Unwrap) -> Result<(), UnwrapError> {
        match self.shape {
            Shape::Tunnel => tunnel_unwrap(buf, unwrap),
            Shape::Transport4 => transport4_unwrap(buf, unwrap),
            Shape::Transport6 => transport6_unwrap(buf, unwrap),
        }
    }
}

/// Where an SA's IVs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IvSource {
    /// The 64-bit sequence number (counter-mode AEADs).
    Sequence,
    /// The random generator (CBC).
    Random,
    /// None (null encryption).
    None,
}

/// How one outbound packet is laid out.
struct Layout {
    /// Offset of the protected part: 0 in tunnel mode, the header's length
    /// in transport mode.
    protected_start: usize,
    next_header: u8,
    /// Bytes in front of ESP once protected.
    outer_len: usize,
}

/// What writing the bytes in front of ESP reads.
struct Wrap<'a> {
    outer: &'a OuterHeader,
    inner: &'a Inner,
    total_len: u16,
    ip_id: u16,
}

/// What putting the inner packet back together reads.
struct Unwrap {
    esp_offset: usize,
    /// ESP's header and IV.
    esp_overhead: usize,
    /// Bytes of protected payload (without padding and trailer).
    payload_len: usize,
    next_header: u8,
}

/// Why an inner packet could not be put back together.
enum UnwrapError {
    /// Counted against the SA as malformed.
    Malformed,
    /// Another reason (an ECN combination RFC 6040 drops).
    Drop(DropReason),
}

/// Tunnel mode: the whole packet is protected, behind the outer header.
fn tunnel_layout(inner: &Inner, outer: &OuterHeader) -> Result<Layout, DropReason> {
    let next_header = if inner.family == 4 {
        NEXT_HEADER_IPV4
    } else {
        NEXT_HEADER_IPV6
    };
    Ok(Layout {
        protected_start: 0,
        next_header,
        outer_len: outer.header_len(),
    })
}

/// Transport mode keeps the packet's own header, whose family must be the
/// SA's ends' (`FAMILY`; the SPD's selectors see to it).
fn transport_layout<const FAMILY: u8>(inner: &Inner, _: &OuterHeader) -> Result<Layout, DropReason> {
    if inner.family != FAMILY {
        return Err(DropReason::PolicyMismatch);
    }
    // RFC 4301 §4.1: transport mode carries whole packets only.
    if inner.is_fragment {
        return Err(DropReason::Unsupported);
    }
    // Next header 59 marks a dummy packet, which the peer must discard
    // (RFC 4303 §2.6): such a payload cannot be carried in transport mode.
    if inner.protocol == NEXT_HEADER_NONE {
        return Err(DropReason::Unsupported);
    }
    Ok(Layout {
        protected_start: inner.header_len,
        next_header: inner.protocol,
        outer_len: inner.header_len,
    })
}

fn tunnel_room(buf: &mut PacketBuf, layout: &Layout, esp_overhead: usize) -> bool {
    buf.prepend(layout.outer_len + esp_overhead).is_some()
}

fn transport_room(buf: &mut PacketBuf, layout: &Layout, esp_overhead: usize) -> bool {
    buf.open_gap_after(layout.outer_len, esp_overhead)
}

/// RFC 4301 §5.1.2.1: DSCP copied; ECN copied (RFC 6040 normal mode); RFC
/// 4301 §8.1: DF copied from the inner header.
fn tunnel_wrap(header: &mut [u8], w: &Wrap<'_>) -> Result<(), DropReason> {
    w.outer
        .write(header, w.inner.tos, w.total_len, w.ip_id, w.inner.dont_fragment);
    Ok(())
}

fn transport4_wrap(header: &mut [u8], w: &Wrap<'_>) -> Result<(), DropReason> {
    let mut ip = ipv4::header_mut(header)?;
    ip.set_next_header(IpProtocol::from(proto::ESP));
    ip.set_total_len(w.total_len);
    ip.fill_checksum();
    Ok(())
}

/// RFC 4303 §3.1.1: ESP after the headers routers read, named by the byte
/// that named what it now protects.
fn transport6_wrap(header: &mut [u8], w: &Wrap<'_>) -> Result<(), DropReason> {
    header[w.inner.next_header_at] = proto::ESP;
    let payload_len = w.total_len - IPV6_HEADER_LEN as u16;
    header[4..6].copy_from_slice(&payload_len.to_be_bytes());
    Ok(())
}

fn tunnel_unwrap(buf: &mut PacketBuf, u: &Unwrap) -> Result<(), UnwrapError> {
    let outer_ecn = ecn_of(buf.data());
    buf.trim_front(u.esp_offset + u.esp_overhead);
    buf.truncate(u.payload_len);
    // RFC 4303 §2.7: tunnel-mode TFC padding may follow the inner packet;
    // its own total length says where it ends.
    let inner_len = match u.next_header {
        NEXT_HEADER_IPV4 => match Ipv4Packet::new_checked(buf.data()) {
            Ok(inner) if inner.version() == 4 && inner.verify_checksum() => usize::from(inner.total_len()),
            _ => return Err(UnwrapError::Malformed),
        },
        NEXT_HEADER_IPV6 => match crate::wire::ipv6::view(buf.data()) {
            Ok(inner) => inner.total_len(),
            Err(_) => return Err(UnwrapError::Malformed),
        },
        _ => return Err(UnwrapError::Malformed),
    };
    buf.truncate(inner_len);
    combine_ecn(buf.data_mut(), outer_ecn).map_err(UnwrapError::Drop)
}

fn transport6_unwrap(buf: &mut PacketBuf, u: &Unwrap) -> Result<(), UnwrapError> {
    // The byte that names ESP names what ESP protected again.
    let named_esp = match crate::wire::ipv6::upper_layer(buf.data()) {
        Ok(upper) if upper.protocol == proto::ESP && upper.offset == u.esp_offset => upper.next_header_at,
        _ => return Err(UnwrapError::Malformed),
    };
    buf.truncate(u.esp_offset + u.esp_overhead + u.payload_len);
    buf.close_gap_after(u.esp_offset, u.esp_overhead);
    let payload_len = (buf.len() - IPV6_HEADER_LEN) as u16;
    let data = buf.data_mut();
    data[named_esp] = u.next_header;
    data[4..6].copy_from_slice(&payload_len.to_be_bytes());
    Ok(())
}

fn transport4_unwrap(buf: &mut PacketBuf, u: &Unwrap) -> Result<(), UnwrapError> {
    buf.truncate(u.esp_offset + u.esp_overhead + u.payload_len);
    buf.close_gap_after(u.esp_offset, u.esp_overhead);
    let total_len = buf.len() as u16;
    let mut ip = ipv4::header_mut(buf.data_mut()).map_err(|_| UnwrapError::Malformed)?;
    ip.set_next_header(IpProtocol::from(u.next_header));
    ip.set_total_len(total_len);
    ip.fill_checksum();
    Ok(())
}

/// A tunnel SA's outer headers (IPv4, and UDP for RFC 3948; or IPv6),
/// built once at install from what never changes per packet (version,
/// IHL, TTL or hop limit, protocol, addresses, ports), with the ones'
/// complement sum of those fields for IPv4 (DPDK's per-SA header
/// template), so that a packet only writes and sums its own fields:
/// DSCP/ECN, length, identification and DF (RFC 4301 §5.1.2.1, RFC 6040).
#[derive(Debug, Clone, Copy)]
pub struct OuterHeader {
    bytes: [u8; IPV6_HEADER_LEN + crate::nat::UDP_HEADER_LEN],
    /// 20, 28 with the UDP header, or 40 for IPv6.
    len: usize,
    partial_sum: u32,
    ipv6: bool,
}

/// Bytes of the fixed IPv6 header.
const IPV6_HEADER_LEN: usize = crate::wire::ipv6::HEADER_LEN;

impl OuterHeader {
    /// The header of a plain ESP SA over IPv4 (no UDP) from `local` to
    /// `remote`, sent with `ttl`.
    pub fn new(local: Ipv4Addr, remote: Ipv4Addr, ttl: u8) -> OuterHeader {
        Self::with_encap(local, remote, ttl, None)
    }

    /// The header of an SA with `encap`: UDP from our port to the peer's,
    /// with checksum zero as RFC 3948 §2.1 allows over IPv4 (ESP's ICV
    /// covers the payload).
    pub fn with_encap(local: Ipv4Addr, remote: Ipv4Addr, ttl: u8, encap: Option<UdpEncap>) -> OuterHeader {
        let mut bytes = [0u8; IPV6_HEADER_LEN + crate::nat::UDP_HEADER_LEN];
        bytes[0] = 0x45;
        bytes[8] = ttl;
        bytes[9] = if encap.is_some() { proto::UDP } else { proto::ESP };
        bytes[12..16].copy_from_slice(&local.octets());
        bytes[16..20].copy_from_slice(&remote.octets());
        let partial_sum = bytes[..IPV4_HEADER_LEN]
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let len = match encap {
            Some(encap) => {
                bytes[20..22].copy_from_slice(&encap.local_port.to_be_bytes());
                bytes[22..24].copy_from_slice(&encap.remote_port.to_be_bytes());
                IPV4_HEADER_LEN + crate::nat::UDP_HEADER_LEN
            }
            None => IPV4_HEADER_LEN,
        };
        OuterHeader {
            bytes,
            len,
            partial_sum,
            ipv6: false,
        }
    }

    /// An IPv6 outer header (RFC 4303 §3.1.2, RFC 2473): next header ESP,
    /// `hop_limit`, flow label zero (RFC 6437 allows it).
    pub fn ipv6(local: Ipv6Addr, remote: Ipv6Addr, hop_limit: u8) -> OuterHeader {
        let mut bytes = [0u8; IPV6_HEADER_LEN + crate::nat::UDP_HEADER_LEN];
        bytes[0] = 0x60;
        bytes[6] = proto::ESP;
        bytes[7] = hop_limit;
        bytes[8..24].copy_from_slice(&local.octets());
        bytes[24..40].copy_from_slice(&remote.octets());
        OuterHeader {
            bytes,
            len: IPV6_HEADER_LEN,
            partial_sum: 0,
            ipv6: true,
        }
    }

    /// Bytes of outer header before ESP: 20, 28 when UDP-encapsulated, 40
    /// for IPv6.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        self.len
    }

    /// Whether the header carries UDP (RFC 3948).
    pub fn is_udp(&self) -> bool {
        !self.ipv6 && self.len > IPV4_HEADER_LEN
    }

    /// Whether the outer header is IPv6: never fragmented on the way.
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// Writes the header for one packet into `dst` ([`header_len`](Self::header_len) bytes).
    #[inline(always)]
    fn write(&self, dst: &mut [u8], tos: u8, total_len: u16, ident: u16, dont_fragment: bool) {
        dst.copy_from_slice(&self.bytes[..self.len]);
        if self.ipv6 {
            // Traffic class across the version and flow label nibbles.
            dst[0] = 0x60 | tos >> 4;
            dst[1] = tos << 4;
            let payload_len = total_len - IPV6_HEADER_LEN as u16;
            dst[4..6].copy_from_slice(&payload_len.to_be_bytes());
            return;
        }
        dst[1] = tos;
        dst[2..4].copy_from_slice(&total_len.to_be_bytes());
        dst[4..6].copy_from_slice(&ident.to_be_bytes());
        let flags: u16 = if dont_fragment { 0x4000 } else { 0 };
        dst[6..8].copy_from_slice(&flags.to_be_bytes());
        let mut sum =
            self.partial_sum + u32::from(tos) + u32::from(total_len) + u32::from(ident) + u32::from(flags);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        dst[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        if self.len > IPV4_HEADER_LEN {
            let udp_len = total_len - IPV4_HEADER_LEN as u16;
            dst[24..26].copy_from_slice(&udp_len.to_be_bytes());
        }
    }
}

impl std::fmt::Debug for SaCrypto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaCrypto")
            .field("handle", &self.handle)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// What the outbound half needs besides the SA.
pub struct OutboundContext<'a, R: Rng> {
    /// Where a random IV comes from (CBC ciphers; counter-mode IVs are the
    /// sequence number).
    pub rng: &'a mut R,
    /// IPv4 identification for a new outer header.
    pub ip_id: u16,
    /// The driver's time, against which the SA's time lifetimes are
    /// checked: an expired SA refuses the packet.
    pub now: Duration,
}

/// A packet between the two halves.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    /// The SA the packet goes through; inbound finish looks it up again
    /// (it may have been removed while the packet was with the engine).
    pub sa: SaId,
    /// What the engine does to the packet: its session, direction and the
    /// regions it ciphers and authenticates.
    pub desc: Descriptor,
    /// Offset of the ESP header in the packet data.
    pub esp_offset: usize,
    /// Full (ESN-inferred) sequence number, inbound only.
    pub seq: u64,
    /// Bytes of protected data, for lifetimes (outbound; inbound counts
    /// the authenticated packet at finish).
    pub protected_len: usize,
}

/// `n` rounded up to a multiple of `align`, a power of two (every ESP
/// alignment is): masks instead of divisions on the per-packet path.
fn round_up(n: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two());
    (n + align - 1) & !(align - 1)
}

/// Size of `packet` (an IP packet) once `alg` protects it in `mode`
/// (tunnel mode: behind `outer_len` bytes of outer headers, IPv4 or IPv6,
/// UDP included), and the largest packet that still fits `mtu` (for ICMP
/// fragmentation-needed and packet-too-big).
#[inline]
pub fn protected_size(
    packet: &[u8],
    alg: Algorithm,
    mode: Mode,
    outer_len: usize,
    mtu: usize,
) -> (usize, usize) {
    // Classification checked the packet; were it not whole, it is sized
    // as if its header were the plain 20 bytes (and refused later).
    let header_len = match packet.first() {
        Some(b) if b >> 4 == 6 => {
            crate::wire::ipv6::upper_layer(packet).map_or(IPV6_HEADER_LEN, |u| u.esp_insert_at)
        }
        _ => ipv4::header_len(packet).unwrap_or(IPV4_HEADER_LEN),
    }
    .min(packet.len());
    let (outer, protected, kept) = match mode {
        Mode::Tunnel => (outer_len, packet.len(), 0),
        Mode::Transport => (header_len, packet.len() - header_len, header_len),
    };
    let align = alg.pad_align();
    let size = |protected: usize| {
        outer + esp::HEADER_LEN + alg.iv_len() + round_up(protected + esp::TRAILER_LEN, align) + alg.icv_len()
    };
    let fixed = outer + esp::HEADER_LEN + alg.iv_len() + alg.icv_len();
    // The largest protected length whose padded form fits.
    let room = mtu.saturating_sub(fixed) & !(align - 1);
    let fits = room.saturating_sub(esp::TRAILER_LEN) + kept;
    (size(protected), fits)
}

/// Outbound prepare: `buf` holds the (already forwarded, TTL-decremented)
/// IPv4 packet; on return it holds the ESP packet awaiting crypto.
#[inline(always)]
pub fn encapsulate_prepare<R: Rng>(
    sa_id: SaId,
    sa: &mut SecurityAssociation<SaCrypto>,
    buf: &mut PacketBuf,
    ctx: OutboundContext<'_, R>,
) -> Result<Pending, DropReason> {
    // An SA that ran out of sequence numbers is also hard-expired; name the
    // more specific reason.
    if sa.sequence_exhausted() {
        sa.counters_mut().count(DropReason::SeqOverflow);
        return Err(DropReason::SeqOverflow);
    }
    if !sa.is_usable(ctx.now) {
        sa.counters_mut().count(DropReason::SaExpired);
        return Err(DropReason::SaExpired);
    }
    let (alg, plan) = (sa.crypto().algorithm, sa.crypto().plan);
    let params = sa.params();
    let (spi, esn) = (params.spi, params.esn);
    let inner = Inner::read(buf.data(), params.mode == Mode::Transport)?;
    let layout = plan.layout(&inner, &sa.crypto().outer)?;
    let payload_len = buf.len() - layout.protected_start;
    let pad_len = EspTrailer::pad_len_for(payload_len, alg.pad_align());
    let cipher_len = payload_len + pad_len + esp::TRAILER_LEN;
    let esp_overhead = esp::HEADER_LEN + alg.iv_len();
    let outer_len = layout.outer_len;
    if buf.tailroom() < pad_len + esp::TRAILER_LEN + alg.icv_len()
        || buf.headroom() < esp_overhead + outer_len
        || outer_len + esp_overhead + cipher_len + alg.icv_len() > usize::from(u16::MAX)
    {
        return Err(DropReason::NoBufferSpace);
    }
    let seq = match sa.next_sequence() {
        Ok(seq) => seq,
        // The caller retires the SA (see `note_exhausted`).
        Err(SequenceError::Exhausted) => return Err(DropReason::SeqOverflow),
        Err(SequenceError::NotReserved) => return Err(DropReason::SeqNotReserved),
    };
    // Built before the packet is written rather than after: the caller
    // copies it at once, and a copy of fields stored just now would stall
    // on store forwarding.
    let pending = Pending {
        sa: sa_id,
        desc: Descriptor::esp(
            Direction::Encrypt,
            alg,
            cipher_len,
            esn.then_some((seq >> 32) as u32),
        ),
        esp_offset: outer_len,
        seq,
        protected_len: payload_len,
    };

    // The ICV's bytes are left as they are: every engine writes them, and a
    // packet whose engine did not is dropped, never sent.
    let trailer = buf
        .append(pad_len + esp::TRAILER_LEN + alg.icv_len())
        .ok_or(DropReason::NoBufferSpace)?;
    EspTrailer::emit(&mut trailer[..pad_len + esp::TRAILER_LEN], layout.next_header);

    if !plan.make_room(buf, &layout, esp_overhead) {
        return Err(DropReason::NoBufferSpace);
    }
    let esp_offset = pending.esp_offset;
    let total_len = buf.len() as u16;
    let outer = &sa.crypto().outer;
    let data = buf.data_mut();
    let (header, rest) = data.split_at_mut(esp_offset);
    let mut esp_packet = EspPacket::new_unchecked(&mut rest[..esp::HEADER_LEN]);
    esp_packet.set_spi(spi);
    esp_packet.set_sequence_number(seq as u32);
    let iv = &mut rest[esp::HEADER_LEN..esp_overhead];
    match plan.iv {
        IvSource::Sequence => iv.copy_from_slice(&seq.to_be_bytes()),
        IvSource::Random => ctx.rng.fill_bytes(iv),
        IvSource::None => {}
    }
    let wrap = Wrap {
        outer,
        inner: &inner,
        total_len,
        ip_id: ctx.ip_id,
    };
    plan.wrap(header, &wrap)?;
    Ok(pending)
}

/// The fields of the packet to protect that its protection reads.
struct Inner {
    family: u8,
    /// IPv4 TOS or IPv6 traffic class: DSCP and ECN.
    tos: u8,
    dont_fragment: bool,
    is_fragment: bool,
    /// What transport mode keeps in front of ESP: the IPv4 header, or the
    /// IPv6 header with the extension headers before ESP's place.
    header_len: usize,
    /// The protocol transport-mode ESP protects, and the byte that names
    /// it (IPv4's protocol field, or the next-header byte before ESP's
    /// place).
    protocol: u8,
    next_header_at: usize,
}

impl Inner {
    /// The caller has checked the header (classification): the few fields
    /// needed are read straight from it, guarding only the length. For
    /// IPv6 in `transport` mode, the extension headers are walked for
    /// ESP's place (RFC 4303 §3.1.1).
    #[inline(always)]
    fn read(data: &[u8], transport: bool) -> Result<Inner, DropReason> {
        let Some(&[ver_ihl, tos, _, _, _, _, flags_hi, flags_lo, _, protocol]) = data.get(..10) else {
            return Err(DropReason::Malformed);
        };
        if ver_ihl >> 4 == 6 {
            let (header_len, next_header_at, is_fragment) = if transport {
                let upper = crate::wire::ipv6::upper_layer(data)?;
                (
                    upper.esp_insert_at,
                    upper.esp_next_header_at,
                    upper.fragment.is_some(),
                )
            } else {
                // Tunnel mode carries an IPv6 fragment like any packet.
                (IPV6_HEADER_LEN, 6, false)
            };
            return Ok(Inner {
                family: 6,
                tos: (ver_ihl << 4) | (tos >> 4),
                // RFC 4213 §3.2.1: IPv6 in IPv4 goes with DF clear, so
                // that a smaller IPv4 path fragments the outer packet;
                // what exceeds our own tunnel MTU got a packet-too-big.
                dont_fragment: false,
                is_fragment,
                header_len,
                protocol: data.get(next_header_at).copied().unwrap_or(NEXT_HEADER_NONE),
                next_header_at,
            });
        }
        let header_len = usize::from(ver_ihl & 0x0f) * 4;
        if header_len < IPV4_HEADER_LEN || header_len > data.len() {
            return Err(DropReason::Malformed);
        }
        Ok(Inner {
            family: 4,
            tos,
            dont_fragment: flags_hi & 0x40 != 0,
            is_fragment: flags_hi & 0x20 != 0 || u16::from_be_bytes([flags_hi & 0x1f, flags_lo]) != 0,
            header_len,
            protocol,
            next_header_at: 9,
        })
    }
}

/// Outbound finish: the engine has run. Lifetimes were counted when the
/// packet was handed over (see `start_encapsulation`).
pub fn encapsulate_finish(status: Status) -> Result<(), DropReason> {
    if status == Status::Done {
        Ok(())
    } else {
        Err(engine_drop(status))
    }
}

/// The drop for a job the engine did not complete: a timeout (an engine
/// whose server stopped answering gives its jobs back, then refuses new
/// ones until it answers again) is told from an engine's error.
fn engine_drop(status: Status) -> DropReason {
    match status {
        Status::Error(accel::DescriptorError::Timeout | accel::DescriptorError::Unavailable) => {
            DropReason::EngineTimeout
        }
        _ => DropReason::EngineError,
    }
}

/// What inbound prepare decided.
#[derive(Debug, Clone, Copy)]
pub enum Inbound {
    /// The descriptor is ready for the engine.
    Ready(Pending),
    /// The packet must wait for the SA's packets in flight: its ESN high
    /// half depends on their fate, or earlier packets of the SA wait too.
    Hold(SaId),
}

/// Inbound prepare: `buf` holds an IPv4 packet with protocol ESP addressed
/// to us. Checks lengths, finds the SA, infers the sequence number and
/// checks the replay window (without updating it) and builds the
/// descriptor. A packet of an SA for which `has_held` says packets are held
/// waits behind them.
pub fn decapsulate_prepare(
    sad: &mut Sad<SaCrypto>,
    buf: &mut PacketBuf,
    now: Duration,
    has_held: impl Fn(SaId) -> bool,
) -> Result<Inbound, DropReason> {
    let data = buf.data();
    let (esp_offset, dst, arrival_port) = if crate::wire::is_ipv6(data) {
        // ESP over IPv6, after the extension headers (RFC 4303 §3.1.2);
        // classification sent only unfragmented ESP here.
        let upper = crate::wire::ipv6::upper_layer(data)?;
        if upper.protocol != proto::ESP || upper.fragment.is_some() {
            return Err(DropReason::Malformed);
        }
        let dst = crate::wire::ipv6::view(data)?.dst_addr();
        (upper.offset, IpAddr::V6(dst), None)
    } else {
        let ip = ipv4::view(data)?;
        let header_len = usize::from(ip.header_len());
        // RFC 3948: classification sent UDP here only for an encapsulation
        // port, with a payload that is not a keepalive or IKE.
        let arrival_port = match ip.next_header() == IpProtocol::Udp {
            true => Some(crate::nat::destination_port(&data[header_len..]).ok_or(DropReason::Malformed)?),
            false => None,
        };
        let esp_offset = header_len + arrival_port.map_or(0, |_| crate::nat::UDP_HEADER_LEN);
        (esp_offset, IpAddr::V4(ip.dst_addr()), arrival_port)
    };
    let esp_packet = data
        .get(esp_offset..)
        .and_then(|esp| EspPacket::new_checked(esp).ok())
        .ok_or(DropReason::Malformed)?;
    let sa_id = sad
        .lookup_inbound(esp_packet.spi(), dst)
        .ok_or(DropReason::UnknownSpi)?;
    let sa = sad.get_mut(sa_id).ok_or(DropReason::UnknownSpi)?;
    // Linux XFRM's rule too: an SA takes the encapsulation it was made for.
    if sa.params().encap.map(|e| e.local_port) != arrival_port {
        return Err(DropReason::EncapMismatch);
    }
    // One replay window per SA: a packet the steering did not send to the
    // window's worker (a source the kernel hashed elsewhere) is refused,
    // never checked against a second window.
    if sa.owner() == Some(false) {
        return Err(DropReason::NotOwner);
    }
    let alg = sa.crypto().algorithm;
    let esp_len = data.len() - esp_offset;
    let overhead = esp::HEADER_LEN + alg.iv_len() + alg.icv_len();
    // RFC 4303 §2.4: the ciphertext is whole blocks, and at least a trailer.
    let cipher_len = match esp_len.checked_sub(overhead) {
        Some(n) if n >= esp::TRAILER_LEN && n & (alg.pad_align() - 1) == 0 => n,
        _ => {
            sa.counters_mut().count(DropReason::Malformed);
            return Err(DropReason::Malformed);
        }
    };
    if !sa.is_usable(now) {
        sa.counters_mut().count(DropReason::SaExpired);
        return Err(DropReason::SaExpired);
    }
    let seq_low = esp_packet.sequence_number();
    if has_held(sa_id) || !sa.inference_settled(seq_low) {
        return Ok(Inbound::Hold(sa_id));
    }
    let seq = match sa.check_replay(seq_low) {
        Ok(seq) => seq,
        // Duplicate or too old depends on the packets in flight: finish
        // re-checks before the ICV, so this costs what a forgery costs.
        Err(ReplayError::Duplicate(seq)) if !sa.duplicate_settled(seq) => seq,
        Err(e) => {
            sa.counters_mut().count_replay(e);
            return Err(e.into());
        }
    };
    let esn_high = sa.params().esn.then_some((seq >> 32) as u32);
    Ok(Inbound::Ready(Pending {
        sa: sa_id,
        desc: Descriptor::esp(Direction::Decrypt, alg, cipher_len, esn_high),
        esp_offset,
        seq,
        protected_len: 0,
    }))
}

/// What an authenticated inbound packet turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decapsulated {
    /// `buf` now holds the inner IPv4 packet.
    Packet,
    /// A dummy packet (next header 59): authenticated, then discarded.
    Dummy,
}

/// Inbound finish: re-checks the replay window, checks the engine status,
/// updates the window, checks the trailer and strips ESP, leaving the inner
/// IPv4 packet.
pub fn decapsulate_finish(
    sad: &mut Sad<SaCrypto>,
    buf: &mut PacketBuf,
    pending: &Pending,
    now: Duration,
) -> Result<Decapsulated, DropReason> {
    let sa = sad.get_mut(pending.sa).ok_or(DropReason::UnknownSpi)?;
    // The window may have moved while this packet was with the engine
    // (another copy of it verified, or packets ahead of it): infer the high
    // half and check again against the window as it is now, before the
    // ICV status, exactly as if the packet were being received only now
    // (RFC 4303 §3.4.3, Appendix A; Linux's xfrm_replay_recheck). A high
    // half that changed means the ICV was computed over the wrong one.
    let seq_low = pending.seq as u32;
    let refused = match sa.check_replay(seq_low) {
        Ok(seq) if seq == pending.seq => None,
        // The window's top moved so far that the low half now reads as the
        // next subspace: the packet fell off the left of the window.
        Ok(_) => Some(ReplayError::TooOld(pending.seq)),
        Err(e) => Some(e),
    };
    if let Some(e) = refused {
        sa.counters_mut().count_replay(e);
        return Err(e.into());
    }
    match pending.desc.status {
        Status::Done => {}
        Status::AuthFailed => {
            sa.counters_mut().count(DropReason::AuthFailed);
            return Err(DropReason::AuthFailed);
        }
        Status::Pending | Status::Error(_) => return Err(engine_drop(pending.desc.status)),
    }
    // With static keys, a number is accepted only once the state
    // directory holds a ceiling at or above it (or a replay of this packet
    // after a restart would be new again). Checked here, once the packet
    // is authentic, so that a forged number cannot move the ceiling; the
    // buffer is left as it is, and the caller may finish the packet again
    // once the ceiling has been raised.
    if !sa.inbound_within_ceiling(pending.seq) {
        return Err(DropReason::SeqNotReserved);
    }
    // RFC 4303 §3.4.3: the window moves only for authenticated packets.
    sa.accept_sequence(pending.seq);
    let cipher = pending.desc.cipher.range();
    let esp_offset = pending.esp_offset;
    let plain = &buf.data()[esp_offset + cipher.start..esp_offset + cipher.end];
    let (trailer, payload_len) = match EspTrailer::parse(plain) {
        Ok(parsed) => parsed,
        Err(_) => {
            sa.counters_mut().count(DropReason::Malformed);
            return Err(DropReason::Malformed);
        }
    };
    if trailer.next_header == NEXT_HEADER_NONE {
        return Ok(Decapsulated::Dummy);
    }
    let malformed = |sa: &mut SecurityAssociation<SaCrypto>| {
        sa.counters_mut().count(DropReason::Malformed);
        DropReason::Malformed
    };
    let unwrap = Unwrap {
        esp_offset: pending.esp_offset,
        esp_overhead: cipher.start,
        payload_len,
        next_header: trailer.next_header,
    };
    match sa.crypto().plan.unwrap(buf, &unwrap) {
        Ok(()) => {}
        Err(UnwrapError::Malformed) => return Err(malformed(sa)),
        Err(UnwrapError::Drop(reason)) => return Err(reason),
    }
    let protected_len = buf.len();
    sad.account(pending.sa, protected_len, now);
    Ok(Decapsulated::Packet)
}

/// ECN codepoints (RFC 3168 §5).
mod ecn {
    pub(crate) const NOT_ECT: u8 = 0;
    pub(crate) const ECT1: u8 = 1;
    pub(crate) const ECT0: u8 = 2;
    pub(crate) const CE: u8 = 3;
}

/// The ECN field of an IPv4 or IPv6 header.
fn ecn_of(packet: &[u8]) -> u8 {
    match packet.first().map(|b| b >> 4) {
        Some(6) => packet.get(1).map_or(0, |b| (b >> 4) & 3),
        _ => packet.get(1).map_or(0, |b| b & 3),
    }
}

/// RFC 6040 §4.2, normal mode: the decapsulated packet carries what the
/// outer header learnt on the way. Congestion experienced outside becomes
/// CE inside (or a drop when the inner packet is not ECN-capable); ECT(1)
/// outside turns an inner ECT(0) into ECT(1); nothing else changes. An
/// IPv4 inner header's checksum follows the change.
fn combine_ecn(inner: &mut [u8], outer: u8) -> Result<(), DropReason> {
    let before = ecn_of(inner);
    let after = match (before, outer) {
        (ecn::NOT_ECT, ecn::CE) => return Err(DropReason::EcnNotEct),
        (ecn::NOT_ECT, _) | (ecn::CE, _) => return Ok(()),
        (_, ecn::CE) => ecn::CE,
        (ecn::ECT0, ecn::ECT1) => ecn::ECT1,
        _ => return Ok(()),
    };
    if crate::wire::is_ipv6(inner) {
        if let Some(b) = inner.get_mut(1) {
            *b = (*b & !0x30) | after << 4;
        }
        return Ok(());
    }
    let mut ip = ipv4::header_mut(inner)?;
    ip.set_ecn(after);
    ip.fill_checksum();
    Ok(())
}

/// Marks an SA hard-expired after the counter ran out, raising the event once.
pub fn note_exhausted(sad: &mut Sad<SaCrypto>, id: SaId) {
    if let Some(sa) = sad.get_mut(id) {
        if sa.params().direction == SaDirection::Outbound && sa.expire() {
            sad.note_transition(id, SaState::HardExpired);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6040 §4.2's table, for both inner families: every inner and
    /// outer codepoint, the DSCP kept and an IPv4 checksum still right.
    #[test]
    fn decapsulation_combines_ecn_as_rfc_6040_says() {
        use ecn::{CE, ECT0, ECT1, NOT_ECT};
        let table = [
            // inner, then what each outer (Not-ECT, ECT(0), ECT(1), CE) makes of it
            (NOT_ECT, [Some(NOT_ECT), Some(NOT_ECT), Some(NOT_ECT), None]),
            (ECT0, [Some(ECT0), Some(ECT0), Some(ECT1), Some(CE)]),
            (ECT1, [Some(ECT1), Some(ECT1), Some(ECT1), Some(CE)]),
            (CE, [Some(CE), Some(CE), Some(CE), Some(CE)]),
        ];
        for (inner, results) in table {
            for (outer, want) in [NOT_ECT, ECT0, ECT1, CE].into_iter().zip(results) {
                let mut v4 = [0u8; 20];
                {
                    let mut ip = Ipv4Packet::new_unchecked(&mut v4[..]);
                    ip.set_version(4);
                    ip.set_header_len(20);
                    ip.set_total_len(20);
                    ip.set_dscp(0x2e);
                    ip.set_ecn(inner);
                    ip.set_hop_limit(9);
                    ip.fill_checksum();
                }
                let mut v6 = [0u8; 40];
                v6[0] = 0x60 | 0x2e >> 2;
                v6[1] = ((0x2e & 3) << 6) | inner << 4 | 0x0a;
                let got4 = combine_ecn(&mut v4, outer).map(|()| ecn_of(&v4)).ok();
                let got6 = combine_ecn(&mut v6, outer).map(|()| ecn_of(&v6)).ok();
                assert_eq!((got4, got6), (want, want), "inner {inner} outer {outer}");
                let ip = Ipv4Packet::new_checked(&v4[..]).unwrap();
                assert!(ip.verify_checksum() && ip.dscp() == 0x2e);
                assert_eq!(
                    (v6[0], v6[1] & 0xcf),
                    (0x60 | 0x2e >> 2, ((0x2e & 3) << 6) | 0x0a)
                );
            }
        }
    }
}
