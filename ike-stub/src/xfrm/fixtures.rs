//! XFRM netlink messages built with `netlink-packet-xfrm`'s emitters, laid
//! out as the kernel's `xfrm_user.h` documents them: for tests, fuzz seeds
//! and the committed fixtures that were not captured from a kernel (the
//! fixtures' README says which are which). Test keys only.

use std::net::IpAddr;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_MULTIPART};
use netlink_packet_xfrm::policy::{DelGetMessage as PolicyDelGet, ModifyMessage as PolicyModify};
use netlink_packet_xfrm::state::{DelGetMessage as SaDelGet, ModifyMessage as SaModify};
use netlink_packet_xfrm::{
    Address, Alg, AlgAead, AlgAuth, EncapTmpl, LifetimeConfig, ReplayEsn, UserPolicyInfo, UserSaInfo,
    UserTemplate, XfrmAttrs, XfrmMessage, UDP_ENCAP_ESPINUDP, XFRM_ALG_AEAD_NAME_LEN, XFRM_ALG_AUTH_NAME_LEN,
    XFRM_ALG_NAME_LEN, XFRM_INF, XFRM_MODE_TRANSPORT, XFRM_MODE_TUNNEL, XFRM_POLICY_ALLOW, XFRM_STATE_ESN,
};

use super::sa::{AF_INET, AF_INET6, IPPROTO_ESP};

/// XFRM's 16-byte address.
pub fn xfrm_address(a: IpAddr) -> Address {
    let mut addr = [0u8; 16];
    match a {
        IpAddr::V4(v4) => addr[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => addr = v6.octets(),
    }
    Address { addr }
}

fn family(a: IpAddr) -> u16 {
    if a.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    }
}

fn name<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [0u8; N];
    out[..text.len()].copy_from_slice(text.as_bytes());
    out
}

/// An AEAD attribute (key bits include the 4-byte salt).
pub fn aead(alg: &str, key: &[u8], icv_bits: u32) -> XfrmAttrs {
    XfrmAttrs::EncryptionAlgAead(AlgAead {
        alg_name: name::<XFRM_ALG_AEAD_NAME_LEN>(alg),
        alg_key_len: (key.len() * 8) as u32,
        alg_icv_len: icv_bits,
        alg_key: key.to_vec(),
    })
}

/// A cipher attribute.
pub fn cipher(alg: &str, key: &[u8]) -> XfrmAttrs {
    XfrmAttrs::EncryptionAlg(Alg {
        alg_name: name::<XFRM_ALG_NAME_LEN>(alg),
        alg_key_len: (key.len() * 8) as u32,
        alg_key: key.to_vec(),
    })
}

/// An integrity attribute with its truncation.
pub fn auth(alg: &str, key: &[u8], trunc_bits: u32) -> XfrmAttrs {
    XfrmAttrs::AuthenticationAlgTrunc(AlgAuth {
        alg_name: name::<XFRM_ALG_AUTH_NAME_LEN>(alg),
        alg_key_len: (key.len() * 8) as u32,
        alg_trunc_len: trunc_bits,
        alg_key: key.to_vec(),
    })
}

/// ESP in UDP between `sport` (the state's source) and `dport`.
pub fn encap(sport: u16, dport: u16) -> XfrmAttrs {
    XfrmAttrs::EncapsulationTemplate(EncapTmpl {
        encap_type: UDP_ENCAP_ESPINUDP,
        encap_sport: sport,
        encap_dport: dport,
        encap_oa: Address::default(),
    })
}

/// The ESN replay state with a window of `window` packets.
pub fn replay_esn(window: u32) -> XfrmAttrs {
    let words = window.div_ceil(32) as usize;
    XfrmAttrs::ReplayStateEsn(ReplayEsn {
        bmp_len: words as u32,
        oseq: 0,
        seq: 0,
        oseq_hi: 0,
        seq_hi: 0,
        replay_window: window,
        bmp: vec![0; words],
    })
}

/// The fixed part of a state from `src` to `dst`, with strongSwan's
/// defaults: tunnel mode, no byte or packet limits, no ESN.
pub fn state(src: IpAddr, dst: IpAddr, spi: u32, reqid: u32) -> UserSaInfo {
    let mut info = UserSaInfo::default();
    info.id.daddr = xfrm_address(dst);
    info.id.spi = spi;
    info.id.proto = IPPROTO_ESP;
    info.saddr = xfrm_address(src);
    info.family = family(dst);
    info.mode = XFRM_MODE_TUNNEL;
    info.reqid = reqid;
    info.lifetime_cfg = without_limits();
    info
}

