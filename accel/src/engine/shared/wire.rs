//! The shared engine's protocol: control messages on the Unix socket, the
//! request and completion entries (the same 64- and 16-byte forms in the
//! shared-memory rings and, followed by their data, in the socket
//! transport's messages), and the layout of a tenant's shared region.
//!
//! Parsing is sans-IO and total: every function takes bytes the other side
//! wrote (the server must assume a hostile tenant) and returns a typed
//! error, never panics and never trusts a length it has not checked. The
//! fuzz target `shared_request` drives [`Request::parse`] and
//! [`RequestEntry::decode`]. All integers are little-endian.

use crate::algorithm::Algorithm;
use crate::descriptor::{Descriptor, DescriptorError, DescriptorKind, Direction, Region, Status};
use crate::session::SessionHandle;
use strum::{Display, EnumString, IntoStaticStr, VariantArray, VariantNames};

/// Bumped whenever a message or entry changes shape (2: the stats reply
/// counts evictions, idle connections, refused peers and over-budget
/// registrations).
pub const VERSION: u16 = 2;
/// The largest message either side sends: a socket-transport burst is cut
/// to fit (its data included).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Bytes of one request entry.
pub const REQUEST_LEN: usize = 64;
/// Bytes of one completion entry.
pub const COMPLETION_LEN: usize = 16;
/// The largest key either half of a session may have (the longest real
/// one is 36 bytes; HMAC keys are their digest length).
pub const MAX_KEY: usize = 64;
/// Bytes of a Refused message's reason at most.
pub const MAX_REASON: usize = 200;

/// How a tenant's descriptors and data reach the server.
///
/// Names (config `[accel] transport`, `--transport`, JSON) are the
/// variants in lower case, derived once for strum and serde alike; the wire
/// codes are written out, as they must never move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[derive(VariantArray, VariantNames, IntoStaticStr, EnumString, Display)]
#[strum(serialize_all = "lowercase", parse_err_ty = UnknownTransport, parse_err_fn = UnknownTransport::new)]
pub enum Transport {
    /// A ring pair and data area in shared memory, eventfd doorbells.
    #[default]
    Shm,
    /// Descriptors and data in messages on the Unix socket (the study's
    /// vsock comparison).
    Socket,
}

crate::name_table!(Transport);

impl Transport {
    fn code(self) -> u8 {
        match self {
            Transport::Shm => 1,
            Transport::Socket => 2,
        }
    }

    fn from_code(code: u8) -> Option<Transport> {
        match code {
            1 => Some(Transport::Shm),
            2 => Some(Transport::Socket),
            _ => None,
        }
    }
}

crate::unknown_name!(
    /// A transport name that is not known.
    UnknownTransport,
    Transport,
    "transport"
);

/// Why bytes from the other side are not a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Empty, or shorter than its operation needs.
    #[error("message is {got} bytes; operation {op:#04x} needs {need}")]
    Short {
        /// The operation code (0 for an empty message).
        op: u8,
        /// Bytes received.
        got: usize,
        /// Bytes the operation needs at least.
        need: usize,
    },
    /// Longer than its operation allows (trailing bytes are refused, not
    /// ignored, so that two parsers cannot disagree about a message).
    #[error("message is {got} bytes; operation {op:#04x} takes {want}")]
    Long {
        /// The operation code.
        op: u8,
        /// Bytes received.
        got: usize,
        /// Bytes the operation takes.
        want: usize,
    },
    /// The operation code is not one of the protocol's.
    #[error("unknown operation {0:#04x}")]
    UnknownOp(u8),
    /// The tenant speaks another version of the protocol.
    #[error("protocol version {0}, this server speaks {VERSION}")]
    Version(u16),
    /// A field holds a value outside its set.
    #[error("field `{0}` holds a value outside its set")]
    Field(&'static str),
    /// A key is longer than any algorithm's.
    #[error("a key of {0} bytes is longer than any algorithm takes")]
    KeyLength(usize),
    /// A burst's entries or data run past the end of the message.
    #[error("a burst's entries or data run past the end of the message")]
    Truncated,
}

