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
//! thread) or asynchronous through io_uring: a linked `sendmsg` + `readv`
//! pair per packet, each on its own operation socket, many in flight,
//! completions reaped in `poll` (single-pass descriptors; the cipher-only
//! and MAC-only passes of the dual-pass and sync styles stay synchronous).
//! Where the kernel has no AF_ALG (`CONFIG_CRYPTO_USER_API_AEAD` off),
//! [`probe`] says so and the engine cannot be built.

// A full ring hands the job back by value: boxing it would allocate per
// packet.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::descriptor::{DescriptorError, DescriptorKind, Direction, Status};
use crate::engine::{Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::job::{BufferPolicy, Job};
use crate::session::{SessionHandle, SessionSpec, SessionTable};

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
    #[error("io_uring is unavailable ({0}); use the synchronous AF_ALG I/O (`afalg_io = \"sync\"`)")]
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

/// A bound, keyed transform and one operation socket on it.
struct AlgSocket {
    tfm: OwnedFd,
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
        let op = accept_op(&tfm)?;
        Ok(AlgSocket { tfm, op })
    }
}

/// Another operation socket on a keyed transform: each one carries one
/// request at a time, so asynchronous submission uses several.
fn accept_op(tfm: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept(2) on our own bound socket, no peer address wanted.
    let op = unsafe { libc::accept(tfm.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    if op < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: op is a fresh descriptor owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(op) })
}

const CMSG_ROOM: usize = 128;

/// One AF_ALG request with everything the kernel reads or writes during
/// it: the control messages (operation, IV, associated-data length), the
/// input copy and the scatter list for the result. Boxed, so the pointers
/// the message holds stay valid while io_uring works on it.
struct Request {
    input: Vec<u8>,
    /// Receives the ESN high word the kernel writes back.
    scratch: [u8; 4],
    control: [u64; CMSG_ROOM / 8],
    control_len: usize,
    iov_in: libc::iovec,
    iov_out: [libc::iovec; 3],
    iov_out_len: usize,
    msg: libc::msghdr,
    /// Bytes the read must return.
    expected: usize,
}

// SAFETY: the raw pointers point into the request itself or into the job's
// packet buffer, which travels with the request; nothing is shared.
unsafe impl Send for Request {}

