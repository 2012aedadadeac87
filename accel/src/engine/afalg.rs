//! The Linux kernel crypto API through AF_ALG sockets: the path to crypto
//! hardware (talitos, CAAM, QAT) that the kernel drives.
//!
//! This file owns the engine's kernel objects and the memory the kernel
//! reads and writes on its behalf: the keyed transform sockets of every
//! registered session, their pooled operation sockets, the io_uring, and a
//! fixed array of request slots. It must not touch packet headers, SA state
//! or anything outside the regions a descriptor names, and it never reads a
//! clock: every time it compares is the caller's `now`.
//!
//! Sessions. [`Engine::register`] (SA install) opens the session's keyed
//! transforms and one operation socket on each; a kernel refusal is
//! `RegisterError::Refused` with the kernel's reason:
//! - single-pass: `rfc4106(gcm(aes))`, `authenc(hmac(sha1|sha256),cbc(aes|des3_ede))`
//!   (`authencesn(...)` when the session uses extended sequence numbers),
//!   `authenc(hmac(sha1),ecb(cipher_null))` for null-sha1;
//! - cipher-only (dual-pass and sync styles): `cbc(aes)`, `cbc(des3_ede)` (skcipher);
//! - MAC-only: `hmac(sha1)`, `hmac(sha256)` (hash).
//!
//! null/null needs no socket. The raw keys are not kept: the kernel holds
//! the only copies, and [`Engine::release`] closes the transform sockets
//! and the idle operation sockets (the kernel frees and wipes the key when
//! the last socket on a transform closes). A request still in flight owns
//! its operation socket until its completion arrives (the kernel pins the
//! transform for every accepted socket), so jobs of a released session
//! complete normally; their sockets close then.
//!
//! Requests. Every job takes one of [`SLOTS`] preallocated slots until it is
//! handed back: the slot's `msghdr`, control-message buffer, iovecs and a
//! staging buffer of [`STAGING`] bytes are reused, and operation sockets
//! are pooled per transform, so on the registered-buffer path nothing
//! allocates per packet (the first packets of a session may `accept` more
//! operation sockets, into a pool whose room was reserved at
//! registration). A transform keeps one idle socket of its own; more are
//! kept only within the engine-wide [`SPARE_OPS`], so what a session costs
//! in file descriptors is fixed ([`session_fds`]) and a server can bound
//! its tenants' sessions by it. The request reads the packet in place (SPI ‖ [ESN high
//! word ‖] sequence ‖ IV ‖ data [‖ ICV], the associated data being
//! SPI ‖ sequence ‖ IV, with the IV also given by `ALG_SET_IV`); the kernel
//! writes its result into the staging buffer, and only a successful result
//! is copied back, so a packet whose ICV fails is left as it arrived.
//! `authencesn` moves the ESN high word behind the payload for the MAC, as
//! RFC 4303 §2.2.1 asks; the kernel answers `EBADMSG` when the ICV does not
//! match, and MAC-only decryption compares in constant time here.
//!
//! I/O. Synchronous (`sendmsg` then `readv` in the caller's thread), or
//! io_uring: a linked `sendmsg` + `readv` pair per job, each on its own
//! operation socket, one doorbell per burst. Completions can arrive out of
//! order; a finished job is held until every earlier job of its session has
//! been handed back, so `poll_burst` keeps per-session order.
//! [`Engine::reclaim`] cancels requests older than the reclaim age
//! ([`AfalgEngine::set_reclaim_after`]) and returns them with
//! `Error(Fault)`; `Drop` cancels everything on the ring and waits for every
//! completion before it frees a slot or a buffer. Tests make a request
//! stay on the ring with the hidden hook
//! `AfalgEngine::stall_next_requests_for_test` (a `sendmsg` with
//! `MSG_MORE`, so the kernel waits for input that never comes).
//!
//! Where the kernel has no AF_ALG (`CONFIG_CRYPTO_USER_API_AEAD` off),
//! [`probe`] says so and the engine cannot be built.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::buffer::BUFFER_SIZE;
use crate::descriptor::{Descriptor, DescriptorError, DescriptorKind, Direction, Status};
use crate::engine::{Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::job::{BufferPolicy, Job};
use crate::session::{SessionHandle, SessionSpec, SessionTable};
use strum::{Display, EnumString, IntoStaticStr, VariantArray, VariantNames};

/// Why AF_ALG cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AfalgError {
    #[error(
        "this kernel has no AF_ALG sockets ({0}); it needs CONFIG_CRYPTO_USER_API_AEAD (and CONFIG_CRYPTO_USER_API_SKCIPHER, CONFIG_CRYPTO_USER_API_HASH for the dual-pass and sync styles)"
    )]
    /// No AF_ALG sockets at all; the kernel's error.
    NoAfAlg(String),
    #[error(
        "the kernel has AF_ALG but no `{template}` AEAD ({reason}); it needs CONFIG_CRYPTO_USER_API_AEAD and the template's modules"
    )]
    /// AF_ALG, but not this AEAD template.
    NoTemplate {
        /// The kernel's name for the transform (`rfc4106(gcm(aes))`, ...).
        template: String,
        /// The kernel's error.
        reason: String,
    },
    #[error("io_uring is unavailable ({0}); use the synchronous AF_ALG I/O (`afalg_io = \"sync\"`)")]
    /// io_uring is missing or refused; the kernel's error.
    NoIoUring(String),
}

/// Checks that the kernel offers AF_ALG AEAD sockets (`rfc4106(gcm(aes))`
/// as the witness).
pub fn probe() -> Result<(), AfalgError> {
    let fd = alg_socket().map_err(|e| AfalgError::NoAfAlg(e.to_string()))?;
    bind(&fd, "aead", "rfc4106(gcm(aes))").map_err(|e| AfalgError::NoTemplate {
        template: "rfc4106(gcm(aes))".into(),
        reason: e.to_string(),
    })
}