/// Operation codes: requests from tenants, replies from the server.
pub mod op {
    /// Tenant: attach (Attach).
    pub const ATTACH: u8 = 0x01;
    /// Tenant: register a session's keys (Register).
    pub const REGISTER: u8 = 0x02;
    /// Tenant: forget a session (Release).
    pub const RELEASE: u8 = 0x03;
    /// Tenant, socket transport: a burst of requests (Submit).
    pub const SUBMIT: u8 = 0x04;
    /// Anyone: ask for the server's counters (Stats).
    pub const STATS: u8 = 0x05;
    /// Tenant: leaving; the server reclaims the rest (Detach).
    pub const DETACH: u8 = 0x06;
    /// Server: attached, with the tenant's ID and region (Attached).
    pub const ATTACHED: u8 = 0x81;
    /// Server: the session's handle (Registered).
    pub const REGISTERED: u8 = 0x82;
    /// Server: the session is closed to new requests (Released).
    pub const RELEASED: u8 = 0x83;
    /// Server, socket transport: a burst of completions (Completions).
    pub const COMPLETIONS: u8 = 0x84;
    /// Server: its counters (Stats).
    pub const STATS_REPLY: u8 = 0x85;
    /// Server: a refusal with a code and a reason; unasked, it lets the tenant go (Refused).
    pub const REFUSED: u8 = 0xff;
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// A message's first byte, its operation; an empty message is short.
fn op_code(msg: &[u8]) -> Result<u8, WireError> {
    msg.first().copied().ok_or(WireError::Short {
        op: 0,
        got: 0,
        need: 1,
    })
}

fn exact(b: &[u8], want: usize) -> Result<(), WireError> {
    let op = b.first().copied().unwrap_or(0);
    if b.len() < want {
        return Err(WireError::Short {
            op,
            got: b.len(),
            need: want,
        });
    }
    if b.len() > want {
        return Err(WireError::Long {
            op,
            got: b.len(),
            want,
        });
    }
    Ok(())
}

/// A message from a tenant to the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Asks for a tenant ID and, for `shm`, a region of `entries` ring
    /// entries (a power of two) with a data slot of `slot_size` bytes each.
    Attach {
        /// The protocol version the tenant speaks: [`VERSION`].
        version: u16,
        /// How its descriptors and data will travel.
        transport: Transport,
        /// Ring entries asked for.
        entries: u32,
        /// Bytes of one data slot asked for.
        slot_size: u32,
    },
    /// An SA's keys, which cross once and stay in the server.
    Register {
        /// The SA's transform.
        algorithm: Algorithm,
        /// Whether it uses extended sequence numbers.
        esn: bool,
        /// The encryption key material, borrowed from the message.
        enc_key: &'a [u8],
        /// The HMAC key, borrowed from the message.
        auth_key: &'a [u8],
    },
    /// Forgets a session. `mark` is the tenant's request-ring head when it
    /// released (shm): entries before it still run, entries from it on
    /// naming the session are refused. Answered with Released at once (the
    /// engine wipes the keys once the earlier requests are with it), or
    /// Refused for a handle that is not the tenant's.
    Release {
        /// The session, as the server issued it.
        handle: SessionHandle,
        /// The tenant's request-ring head when it released (shm; 0 on a socket).
        mark: u32,
    },
    /// Socket transport: `count` request entries, each followed by its
    /// `data_len` bytes, in `body`.
    Submit {
        /// Entries in `body`.
        count: u16,
        /// The entries and their data, borrowed from the message.
        body: &'a [u8],
    },
    /// Asks for the server's counters (attached or not: an operator's query).
    Stats,
    /// The tenant leaves; the server reclaims its sessions and region.
    Detach,
}

