//! One XFRM state (`xfrm_usersa_info` and its attributes) to an espgw SA.
//!
//! Owns the mapping of algorithms, keys, modes, addresses, UDP
//! encapsulation, replay windows, ESN and lifetimes, and the refusal of
//! whatever espgw's SA cannot carry exactly. Keys are copied once, into
//! memory that is wiped when dropped, and the parsed message's copies are
//! wiped here (see [`wipe_keys`]). Must not decide what is installed when
//! ([`super::mirror`] does).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use accel::Algorithm;
use netlink_packet_core::Nla;
use netlink_packet_xfrm::{
    Address, LifetimeConfig, UserSaInfo, XfrmAttrs, UDP_ENCAP_ESPINUDP, XFRM_INF, XFRM_MODE_BEET,
    XFRM_MODE_TRANSPORT, XFRM_MODE_TUNNEL, XFRM_STATE_ESN,
};
use spd_sad::{Lifetime, Limits, Mode, SaDirection, SaParams, UdpEncap, MAX_WINDOW};
use zeroize::{Zeroize, Zeroizing};

use super::{Refusal, Refused};

/// ESP, as an XFRM state's or template's `id.proto` names it.
pub const IPPROTO_ESP: u8 = 50;
/// AH, which espgw does not do.
pub const IPPROTO_AH: u8 = 51;
/// IPComp, which espgw does not do.
pub const IPPROTO_COMP: u8 = 108;
/// IPv4, as `xfrm_usersa_info.family` and selectors name it.
pub const AF_INET: u16 = 2;
/// IPv6, likewise.
pub const AF_INET6: u16 = 10;
/// `XFRMA_SA_DIR` (Linux 6.10): the state's direction, when its creator
/// gave one; the crate does not know it yet and hands it over raw.
pub const XFRMA_SA_DIR: u16 = 40;
const XFRM_SA_DIR_IN: u8 = 1;
const XFRM_SA_DIR_OUT: u8 = 2;

/// Where an XFRM state is found: its destination and SPI (its protocol
/// is ESP: nothing else is mirrored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SaKey {
    /// The state's destination address.
    pub daddr: IpAddr,
    /// Its SPI.
    pub spi: u32,
}

impl std::fmt::Display for SaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spi 0x{:08x} dst {}", self.spi, self.daddr)
    }
}

/// An XFRM state translated: espgw's SA and what the mirror matches
/// policies' templates against.
pub struct TranslatedSa {
    /// Which kernel state it is.
    pub key: SaKey,
    /// The request id it shares with the policies whose templates name
    /// it.
    pub reqid: u32,
    /// The state's source address.
    pub saddr: IpAddr,
    /// The SA as espgw installs it; an inbound one's selectors are still
    /// empty (the mirror gives it its policies').
    pub params: SaParams,
    /// The ESP transform of its algorithms.
    pub algorithm: Algorithm,
    /// The encryption key (an AEAD's salt appended), wiped when dropped.
    pub enc_key: Zeroizing<Vec<u8>>,
    /// The integrity key; empty for an AEAD or NULL.
    pub auth_key: Zeroizing<Vec<u8>>,
    /// The kernel's counter (`oseq` out, `seq` in), with ESN's high half.
    pub initial_seq: u64,
    /// When the kernel added it (seconds since the epoch): the newest SA
    /// of a reqid is the one policies use, as the kernel's lookup does.
    pub added: u64,
}

/// What an XFRM state is, before any key is looked at.
pub enum Classified {
    /// ESP with keys: translate it.
    Keyed,
    /// A larval state from `XFRM_MSG_ALLOCSPI` (an SPI reserved for an
    /// exchange in progress, no keys yet): nothing to install.
    Larval,
}

/// The address of `family` in XFRM's 16-byte form.
pub fn address(family: u16, a: &Address) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::new(
            a.addr[0], a.addr[1], a.addr[2], a.addr[3],
        ))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(a.addr))),
        _ => None,
    }
}