fn alg_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_ALG, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn bind(fd: &OwnedFd, kind: &str, name: &str) -> io::Result<()> {
    // SAFETY: sockaddr_alg is plain data; zero is a valid starting value.
    let mut sa: libc::sockaddr_alg = unsafe { std::mem::zeroed() };
    sa.salg_family = libc::AF_ALG as u16;
    let kind = CString::new(kind).map_err(io::Error::other)?;
    let name = CString::new(name).map_err(io::Error::other)?;
    let (kb, nb) = (kind.as_bytes_with_nul(), name.as_bytes_with_nul());
    if kb.len() > sa.salg_type.len() || nb.len() > sa.salg_name.len() {
        return Err(io::Error::other("algorithm name too long"));
    }
    sa.salg_type[..kb.len()].copy_from_slice(kb);
    sa.salg_name[..nb.len()].copy_from_slice(nb);
    // SAFETY: sa is a valid sockaddr_alg of the size passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_alg).cast(),
            std::mem::size_of::<libc::sockaddr_alg>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn setsockopt(fd: &OwnedFd, opt: libc::c_int, value: Option<&[u8]>, len: usize) -> io::Result<()> {
    let ptr = value.map_or(std::ptr::null(), |v| v.as_ptr().cast());
    // SAFETY: ptr is null or points at `len` readable bytes.
    let r = unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_ALG, opt, ptr, len as u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Another operation socket on a keyed transform: each one carries one
/// request at a time, so asynchronous submission uses several.
fn accept_op(tfm: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4(2) on our own bound socket, no peer address wanted.
    let op = unsafe {
        libc::accept4(
            tfm.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if op < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: op is a fresh descriptor owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(op) })
}

/// Request slots: the most jobs the engine holds at once (in the kernel,
/// finished and waiting for earlier jobs of their session, or waiting for
/// `poll_burst`).
pub const SLOTS: usize = 128;
/// Bytes of each slot's staging buffer: the largest result the kernel can
/// write for a packet buffer (the whole buffer, plus the ESN word).
pub const STAGING: usize = BUFFER_SIZE + 64;
/// The reclaim age until [`AfalgEngine::set_reclaim_after`] changes it.
pub const DEFAULT_RECLAIM_AFTER: Duration = Duration::from_millis(100);
/// Idle operation sockets kept beyond each transform's first, for all
/// sessions together: the engine's shared pool. A socket that would go
/// past it is closed instead (a later burst accepts one again), so that a
/// session's cost in file descriptors stays [`session_fds`] however many
/// of its requests were once in flight at a time.
pub const SPARE_OPS: usize = SLOTS;
/// File descriptors the engine holds besides its sessions' own: one
/// operation socket per request slot in flight, the shared idle pool and
/// the io_uring.
pub const ENGINE_FDS: usize = SLOTS + SPARE_OPS + 1;

/// The transforms a session of `alg` opens (see [`Registered::open`]): a
/// single-pass AEAD or `authenc` one, and a cipher-only and a MAC-only one
/// for the two-descriptor and sync styles.
fn transforms(alg: Algorithm) -> usize {
    let single = matches!(alg.cipher(), CipherKind::AesGcm | CipherKind::ChaCha20Poly1305)
        || !matches!(alg.integrity(), IntegrityKind::Aead | IntegrityKind::None);
    let cipher = matches!(alg.cipher(), CipherKind::AesCbc | CipherKind::TripleDesCbc);
    let mac = matches!(
        alg.integrity(),
        IntegrityKind::HmacSha1_96 | IntegrityKind::HmacSha256_128
    );
    usize::from(single) + usize::from(cipher) + usize::from(mac)
}

/// What a session of `alg` costs in file descriptors while it is
/// registered: each transform's socket and the operation socket it keeps
/// (requests in flight, and the shared idle pool, are [`ENGINE_FDS`]).
/// `espgw engine serve` bounds its tenants' sessions by this.
pub fn session_fds(alg: Algorithm) -> usize {
    2 * transforms(alg)
}

const CMSG_ROOM: usize = 128;
/// No slot (the end of a session's chain).
const NIL: u16 = u16::MAX;
/// io_uring user data: slot index << 2 | what.
const UD_SEND: u64 = 0;
const UD_READ: u64 = 1;
const UD_CANCEL: u64 = 2;
/// Waits on the ring in `reclaim` and `Drop`: rounds of `WAIT_ROUND` each.
const WAIT_ROUND: Duration = Duration::from_millis(10);
const RECLAIM_ROUNDS: usize = 100;
const DROP_ROUNDS: usize = 500;

/// Which transform of a session a request runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Aead,
    Cipher,
    Mac,
}

/// A keyed transform and its idle operation sockets.
struct Transform {
    tfm: OwnedFd,
    /// Room for [`SLOTS`] sockets, reserved at registration.
    idle: Vec<OwnedFd>,
}

impl Transform {
    fn open(kind: &str, name: &str, key: &[u8], authsize: usize) -> io::Result<Transform> {
        let tfm = alg_socket()?;
        bind(&tfm, kind, name)?;
        if !key.is_empty() {
            setsockopt(&tfm, libc::ALG_SET_KEY, Some(key), key.len())?;
        }
        if authsize > 0 {
            setsockopt(&tfm, libc::ALG_SET_AEAD_AUTHSIZE, None, authsize)?;
        }
        let mut idle = Vec::with_capacity(SLOTS);
        idle.push(accept_op(&tfm)?);
        Ok(Transform { tfm, idle })
    }

    /// An operation socket: an idle one, or a new one. `spare` counts
    /// the idle sockets beyond each transform's first, engine-wide.
    fn take_op(&mut self, spare: &mut usize) -> io::Result<OwnedFd> {
        if self.idle.len() > 1 {
            *spare -= 1;
        }
        match self.idle.pop() {
            Some(fd) => Ok(fd),
            None => accept_op(&self.tfm),
        }
    }

    /// Keeps a finished request's socket: the transform's first idle one
    /// always, more while the engine's shared pool ([`SPARE_OPS`]) and the
    /// reserved room last; beyond them it is closed.
    fn put_op(&mut self, fd: OwnedFd, spare: &mut usize) {
        if self.idle.is_empty() {
            self.idle.push(fd);
        } else if *spare < SPARE_OPS && self.idle.len() < self.idle.capacity() {
            *spare += 1;
            self.idle.push(fd);
        }
    }

    /// Idle sockets it holds beyond its first.
    fn spare(&self) -> usize {
        self.idle.len().saturating_sub(1)
    }
}

/// A registered session: its transforms and the newest of its jobs not yet
/// handed back.
struct Registered {
    algorithm: Algorithm,
    esn: bool,
    aead: Option<Transform>,
    cipher: Option<Transform>,
    mac: Option<Transform>,
    digest_len: usize,
    tail: u16,
}

impl Registered {
    fn open(spec: &SessionSpec) -> Result<Registered, RegisterError> {
        // The same key checks (lengths, degenerate 3DES) as the CPU engines.
        crate::session::Session::from_spec(spec)?;
        let alg = spec.algorithm;
        let refused = |what: &str, e: io::Error| RegisterError::Refused {
            engine: EngineKind::Afalg,
            reason: format!("`{what}`: {e}"),
        };
        let aead = match aead_template(alg, spec.esn, spec) {
            Some((name, key, authsize)) => {
                Some(Transform::open("aead", &name, &key, authsize).map_err(|e| refused(&name, e))?)
            }
            None => None,
        };
        let cipher = match alg.cipher() {
            CipherKind::AesCbc => Some("cbc(aes)"),
            CipherKind::TripleDesCbc => Some("cbc(des3_ede)"),
            CipherKind::AesGcm | CipherKind::ChaCha20Poly1305 | CipherKind::Null => None,
        };
        let cipher = match cipher {
            Some(name) => {
                Some(Transform::open("skcipher", name, &spec.enc_key, 0).map_err(|e| refused(name, e))?)
            }
            None => None,
        };
        let (mac, digest_len) = match alg.integrity() {
            IntegrityKind::HmacSha1_96 => (Some("hmac(sha1)"), 20),
            IntegrityKind::HmacSha256_128 => (Some("hmac(sha256)"), 32),
            IntegrityKind::Aead | IntegrityKind::None => (None, 0),
        };
        let mac = match mac {
            Some(name) => {
                Some(Transform::open("hash", name, &spec.auth_key, 0).map_err(|e| refused(name, e))?)
            }
            None => None,
        };
        debug_assert_eq!(
            [aead.is_some(), cipher.is_some(), mac.is_some()]
                .iter()
                .filter(|o| **o)
                .count(),
            transforms(alg),
            "session_fds must count what open opens"
        );
        Ok(Registered {
            algorithm: alg,
            esn: spec.esn,
            aead,
            cipher,
            mac,
            digest_len,
            tail: NIL,
        })
    }

    fn transform(&mut self, pass: Pass) -> Option<&mut Transform> {
        match pass {
            Pass::Aead => self.aead.as_mut(),
            Pass::Cipher => self.cipher.as_mut(),
            Pass::Mac => self.mac.as_mut(),
        }
    }

    /// Idle operation sockets of its transforms beyond their first.
    fn spare(&self) -> usize {
        [&self.aead, &self.cipher, &self.mac]
            .into_iter()
            .flatten()
            .map(Transform::spare)
            .sum()
    }
}

/// The AEAD template, key blob and ICV size for an algorithm (none for
/// null/null).
fn aead_template(
    alg: Algorithm,
    esn: bool,
    session: &SessionSpec,
) -> Option<(String, Zeroizing<Vec<u8>>, usize)> {
    let enc = &session.enc_key;
    let auth = &session.auth_key;
    // The ESP forms of the AEADs: the key blob is the key followed by the
    // 4-byte salt, and the associated data is SPI ‖ seq (‖ seq_hi) ‖ IV.
    let aead = match alg.cipher() {
        CipherKind::AesGcm => Some("rfc4106(gcm(aes))"),
        CipherKind::ChaCha20Poly1305 => Some("rfc7539esp(chacha20,poly1305)"),
        CipherKind::AesCbc | CipherKind::TripleDesCbc | CipherKind::Null => None,
    };
    if let Some(name) = aead {
        return Some((name.into(), Zeroizing::new(enc.to_vec()), alg.icv_len()));
    }
    let hash = match alg.integrity() {
        IntegrityKind::HmacSha1_96 => "hmac(sha1)",
        IntegrityKind::HmacSha256_128 => "hmac(sha256)",
        IntegrityKind::Aead | IntegrityKind::None => return None,
    };
    let cipher = match alg.cipher() {
        CipherKind::AesCbc => "cbc(aes)",
        CipherKind::TripleDesCbc => "cbc(des3_ede)",
        CipherKind::Null => "ecb(cipher_null)",
        CipherKind::AesGcm | CipherKind::ChaCha20Poly1305 => return None,
    };
    let template = if esn { "authencesn" } else { "authenc" };
    // crypto/authenc.c: rtattr { len 8, type CRYPTO_AUTHENC_KEYA_PARAM (1) }
    // holding the big-endian encryption key length, then auth key, enc key.
    let mut blob = Zeroizing::new(Vec::with_capacity(8 + auth.len() + enc.len()));
    blob.extend_from_slice(&8u16.to_ne_bytes());
    blob.extend_from_slice(&1u16.to_ne_bytes());
    blob.extend_from_slice(&(enc.len() as u32).to_be_bytes());
    blob.extend_from_slice(auth);
    blob.extend_from_slice(enc);
    Some((format!("{template}({hash},{cipher})"), blob, alg.icv_len()))
}

/// What the kernel reads and writes for one request: the message, its
/// control messages (operation, IV, associated-data length), the iovecs
/// over the packet, the ESN word, and the staging buffer the result goes
/// to. One per slot, in an array that never moves, so the pointers the
/// message holds stay valid while io_uring works on it.
struct Request {
    msg: libc::msghdr,
    control: [u64; CMSG_ROOM / 8],
    iov_in: [libc::iovec; 3],
    iov_out: libc::iovec,
    esn_word: [u8; 4],
    staging: [u8; STAGING],
}

const EMPTY_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

impl Request {
    fn boxed_array() -> Box<[UnsafeCell<Request>]> {
        (0..SLOTS)
            .map(|_| {
                UnsafeCell::new(Request {
                    // SAFETY: msghdr is plain data; zero is its empty value.
                    msg: unsafe { std::mem::zeroed() },
                    control: [0; CMSG_ROOM / 8],
                    iov_in: [EMPTY_IOV; 3],
                    iov_out: EMPTY_IOV,
                    esn_word: [0; 4],
                    staging: [0; STAGING],
                })
            })
            .collect()
    }

    /// Writes the control messages: `ALG_SET_OP`, `ALG_SET_IV`,
    /// `ALG_SET_AEAD_ASSOCLEN` as given.
    fn set_control(
        &mut self,
        encrypt: bool,
        iv: &[u8],
        assoclen: Option<u32>,
    ) -> Result<(), DescriptorError> {
        self.control = [0; CMSG_ROOM / 8];
        self.msg.msg_control = self.control.as_mut_ptr().cast();
        self.msg.msg_controllen = CMSG_ROOM;
        let mut used = 0usize;
        let op: u32 = if encrypt {
            libc::ALG_OP_ENCRYPT as u32
        } else {
            libc::ALG_OP_DECRYPT as u32
        };
        // struct af_alg_iv { u32 ivlen; u8 iv[]; }
        let mut ivmsg = [0u8; 4 + 16];
        if iv.len() > 16 {
            return Err(DescriptorError::BadRegions);
        }
        ivmsg[..4].copy_from_slice(&(iv.len() as u32).to_ne_bytes());
        ivmsg[4..4 + iv.len()].copy_from_slice(iv);
        let assoc = assoclen.map(u32::to_ne_bytes);
        let parts: [(libc::c_int, &[u8]); 3] = [
            (libc::ALG_SET_OP, &op.to_ne_bytes()),
            (libc::ALG_SET_IV, &ivmsg[..4 + iv.len()]),
            (
                libc::ALG_SET_AEAD_ASSOCLEN,
                assoc.as_ref().map_or(&[][..], |a| &a[..]),
            ),
        ];
        // SAFETY: the control buffer is CMSG_ROOM bytes, aligned for
        // cmsghdr, zeroed, and declared whole in msg while headers are
        // written, so CMSG_NXTHDR checks each header's room against it and
        // every write below stays inside it (checked against CMSG_ROOM).
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&self.msg);
            for (kind, data) in parts {
                if kind == libc::ALG_SET_AEAD_ASSOCLEN && assoclen.is_none() {
                    continue;
                }
                let space = libc::CMSG_SPACE(data.len() as u32) as usize;
                if cmsg.is_null() || used + space > CMSG_ROOM {
                    return Err(DescriptorError::Fault);
                }
                (*cmsg).cmsg_level = libc::SOL_ALG;
                (*cmsg).cmsg_type = kind;
                (*cmsg).cmsg_len = libc::CMSG_LEN(data.len() as u32) as usize;
                std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(cmsg), data.len());
                used += space;
                cmsg = libc::CMSG_NXTHDR(&self.msg, cmsg);
            }
        }
        self.msg.msg_controllen = used;
        Ok(())
    }

    fn no_control(&mut self) {
        self.msg.msg_control = std::ptr::null_mut();
        self.msg.msg_controllen = 0;
    }

    /// Points the message at `parts` (packet bytes, or this request's ESN
    /// word) and the read at the first `out_len` staging bytes.
    fn set_data(&mut self, parts: &[(*const u8, usize)], out_len: usize) {
        self.iov_in = [EMPTY_IOV; 3];
        for (iov, &(ptr, len)) in self.iov_in.iter_mut().zip(parts) {
            *iov = libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            };
        }
        self.msg.msg_iov = self.iov_in.as_mut_ptr();
        self.msg.msg_iovlen = parts.len().min(3);
        self.msg.msg_name = std::ptr::null_mut();
        self.msg.msg_namelen = 0;
        self.msg.msg_flags = 0;
        self.iov_out = libc::iovec {
            iov_base: self.staging.as_mut_ptr().cast(),
            iov_len: out_len,
        };
    }
}