impl<'a> Request<'a> {
    /// Parses one message. Key bytes are borrowed from `msg`: the caller
    /// wipes its receive buffer after using them.
    pub fn parse(msg: &'a [u8]) -> Result<Request<'a>, WireError> {
        let code = op_code(msg)?;
        match code {
            op::ATTACH => {
                exact(msg, 16)?;
                let version = u16_at(msg, 2);
                if version != VERSION {
                    return Err(WireError::Version(version));
                }
                let transport = Transport::from_code(msg[1]).ok_or(WireError::Field("transport"))?;
                Ok(Request::Attach {
                    version,
                    transport,
                    entries: u32_at(msg, 4),
                    slot_size: u32_at(msg, 8),
                })
            }
            op::REGISTER => {
                if msg.len() < 8 {
                    return Err(WireError::Short {
                        op: code,
                        got: msg.len(),
                        need: 8,
                    });
                }
                let algorithm = *Algorithm::ALL
                    .get(msg[1] as usize)
                    .ok_or(WireError::Field("algorithm"))?;
                let esn = match msg[2] {
                    0 => false,
                    1 => true,
                    _ => return Err(WireError::Field("esn")),
                };
                let enc_len = u16_at(msg, 4) as usize;
                let auth_len = u16_at(msg, 6) as usize;
                for len in [enc_len, auth_len] {
                    if len > MAX_KEY {
                        return Err(WireError::KeyLength(len));
                    }
                }
                exact(msg, 8 + enc_len + auth_len)?;
                Ok(Request::Register {
                    algorithm,
                    esn,
                    enc_key: &msg[8..8 + enc_len],
                    auth_key: &msg[8 + enc_len..],
                })
            }
            op::RELEASE => {
                exact(msg, 16)?;
                Ok(Request::Release {
                    handle: SessionHandle {
                        index: u32_at(msg, 4),
                        generation: u32_at(msg, 8),
                    },
                    mark: u32_at(msg, 12),
                })
            }
            op::SUBMIT => {
                if msg.len() < 4 {
                    return Err(WireError::Short {
                        op: code,
                        got: msg.len(),
                        need: 4,
                    });
                }
                Ok(Request::Submit {
                    count: u16_at(msg, 2),
                    body: &msg[4..],
                })
            }
            op::STATS => {
                exact(msg, 1)?;
                Ok(Request::Stats)
            }
            op::DETACH => {
                exact(msg, 1)?;
                Ok(Request::Detach)
            }
            other => Err(WireError::UnknownOp(other)),
        }
    }
}

/// Appends an Attach request to `out`.
pub fn attach(out: &mut Vec<u8>, transport: Transport, entries: u32, slot_size: u32) {
    out.extend_from_slice(&[op::ATTACH, transport.code()]);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&entries.to_le_bytes());
    out.extend_from_slice(&slot_size.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
}

/// Appends a Register request to `out` (a buffer the caller wipes).
pub fn register(out: &mut Vec<u8>, algorithm: Algorithm, esn: bool, enc_key: &[u8], auth_key: &[u8]) {
    let index = Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap_or(0) as u8;
    out.extend_from_slice(&[op::REGISTER, index, esn as u8, 0]);
    out.extend_from_slice(&(enc_key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(auth_key.len() as u16).to_le_bytes());
    out.extend_from_slice(enc_key);
    out.extend_from_slice(auth_key);
}

/// Appends a Release request to `out`.
pub fn release(out: &mut Vec<u8>, handle: SessionHandle, mark: u32) {
    out.extend_from_slice(&[op::RELEASE, 0, 0, 0]);
    out.extend_from_slice(&handle.index.to_le_bytes());
    out.extend_from_slice(&handle.generation.to_le_bytes());
    out.extend_from_slice(&mark.to_le_bytes());
}

/// Starts a Submit (or Completions, with `code`) message in `out`; entries
/// are appended after it and the count patched with [`set_count`].
pub fn start_burst(out: &mut Vec<u8>, code: u8) {
    out.clear();
    out.extend_from_slice(&[code, 0, 0, 0]);
}

/// Patches the entry count of a burst started with [`start_burst`].
pub fn set_count(out: &mut [u8], count: u16) {
    out[2..4].copy_from_slice(&count.to_le_bytes());
}

/// A reply from the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The tenant is attached; for `shm` the region's descriptors come
    /// with this message.
    Attached {
        /// The transport granted (the one asked for).
        transport: Transport,
        /// The ID the server gave the tenant.
        tenant: u32,
        /// Ring entries granted.
        entries: u32,
        /// Bytes of one data slot granted.
        slot_size: u32,
        /// Bytes of the shared region to map (shm; 0 on a socket).
        region_len: u64,
    },
    /// The session's handle, to name it in requests.
    Registered(SessionHandle),
    /// The session is closed to new requests (its earlier ones still run).
    Released,
    /// Socket transport: `count` completion entries each followed by its data.
    Completions {
        /// Entries in `body`.
        count: u16,
        /// The entries and their data, borrowed from the message.
        body: &'a [u8],
    },
    /// The server's counters.
    Stats(StatsReply),
    /// A request refused, or (unasked) the tenant let go.
    Refused {
        /// Why, as a [`refusal`](super::server::refusal) code.
        code: u8,
        /// Why, for people: at most [`MAX_REASON`] bytes of UTF-8.
        reason: &'a str,
    },
}

/// The server's counters, as a tenant or an operator can ask for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsReply {
    /// Tenants attached now.
    pub tenants: u64,
    /// Attaches accepted since the server started.
    pub attached: u64,
    /// Tenants reclaimed: detached, died or evicted.
    pub reclaimed: u64,
    /// Requests the engine executed.
    pub executed: u64,
    /// Requests (and releases) refused for naming another tenant's session.
    pub foreign_session: u64,
    /// Requests (and releases) refused for naming a released or never issued session.
    pub stale_session: u64,
    /// Requests refused for regions outside the tenant's data area or its slot.
    pub bad_region: u64,
    /// Messages and entries that did not parse, or came on the wrong path.
    pub malformed: u64,
    /// Requests refused past the tenant's in-flight quota.
    pub quota_full: u64,
    /// Completions of reclaimed tenants, dropped as they came.
    pub discarded: u64,
    /// Sessions released with the engine, their keys wiped.
    pub sessions_wiped: u64,
    /// Tenants let go: hung, a ring no honest tenant writes, or
    /// [`MAX_STRIKES`](super::server::MAX_STRIKES) messages outside the
    /// protocol (garbage, or requests on top of unread answers).
    pub evicted: u64,
    /// Connections closed without attaching: past the attach deadline, or
    /// the oldest waiting when a new one came.
    pub idle_closed: u64,
    /// Connections turned away by their peer's credentials.
    pub refused_peers: u64,
    /// Registrations refused for what the session would cost in file
    /// descriptors.
    pub over_budget: u64,
}