/// No byte or packet limits (`XFRM_INF`) and no time limits: what
/// strongSwan leaves on a state or policy without a lifetime.
fn without_limits() -> LifetimeConfig {
    LifetimeConfig {
        soft_byte_limit: XFRM_INF,
        hard_byte_limit: XFRM_INF,
        soft_packet_limit: XFRM_INF,
        hard_packet_limit: XFRM_INF,
        soft_add_expires_seconds: 0,
        hard_add_expires_seconds: 0,
        soft_use_expires_seconds: 0,
        hard_use_expires_seconds: 0,
    }
}

/// Sets ESN on a state (its flag; the replay state goes in the attributes).
pub fn with_esn(mut info: UserSaInfo) -> UserSaInfo {
    info.flags |= XFRM_STATE_ESN;
    info
}

/// Transport mode.
pub fn transport(mut info: UserSaInfo) -> UserSaInfo {
    info.mode = XFRM_MODE_TRANSPORT;
    info
}

/// A policy of `dir` (0 in, 1 out, 2 fwd) from `src` to `dst` (prefixes)
/// with index `index` and `priority`.
pub fn policy(dir: u8, index: u32, priority: u32, src: (IpAddr, u8), dst: (IpAddr, u8)) -> UserPolicyInfo {
    let mut info = UserPolicyInfo::default();
    info.selector.saddr = xfrm_address(src.0);
    info.selector.prefixlen_s = src.1;
    info.selector.daddr = xfrm_address(dst.0);
    info.selector.prefixlen_d = dst.1;
    info.selector.family = family(src.0);
    info.priority = priority;
    info.index = index;
    info.direction = dir;
    info.action = XFRM_POLICY_ALLOW;
    info.lifetime_cfg = without_limits();
    info
}

/// One ESP template of `mode` and `reqid` between outer `src` and `dst`.
pub fn template(src: IpAddr, dst: IpAddr, reqid: u32, mode: u8) -> UserTemplate {
    let mut t = UserTemplate::default();
    t.id.daddr = xfrm_address(dst);
    t.id.proto = IPPROTO_ESP;
    t.family = family(dst);
    t.saddr = xfrm_address(src);
    t.reqid = reqid;
    t.mode = mode;
    t.aalgos = u32::MAX;
    t.ealgos = u32::MAX;
    t.calgos = u32::MAX;
    t
}

/// A netlink datagram of one message, as the kernel frames it (`multi`:
/// a dump reply).
pub fn frame(message: XfrmMessage, multi: bool) -> Vec<u8> {
    framed(NetlinkPayload::InnerMessage(message), multi)
}

/// The end of a dump.
pub fn done() -> Vec<u8> {
    framed(
        NetlinkPayload::Done(netlink_packet_core::DoneMessage::default()),
        true,
    )
}

fn framed(payload: NetlinkPayload<XfrmMessage>, multi: bool) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    if multi {
        header.flags = NLM_F_MULTIPART;
    }
    let mut m = NetlinkMessage::new(header, payload);
    m.finalize();
    let mut out = vec![0u8; m.buffer_len()];
    m.serialize(&mut out);
    out
}

/// `XFRM_MSG_NEWSA`.
pub fn new_sa(info: UserSaInfo, nlas: Vec<XfrmAttrs>) -> XfrmMessage {
    XfrmMessage::AddSa(SaModify {
        user_sa_info: info,
        nlas,
    })
}

/// `XFRM_MSG_UPDSA`.
pub fn update_sa(info: UserSaInfo, nlas: Vec<XfrmAttrs>) -> XfrmMessage {
    XfrmMessage::UpdateSa(SaModify {
        user_sa_info: info,
        nlas,
    })
}

/// `XFRM_MSG_UPDPOLICY` with `templates`.
pub fn update_policy(info: UserPolicyInfo, templates: Vec<UserTemplate>) -> XfrmMessage {
    match new_policy(info, templates) {
        XfrmMessage::AddPolicy(m) => XfrmMessage::UpdatePolicy(m),
        other => other,
    }
}