/// How a slot's request was laid out, for checking and copying back.
#[derive(Debug, Clone, Copy, Default)]
struct Plan {
    /// Bytes the `sendmsg` must take.
    sent: usize,
    /// Bytes the read must return (and asks for exactly: a larger read
    /// waits for more input).
    expected: usize,
    /// On success: staging[from..from + len] goes to the bytes at `to`.
    from: usize,
    to: usize,
    len: usize,
    /// MAC-only decryption: compare staging[..len] with the bytes at `to`
    /// (the ICV) instead of copying.
    verify: bool,
}

/// Lays out `desc` over `bytes` (the job's work bytes) in `req`.
fn build(
    req: &mut Request,
    pass: Pass,
    desc: &Descriptor,
    bytes: &[u8],
    digest_len: usize,
) -> Result<Plan, DescriptorError> {
    let encrypt = desc.direction == Direction::Encrypt;
    let base = bytes.as_ptr();
    let at = |offset: usize| base.wrapping_add(offset);
    match pass {
        Pass::Aead => {
            if desc.auth_only.len != 8 {
                return Err(DescriptorError::BadRegions);
            }
            let start = desc.auth_only.offset as usize;
            let (in_end, out_end) = if encrypt {
                (desc.cipher.end(), desc.icv.end())
            } else {
                (desc.icv.end(), desc.cipher.end())
            };
            let esn = desc.esn_high.is_some();
            let extra = if esn { 4 } else { 0 };
            let aad_len = desc.cipher.offset as usize - start + extra;
            let expected = out_end - start + extra;
            if expected > STAGING {
                return Err(DescriptorError::BadRegions);
            }
            req.set_control(encrypt, &bytes[desc.iv.range()], Some(aad_len as u32))?;
            if let Some(high) = desc.esn_high {
                req.esn_word = high.to_be_bytes();
                let word = req.esn_word.as_ptr();
                req.set_data(
                    &[(at(start), 4), (word, 4), (at(start + 4), in_end - start - 4)],
                    expected,
                );
            } else {
                req.set_data(&[(at(start), in_end - start)], expected);
            }
            Ok(Plan {
                sent: in_end - start + extra,
                expected,
                from: aad_len,
                to: desc.cipher.offset as usize,
                len: out_end - desc.cipher.offset as usize,
                verify: false,
            })
        }
        Pass::Cipher => {
            let len = desc.cipher.len as usize;
            if len > STAGING {
                return Err(DescriptorError::BadRegions);
            }
            req.set_control(encrypt, &bytes[desc.iv.range()], None)?;
            req.set_data(&[(at(desc.cipher.offset as usize), len)], len);
            Ok(Plan {
                sent: len,
                expected: len,
                from: 0,
                to: desc.cipher.offset as usize,
                len,
                verify: false,
            })
        }
        Pass::Mac => {
            let icv = desc.icv.len as usize;
            if icv > digest_len {
                return Err(DescriptorError::BadRegions);
            }
            let auth = desc.authenticated();
            req.no_control();
            let auth_len = auth.end - auth.start;
            if let Some(high) = desc.esn_high {
                req.esn_word = high.to_be_bytes();
                let word = req.esn_word.as_ptr();
                req.set_data(&[(at(auth.start), auth_len), (word, 4)], digest_len);
            } else {
                req.set_data(&[(at(auth.start), auth_len)], digest_len);
            }
            Ok(Plan {
                sent: auth_len + if desc.esn_high.is_some() { 4 } else { 0 },
                expected: digest_len,
                from: 0,
                to: desc.icv.offset as usize,
                len: icv,
                verify: !encrypt,
            })
        }
    }
}

