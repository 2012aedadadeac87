//! The Linux kernel crypto API through AF_ALG sockets: the path to crypto
//! hardware (talitos, CAAM, QAT) that the kernel drives.
//!
//! One operation socket per session and template, opened when the session's
//! first job arrives (registration) and closed when the session is gone
//! (the kernel then frees and wipes the key):
//! - single-pass: `rfc4106(gcm(aes))`, `authenc(hmac(sha1|sha256),cbc(aes|des3_ede))`
//!   (`authencesn(...)` with extended sequence numbers), `ecb(cipher_null)` for null-sha1;
//! - cipher-only: `cbc(aes)`, `cbc(des3_ede)` (skcipher);
//! - MAC-only: `hmac(sha1)`, `hmac(sha256)` (hash).
//!
//! The ESP packet already lies the way AF_ALG wants an AEAD request: the
//! associated data is SPI ‖ sequence ‖ IV (the IV is also given with
//! `ALG_SET_IV`), followed by the payload and, when decrypting, the ICV.
//! With ESN the high sequence bits are inserted after the SPI through a
//! scatter list; `authencesn` moves them behind the payload for the MAC, as
//! RFC 4303 §2.2.1 asks. The kernel verifies the ICV and answers `EBADMSG`
//! when it does not match.
//!
//! Submission is synchronous (`sendmsg` then `read`, in the caller's
//! thread). Where the kernel has no AF_ALG (`CONFIG_CRYPTO_USER_API_AEAD`
//! off), [`probe`] says so and the engine cannot be built.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::Duration;

use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::descriptor::{DescriptorError, DescriptorKind, Direction, Status};
use crate::engine::{Engine, EngineCounters, EngineKind};
use crate::job::{BufferPolicy, Job};
use crate::session::{Session, SessionId};

/// Why AF_ALG cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AfalgError {
    #[error(
        "this kernel has no AF_ALG sockets ({0}); it needs CONFIG_CRYPTO_USER_API_AEAD (and CONFIG_CRYPTO_USER_API_SKCIPHER, CONFIG_CRYPTO_USER_API_HASH for the dual-pass and sync styles)"
    )]
    NoAfAlg(String),
    #[error(
        "the kernel has AF_ALG but no `{template}` AEAD ({reason}); it needs CONFIG_CRYPTO_USER_API_AEAD and the template's modules"
    )]
    NoTemplate { template: String, reason: String },
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

/// A bound, keyed transform and one operation socket on it.
struct AlgSocket {
    _tfm: OwnedFd,
    op: OwnedFd,
}