impl Request {
    fn new(
        encrypt: Option<bool>,
        iv: Option<&[u8]>,
        assoclen: Option<u32>,
        input: Vec<u8>,
    ) -> io::Result<Box<Request>> {
        let mut req = Box::new(Request {
            input,
            scratch: [0; 4],
            control: [0; CMSG_ROOM / 8],
            control_len: 0,
            iov_in: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            iov_out: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 3],
            iov_out_len: 0,
            // SAFETY: msghdr is plain data; zero is its empty value.
            msg: unsafe { std::mem::zeroed() },
            expected: 0,
        });
        let mut used = 0usize;
        req.msg.msg_control = req.control.as_mut_ptr().cast();
        req.msg.msg_controllen = CMSG_ROOM;
        // SAFETY: the control buffer is CMSG_ROOM bytes, aligned for cmsghdr,
        // zeroed, and declared whole while headers are written, so
        // CMSG_NXTHDR checks each header's room against it.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&req.msg);
            let mut put = |kind: libc::c_int, data: &[u8]| -> io::Result<()> {
                let space = libc::CMSG_SPACE(data.len() as u32) as usize;
                if cmsg.is_null() || used + space > CMSG_ROOM {
                    return Err(io::Error::other("AF_ALG control messages do not fit"));
                }
                (*cmsg).cmsg_level = libc::SOL_ALG;
                (*cmsg).cmsg_type = kind;
                (*cmsg).cmsg_len = libc::CMSG_LEN(data.len() as u32) as usize;
                std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(cmsg), data.len());
                used += space;
                cmsg = libc::CMSG_NXTHDR(&req.msg, cmsg);
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
                // struct af_alg_iv { u32 ivlen; u8 iv[]; }
                let mut ivmsg = [0u8; 4 + 16];
                let n = iv.len().min(16);
                ivmsg[..4].copy_from_slice(&(n as u32).to_ne_bytes());
                ivmsg[4..4 + n].copy_from_slice(&iv[..n]);
                put(libc::ALG_SET_IV, &ivmsg[..4 + n])?;
            }
            if let Some(assoclen) = assoclen {
                put(libc::ALG_SET_AEAD_ASSOCLEN, &assoclen.to_ne_bytes())?;
            }
        }
        req.control_len = used;
        req.iov_in = libc::iovec {
            iov_base: req.input.as_mut_ptr().cast(),
            iov_len: req.input.len(),
        };
        req.msg.msg_iov = &mut req.iov_in;
        req.msg.msg_iovlen = 1;
        req.msg.msg_controllen = used;
        if used == 0 {
            req.msg.msg_control = std::ptr::null_mut();
        }
        Ok(req)
    }

    /// Where the result goes; the slices must outlive the request.
    fn scatter_into(&mut self, outputs: &mut [&mut [u8]]) {
        self.iov_out_len = outputs.len().min(3);
        self.expected = 0;
        for (slot, out) in self.iov_out.iter_mut().zip(outputs.iter_mut()) {
            *slot = libc::iovec {
                iov_base: out.as_mut_ptr().cast(),
                iov_len: out.len(),
            };
            self.expected += out.len();
        }
    }

    /// Like `scatter_into`, with the request's own scratch word between
    /// `head` and `tail` (where the kernel writes the ESN high bits back).
    fn scatter_around_scratch(&mut self, head: &mut [u8], tail: &mut [u8]) {
        let scratch: *mut u8 = self.scratch.as_mut_ptr();
        self.iov_out = [
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: scratch.cast(),
                iov_len: 4,
            },
            libc::iovec {
                iov_base: tail.as_mut_ptr().cast(),
                iov_len: tail.len(),
            },
        ];
        self.iov_out_len = 3;
        self.expected = head.len() + 4 + tail.len();
    }

    /// `sendmsg` then `readv`, in this thread.
    fn run(&mut self, fd: RawFd) -> io::Result<usize> {
        // SAFETY: msg points at this request's own live storage.
        let sent = unsafe { libc::sendmsg(fd, &self.msg, 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if sent as usize != self.input.len() {
            return Err(io::Error::other("AF_ALG accepted only part of the request"));
        }
        // The read must ask for exactly the result size: a larger one blocks
        // waiting for more input.
        // SAFETY: the iovecs point at live, writable buffers (scatter_into).
        let got = unsafe { libc::readv(fd, self.iov_out.as_ptr(), self.iov_out_len as i32) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(got as usize)
    }
}

/// One AF_ALG request run synchronously.
fn crypt(
    fd: RawFd,
    encrypt: Option<bool>,
    iv: Option<&[u8]>,
    assoclen: Option<u32>,
    input: &[&[u8]],
    output: &mut [&mut [u8]],
) -> io::Result<usize> {
    let mut req = Request::new(encrypt, iv, assoclen, input.concat())?;
    req.scatter_into(output);
    req.run(fd)
}

/// The AEAD template, key blob and ICV size for an algorithm.
fn aead_template(
    alg: Algorithm,
    esn: bool,
    session: &SessionSpec,
) -> Option<(String, Zeroizing<Vec<u8>>, usize)> {
    let enc = &session.enc_key;
    let auth = &session.auth_key;
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
    spec: SessionSpec,
    aead: Option<AlgSocket>,
    /// Idle extra operation sockets on the AEAD transform (io_uring).
    aead_spare: Vec<OwnedFd>,
    cipher: Option<AlgSocket>,
    mac: Option<AlgSocket>,
}

/// How requests reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfalgIo {
    /// `sendmsg` then `read` in the caller's thread.
    Sync,
    /// Linked `sendmsg` + `readv` pairs on an io_uring, many in flight,
    /// each on its own operation socket.
    #[default]
    IoUring,
}

impl AfalgIo {
    pub fn name(self) -> &'static str {
        match self {
            AfalgIo::Sync => "sync",
            AfalgIo::IoUring => "io-uring",
        }
    }
}

impl std::str::FromStr for AfalgIo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(AfalgIo::Sync),
            "io-uring" => Ok(AfalgIo::IoUring),
            other => Err(format!("unknown AF_ALG I/O `{other}`; expected sync or io-uring")),
        }
    }
}