/// The checks every engine makes before it computes (the same as the CPU
/// primitive's, in the same order), and which transform, if any, the
/// descriptor needs: `None` means there is nothing to compute.
fn precheck(alg: Algorithm, desc: &Descriptor, len: usize) -> Result<Option<Pass>, DescriptorError> {
    desc.validate(len)?;
    if desc.icv.len as usize != alg.icv_len() || desc.iv.len as usize != alg.iv_len() {
        return Err(DescriptorError::BadRegions);
    }
    if alg.is_aead() && desc.kind != DescriptorKind::SinglePass {
        return Err(DescriptorError::Unsupported);
    }
    let cbc = matches!(alg.cipher(), CipherKind::AesCbc | CipherKind::TripleDesCbc);
    if cbc
        && desc.kind != DescriptorKind::MacOnly
        && !(desc.cipher.len as usize).is_multiple_of(alg.pad_align())
    {
        return Err(DescriptorError::Misaligned);
    }
    let hmac = matches!(
        alg.integrity(),
        IntegrityKind::HmacSha1_96 | IntegrityKind::HmacSha256_128
    );
    Ok(match desc.kind {
        DescriptorKind::SinglePass => (alg != Algorithm::Null).then_some(Pass::Aead),
        DescriptorKind::CipherOnly => (cbc && desc.cipher.len > 0).then_some(Pass::Cipher),
        DescriptorKind::MacOnly => hmac.then_some(Pass::Mac),
    })
}