impl AlgSocket {
    fn open(kind: &str, name: &str, key: &[u8], authsize: usize) -> io::Result<AlgSocket> {
        let tfm = alg_socket()?;
        bind(&tfm, kind, name)?;
        if !key.is_empty() {
            setsockopt(&tfm, libc::ALG_SET_KEY, Some(key), key.len())?;
        }
        if authsize > 0 {
            setsockopt(&tfm, libc::ALG_SET_AEAD_AUTHSIZE, None, authsize)?;
        }
        // SAFETY: accept(2) on our own bound socket, no peer address wanted.
        let op = unsafe { libc::accept(tfm.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
        if op < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(AlgSocket {
            _tfm: tfm,
            // SAFETY: op is a fresh descriptor owned from here on.
            op: unsafe { OwnedFd::from_raw_fd(op) },
        })
    }
}

/// One AF_ALG request: operation, IV and associated-data length as control
/// messages, data as a gather list; then the result scattered back.
fn crypt(
    fd: RawFd,
    encrypt: Option<bool>,
    iv: Option<&[u8]>,
    assoclen: Option<u32>,
    input: &[&[u8]],
    output: &mut [&mut [u8]],
) -> io::Result<usize> {
    const CMSG_ROOM: usize = 128;
    let mut control = [0u64; CMSG_ROOM / 8];
    let mut used = 0usize;
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    let iovecs: Vec<libc::iovec> = input
        .iter()
        .map(|s| libc::iovec {
            iov_base: s.as_ptr() as *mut libc::c_void,
            iov_len: s.len(),
        })
        .collect();
    msg.msg_iov = iovecs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iovecs.len();
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_ROOM;
    // SAFETY: the control buffer is CMSG_ROOM bytes, aligned for cmsghdr,
    // and every header written below stays inside it (checked by `room`).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        let mut put = |level_type: libc::c_int, data: &[u8]| -> io::Result<()> {
            let space = libc::CMSG_SPACE(data.len() as u32) as usize;
            if cmsg.is_null() || used + space > CMSG_ROOM {
                return Err(io::Error::other("AF_ALG control messages do not fit"));
            }
            (*cmsg).cmsg_level = libc::SOL_ALG;
            (*cmsg).cmsg_type = level_type;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data.len() as u32) as usize;
            std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(cmsg), data.len());
            used += space;
            // The whole buffer stays declared while building, so the next
            // header's room is checked against it; trimmed to `used` below.
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            Ok(())
        };
        if let Some(enc) = encrypt {
            let op: u32 = if enc {
                libc::ALG_OP_ENCRYPT as u32
            } else {
                libc::ALG_OP_DECRYPT as u32
            };
            put(libc::ALG_SET_OP, &op.to_ne_bytes())?;
        }
        if let Some(iv) = iv {
            let mut ivmsg = [0u8; 4 + 16];
            ivmsg[..4].copy_from_slice(&(iv.len() as u32).to_ne_bytes());
            ivmsg[4..4 + iv.len()].copy_from_slice(iv);
            put(libc::ALG_SET_IV, &ivmsg[..4 + iv.len()])?;
        }
        if let Some(assoclen) = assoclen {
            put(libc::ALG_SET_AEAD_ASSOCLEN, &assoclen.to_ne_bytes())?;
        }
    }
    msg.msg_controllen = used;
    if used == 0 {
        msg.msg_control = std::ptr::null_mut();
    }
    let expected: usize = input.iter().map(|s| s.len()).sum();
    // SAFETY: msg points at live iovecs and control data for the call.
    let sent = unsafe { libc::sendmsg(fd, &msg, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != expected {
        return Err(io::Error::other("AF_ALG accepted only part of the request"));
    }
    let out_iovecs: Vec<libc::iovec> = output
        .iter_mut()
        .map(|s| libc::iovec {
            iov_base: s.as_mut_ptr().cast(),
            iov_len: s.len(),
        })
        .collect();
    // The read must ask for exactly the result size: a larger one blocks
    // waiting for more input.
    // SAFETY: the iovecs point at live, writable buffers.
    let got = unsafe { libc::readv(fd, out_iovecs.as_ptr(), out_iovecs.len() as i32) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(got as usize)
}

/// The AEAD template, key blob and ICV size for an algorithm.
fn aead_template(
    alg: Algorithm,
    esn: bool,
    session: &Session,
) -> Option<(String, Zeroizing<Vec<u8>>, usize)> {
    let enc = &session.raw_enc_key;
    let auth = &session.raw_auth_key;
    if alg.cipher() == CipherKind::AesGcm {
        return Some((
            "rfc4106(gcm(aes))".into(),
            Zeroizing::new(enc.to_vec()),
            alg.icv_len(),
        ));
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
        CipherKind::AesGcm => return None,
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

/// The operation sockets of one registered session.
struct Registered {
    session: Weak<Session>,
    aead: Option<AlgSocket>,
    cipher: Option<AlgSocket>,
    mac: Option<AlgSocket>,
}

/// The AF_ALG engine; see the module documentation.
pub struct AfalgEngine {
    buffers: BufferPolicy,
    sessions: HashMap<SessionId, Registered>,
    done: VecDeque<Job>,
    counters: EngineCounters,
}

impl AfalgEngine {
    /// Probes the kernel first; fails with the reason when AF_ALG is missing.
    pub fn new(buffers: BufferPolicy) -> Result<AfalgEngine, AfalgError> {
        probe()?;
        Ok(AfalgEngine {
            buffers,
            sessions: HashMap::new(),
            done: VecDeque::with_capacity(256),
            counters: EngineCounters {
                per_channel: vec![0],
                ..EngineCounters::default()
            },
        })
    }

    /// Closes the sockets of sessions that no longer exist, so the kernel
    /// frees (and wipes) their keys.
    fn sweep(&mut self) {
        self.sessions.retain(|_, r| r.session.strong_count() > 0);
    }

    fn run(
        &mut self,
        session: &Arc<Session>,
        desc: &crate::Descriptor,
        bytes: &mut [u8],
    ) -> Result<bool, DescriptorError> {
        desc.validate(bytes.len())?;
        let alg = session.algorithm();
        if alg == Algorithm::Null {
            return Ok(true);
        }
        if self.sessions.len() > 64 {
            self.sweep();
        }
        let entry = self.sessions.entry(session.id()).or_insert_with(|| Registered {
            session: Arc::downgrade(session),
            aead: None,
            cipher: None,
            mac: None,
        });
        match desc.kind {
            DescriptorKind::SinglePass => {
                if entry.aead.is_none() {
                    let (name, key, authsize) = aead_template(alg, desc.esn_high.is_some(), session)
                        .ok_or(DescriptorError::Unsupported)?;
                    entry.aead = Some(
                        AlgSocket::open("aead", &name, &key, authsize).map_err(|_| DescriptorError::Fault)?,
                    );
                }
                let socket = entry.aead.as_ref().ok_or(DescriptorError::Fault)?;
                aead_pass(socket.op.as_raw_fd(), desc, bytes)
            }
            DescriptorKind::CipherOnly => {
                let name = match alg.cipher() {
                    CipherKind::AesCbc => "cbc(aes)",
                    CipherKind::TripleDesCbc => "cbc(des3_ede)",
                    CipherKind::Null => return Ok(true),
                    CipherKind::AesGcm => return Err(DescriptorError::Unsupported),
                };
                if entry.cipher.is_none() {
                    entry.cipher = Some(
                        AlgSocket::open("skcipher", name, &session.raw_enc_key, 0)
                            .map_err(|_| DescriptorError::Fault)?,
                    );
                }
                let socket = entry.cipher.as_ref().ok_or(DescriptorError::Fault)?;
                if !(desc.cipher.len as usize).is_multiple_of(alg.pad_align()) {
                    return Err(DescriptorError::Misaligned);
                }
                let (head, data) = bytes[..desc.cipher.end()].split_at_mut(desc.cipher.offset as usize);
                let iv = &head[desc.iv.range()];
                let input = data.to_vec();
                let n = crypt(
                    socket.op.as_raw_fd(),
                    Some(desc.direction == Direction::Encrypt),
                    Some(iv),
                    None,
                    &[&input],
                    &mut [data],
                )
                .map_err(|_| DescriptorError::Fault)?;
                if n != input.len() {
                    return Err(DescriptorError::Fault);
                }
                Ok(true)
            }
            DescriptorKind::MacOnly => {
                let name = match alg.integrity() {
                    IntegrityKind::HmacSha1_96 => "hmac(sha1)",
                    IntegrityKind::HmacSha256_128 => "hmac(sha256)",
                    IntegrityKind::None => return Ok(true),
                    IntegrityKind::Aead => return Err(DescriptorError::Unsupported),
                };
                if entry.mac.is_none() {
                    entry.mac = Some(
                        AlgSocket::open("hash", name, &session.raw_auth_key, 0)
                            .map_err(|_| DescriptorError::Fault)?,
                    );
                }
                let socket = entry.mac.as_ref().ok_or(DescriptorError::Fault)?;
                let high = desc.esn_high.map(u32::to_be_bytes);
                let mut digest = [0u8; 32];
                let digest_len = if name == "hmac(sha1)" { 20 } else { 32 };
                let authenticated = &bytes[desc.authenticated()];
                let mut parts: Vec<&[u8]> = vec![authenticated];
                if let Some(h) = high.as_ref() {
                    parts.push(h);
                }
                crypt(
                    socket.op.as_raw_fd(),
                    None,
                    None,
                    None,
                    &parts,
                    &mut [&mut digest[..digest_len]],
                )
                .map_err(|_| DescriptorError::Fault)?;
                let icv = &mut bytes[desc.icv.range()];
                let truncated = &digest[..icv.len()];
                match desc.direction {
                    Direction::Encrypt => {
                        icv.copy_from_slice(truncated);
                        Ok(true)
                    }
                    Direction::Decrypt => Ok(bool::from(icv.ct_eq(truncated))),
                }
            }
        }
    }
}

/// A single-pass AEAD request over the ESP bytes, in place.
fn aead_pass(fd: RawFd, desc: &crate::Descriptor, bytes: &mut [u8]) -> Result<bool, DescriptorError> {
    let iv = bytes[desc.iv.range()].to_vec();
    let aad_len = desc.cipher.offset as usize + if desc.esn_high.is_some() { 4 } else { 0 };
    let high = desc.esn_high.map(u32::to_be_bytes).unwrap_or_default();
    let encrypt = desc.direction == Direction::Encrypt;
    let input_end = if encrypt {
        desc.cipher.end()
    } else {
        desc.icv.end()
    };
    let output_end = if encrypt {
        desc.icv.end()
    } else {
        desc.cipher.end()
    };
    // The kernel reads from and writes to separate buffers; the input is
    // copied once so the result can land in place.
    let input = bytes[..input_end].to_vec();
    let mut scratch = [0u8; 4];
    let result = if desc.esn_high.is_some() {
        // SPI ‖ seq_hi ‖ seq_lo ‖ IV ‖ data
        let (spi, rest) = input.split_at(4);
        let (spi_out, rest_out) = bytes[..output_end].split_at_mut(4);
        crypt(
            fd,
            Some(encrypt),
            Some(&iv),
            Some(aad_len as u32),
            &[spi, &high, rest],
            &mut [spi_out, &mut scratch, rest_out],
        )
    } else {
        crypt(
            fd,
            Some(encrypt),
            Some(&iv),
            Some(aad_len as u32),
            &[&input],
            &mut [&mut bytes[..output_end]],
        )
    };
    match result {
        Ok(n) if n == output_end + if desc.esn_high.is_some() { 4 } else { 0 } => Ok(true),
        Ok(_) => Err(DescriptorError::Fault),
        Err(e) if e.raw_os_error() == Some(libc::EBADMSG) => Ok(false),
        Err(_) => Err(DescriptorError::Fault),
    }
}

impl Engine for AfalgEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Afalg
    }

    fn submit(&mut self, mut job: Job) -> Result<(), Job> {
        let session = Arc::clone(&job.session);
        let desc = job.desc;
        let result = match self.buffers {
            BufferPolicy::Registered => self.run(&session, &desc, job.region_bytes()),
            BufferPolicy::PerRequest => {
                // Allocate a bounce buffer, copy in, process, copy out, free.
                let mut bounce = job.region_bytes().to_vec();
                self.counters.bounce_buffers += 1;
                let r = self.run(&session, &desc, &mut bounce);
                job.region_bytes().copy_from_slice(&bounce);
                r
            }
        };
        job.desc.status = match result {
            Ok(true) => Status::Done,
            Ok(false) => Status::AuthFailed,
            Err(e) => {
                self.counters.errors += 1;
                Status::Error(e)
            }
        };
        self.counters.submitted += 1;
        if let Some(c) = self.counters.per_channel.first_mut() {
            *c += 1;
        }
        self.done.push_back(job);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Job>) -> usize {
        let n = self.done.len();
        self.counters.completed += n as u64;
        out.extend(self.done.drain(..));
        n
    }

    fn wait(&mut self, _timeout: Duration) {}

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }
}