impl StatsReply {
    const FIELDS: usize = 15;

    fn to_array(self) -> [u64; Self::FIELDS] {
        [
            self.tenants,
            self.attached,
            self.reclaimed,
            self.executed,
            self.foreign_session,
            self.stale_session,
            self.bad_region,
            self.malformed,
            self.quota_full,
            self.discarded,
            self.sessions_wiped,
            self.evicted,
            self.idle_closed,
            self.refused_peers,
            self.over_budget,
        ]
    }

    fn from_array(a: [u64; Self::FIELDS]) -> StatsReply {
        StatsReply {
            tenants: a[0],
            attached: a[1],
            reclaimed: a[2],
            executed: a[3],
            foreign_session: a[4],
            stale_session: a[5],
            bad_region: a[6],
            malformed: a[7],
            quota_full: a[8],
            discarded: a[9],
            sessions_wiped: a[10],
            evicted: a[11],
            idle_closed: a[12],
            refused_peers: a[13],
            over_budget: a[14],
        }
    }

    /// Every refusal, whatever the rule.
    pub fn refused(&self) -> u64 {
        self.foreign_session + self.stale_session + self.bad_region + self.malformed
    }
}

impl<'a> Reply<'a> {
    /// Parses one reply, as strictly as [`Request::parse`]; the reason of a Refused is borrowed from `msg`.
    pub fn parse(msg: &'a [u8]) -> Result<Reply<'a>, WireError> {
        let code = op_code(msg)?;
        match code {
            op::ATTACHED => {
                exact(msg, 24)?;
                Ok(Reply::Attached {
                    transport: Transport::from_code(msg[1]).ok_or(WireError::Field("transport"))?,
                    tenant: u32_at(msg, 4),
                    entries: u32_at(msg, 8),
                    slot_size: u32_at(msg, 12),
                    region_len: u64_at(msg, 16),
                })
            }
            op::REGISTERED => {
                exact(msg, 12)?;
                Ok(Reply::Registered(SessionHandle {
                    index: u32_at(msg, 4),
                    generation: u32_at(msg, 8),
                }))
            }
            op::RELEASED => {
                exact(msg, 1)?;
                Ok(Reply::Released)
            }
            op::COMPLETIONS => {
                if msg.len() < 4 {
                    return Err(WireError::Truncated);
                }
                Ok(Reply::Completions {
                    count: u16_at(msg, 2),
                    body: &msg[4..],
                })
            }
            op::STATS_REPLY => {
                exact(msg, 8 + 8 * StatsReply::FIELDS)?;
                let mut a = [0u64; StatsReply::FIELDS];
                for (i, v) in a.iter_mut().enumerate() {
                    *v = u64_at(msg, 8 + 8 * i);
                }
                Ok(Reply::Stats(StatsReply::from_array(a)))
            }
            op::REFUSED => {
                if msg.len() < 2 || msg.len() > 2 + MAX_REASON {
                    return Err(WireError::Field("reason"));
                }
                let reason = std::str::from_utf8(&msg[2..]).map_err(|_| WireError::Field("reason"))?;
                Ok(Reply::Refused { code: msg[1], reason })
            }
            other => Err(WireError::UnknownOp(other)),
        }
    }

    /// Writes the reply into `out` (cleared first).
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.clear();
        match *self {
            Reply::Attached {
                transport,
                tenant,
                entries,
                slot_size,
                region_len,
            } => {
                out.extend_from_slice(&[op::ATTACHED, transport.code(), 0, 0]);
                out.extend_from_slice(&tenant.to_le_bytes());
                out.extend_from_slice(&entries.to_le_bytes());
                out.extend_from_slice(&slot_size.to_le_bytes());
                out.extend_from_slice(&region_len.to_le_bytes());
            }
            Reply::Registered(h) => {
                out.extend_from_slice(&[op::REGISTERED, 0, 0, 0]);
                out.extend_from_slice(&h.index.to_le_bytes());
                out.extend_from_slice(&h.generation.to_le_bytes());
            }
            Reply::Released => out.push(op::RELEASED),
            Reply::Completions { count, body } => {
                out.extend_from_slice(&[op::COMPLETIONS, 0]);
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(body);
            }
            Reply::Stats(s) => {
                out.extend_from_slice(&[op::STATS_REPLY, 0, 0, 0, 0, 0, 0, 0]);
                for v in s.to_array() {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Reply::Refused { code, reason } => {
                out.extend_from_slice(&[op::REFUSED, code]);
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&reason.as_bytes()[..end]);
            }
        }
    }
}

/// One request: which session, what to do, where the bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestEntry {
    /// The tenant's cookie, returned in the completion.
    pub user: u32,
    /// The session, by the handle the server issued this tenant.
    pub session: SessionHandle,
    /// Regions relative to the start of the request's data.
    pub desc: Descriptor,
    /// Shm: where the data lies in the tenant's data area. Socket: 0.
    pub data_offset: u32,
    /// Bytes of the request's data: its regions must fit in them.
    pub data_len: u32,
}