/// How requests reach the kernel.
///
/// Names (config `[accel] afalg_io`, `--afalg-io`, JSON) are the variants
/// in kebab case, derived once for strum and serde alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[derive(VariantArray, VariantNames, IntoStaticStr, EnumString, Display)]
#[strum(serialize_all = "kebab-case", parse_err_ty = UnknownAfalgIo, parse_err_fn = UnknownAfalgIo::new)]
pub enum AfalgIo {
    /// `sendmsg` then `read` in the caller's thread.
    Sync,
    /// Linked `sendmsg` + `readv` pairs on an io_uring, many in flight,
    /// each on its own operation socket.
    #[default]
    IoUring,
}

crate::name_table!(AfalgIo);

crate::unknown_name!(
    /// An AF_ALG I/O name that is not known.
    UnknownAfalgIo,
    AfalgIo,
    "AF_ALG I/O"
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    /// The kernel owns the request (on the ring).
    OnRing,
    /// Finished; waiting for earlier jobs of its session, or for
    /// `poll_burst`.
    Complete,
}

/// A slot's bookkeeping; the kernel never sees it.
struct Meta {
    state: State,
    job: Option<Job>,
    session: SessionHandle,
    pass: Pass,
    op: Option<OwnedFd>,
    plan: Plan,
    /// The caller's `now` at submission.
    submitted: Duration,
    /// Completions still to come from the ring.
    pending: u8,
    send_result: i64,
    read_result: i64,
    /// Cancelled by `reclaim`: completes with `Error(Fault)`.
    reclaimed: bool,
    /// The previous and next not-yet-returned jobs of the same session.
    prev: u16,
    next: u16,
}

impl Meta {
    fn free() -> Meta {
        Meta {
            state: State::Free,
            job: None,
            session: SessionHandle::INVALID,
            pass: Pass::Aead,
            op: None,
            plan: Plan::default(),
            submitted: Duration::ZERO,
            pending: 0,
            send_result: 0,
            read_result: 0,
            reclaimed: false,
            prev: NIL,
            next: NIL,
        }
    }
}

/// The slots' kernel-visible memory.
struct Requests(Box<[UnsafeCell<Request>]>);

// SAFETY: the raw pointers inside each request point into the request
// itself or into buffers of jobs the engine owns; moving the engine to
// another thread moves all of them along, and the kernel does not care
// which thread reaps a completion.
unsafe impl Send for Requests {}

/// The AF_ALG engine; see the module documentation.
pub struct AfalgEngine {
    buffers: BufferPolicy,
    io: AfalgIo,
    sessions: SessionTable<Registered>,
    counters: EngineCounters,
    ring: Option<io_uring::IoUring>,
    reqs: Requests,
    meta: Box<[Meta]>,
    free: Vec<u16>,
    /// Slots finished in order, to hand back by `poll_burst`.
    done: VecDeque<u16>,
    /// Slots whose last completion arrived, to settle.
    settle: Vec<u16>,
    on_ring: usize,
    /// Queued on the ring since the last doorbell.
    unsubmitted: usize,
    reclaiming: usize,
    reclaim_after: Duration,
    stall_next: usize,
    /// Idle operation sockets beyond each transform's first, all sessions
    /// together (at most [`SPARE_OPS`]).
    spare_ops: usize,
}

impl AfalgEngine {
    /// Probes the kernel first; fails with the reason when AF_ALG (or, for
    /// `io-uring`, io_uring) is missing.
    pub fn new(buffers: BufferPolicy, io: AfalgIo) -> Result<AfalgEngine, AfalgError> {
        probe()?;
        let ring = match io {
            AfalgIo::Sync => None,
            AfalgIo::IoUring => Some(
                io_uring::IoUring::builder()
                    .setup_cqsize((SLOTS * 8) as u32)
                    .build((SLOTS * 2) as u32)
                    .map_err(|e| AfalgError::NoIoUring(e.to_string()))?,
            ),
        };
        Ok(AfalgEngine {
            buffers,
            io,
            sessions: SessionTable::default(),
            counters: EngineCounters {
                per_channel: vec![0],
                ..EngineCounters::default()
            },
            ring,
            reqs: Requests(Request::boxed_array()),
            meta: (0..SLOTS).map(|_| Meta::free()).collect(),
            free: (0..SLOTS as u16).rev().collect(),
            done: VecDeque::with_capacity(SLOTS),
            settle: Vec::with_capacity(SLOTS),
            on_ring: 0,
            unsubmitted: 0,
            reclaiming: 0,
            reclaim_after: DEFAULT_RECLAIM_AFTER,
            stall_next: 0,
            spare_ops: 0,
        })
    }