/// Wipes every key the parsed attributes hold. The crate copies each key
/// into a vector of exactly its length, so wiping it leaves no copy.
pub fn wipe_keys(attrs: &mut [XfrmAttrs]) {
    for attr in attrs {
        match attr {
            XfrmAttrs::EncryptionAlg(a) | XfrmAttrs::AuthenticationAlg(a) | XfrmAttrs::CompressionAlg(a) => {
                a.alg_key.zeroize()
            }
            XfrmAttrs::EncryptionAlgAead(a) => a.alg_key.zeroize(),
            XfrmAttrs::AuthenticationAlgTrunc(a) => a.alg_key.zeroize(),
            _ => {}
        }
    }
}

/// Whether `info` with `attrs` is a keyed ESP state or a larval one.
pub fn classify(info: &UserSaInfo, attrs: &[XfrmAttrs]) -> Result<Classified, Refused> {
    match info.id.proto {
        IPPROTO_ESP => {}
        IPPROTO_AH => return Err(Refused::new(Refusal::Protocol, "AH (espgw does ESP only)")),
        IPPROTO_COMP => return Err(Refused::new(Refusal::Protocol, "IPComp")),
        other => return Err(Refused::new(Refusal::Protocol, format!("IP protocol {other}"))),
    }
    let keyed = attrs.iter().any(|a| {
        matches!(
            a,
            XfrmAttrs::EncryptionAlg(_)
                | XfrmAttrs::EncryptionAlgAead(_)
                | XfrmAttrs::AuthenticationAlgTrunc(_)
        ) || matches!(a, XfrmAttrs::AuthenticationAlg(_))
    });
    Ok(if keyed {
        Classified::Keyed
    } else {
        Classified::Larval
    })
}

/// The first `bits / 8` bytes of `key`, if it has them and `bits` is whole
/// bytes.
fn key_bytes(what: &str, key: &[u8], bits: u32) -> Result<Zeroizing<Vec<u8>>, Refused> {
    let len = usize::try_from(bits / 8).unwrap_or(usize::MAX);
    if !bits.is_multiple_of(8) || key.len() < len {
        return Err(Refused::new(
            Refusal::KeyLength,
            format!("{what}: {bits}-bit key with {} bytes given", key.len()),
        ));
    }
    Ok(Zeroizing::new(key[..len].to_vec()))
}