fn kind_code(kind: DescriptorKind) -> u8 {
    match kind {
        DescriptorKind::SinglePass => 0,
        DescriptorKind::CipherOnly => 1,
        DescriptorKind::MacOnly => 2,
    }
}

impl RequestEntry {
    /// Writes the entry's [`REQUEST_LEN`] bytes at the start of `out` (which must hold them).
    pub fn encode(&self, out: &mut [u8]) {
        let d = &self.desc;
        out[0..4].copy_from_slice(&self.user.to_le_bytes());
        out[4..8].copy_from_slice(&self.session.index.to_le_bytes());
        out[8..12].copy_from_slice(&self.session.generation.to_le_bytes());
        out[12] = kind_code(d.kind);
        out[13] = match d.direction {
            Direction::Encrypt => 0,
            Direction::Decrypt => 1,
        };
        out[14] = d.esn_high.is_some() as u8;
        out[15] = 0;
        out[16..20].copy_from_slice(&d.esn_high.unwrap_or(0).to_le_bytes());
        for (i, r) in [d.auth_only, d.iv, d.cipher, d.icv].into_iter().enumerate() {
            let at = 20 + 8 * i;
            out[at..at + 4].copy_from_slice(&r.offset.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&r.len.to_le_bytes());
        }
        out[52..56].copy_from_slice(&self.data_offset.to_le_bytes());
        out[56..60].copy_from_slice(&self.data_len.to_le_bytes());
        out[60..64].fill(0);
    }