    /// How this engine talks to the kernel.
    pub fn io(&self) -> AfalgIo {
        self.io
    }

    /// Requests on the ring older than `age` (by the caller's `now`) are
    /// what [`Engine::reclaim`] cancels.
    pub fn set_reclaim_after(&mut self, age: Duration) {
        self.reclaim_after = age;
    }

    /// Test hook: the next `n` AEAD or cipher requests put on the io_uring
    /// are sent with `MSG_MORE`, so the kernel waits for input that never
    /// comes and the request stays on the ring until it is cancelled
    /// (`reclaim`, `Drop`). Ignored with synchronous I/O, which would block.
    #[doc(hidden)]
    pub fn stall_next_requests_for_test(&mut self, n: usize) {
        self.stall_next = n;
    }

    /// Whether the ring has room for a job's two entries.
    fn sq_has_room(&mut self) -> bool {
        match self.ring.as_mut() {
            Some(r) => {
                let sq = r.submission();
                sq.capacity() - sq.len() >= 2
            }
            None => true,
        }
    }

    /// Takes `job` into the free slot `idx`.
    fn submit_one(&mut self, now: Duration, idx: u16, mut job: Job) {
        let i = idx as usize;
        self.counters.submitted += 1;
        self.counters.per_channel[0] += 1;
        if self.buffers == BufferPolicy::PerRequest {
            job.bounce_in();
            self.counters.bounce_buffers += 1;
        }
        let m = &mut self.meta[i];
        m.session = job.session;
        m.submitted = now;
        m.prev = NIL;
        m.next = NIL;
        m.reclaimed = false;
        m.pending = 0;
        m.send_result = 0;
        m.read_result = 0;
        // Chain the slot behind the session's newest job still held.
        let prepared = match self.sessions.get_mut(job.session) {
            None => Err(DescriptorError::BadSession),
            Some(reg) => {
                let prev = reg.tail;
                reg.tail = idx;
                self.meta[i].prev = prev;
                if prev != NIL {
                    self.meta[prev as usize].next = idx;
                }
                let desc = job.desc;
                let bytes = job.work_bytes();
                let alg = reg.algorithm;
                match precheck(alg, &desc, bytes.len()) {
                    Err(e) => Err(e),
                    Ok(None) => Ok(None),
                    // authenc and authencesn lay out the associated data
                    // differently: the session's template decides.
                    Ok(Some(Pass::Aead)) if !alg.is_aead() && desc.esn_high.is_some() != reg.esn => {
                        Err(DescriptorError::Unsupported)
                    }
                    Ok(Some(pass)) => {
                        let digest_len = reg.digest_len;
                        // SAFETY: slot `i` is free, so no request of the
                        // kernel references its memory and nothing else
                        // holds a reference to it.
                        let req = unsafe { &mut *self.reqs.0[i].get() };
                        match build(req, pass, &desc, bytes, digest_len) {
                            Err(e) => Err(e),
                            Ok(plan) => match reg.transform(pass).map(|t| t.take_op(&mut self.spare_ops)) {
                                Some(Ok(fd)) => Ok(Some((pass, plan, fd))),
                                _ => Err(DescriptorError::Fault),
                            },
                        }
                    }
                }
            }
        };
        self.meta[i].job = Some(job);
        match prepared {
            Err(e) => self.settle_inline(i, Status::Error(e)),
            Ok(None) => self.settle_inline(i, Status::Done),
            Ok(Some((pass, plan, fd))) => {
                let raw = fd.as_raw_fd();
                let m = &mut self.meta[i];
                m.pass = pass;
                m.plan = plan;
                m.op = Some(fd);
                if self.ring.is_some() {
                    self.push_ring(i, raw);
                } else {
                    self.run_sync(i, raw);
                }
            }
        }
    }