/// An algorithm name as the kernel writes it (NUL-terminated).
fn name_of(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// The proposal and keys of a state's algorithm attributes.
#[allow(clippy::type_complexity)]
fn algorithm(attrs: &[XfrmAttrs]) -> Result<(Algorithm, Zeroizing<Vec<u8>>, Zeroizing<Vec<u8>>), Refused> {
    let mut aead = None;
    let mut crypt = None;
    let mut auth = None;
    let mut auth_legacy = None;
    for attr in attrs {
        match attr {
            XfrmAttrs::EncryptionAlgAead(a) => aead = Some(a),
            XfrmAttrs::EncryptionAlg(a) => crypt = Some(a),
            XfrmAttrs::AuthenticationAlgTrunc(a) => auth = Some(a),
            XfrmAttrs::AuthenticationAlg(a) => auth_legacy = Some(a),
            XfrmAttrs::CompressionAlg(_) => {
                return Err(Refused::new(Refusal::Protocol, "IPComp on an ESP state"))
            }
            _ => {}
        }
    }
    if let Some(a) = aead {
        if crypt.is_some() || auth.is_some() || auth_legacy.is_some() {
            return Err(Refused::new(
                Refusal::Algorithm,
                "an AEAD with a separate cipher or integrity algorithm",
            ));
        }
        let name = name_of(&a.alg_name);
        let algorithm = match (name.as_str(), a.alg_key_len, a.alg_icv_len) {
            ("rfc4106(gcm(aes))", 160, 128) => Algorithm::Aes128Gcm16,
            ("rfc4106(gcm(aes))", 288, 128) => Algorithm::Aes256Gcm16,
            ("rfc7539esp(chacha20,poly1305)", 288, 128) => Algorithm::ChaCha20Poly1305,
            (name, key, icv) => {
                return Err(Refused::new(
                    Refusal::Algorithm,
                    format!("AEAD {name} with a {key}-bit key (salt included) and a {icv}-bit ICV"),
                ))
            }
        };
        let key = key_bytes(&name, &a.alg_key, a.alg_key_len)?;
        return Ok((algorithm, key, Zeroizing::new(Vec::new())));
    }
    let Some(c) = crypt else {
        return Err(Refused::new(Refusal::Algorithm, "integrity without encryption"));
    };
    // The legacy attribute has no truncation: the kernel then uses the
    // algorithm's default, 96 bits for both (RFC 2404; RFC 4868 wants 128
    // for SHA-256, which espgw does).
    let (auth_name, auth_bits, trunc, auth_key) = match (auth, auth_legacy) {
        (Some(a), _) => (name_of(&a.alg_name), a.alg_key_len, a.alg_trunc_len, &a.alg_key),
        (None, Some(a)) => (name_of(&a.alg_name), a.alg_key_len, 96, &a.alg_key),
        (None, None) => {
            return Err(Refused::new(
                Refusal::Algorithm,
                format!("{} without integrity", name_of(&c.alg_name)),
            ))
        }
    };
    let crypt_name = name_of(&c.alg_name);
    let algorithm = match (
        crypt_name.as_str(),
        c.alg_key_len,
        auth_name.as_str(),
        auth_bits,
        trunc,
    ) {
        ("cbc(aes)", 128, "hmac(sha1)", 160, 96) => Algorithm::Aes128Sha1,
        ("cbc(aes)", 256, "hmac(sha256)", 256, 128) => Algorithm::Aes256Sha256,
        ("cbc(des3_ede)", 192, "hmac(sha1)", 160, 96) => Algorithm::TripleDesSha1,
        (cn, ck, an, ak, t) => {
            return Err(Refused::new(
                Refusal::Algorithm,
                format!(
                    "{cn} with a {ck}-bit key and {an} with a {ak}-bit key truncated to {t} bits; espgw has \
                     cbc(aes)-128 with hmac(sha1)/96, cbc(aes)-256 with hmac(sha256)/128, cbc(des3_ede) with \
                     hmac(sha1)/96, rfc4106(gcm(aes)) 128/256 and rfc7539esp(chacha20,poly1305)"
                ),
            ))
        }
    };
    let enc = key_bytes(&crypt_name, &c.alg_key, c.alg_key_len)?;
    let integrity = key_bytes(&auth_name, auth_key, auth_bits)?;
    if algorithm == Algorithm::TripleDesSha1 {
        let parts: Vec<&[u8]> = enc.chunks(8).collect();
        if parts.len() == 3 && (parts[0] == parts[1] || parts[1] == parts[2] || parts[0] == parts[2]) {
            return Err(Refused::new(
                Refusal::WeakKey,
                "a 3DES key with repeated 8-byte parts (RFC 2451 §2.3: that is single DES)",
            ));
        }
    }
    Ok((algorithm, enc, integrity))
}

/// A limit in XFRM's form: `XFRM_INF` is none.
fn limit(value: u64) -> Option<u64> {
    (value != XFRM_INF).then_some(value)
}

/// A time limit: zero is none (the kernel arms no timer for it).
fn seconds(value: u64) -> Option<u64> {
    (value != 0).then_some(value)
}

fn lifetime(cfg: &LifetimeConfig) -> Result<Lifetime, Refused> {
    if cfg.soft_use_expires_seconds != 0 || cfg.hard_use_expires_seconds != 0 {
        return Err(Refused::new(
            Refusal::Lifetime,
            "a lifetime in seconds since first use (espgw counts seconds since installation)",
        ));
    }
    Ok(Lifetime {
        soft: Limits {
            bytes: limit(cfg.soft_byte_limit),
            packets: limit(cfg.soft_packet_limit),
            seconds: seconds(cfg.soft_add_expires_seconds),
            idle_seconds: None,
        },
        hard: Limits {
            bytes: limit(cfg.hard_byte_limit),
            packets: limit(cfg.hard_packet_limit),
            seconds: seconds(cfg.hard_add_expires_seconds),
            idle_seconds: None,
        },
    })
}

/// Attributes that change what the state does in a way espgw cannot
/// follow.
fn unsupported_attribute(attrs: &[XfrmAttrs]) -> Result<(), Refused> {
    for attr in attrs {
        match attr {
            XfrmAttrs::Mark(m) if m.mask != 0 => {
                return Err(Refused::new(
                    Refusal::Mark,
                    format!("mark 0x{:x}/0x{:x}", m.value, m.mask),
                ))
            }
            XfrmAttrs::MarkVal(v) if *v != 0 => {
                return Err(Refused::new(Refusal::Mark, format!("output mark 0x{v:x}")))
            }
            XfrmAttrs::IfId(id) if *id != 0 => {
                return Err(Refused::new(Refusal::Mark, format!("XFRM interface id {id}")))
            }
            XfrmAttrs::SecurityContext(_) => {
                return Err(Refused::new(Refusal::SecurityContext, "a security context"))
            }
            XfrmAttrs::CareOfAddr(_) => return Err(Refused::new(Refusal::CareOf, "a care-of address")),
            XfrmAttrs::TfcPadding(p) if *p != 0 => {
                return Err(Refused::new(
                    Refusal::TfcPadding,
                    format!("TFC padding to {p} bytes"),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The direction the state's creator gave (`XFRMA_SA_DIR`), if any.
fn given_direction(attrs: &[XfrmAttrs]) -> Option<SaDirection> {
    attrs.iter().find_map(|attr| match attr {
        XfrmAttrs::Other(nla) if nla.kind() == XFRMA_SA_DIR && nla.value_len() == 1 => {
            let mut value = [0u8; 1];
            nla.emit_value(&mut value);
            match value[0] {
                XFRM_SA_DIR_IN => Some(SaDirection::Inbound),
                XFRM_SA_DIR_OUT => Some(SaDirection::Outbound),
                _ => None,
            }
        }
        _ => None,
    })
}

/// Translates a keyed ESP state. `local` holds this gateway's outside
/// addresses: a state to one of them is inbound, one from one of them
/// outbound. `name` names the SA from its key, reqid and direction.
pub fn translate(
    info: &UserSaInfo,
    attrs: &[XfrmAttrs],
    local: &[IpAddr],
    name: impl FnOnce(SaKey, u32, SaDirection) -> String,
) -> Result<TranslatedSa, Refused> {
    let family = info.family;
    let (Some(daddr), Some(saddr)) = (address(family, &info.id.daddr), address(family, &info.saddr)) else {
        return Err(Refused::new(
            Refusal::Addresses,
            format!("address family {family}"),
        ));
    };
    let key = SaKey {
        daddr,
        spi: info.id.spi,
    };
    if info.id.spi < 256 {
        return Err(Refused::new(
            Refusal::Spi,
            format!(
                "SPI {} is reserved (RFC 4303 §2.1: 1 to 255; 0 is no SPI)",
                info.id.spi
            ),
        ));
    }
    let mode = match info.mode {
        XFRM_MODE_TUNNEL => Mode::Tunnel,
        XFRM_MODE_TRANSPORT => Mode::Transport,
        XFRM_MODE_BEET => return Err(Refused::new(Refusal::Mode, "BEET mode")),
        other => return Err(Refused::new(Refusal::Mode, format!("mode {other}"))),
    };
    unsupported_attribute(attrs)?;
    let direction = match given_direction(attrs) {
        Some(d) => d,
        None => match (local.contains(&daddr), local.contains(&saddr)) {
            (true, false) => SaDirection::Inbound,
            (false, true) => SaDirection::Outbound,
            (true, true) => {
                return Err(Refused::new(
                    Refusal::Addresses,
                    format!("both ends ({saddr} -> {daddr}) are this gateway's"),
                ))
            }
            (false, false) => {
                return Err(Refused::new(
                    Refusal::Addresses,
                    format!("neither end ({saddr} -> {daddr}) is this gateway's outside address"),
                ))
            }
        },
    };
    let (local_addr, remote_addr) = match direction {
        SaDirection::Inbound => (daddr, saddr),
        SaDirection::Outbound => (saddr, daddr),
    };
    let mut encap = None;
    let mut replay_esn = None;
    let mut replay_legacy = None;
    for attr in attrs {
        match attr {
            XfrmAttrs::EncapsulationTemplate(t) => {
                if t.encap_type != UDP_ENCAP_ESPINUDP {
                    return Err(Refused::new(
                        Refusal::Encapsulation,
                        format!(
                            "encapsulation type {} (espgw does ESP in UDP, type 2)",
                            t.encap_type
                        ),
                    ));
                }
                // The source port is the state's source's, whichever way
                // the state goes.
                let (local_port, remote_port) = match direction {
                    SaDirection::Inbound => (t.encap_dport, t.encap_sport),
                    SaDirection::Outbound => (t.encap_sport, t.encap_dport),
                };
                encap = Some(UdpEncap {
                    local_port,
                    remote_port,
                });
            }
            XfrmAttrs::ReplayStateEsn(r) => replay_esn = Some(r),
            XfrmAttrs::ReplayState(r) => replay_legacy = Some(r),
            _ => {}
        }
    }
    if encap.is_some() && mode == Mode::Transport {
        return Err(Refused::new(
            Refusal::Encapsulation,
            "ESP in UDP in transport mode (espgw encapsulates tunnel mode only)",
        ));
    }
    if encap.is_some() && family == AF_INET6 {
        return Err(Refused::new(Refusal::Encapsulation, "ESP in UDP over IPv6"));
    }
    let esn = info.flags & XFRM_STATE_ESN != 0;
    let (replay_window, initial_seq) = match (replay_esn, esn) {
        (Some(r), _) => {
            let (out, into) = (
                u64::from(r.oseq_hi) << 32 | u64::from(r.oseq),
                u64::from(r.seq_hi) << 32 | u64::from(r.seq),
            );
            (
                r.replay_window,
                match direction {
                    SaDirection::Outbound => out,
                    SaDirection::Inbound => into,
                },
            )
        }
        (None, true) => {
            return Err(Refused::new(
                Refusal::ReplayWindow,
                "ESN without its replay state (XFRMA_REPLAY_ESN_VAL)",
            ))
        }
        (None, false) => (
            u32::from(info.replay_window),
            replay_legacy.map_or(0, |r| match direction {
                SaDirection::Outbound => u64::from(r.oseq),
                SaDirection::Inbound => u64::from(r.seq),
            }),
        ),
    };
    if replay_window > MAX_WINDOW {
        return Err(Refused::new(
            Refusal::ReplayWindow,
            format!("a replay window of {replay_window} packets (espgw's largest is {MAX_WINDOW})"),
        ));
    }
    if esn && replay_window == 0 {
        return Err(Refused::new(Refusal::ReplayWindow, "ESN without a replay window"));
    }
    let lifetime = lifetime(&info.lifetime_cfg)?;
    let (algorithm, enc_key, auth_key) = algorithm(attrs)?;
    let name = name(key, info.reqid, direction);
    Ok(TranslatedSa {
        key,
        reqid: info.reqid,
        saddr,
        params: SaParams {
            name,
            direction,
            spi: info.id.spi,
            mode,
            local: local_addr,
            remote: remote_addr,
            esn,
            replay_window,
            lifetime,
            encap,
            selectors: Vec::new(),
        },
        algorithm,
        enc_key,
        auth_key,
        initial_seq,
        added: info.lifetime_cur.add_time,
    })
}