impl std::fmt::Display for AfalgIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Requests the ring may hold at once (two entries each).
const URING_REQUESTS: usize = 128;

/// A request in flight on the io_uring.
struct InFlight {
    job: Job,
    req: Box<Request>,
    fd: OwnedFd,
    session: SessionHandle,
    send_failed: bool,
}

/// The AF_ALG engine; see the module documentation.
pub struct AfalgEngine {
    buffers: BufferPolicy,
    io: AfalgIo,
    sessions: SessionTable<Registered>,
    done: VecDeque<Job>,
    counters: EngineCounters,
    ring: Option<io_uring::IoUring>,
    slots: Vec<Option<InFlight>>,
    free_slots: Vec<usize>,
    on_ring: usize,
}

impl AfalgEngine {
    /// Probes the kernel first; fails with the reason when AF_ALG (or, for
    /// `io-uring`, io_uring) is missing.
    pub fn new(buffers: BufferPolicy, io: AfalgIo) -> Result<AfalgEngine, AfalgError> {
        probe()?;
        let ring = match io {
            AfalgIo::Sync => None,
            AfalgIo::IoUring => Some(
                io_uring::IoUring::new((URING_REQUESTS * 2) as u32)
                    .map_err(|e| AfalgError::NoIoUring(e.to_string()))?,
            ),
        };
        Ok(AfalgEngine {
            buffers,
            io,
            sessions: SessionTable::default(),
            done: VecDeque::with_capacity(256),
            counters: EngineCounters {
                per_channel: vec![0],
                ..EngineCounters::default()
            },
            ring,
            slots: (0..URING_REQUESTS).map(|_| None).collect(),
            free_slots: (0..URING_REQUESTS).rev().collect(),
            on_ring: 0,
        })
    }

    pub fn io(&self) -> AfalgIo {
        self.io
    }

    /// Puts a single-pass job on the ring: a linked `sendmsg` + `readv`
    /// on an idle operation socket of its session.
    fn submit_uring(&mut self, mut job: Job) -> Result<(), Job> {
        let Some(slot) = self.free_slots.pop() else {
            self.counters.ring_full += 1;
            return Err(job);
        };
        let session = job.session;
        let desc = job.desc;
        let prepared = (|| -> Result<(OwnedFd, Box<Request>), DescriptorError> {
            let entry = self
                .sessions
                .get_mut(session)
                .ok_or(DescriptorError::BadSession)?;
            if entry.aead.is_none() {
                let (name, key, authsize) =
                    aead_template(entry.spec.algorithm, desc.esn_high.is_some(), &entry.spec)
                        .ok_or(DescriptorError::Unsupported)?;
                entry.aead =
                    Some(AlgSocket::open("aead", &name, &key, authsize).map_err(|_| DescriptorError::Fault)?);
            }
            let tfm = &entry.aead.as_ref().ok_or(DescriptorError::Fault)?.tfm;
            let fd = match entry.aead_spare.pop() {
                Some(fd) => fd,
                None => accept_op(tfm).map_err(|_| DescriptorError::Fault)?,
            };
            let bytes = job.work_bytes();
            desc.validate(bytes.len())?;
            let req = aead_request(&desc, bytes).map_err(|_| DescriptorError::Fault)?;
            Ok((fd, req))
        })();
        let (fd, req) = match prepared {
            Ok(p) => p,
            Err(e) => {
                self.free_slots.push(slot);
                job.desc.status = Status::Error(e);
                self.finish(job);
                return Ok(());
            }
        };
        let raw = fd.as_raw_fd();
        let send = io_uring::opcode::SendMsg::new(io_uring::types::Fd(raw), &req.msg)
            .build()
            .flags(io_uring::squeue::Flags::IO_LINK)
            .user_data((slot as u64) << 1);
        let read = io_uring::opcode::Readv::new(
            io_uring::types::Fd(raw),
            req.iov_out.as_ptr(),
            req.iov_out_len as u32,
        )
        .build()
        .user_data(((slot as u64) << 1) | 1);
        let Some(ring) = self.ring.as_mut() else {
            self.free_slots.push(slot);
            return Err(job);
        };
        // SAFETY: the entries point into `req` and the job's buffer, both
        // kept alive in `slots[slot]` until both completions are reaped.
        let pushed = unsafe {
            let mut sq = ring.submission();
            if sq.capacity() - sq.len() < 2 {
                false
            } else {
                sq.push(&send).is_ok() && sq.push(&read).is_ok()
            }
        };
        if !pushed {
            self.free_slots.push(slot);
            if let Some(entry) = self.sessions.get_mut(session) {
                entry.aead_spare.push(fd);
            }
            self.counters.ring_full += 1;
            return Err(job);
        }
        self.slots[slot] = Some(InFlight {
            job,
            req,
            fd,
            session,
            send_failed: false,
        });
        self.on_ring += 1;
        let _ = ring.submit();
        Ok(())
    }

