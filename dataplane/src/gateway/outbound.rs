//! ESP outbound: a packet a `protect` policy (or the gateway's own
//! traffic) sent to an SA, checked against the outside MTU once protected
//! (RFC 4301 §8.1, RFC 1191; RFC 8200 §5 for IPv6) and prepared for the
//! engine: headers, sequence number, padding, IV, descriptor. The SA's
//! usage is counted here, when the packet is handed to the engine, as
//! Linux's `xfrm_output` counts before the transform, so that finishing an
//! outbound packet needs no SA.
//!
//! Owns the IV generator. Must not submit to the engine (the front hands
//! the prepared packet to the job machine), route, or write ICMP errors
//! (it asks for one with [`Next::Error`]).

use std::net::Ipv4Addr;
use std::time::Duration;

use accel::{Algorithm, SessionHandle};
use rand::rngs::StdRng;
use spd_sad::{SaId, Sad};

use super::output::{IcmpError, Next};
use crate::buffer::PacketBuf;
use crate::esp::SaCrypto;
use crate::esp::{self, OutboundContext, Pending};
use crate::stats::DropReason;
use crate::wire::ipv4;
use crate::{icmp, icmp6};

/// A prepared outbound packet, for the engine.
pub(super) struct Prepared {
    pub(super) pending: Pending,
    pub(super) session: (SessionHandle, Algorithm),
}

/// Where a packet is to go: the outside MTU, our inside address (the
/// source of a fragmentation-needed error) and the outer IPv4 ID it takes.
pub(super) struct Path {
    pub(super) mtu: usize,
    pub(super) inside: Ipv4Addr,
    pub(super) ip_id: u16,
}

/// The outbound ESP stage.
pub(super) struct EspOut {
    rng: StdRng,
}

impl EspOut {
    pub(super) fn new() -> EspOut {
        EspOut {
            rng: rand::make_rng(),
        }
    }

    /// Makes CBC IVs a deterministic function of `seed` (tests and
    /// reproducible captures only).
    pub(super) fn set_iv_seed(&mut self, seed: u64) {
        use rand::SeedableRng;
        self.rng = StdRng::seed_from_u64(seed);
    }

    /// Prepares `buf` for `sa_id`, in place. What cannot go comes back as
    /// the packet's result instead: a drop, or an ICMP error (too big for
    /// the tunnel, DF set or IPv6).
    #[inline]
    pub(super) fn prepare(
        &mut self,
        sad: &mut Sad<SaCrypto>,
        sa_id: SaId,
        buf: &mut PacketBuf,
        path: Path,
        now: Duration,
    ) -> Result<Prepared, Result<Next, DropReason>> {
        let Some(sa) = sad.get_mut(sa_id) else {
            return Err(Err(DropReason::SaExpired));
        };
        let mtu = path.mtu;
        let (size, fits) = esp::protected_size(
            buf.data(),
            sa.crypto().algorithm,
            sa.params().mode,
            sa.crypto().outer.header_len(),
            mtu,
        );
        let is_ipv6 = crate::wire::is_ipv6(buf.data());
        // An IPv6 outer packet is never fragmented (this gateway does not
        // fragment at the source either): what does not fit is refused
        // with the size that does, whatever the inner DF says.
        let outer_ipv6 = sa.crypto().outer.is_ipv6();
        if is_ipv6 && size > mtu && (fits >= icmp6::MIN_MTU || outer_ipv6) {
            // RFC 4213 §3.2 / RFC 8200 §5: the tunnel is a link of MTU
            // `fits` for IPv6, which routers never fragment: too big is a
            // packet-too-big error. Below the IPv6 minimum an IPv4 outer
            // packet is fragmented instead; an IPv6 one cannot be.
            if fits < icmp6::MIN_MTU {
                return Err(Err(DropReason::FragNeeded));
            }
            let error = (icmp6::kind::PACKET_TOO_BIG, 0, u32::try_from(fits).unwrap_or(0));
            return Err(Ok(Next::Error(IcmpError::v6(error, DropReason::FragNeeded))));
        }
        let dont_fragment = match ipv4::view(buf.data()) {
            Ok(ip) => ip.dont_frag() || outer_ipv6,
            Err(_) if is_ipv6 => false,
            Err(reason) => return Err(Err(reason)),
        };
        if size > mtu && dont_fragment {
            let next_hop_mtu = u32::try_from(fits).unwrap_or(0);
            let error = (
                icmp::kind::DEST_UNREACHABLE,
                icmp::kind::FRAG_NEEDED,
                next_hop_mtu,
            );
            return Err(Ok(Next::Error(IcmpError::v4(
                error,
                path.inside,
                DropReason::FragNeeded,
            ))));
        }
        let ctx = OutboundContext {
            rng: &mut self.rng,
            ip_id: path.ip_id,
            now,
        };
        match esp::encapsulate_prepare(sa_id, sa, buf, ctx) {
            Ok(pending) => {
                let session = (sa.crypto().handle, sa.crypto().algorithm);
                sad.account(sa_id, pending.protected_len, now);
                Ok(Prepared { pending, session })
            }
            Err(reason) => {
                if reason == DropReason::SeqOverflow {
                    esp::note_exhausted(sad, sa_id);
                }
                Err(Err(reason))
            }
        }
    }
}
