//! Framing of `NETLINK_XFRM` datagrams into parsed messages.
//!
//! Owns the walk over the netlink messages of one datagram and the checks
//! `netlink-packet-xfrm` leaves to its caller: its message parsers slice
//! their fixed part (`xfrm_usersa_info`, `xfrm_userpolicy_id`, ...) out of
//! the payload without looking at its length, so a short payload would
//! panic there. Each payload is measured against its fixed part first.
//! Only the types the mirror acts on are parsed; the others are named by
//! type and left alone. Must not interpret what it parses ([`super::mirror`]
//! does).

use std::mem::size_of;

use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP,
    NLMSG_OVERRUN,
};
use netlink_packet_xfrm::{
    UserExpireBuffer, UserPolicyIdBuffer, UserPolicyInfoBuffer, UserSaIdBuffer, UserSaInfoBuffer,
    XfrmMessage, XFRM_MSG_DELPOLICY, XFRM_MSG_DELSA, XFRM_MSG_EXPIRE, XFRM_MSG_FLUSHPOLICY, XFRM_MSG_FLUSHSA,
    XFRM_MSG_NEWPOLICY, XFRM_MSG_NEWSA, XFRM_MSG_UPDPOLICY, XFRM_MSG_UPDSA,
};

/// The netlink header: length, type, flags, sequence, port.
pub const HEADER_LEN: usize = 16;

/// One message of a datagram.
#[derive(Debug)]
pub enum Decoded {
    /// A message the mirror acts on, parsed.
    Xfrm(Box<XfrmMessage>),
    /// The end of a dump.
    Done,
    /// An error answer (`NLMSG_ERROR` with a non-zero code: a refused
    /// dump request) or an acknowledgement (code 0).
    Error(i32),
    /// `NLMSG_NOOP` or `NLMSG_OVERRUN`: nothing to do.
    Noop,
    /// A type the mirror does not act on (`XFRM_MSG_ACQUIRE`, `NEWAE`,
    /// `MAPPING`, ...), not parsed.
    Other(u16),
}

/// Why (part of) a datagram could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeIssue {
    /// The datagram ends within a message's header.
    #[error("{left} bytes left, too few for a netlink header")]
    TruncatedHeader {
        /// Bytes of the datagram after the last whole message.
        left: usize,
    },
    /// A header's length is shorter than the header or longer than what
    /// is left of the datagram.
    #[error("netlink message of {length} bytes where {left} are left")]
    BadLength {
        /// The length the header gives.
        length: usize,
        /// Bytes of the datagram from that header on.
        left: usize,
    },
    /// A message of a type the mirror parses is too short for that type's
    /// fixed part.
    #[error("message type {message_type}: {len} payload bytes, fewer than the {needed} of its fixed part")]
    ShortPayload {
        /// The netlink message type (`XFRM_MSG_*`).
        message_type: u16,
        /// Bytes of payload it has.
        len: usize,
        /// Bytes its fixed part takes.
        needed: usize,
    },
    /// `netlink-packet-xfrm` could not parse the message.
    #[error("message type {message_type}: {reason}")]
    Parse {
        /// The netlink message type (`XFRM_MSG_*`).
        message_type: u16,
        /// The parser's complaint.
        reason: String,
    },
}

/// The fixed part of the payload of the types the mirror parses; `None`
/// for types it does not parse.
fn fixed_part(message_type: u16) -> Option<usize> {
    Some(match message_type {
        XFRM_MSG_NEWSA | XFRM_MSG_UPDSA => size_of::<UserSaInfoBuffer>(),
        XFRM_MSG_DELSA => size_of::<UserSaIdBuffer>(),
        XFRM_MSG_NEWPOLICY | XFRM_MSG_UPDPOLICY => size_of::<UserPolicyInfoBuffer>(),
        XFRM_MSG_DELPOLICY => size_of::<UserPolicyIdBuffer>(),
        XFRM_MSG_EXPIRE => size_of::<UserExpireBuffer>(),
        // `xfrm_usersa_flush`: the protocol.
        XFRM_MSG_FLUSHSA => 1,
        XFRM_MSG_FLUSHPOLICY => 0,
        _ => return None,
    })
}

/// Every message of `datagram`, in order. A framing error ends the walk
/// (what follows cannot be found), and is the last item.
pub fn decode_datagram(datagram: &[u8]) -> Vec<Result<Decoded, DecodeIssue>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < datagram.len() {
        let left = &datagram[at..];
        let buffer = match NetlinkBuffer::new_checked(left) {
            Ok(buffer) => buffer,
            Err(_) if left.len() < HEADER_LEN => {
                out.push(Err(DecodeIssue::TruncatedHeader { left: left.len() }));
                break;
            }
            Err(_) => {
                let length = usize::try_from(u32::from_ne_bytes([left[0], left[1], left[2], left[3]]))
                    .unwrap_or(usize::MAX);
                out.push(Err(DecodeIssue::BadLength {
                    length,
                    left: left.len(),
                }));
                break;
            }
        };
        let length = usize::try_from(buffer.length()).unwrap_or(usize::MAX);
        if length < HEADER_LEN {
            out.push(Err(DecodeIssue::BadLength {
                length,
                left: left.len(),
            }));
            break;
        }
        out.push(decode_one(&left[..length], buffer.message_type()));
        let align = usize::from(NLMSG_ALIGNTO);
        at += length.div_ceil(align) * align;
    }
    out
}

/// One message of exactly its length.
fn decode_one(message: &[u8], message_type: u16) -> Result<Decoded, DecodeIssue> {
    let payload_len = message.len() - HEADER_LEN;
    match message_type {
        NLMSG_NOOP | NLMSG_OVERRUN => return Ok(Decoded::Noop),
        NLMSG_DONE => return Ok(Decoded::Done),
        NLMSG_ERROR | XFRM_MSG_NEWSA..=u16::MAX => {}
        other => return Ok(Decoded::Other(other)),
    }
    if message_type != NLMSG_ERROR {
        let Some(needed) = fixed_part(message_type) else {
            return Ok(Decoded::Other(message_type));
        };
        if payload_len < needed {
            return Err(DecodeIssue::ShortPayload {
                message_type,
                len: payload_len,
                needed,
            });
        }
    }
    let parsed = NetlinkMessage::<XfrmMessage>::deserialize(message).map_err(|e| DecodeIssue::Parse {
        message_type,
        reason: e.to_string(),
    })?;
    Ok(match parsed.payload {
        NetlinkPayload::InnerMessage(m) => Decoded::Xfrm(Box::new(m)),
        NetlinkPayload::Done(_) => Decoded::Done,
        NetlinkPayload::Error(e) => Decoded::Error(e.code.map_or(0, i32::from)),
        NetlinkPayload::Noop | NetlinkPayload::Overrun(_) => Decoded::Noop,
        // A future variant of the crate: nothing the mirror knows.
        #[allow(unreachable_patterns)]
        _ => Decoded::Other(message_type),
    })
}