    /// `sendmsg` then `readv` on `fd`, in this thread.
    fn run_sync(&mut self, i: usize, fd: RawFd) {
        let req = self.reqs.0[i].get();
        // SAFETY: the request was just built for this slot and points at
        // its own storage and at the job's bytes, both alive and untouched
        // until this call returns.
        let sent = unsafe { libc::sendmsg(fd, &(*req).msg, 0) };
        let sent = if sent < 0 {
            -i64::from(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
        } else {
            sent as i64
        };
        let read = if sent < 0 {
            -i64::from(libc::ECANCELED)
        } else {
            // SAFETY: iov_out points at this slot's staging buffer, of at
            // least its length.
            let got = unsafe { libc::readv(fd, &(*req).iov_out, 1) };
            if got < 0 {
                -i64::from(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
            } else {
                got as i64
            }
        };
        let m = &mut self.meta[i];
        m.send_result = sent;
        m.read_result = read;
        self.settle_slot(i);
    }

    /// Queues the linked pair; the doorbell rings at the end of the burst.
    fn push_ring(&mut self, i: usize, fd: RawFd) {
        let stall = self.stall_next > 0 && self.meta[i].pass != Pass::Mac;
        if stall {
            self.stall_next -= 1;
        }
        let req = self.reqs.0[i].get();
        let ud = (i as u64) << 2;
        // SAFETY: only the addresses are taken: the request lives in the
        // engine's fixed array, which is not moved or freed while the
        // kernel may use it (Drop waits for every completion).
        let (msg, iov) = unsafe { (&raw const (*req).msg, &raw const (*req).iov_out) };
        let send = io_uring::opcode::SendMsg::new(io_uring::types::Fd(fd), msg)
            .flags(if stall { libc::MSG_MORE as u32 } else { 0 })
            .build()
            .flags(io_uring::squeue::Flags::IO_LINK)
            .user_data(ud | UD_SEND);
        let mut read = io_uring::opcode::Readv::new(io_uring::types::Fd(fd), iov, 1)
            .build()
            .user_data(ud | UD_READ);
        if stall {
            // A blocking read in an io-wq worker, where a cancel interrupts
            // it (a non-blocking attempt would be retried forever).
            read = read.flags(io_uring::squeue::Flags::ASYNC);
        }
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        // SAFETY: the entries point at the slot's request and, through its
        // iovecs, at the job's bytes, both kept alive (the job in its slot)
        // until both completions are reaped. submit_one checked the room.
        let pushed = unsafe {
            let mut sq = ring.submission();
            sq.push(&send).is_ok() && sq.push(&read).is_ok()
        };
        let m = &mut self.meta[i];
        if pushed {
            m.state = State::OnRing;
            m.pending = 2;
            self.on_ring += 1;
            self.unsubmitted += 2;
        } else {
            // Cannot happen (room was checked); fail the job rather than
            // leave it half queued.
            m.send_result = -i64::from(libc::EBUSY);
            m.read_result = -i64::from(libc::ECANCELED);
            self.settle_slot(i);
        }
    }

    /// The doorbell: one `io_uring_enter` for everything queued.
    fn doorbell(&mut self) {
        if self.unsubmitted == 0 {
            return;
        }
        if let Some(ring) = self.ring.as_mut() {
            // On failure (EAGAIN, EBUSY) the entries stay queued and go
            // with the next doorbell or wait.
            if ring.submit().is_ok() {
                self.unsubmitted = 0;
            }
        }
    }

    /// Finishes a job that needs no kernel work (or failed before it).
    fn settle_inline(&mut self, i: usize, status: Status) {
        if let Some(job) = self.meta[i].job.as_mut() {
            job.desc.status = status;
            job.bounce_out();
        }
        if matches!(status, Status::Error(_)) {
            self.counters.errors += 1;
        }
        self.meta[i].state = State::Complete;
        if self.meta[i].prev == NIL {
            self.deliver_from(i);
        }
    }

    /// Reaps ring completions and settles the slots they finish.
    fn reap(&mut self) {
        let Some(ring) = self.ring.as_mut() else { return };
        for cqe in ring.completion() {
            let ud = cqe.user_data();
            let i = (ud >> 2) as usize;
            let what = ud & 3;
            if what == UD_CANCEL {
                continue;
            }
            let Some(m) = self.meta.get_mut(i) else { continue };
            if m.state != State::OnRing || m.pending == 0 {
                continue;
            }
            if what == UD_SEND {
                m.send_result = i64::from(cqe.result());
            } else {
                m.read_result = i64::from(cqe.result());
            }
            m.pending -= 1;
            if m.pending == 0 && self.settle.len() < self.settle.capacity() {
                self.settle.push(i as u16);
            }
        }
        while let Some(i) = self.settle.pop() {
            self.on_ring -= 1;
            self.settle_slot(i as usize);
        }
    }

    /// The kernel is done with slot `i`: its status, the copy back, its
    /// socket, and its place in the session's order.
    fn settle_slot(&mut self, i: usize) {
        let m = &mut self.meta[i];
        let plan = m.plan;
        let reclaimed = m.reclaimed;
        if reclaimed {
            m.reclaimed = false;
            self.reclaiming -= 1;
        }
        let mut outcome: Result<bool, DescriptorError> = if reclaimed || m.send_result != plan.sent as i64 {
            Err(DescriptorError::Fault)
        } else if m.read_result == plan.expected as i64 {
            Ok(true)
        } else if m.read_result == -i64::from(libc::EBADMSG) && m.pass == Pass::Aead {
            Ok(false)
        } else {
            Err(DescriptorError::Fault)
        };
        // SAFETY: the kernel is done with the slot's request (both
        // completions arrived, or the synchronous calls returned).
        let req = unsafe { &*self.reqs.0[i].get() };
        if let (Ok(true), Some(job)) = (outcome, m.job.as_mut()) {
            let bytes = job.work_bytes();
            let result = &req.staging[plan.from..plan.from + plan.len];
            match bytes.get_mut(plan.to..plan.to + plan.len) {
                None => outcome = Err(DescriptorError::BadRegions),
                Some(dst) if plan.verify => outcome = Ok(bool::from(dst.ct_eq(result))),
                Some(dst) => dst.copy_from_slice(result),
            }
        }
        let status = match outcome {
            Ok(true) => Status::Done,
            Ok(false) => Status::AuthFailed,
            Err(e) => Status::Error(e),
        };
        // A socket that saw anything but success or a failed ICV (an
        // error, a cancel) may hold half a request: it is closed.
        let op = m.op.take();
        let session = m.session;
        let pass = m.pass;
        if let (Ok(_), Some(fd)) = (outcome, op) {
            if let Some(t) = self.sessions.get_mut(session).and_then(|r| r.transform(pass)) {
                t.put_op(fd, &mut self.spare_ops);
            }
        }
        self.settle_inline(i, status);
    }

    /// Slot `i` is complete and first of its session: hands it and the
    /// complete ones queued behind it to `done`, in order.
    fn deliver_from(&mut self, mut i: usize) {
        loop {
            if self.done.len() < self.done.capacity() {
                self.done.push_back(i as u16);
            }
            let next = self.meta[i].next;
            self.meta[i].next = NIL;
            if next == NIL {
                let session = self.meta[i].session;
                if let Some(reg) = self.sessions.get_mut(session) {
                    if reg.tail == i as u16 {
                        reg.tail = NIL;
                    }
                }
                return;
            }
            let n = next as usize;
            self.meta[n].prev = NIL;
            if self.meta[n].state != State::Complete {
                return;
            }
            i = n;
        }
    }

    /// Hands back every job in `done`.
    fn hand_back(&mut self, out: &mut Vec<Job>) -> usize {
        let mut n = 0;
        while let Some(idx) = self.done.pop_front() {
            let m = &mut self.meta[idx as usize];
            m.state = State::Free;
            if let Some(job) = m.job.take() {
                out.push(job);
                n += 1;
            }
            self.free.push(idx);
        }
        self.counters.completed += n as u64;
        n
    }

    /// Asks the kernel to cancel both requests of slot `i`.
    fn cancel(&mut self, i: usize) {
        let Some(ring) = self.ring.as_mut() else { return };
        for what in [UD_SEND, UD_READ] {
            let entry = io_uring::opcode::AsyncCancel::new(((i as u64) << 2) | what)
                .build()
                .user_data(((i as u64) << 2) | UD_CANCEL);
            loop {
                // SAFETY: a cancel entry points at no memory.
                if unsafe { ring.submission().push(&entry) }.is_ok() {
                    break;
                }
                // The queue is full: submit what is there and retry.
                if ring.submit().is_err() {
                    return;
                }
            }
        }
        self.unsubmitted += 2;
    }

    /// Waits up to `rounds` × [`WAIT_ROUND`] for `done_when` to hold,
    /// reaping as completions arrive.
    fn wait_rounds(&mut self, rounds: usize, done_when: fn(&AfalgEngine) -> bool) {
        for _ in 0..rounds {
            self.reap();
            if done_when(self) {
                return;
            }
            let Some(ring) = self.ring.as_mut() else { return };
            let ts = io_uring::types::Timespec::from(WAIT_ROUND);
            let args = io_uring::types::SubmitArgs::new().timespec(&ts);
            // A timeout (ETIME) or an interrupted wait just goes round.
            if ring.submitter().submit_with_args(1, &args).is_ok() {
                self.unsubmitted = 0;
            }
        }
        self.reap();
    }
}

impl Engine for AfalgEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Afalg
    }

    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        let registered = Registered::open(spec)?;
        Ok(self.sessions.insert(registered))
    }

    fn release(&mut self, handle: SessionHandle) {
        // Closes the transforms and idle operation sockets; the sockets of
        // requests in flight belong to their slots and close when the
        // kernel is done with them.
        if let Some(registered) = self.sessions.remove(handle) {
            self.spare_ops -= registered.spare();
        }
    }

    fn submit_burst(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let mut n = 0;
        while !jobs.is_empty() {
            if !self.sq_has_room() {
                self.counters.ring_full += 1;
                break;
            }
            let Some(idx) = self.free.pop() else {
                self.counters.ring_full += 1;
                break;
            };
            match jobs.pop_front() {
                Some(job) => self.submit_one(now, idx, job),
                None => {
                    self.free.push(idx);
                    break;
                }
            }
            n += 1;
        }
        self.doorbell();
        n
    }

    fn poll_burst(&mut self, _now: Duration, out: &mut Vec<Job>) -> usize {
        self.doorbell();
        self.reap();
        self.hand_back(out)
    }

    fn next_completion(&self) -> NextCompletion {
        if !self.done.is_empty() {
            NextCompletion::Ready
        } else if self.on_ring > 0 {
            NextCompletion::External
        } else {
            NextCompletion::Idle
        }
    }

    fn in_flight(&self) -> usize {
        SLOTS - self.free.len()
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }

    /// Cancels the requests on the ring submitted at least the reclaim age
    /// before `now`, waits (bounded) for their completions and gives them
    /// back with `Error(Fault)`, together with every other job finished by
    /// then, in per-session order. A request the kernel does not let go of
    /// within the wait stays in its slot and comes back, with `Fault`,
    /// through a later `poll_burst` or `reclaim`.
    fn reclaim(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        self.doorbell();
        for i in 0..SLOTS {
            let m = &mut self.meta[i];
            if m.state == State::OnRing
                && !m.reclaimed
                && now.saturating_sub(m.submitted) >= self.reclaim_after
            {
                m.reclaimed = true;
                self.reclaiming += 1;
                self.cancel(i);
            }
        }
        if self.reclaiming > 0 {
            self.doorbell();
            self.wait_rounds(RECLAIM_ROUNDS, |e| e.reclaiming == 0);
        } else {
            self.reap();
        }
        self.hand_back(out)
    }

    fn wait(&mut self, timeout: Duration) {
        if !self.done.is_empty() || self.on_ring == 0 {
            return;
        }
        if let Some(ring) = self.ring.as_mut() {
            let ts = io_uring::types::Timespec::from(timeout);
            let args = io_uring::types::SubmitArgs::new().timespec(&ts);
            // A timeout (ETIME) or an interrupted wait just returns.
            if ring.submitter().submit_with_args(1, &args).is_ok() {
                self.unsubmitted = 0;
            }
        }
    }
}