    /// Reaps ring completions into the done queue.
    fn reap(&mut self) {
        let Some(ring) = self.ring.as_mut() else { return };
        let mut finished = Vec::new();
        for cqe in ring.completion() {
            let slot = (cqe.user_data() >> 1) as usize;
            let is_read = cqe.user_data() & 1 == 1;
            let Some(entry) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if !is_read {
                if cqe.result() < 0 {
                    entry.send_failed = true;
                }
                continue;
            }
            let result = if entry.send_failed {
                Err(io::Error::other("sendmsg failed"))
            } else if cqe.result() < 0 {
                Err(io::Error::from_raw_os_error(-cqe.result()))
            } else {
                Ok(cqe.result() as usize)
            };
            finished.push((slot, result));
        }
        for (slot, result) in finished {
            let Some(mut entry) = self.slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.free_slots.push(slot);
            self.on_ring -= 1;
            let outcome = aead_outcome(result, entry.req.expected);
            entry.job.desc.status = match outcome {
                Ok(true) => Status::Done,
                Ok(false) => Status::AuthFailed,
                Err(e) => Status::Error(e),
            };
            // A socket that saw an error other than a failed ICV is not reused.
            if outcome.is_ok() {
                if let Some(reg) = self.sessions.get_mut(entry.session) {
                    reg.aead_spare.push(entry.fd);
                }
            }
            self.finish(entry.job);
        }
    }

    /// Copies a bounce buffer back, counts, and queues the job for `poll`.
    fn finish(&mut self, mut job: Job) {
        job.bounce_out();
        if matches!(job.desc.status, Status::Error(_)) {
            self.counters.errors += 1;
        }
        self.done.push_back(job);
    }