    /// Decodes an entry the tenant wrote. The regions are checked against
    /// the data length here; where the data lies is the server's check.
    pub fn decode(b: &[u8]) -> Result<RequestEntry, WireError> {
        if b.len() < REQUEST_LEN {
            return Err(WireError::Truncated);
        }
        let kind = match b[12] {
            0 => DescriptorKind::SinglePass,
            1 => DescriptorKind::CipherOnly,
            2 => DescriptorKind::MacOnly,
            _ => return Err(WireError::Field("kind")),
        };
        let direction = match b[13] {
            0 => Direction::Encrypt,
            1 => Direction::Decrypt,
            _ => return Err(WireError::Field("direction")),
        };
        let esn_high = match b[14] {
            0 => None,
            1 => Some(u32_at(b, 16)),
            _ => return Err(WireError::Field("esn")),
        };
        let region = |i: usize| Region {
            offset: u32_at(b, 20 + 8 * i),
            len: u32_at(b, 24 + 8 * i),
        };
        Ok(RequestEntry {
            user: u32_at(b, 0),
            session: SessionHandle {
                index: u32_at(b, 4),
                generation: u32_at(b, 8),
            },
            desc: Descriptor {
                kind,
                direction,
                auth_only: region(0),
                esn_high,
                iv: region(1),
                cipher: region(2),
                icv: region(3),
                status: Status::Pending,
            },
            data_offset: u32_at(b, 52),
            data_len: u32_at(b, 56),
        })
    }

    /// Whether the regions fit the data: offsets in u64 so a hostile
    /// entry cannot wrap them round.
    pub fn regions_fit(&self) -> bool {
        let d = &self.desc;
        let end = |r: Region| r.offset as u64 + r.len as u64;
        let contiguous = end(d.auth_only) == d.iv.offset as u64
            && end(d.iv) == d.cipher.offset as u64
            && end(d.cipher) == d.icv.offset as u64;
        contiguous && end(d.icv) <= self.data_len as u64
    }
}

/// One completion: the cookie, the status, the bytes that come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionEntry {
    /// The cookie of the request this completes.
    pub user: u32,
    /// What the engine wrote back.
    pub status: Status,
    /// Bytes of result data (0 when the status is an error).
    pub data_len: u32,
}

impl CompletionEntry {
    /// Writes the entry's [`COMPLETION_LEN`] bytes at the start of `out` (which must hold them).
    pub fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.user.to_le_bytes());
        let (code, err) = status_code(self.status);
        out[4] = code;
        out[5] = err;
        out[6..8].fill(0);
        out[8..12].copy_from_slice(&self.data_len.to_le_bytes());
        out[12..16].fill(0);
    }

    /// Decodes an entry the server wrote; a status outside the protocol's is refused.
    pub fn decode(b: &[u8]) -> Result<CompletionEntry, WireError> {
        if b.len() < COMPLETION_LEN {
            return Err(WireError::Truncated);
        }
        Ok(CompletionEntry {
            user: u32_at(b, 0),
            status: status_from(b[4], b[5]).ok_or(WireError::Field("status"))?,
            data_len: u32_at(b, 8),
        })
    }
}

fn status_code(s: Status) -> (u8, u8) {
    match s {
        Status::Pending => (0, 0),
        Status::Done => (1, 0),
        Status::AuthFailed => (2, 0),
        Status::Error(e) => (
            3,
            match e {
                DescriptorError::BadRegions => 0,
                DescriptorError::Misaligned => 1,
                DescriptorError::Unsupported => 2,
                DescriptorError::Fault => 3,
                DescriptorError::BadSession => 4,
                DescriptorError::Timeout => 5,
                DescriptorError::Unavailable => 6,
            },
        ),
    }
}

fn status_from(code: u8, err: u8) -> Option<Status> {
    Some(match code {
        0 => Status::Pending,
        1 => Status::Done,
        2 => Status::AuthFailed,
        3 => Status::Error(match err {
            0 => DescriptorError::BadRegions,
            1 => DescriptorError::Misaligned,
            2 => DescriptorError::Unsupported,
            3 => DescriptorError::Fault,
            4 => DescriptorError::BadSession,
            5 => DescriptorError::Timeout,
            6 => DescriptorError::Unavailable,
            _ => return None,
        }),
        _ => return None,
    })
}