impl Drop for AfalgEngine {
    /// Cancels every request on the ring and waits for every completion
    /// before the slots, their staging buffers and the jobs' buffers are
    /// freed. Should the kernel hold on to a request beyond the bounded
    /// wait, the memory it may still write is leaked instead of freed.
    fn drop(&mut self) {
        if self.on_ring == 0 {
            return;
        }
        for i in 0..SLOTS {
            if self.meta[i].state == State::OnRing {
                self.cancel(i);
            }
        }
        self.doorbell();
        self.wait_rounds(DROP_ROUNDS, |e| e.on_ring == 0);
        if self.on_ring > 0 {
            for m in self.meta.iter_mut().filter(|m| m.state == State::OnRing) {
                std::mem::forget(m.job.take());
                std::mem::forget(m.op.take());
            }
            std::mem::forget(std::mem::take(&mut self.reqs.0));
            std::mem::forget(self.ring.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's cost is two descriptors per transform it opens: the
    /// single-pass one (AEAD or authenc), and for the CBC and HMAC
    /// algorithms a cipher-only and a MAC-only one too. (That `open` opens
    /// exactly these is asserted there, and counted against the kernel by
    /// `accel/tests/afalg_engine.rs` where AF_ALG exists.)
    #[test]
    fn a_sessions_cost_is_two_descriptors_per_transform() {
        for (alg, fds) in [
            (Algorithm::Aes128Gcm16, 2),
            (Algorithm::Aes256Gcm16, 2),
            (Algorithm::ChaCha20Poly1305, 2),
            (Algorithm::Aes128Sha1, 6),
            (Algorithm::Aes256Sha256, 6),
            (Algorithm::TripleDesSha1, 6),
            (Algorithm::NullSha1, 4),
            (Algorithm::Null, 0),
        ] {
            assert_eq!(session_fds(alg), fds, "{alg}");
        }
        assert_eq!(ENGINE_FDS, 2 * SLOTS + 1);
    }

    /// The names are config values, `--afalg-io` values and JSON text:
    /// deriving them must not rename one, and serde must agree with strum.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        crate::assert_published_names::<AfalgIo>(&["sync", "io-uring"]);
        assert_eq!(
            "epoll".parse::<AfalgIo>().unwrap_err().to_string(),
            "unknown AF_ALG I/O `epoll`; expected sync or io-uring"
        );
    }
}