/// `XFRM_MSG_EXPIRE` of `info` (`hard`: the kernel deleted the state).
pub fn expire(info: UserSaInfo, hard: bool) -> XfrmMessage {
    XfrmMessage::Expire(netlink_packet_xfrm::monitor::ExpireMessage {
        expire: netlink_packet_xfrm::UserExpire {
            state: info,
            hard: u8::from(hard),
        },
    })
}

/// `XFRM_MSG_DELSA` as the kernel notifies it (the kernel adds the whole
/// state and its algorithms, keys included: push them on `nlas`).
pub fn delete_sa(dst: IpAddr, spi: u32) -> XfrmMessage {
    let mut m = SaDelGet::default();
    m.user_sa_id.daddr = xfrm_address(dst);
    m.user_sa_id.spi = spi;
    m.user_sa_id.family = family(dst);
    m.user_sa_id.proto = IPPROTO_ESP;
    XfrmMessage::DeleteSa(m)
}

/// `XFRM_MSG_NEWPOLICY` with `templates`.
pub fn new_policy(info: UserPolicyInfo, templates: Vec<UserTemplate>) -> XfrmMessage {
    let nlas = if templates.is_empty() {
        Vec::new()
    } else {
        vec![XfrmAttrs::Template(templates)]
    };
    XfrmMessage::AddPolicy(PolicyModify {
        user_policy_info: info,
        nlas,
    })
}

/// `XFRM_MSG_DELPOLICY` as the kernel notifies it: the policy's id and the
/// whole policy in `XFRMA_POLICY`.
pub fn delete_policy(info: UserPolicyInfo) -> XfrmMessage {
    let mut m = PolicyDelGet::default();
    m.user_policy_id.selector = info.selector;
    m.user_policy_id.index = info.index;
    m.user_policy_id.direction = info.direction;
    m.nlas.push(XfrmAttrs::PolicyInfo(info));
    XfrmMessage::DeletePolicy(m)
}

/// One step of a recorded exchange with the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The driver asks for a dump.
    Dump(super::DumpKind),
    /// A datagram from the socket (one or more messages).
    Datagram(Vec<u8>),
}

/// The steps of a fixture file (`testdata/xfrm/*.nl`): `dump sa`,
/// `dump policy`, or a datagram in hex, one a line; `#` comments.
pub fn parse_fixture(text: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        steps.push(match line {
            "dump sa" => Step::Dump(super::DumpKind::Sa),
            "dump policy" => Step::Dump(super::DumpKind::Policy),
            hex_line => Step::Datagram(hex::decode(hex_line).map_err(|e| format!("line {}: {e}", n + 1))?),
        });
    }
    Ok(steps)
}

/// The fuzz target `xfrm_mirror`'s input for `steps`: a tag byte each,
/// 0 a dump of SAs, 1 of policies, 2 a datagram whose length follows in
/// two bytes (little-endian), then its bytes.
pub fn encode_steps(steps: &[Step]) -> Vec<u8> {
    let mut out = Vec::new();
    for step in steps {
        match step {
            Step::Dump(super::DumpKind::Sa) => out.push(0),
            Step::Dump(super::DumpKind::Policy) => out.push(1),
            Step::Datagram(d) => {
                for chunk in d.chunks(usize::from(u16::MAX)) {
                    out.push(2);
                    out.extend_from_slice(&(chunk.len() as u16).to_le_bytes());
                    out.extend_from_slice(chunk);
                }
            }
        }
    }
    out
}

/// The steps of a fuzz input ([`encode_steps`]'s form); any bytes read as
/// steps: an unknown tag is a datagram of the rest, a short one is cut.
pub fn decode_steps(mut data: &[u8]) -> Vec<Step> {
    let mut steps = Vec::new();
    while let Some((&tag, rest)) = data.split_first() {
        match tag {
            0 => {
                steps.push(Step::Dump(super::DumpKind::Sa));
                data = rest;
            }
            1 => {
                steps.push(Step::Dump(super::DumpKind::Policy));
                data = rest;
            }
            2 if rest.len() >= 2 => {
                let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
                let body = &rest[2..];
                let take = len.min(body.len());
                steps.push(Step::Datagram(body[..take].to_vec()));
                data = &body[take..];
            }
            _ => {
                steps.push(Step::Datagram(rest.to_vec()));
                break;
            }
        }
    }
    steps
}