/// Walks a burst body: `count` entries, each followed by its data.
pub struct BurstIter<'a, E> {
    body: &'a [u8],
    left: u16,
    decode: fn(&[u8]) -> Result<E, WireError>,
    entry_len: usize,
    data_len: fn(&E) -> u32,
}

impl<'a> BurstIter<'a, RequestEntry> {
    /// The request entries of a Submit body.
    pub fn requests(count: u16, body: &'a [u8]) -> Self {
        BurstIter {
            body,
            left: count,
            decode: RequestEntry::decode,
            entry_len: REQUEST_LEN,
            data_len: |e| e.data_len,
        }
    }
}

impl<'a> BurstIter<'a, CompletionEntry> {
    /// The completion entries of a Completions body.
    pub fn completions(count: u16, body: &'a [u8]) -> Self {
        BurstIter {
            body,
            left: count,
            decode: CompletionEntry::decode,
            entry_len: COMPLETION_LEN,
            data_len: |e| e.data_len,
        }
    }
}

impl<'a, E> Iterator for BurstIter<'a, E> {
    type Item = Result<(E, &'a [u8]), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        if self.body.len() < self.entry_len {
            self.left = 0;
            return Some(Err(WireError::Truncated));
        }
        let entry = match (self.decode)(&self.body[..self.entry_len]) {
            Ok(e) => e,
            Err(e) => {
                self.left = 0;
                return Some(Err(e));
            }
        };
        let len = (self.data_len)(&entry) as usize;
        let rest = &self.body[self.entry_len..];
        if rest.len() < len {
            self.left = 0;
            return Some(Err(WireError::Truncated));
        }
        let (data, tail) = rest.split_at(len);
        self.body = tail;
        Some(Ok((entry, data)))
    }
}

/// Where things lie in a tenant's shared region. The header's ring
/// indices each have a cache line to themselves, so the tenant's writes
/// and the server's do not contend for one line.
pub mod layout {
    /// Written by the tenant: requests published (free-running).
    pub const REQ_HEAD: usize = 64;
    /// Written by the server: requests consumed.
    pub const REQ_TAIL: usize = 128;
    /// Written by the server: completions published.
    pub const COMP_HEAD: usize = 192;
    /// Written by the tenant: completions consumed.
    pub const COMP_TAIL: usize = 256;
    /// Written by the server: 1 while it may sleep (ring its doorbell).
    pub const SERVER_SLEEPING: usize = 320;
    /// Written by the tenant: 1 while it waits (ring its doorbell).
    pub const TENANT_SLEEPING: usize = 384;
    /// Bytes of the header (the ring indices and flags) before the request ring.
    pub const HEADER: usize = 512;
    /// The data area starts on a page boundary.
    pub const PAGE: usize = 4096;