    fn run(
        &mut self,
        session: SessionHandle,
        desc: &crate::Descriptor,
        bytes: &mut [u8],
    ) -> Result<bool, DescriptorError> {
        desc.validate(bytes.len())?;
        let entry = self
            .sessions
            .get_mut(session)
            .ok_or(DescriptorError::BadSession)?;
        let alg = entry.spec.algorithm;
        if alg == Algorithm::Null {
            return Ok(true);
        }
        match desc.kind {
            DescriptorKind::SinglePass => {
                if entry.aead.is_none() {
                    let (name, key, authsize) = aead_template(alg, desc.esn_high.is_some(), &entry.spec)
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
                        AlgSocket::open("skcipher", name, &entry.spec.enc_key, 0)
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
                        AlgSocket::open("hash", name, &entry.spec.auth_key, 0)
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

/// The AF_ALG request for a single-pass AEAD descriptor over the ESP bytes:
/// the input is copied (SPI ‖ [seq_hi ‖] seq_lo ‖ IV ‖ data [‖ ICV]); the
/// result scatters back in place, the inserted ESN word into `scratch`.
fn aead_request(desc: &crate::Descriptor, bytes: &mut [u8]) -> io::Result<Box<Request>> {
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
    let esn = desc.esn_high.map(u32::to_be_bytes);
    let aad_len = desc.cipher.offset as usize + if esn.is_some() { 4 } else { 0 };
    let iv = bytes[desc.iv.range()].to_vec();
    let mut input = Vec::with_capacity(input_end + 4);
    match esn {
        Some(high) => {
            input.extend_from_slice(&bytes[..4]);
            input.extend_from_slice(&high);
            input.extend_from_slice(&bytes[4..input_end]);
        }
        None => input.extend_from_slice(&bytes[..input_end]),
    }
    let mut req = Request::new(Some(encrypt), Some(&iv), Some(aad_len as u32), input)?;
    match esn {
        Some(_) => {
            let (spi, rest) = bytes[..output_end].split_at_mut(4);
            req.scatter_around_scratch(spi, rest);
        }
        None => req.scatter_into(&mut [&mut bytes[..output_end]]),
    }
    Ok(req)
}

/// What a finished AEAD read means.
fn aead_outcome(result: io::Result<usize>, expected: usize) -> Result<bool, DescriptorError> {
    match result {
        Ok(n) if n == expected => Ok(true),
        Ok(_) => Err(DescriptorError::Fault),
        Err(e) if e.raw_os_error() == Some(libc::EBADMSG) => Ok(false),
        Err(_) => Err(DescriptorError::Fault),
    }
}

/// A single-pass AEAD request over the ESP bytes, synchronously.
fn aead_pass(fd: RawFd, desc: &crate::Descriptor, bytes: &mut [u8]) -> Result<bool, DescriptorError> {
    let mut req = aead_request(desc, bytes).map_err(|_| DescriptorError::Fault)?;
    let expected = req.expected;
    aead_outcome(req.run(fd), expected)
}

impl AfalgEngine {
    fn submit_one(&mut self, mut job: Job) -> Result<(), Job> {
        // null/null has nothing for the kernel to do: it completes inline.
        let has_work = self
            .sessions
            .get(job.session)
            .is_some_and(|r| r.spec.algorithm != Algorithm::Null);
        if self.io == AfalgIo::IoUring && job.desc.kind == DescriptorKind::SinglePass && has_work {
            if self.buffers == BufferPolicy::PerRequest {
                job.bounce_in();
                self.counters.bounce_buffers += 1;
            }
            self.counters.submitted += 1;
            if let Some(c) = self.counters.per_channel.first_mut() {
                *c += 1;
            }
            return self
                .submit_uring(job)
                .inspect_err(|_| self.counters.submitted -= 1);
        }
        let session = job.session;
        let desc = job.desc;
        let result = match self.buffers {
            BufferPolicy::Registered => self.run(session, &desc, job.region_bytes()),
            BufferPolicy::PerRequest => {
                // Allocate a bounce buffer, copy in, process, copy out, free.
                let mut bounce = job.region_bytes().to_vec();
                self.counters.bounce_buffers += 1;
                let r = self.run(session, &desc, &mut bounce);
                job.region_bytes().copy_from_slice(&bounce);
                r
            }
        };
        job.desc.status = match result {
            Ok(true) => Status::Done,
            Ok(false) => Status::AuthFailed,
            Err(e) => Status::Error(e),
        };
        self.counters.submitted += 1;
        if let Some(c) = self.counters.per_channel.first_mut() {
            *c += 1;
        }
        self.finish(job);
        Ok(())
    }
}

impl Engine for AfalgEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Afalg
    }

    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        crate::session::Session::from_spec(spec)?;
        Ok(self.sessions.insert(Registered {
            spec: spec.clone(),
            aead: None,
            aead_spare: Vec::new(),
            cipher: None,
            mac: None,
        }))
    }

    fn release(&mut self, handle: SessionHandle) {
        drop(self.sessions.remove(handle));
    }

    fn submit_burst(&mut self, _now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let mut n = 0;
        while let Some(job) = jobs.pop_front() {
            if let Err(back) = self.submit_one(job) {
                jobs.push_front(back);
                break;
            }
            n += 1;
        }
        n
    }

    fn poll_burst(&mut self, _now: Duration, out: &mut Vec<Job>) -> usize {
        self.reap();
        let n = self.done.len();
        self.counters.completed += n as u64;
        out.extend(self.done.drain(..));
        n
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

    fn wait(&mut self, timeout: Duration) {
        if !self.done.is_empty() || self.on_ring == 0 {
            return;
        }
        if let Some(ring) = self.ring.as_mut() {
            let ts = io_uring::types::Timespec::from(timeout);
            let args = io_uring::types::SubmitArgs::new().timespec(&ts);
            // A timeout (ETIME) or an interrupted wait just returns.
            let _ = ring.submitter().submit_with_args(1, &args);
        }
    }

    fn in_flight(&self) -> usize {
        self.done.len() + self.on_ring
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }
}