    /// (request ring, completion ring, data area, total) offsets for
    /// `entries` entries of `slot_size` bytes.
    pub fn offsets(entries: usize, slot_size: usize) -> (usize, usize, usize, usize) {
        let req = HEADER;
        let comp = req + entries * super::REQUEST_LEN;
        let data = (comp + entries * super::COMPLETION_LEN).div_ceil(PAGE) * PAGE;
        let total = data + entries * slot_size;
        (req, comp, data, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are config values, `--transport` values and JSON text:
    /// deriving them must not rename one, and serde must agree with strum.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        crate::assert_published_names::<Transport>(&["shm", "socket"]);
        for transport in Transport::ALL {
            assert_eq!(Transport::from_code(transport.code()), Some(transport));
        }
        assert_eq!(
            "vsock".parse::<Transport>().unwrap_err().to_string(),
            "unknown transport `vsock`; expected shm or socket"
        );
    }

    fn entry() -> RequestEntry {
        RequestEntry {
            user: 7,
            session: SessionHandle {
                index: 3,
                generation: 2,
            },
            desc: Descriptor {
                kind: DescriptorKind::SinglePass,
                direction: Direction::Decrypt,
                auth_only: Region::new(0, 8),
                esn_high: Some(9),
                iv: Region::new(8, 8),
                cipher: Region::new(16, 32),
                icv: Region::new(48, 16),
                status: Status::Pending,
            },
            data_offset: 4096,
            data_len: 64,
        }
    }

    #[test]
    fn entries_round_trip_and_bad_fields_are_refused() {
        let mut b = [0u8; REQUEST_LEN];
        entry().encode(&mut b);
        assert_eq!(RequestEntry::decode(&b), Ok(entry()));
        assert!(entry().regions_fit());
        for (at, field) in [(12, "kind"), (13, "direction"), (14, "esn")] {
            let mut bad = b;
            bad[at] = 9;
            assert_eq!(RequestEntry::decode(&bad), Err(WireError::Field(field)));
        }
        assert_eq!(RequestEntry::decode(&b[..63]), Err(WireError::Truncated));
        let mut wrap = entry();
        wrap.desc.icv = Region {
            offset: 48,
            len: u32::MAX,
        };
        assert!(!wrap.regions_fit(), "a length that would wrap is refused");
        let c = CompletionEntry {
            user: 5,
            status: Status::Error(DescriptorError::BadSession),
            data_len: 0,
        };
        let mut cb = [0u8; COMPLETION_LEN];
        c.encode(&mut cb);
        assert_eq!(CompletionEntry::decode(&cb), Ok(c));
    }

    #[test]
    fn requests_parse_exactly_and_refuse_trailing_bytes() {
        let mut m = Vec::new();
        attach(&mut m, Transport::Shm, 64, 2048);
        assert_eq!(
            Request::parse(&m),
            Ok(Request::Attach {
                version: VERSION,
                transport: Transport::Shm,
                entries: 64,
                slot_size: 2048
            })
        );
        m.push(0);
        assert!(matches!(Request::parse(&m), Err(WireError::Long { .. })));
        m.clear();
        register(&mut m, Algorithm::Aes128Sha1, true, &[1; 16], &[2; 20]);
        let Ok(Request::Register {
            algorithm,
            esn,
            enc_key,
            auth_key,
        }) = Request::parse(&m)
        else {
            panic!("register parses");
        };
        assert_eq!(
            (algorithm, esn, enc_key.len(), auth_key.len()),
            (Algorithm::Aes128Sha1, true, 16, 20)
        );
        m.truncate(m.len() - 1);
        assert!(matches!(Request::parse(&m), Err(WireError::Short { .. })));
        assert_eq!(Request::parse(&[0x42]), Err(WireError::UnknownOp(0x42)));
        assert!(Request::parse(&[]).is_err());
    }

    #[test]
    fn a_burst_with_data_past_its_end_is_truncated_not_read() {
        let mut m = Vec::new();
        start_burst(&mut m, op::SUBMIT);
        let mut b = [0u8; REQUEST_LEN];
        entry().encode(&mut b);
        m.extend_from_slice(&b);
        m.extend_from_slice(&[0; 63]);
        set_count(&mut m, 1);
        let Ok(Request::Submit { count, body }) = Request::parse(&m) else {
            panic!("submit parses");
        };
        let got: Vec<_> = BurstIter::requests(count, body).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().err(), Some(&WireError::Truncated));
        m.push(0);
        let Ok(Request::Submit { count, body }) = Request::parse(&m) else {
            panic!("submit parses");
        };
        let (e, data) = BurstIter::requests(count, body).next().unwrap().unwrap();
        assert_eq!((e, data.len()), (entry(), 64));
    }

    #[test]
    fn replies_round_trip() {
        let mut m = Vec::new();
        for r in [
            Reply::Attached {
                transport: Transport::Socket,
                tenant: 1,
                entries: 64,
                slot_size: 8192,
                region_len: 1 << 20,
            },
            Reply::Registered(SessionHandle {
                index: 1,
                generation: 2,
            }),
            Reply::Released,
            Reply::Stats(StatsReply {
                bad_region: 3,
                ..StatsReply::default()
            }),
            Reply::Refused {
                code: 2,
                reason: "no room",
            },
        ] {
            r.emit(&mut m);
            assert_eq!(Reply::parse(&m), Ok(r));
        }
    }
}
