//! The `xfrm` keying source's privileged broker: a small process of its
//! own that alone holds `CAP_NET_ADMIN` once `espgw run` has dropped its
//! privileges, so that the process parsing packets from the network has
//! none it could turn against the keying namespace's SAD and SPD.
//!
//! The kernel checks `CAP_NET_ADMIN` at every XFRM netlink request, and
//! `run` makes two kinds after its start: feedback (the SAs' counters,
//! volume expiries, on-demand requests: `ike_stub::xfrm::feedback`) and
//! the dumps of a resync after a notification overrun. `run` forks the
//! broker (a process named `espgw-broker`, see `crate::helper`) before it
//! drops its privileges, while it runs one thread, handing it the two
//! netlink sockets those requests go out on and one end of two socket
//! pairs; the broker closes every other descriptor it inherited, and
//! `run` keeps no netlink socket that can send.
//!
//! - Feedback link: each message is a datagram of netlink messages that
//!   `ike_stub::xfrm::feedback::check_feedback` must pass (only
//!   `XFRM_MSG_NEWAE`, `XFRM_MSG_EXPIRE` and `XFRM_MSG_ACQUIRE` requests;
//!   anything else is refused whole and logged); the broker sends it and
//!   answers with how many of its messages failed (8 bytes), refusals
//!   included.
//! - Dump link: a request is a kind (1: SAs, 2: policies) and a sequence
//!   number; the broker builds the dump request itself and hands back the
//!   kernel's datagrams as they came, then a marker with the sequence
//!   number if the dump was given up. `run` skips what carries another
//!   sequence number (the rest of a dump it stopped waiting for).
//!
//! The broker drops everything but `CAP_NET_ADMIN` (and root, with
//! `--user`), exits when `run` goes (its links close, and the kernel kills
//! it when its parent dies), and never logs what it relays (dumps carry
//! keys; its buffers are wiped).

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{Context, Result};
use ike_stub::xfrm::DumpKind;
use netlink_sys::Socket;
use zeroize::Zeroizing;

use crate::helper::{self, Helper};
use crate::privileges::{self, User};

/// Where the broker keeps what `run` hands it, in this order.
const FD_REQUESTS: RawFd = helper::FIRST_FD;
const FD_DUMPS: RawFd = helper::FIRST_FD + 1;
const FD_FEEDBACK_LINK: RawFd = helper::FIRST_FD + 2;
const FD_DUMP_LINK: RawFd = helper::FIRST_FD + 3;

/// The largest message on a link: a dump datagram (the kernel fills up to
/// 32 KiB) or a feedback datagram (`FEEDBACK_DATAGRAM`).
const LINK_MESSAGE: usize = 64 * 1024;
/// What says the broker gave a dump up: this byte and the dump's
/// sequence number (a netlink datagram is never five bytes long).
const DUMP_ABANDONED: u8 = 0;

fn send(fd: &OwnedFd, bytes: &[u8], flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a send from a buffer of its length on a descriptor we own.
    let sent = unsafe {
        libc::send(
            fd.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            flags | libc::MSG_NOSIGNAL,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reads one message into `buffer` (cleared first); `Ok(false)` when the
/// other end has closed.
fn receive(fd: &OwnedFd, buffer: &mut Vec<u8>, flags: libc::c_int) -> std::io::Result<bool> {
    buffer.clear();
    buffer.reserve(LINK_MESSAGE);
    // SAFETY: a read into the spare capacity of `buffer`, of its length.
    let got = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buffer.spare_capacity_mut().as_mut_ptr().cast(),
            buffer.capacity(),
            flags,
        )
    };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: recv initialised `got` bytes.
    unsafe { buffer.set_len(got as usize) };
    Ok(got > 0)
}

/// `run`'s side of the broker: its process and the two links.
pub struct Broker {
    helper: Helper,
    feedback: OwnedFd,
    dumps: OwnedFd,
}

impl Broker {
    /// Forks the broker with `requests` and `dumps` (netlink sockets of
    /// the keying namespace) as its own, to become `user` (uid and gid)
    /// if given. Call it as root, before privileges are dropped, while one
    /// thread runs (it checks).
    pub fn spawn(requests: Socket, dumps: Socket, user: Option<&User>) -> Result<Broker> {
        let (feedback, feedback_child) = helper::seqpacket_pair("the xfrm broker")?;
        let (dump_link, dump_child) = helper::seqpacket_pair("the xfrm broker")?;
        let user = user.cloned();
        // SAFETY: each socket's descriptor is handed over whole, owned
        // once from here on.
        let (requests, dumps) = unsafe {
            (
                OwnedFd::from_raw_fd(requests.into_raw_fd()),
                OwnedFd::from_raw_fd(dumps.into_raw_fd()),
            )
        };
        let helper = Helper::fork(
            c"espgw-broker",
            "the xfrm broker",
            vec![requests, dumps, feedback_child, dump_child],
            || {
                // The child's copies of `run`'s ends go with the rest of
                // what it inherited.
                serve(user.as_ref())
            },
        )?;
        crate::xfrm_source::set_timeout(
            &dump_link,
            crate::xfrm_source::DUMP_TIMEOUT + Duration::from_secs(1),
        )?;
        Ok(Broker {
            helper,
            feedback,
            dumps: dump_link,
        })
    }

    /// The broker's process id (for the log line that says who holds
    /// `CAP_NET_ADMIN`).
    pub fn pid(&self) -> u32 {
        self.helper.pid()
    }

    /// Splits the broker into its feedback side (worker 0's) and its dump
    /// side (the reading thread's).
    pub fn split(self) -> (FeedbackLink, DumpLink) {
        (
            FeedbackLink {
                link: self.feedback,
                _helper: self.helper,
            },
            DumpLink { link: self.dumps },
        )
    }
}

/// Worker 0's side: hands feedback datagrams to the broker without
/// waiting, and collects its answers.
pub struct FeedbackLink {
    link: OwnedFd,
    /// Ended with this side.
    _helper: Helper,
}

impl FeedbackLink {
    /// Sends one datagram of feedback; false if it could not (the link's
    /// buffer full, or the broker gone).
    pub fn send(&self, datagram: &[u8]) -> bool {
        match send(&self.link, datagram, libc::MSG_DONTWAIT) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("xfrm: feedback not handed to the broker: {e}");
                false
            }
        }
    }

    /// The failures the broker has reported since the last call (its
    /// answers to earlier datagrams).
    pub fn failures(&self) -> u64 {
        let mut buffer = Vec::new();
        let mut failed = 0;
        while let Ok(true) = receive(&self.link, &mut buffer, libc::MSG_DONTWAIT) {
            if let Ok(bytes) = <[u8; 8]>::try_from(&buffer[..]) {
                failed += u64::from_ne_bytes(bytes);
            }
        }
        failed
    }
}

/// The reading thread's side: dumps through the broker.
pub struct DumpLink {
    link: OwnedFd,
}

impl DumpLink {
    /// Asks for a dump of `kind` and hands `sink` each datagram of the
    /// answer as it comes; `Err` if the broker gave it up or could not be
    /// asked. `sink` returns false to stop reading (the answer's rest is
    /// then drained).
    pub fn dump(
        &self,
        kind: DumpKind,
        sequence: u32,
        mut sink: impl FnMut(Zeroizing<Vec<u8>>) -> bool,
    ) -> std::io::Result<()> {
        let mut request = [0u8; 5];
        request[0] = match kind {
            DumpKind::Sa => 1,
            DumpKind::Policy => 2,
        };
        request[1..].copy_from_slice(&sequence.to_ne_bytes());
        send(&self.link, &request, 0)?;
        let mut buffer = Zeroizing::new(Vec::new());
        let mut wanted = true;
        loop {
            if !receive(&self.link, &mut buffer, 0)? {
                return Err(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the xfrm broker is gone",
                ));
            }
            // What an earlier dump, given up here on a timeout, left on
            // the link is told apart by its sequence number and skipped.
            if buffer.len() == 5 && buffer[0] == DUMP_ABANDONED {
                if buffer[1..] == sequence.to_ne_bytes() {
                    return Err(std::io::Error::other("the xfrm broker gave the dump up"));
                }
                continue;
            }
            let of = buffer.get(8..12).and_then(|b| <[u8; 4]>::try_from(b).ok());
            if of != Some(sequence.to_ne_bytes()) {
                zeroize::Zeroize::zeroize(&mut buffer[..]);
                continue;
            }
            let datagram = Zeroizing::new(buffer.to_vec());
            zeroize::Zeroize::zeroize(&mut buffer[..]);
            let last = crate::xfrm_source::ends_dump(&datagram);
            if wanted {
                wanted = sink(datagram);
            }
            if last {
                return Ok(());
            }
        }
    }
}

/// The broker's loop: gives up all but `CAP_NET_ADMIN` (and root, for
/// `user`), then serves both links until `run` closes them.
fn serve(user: Option<&User>) -> Result<()> {
    // SAFETY: `Helper::fork` put these four in place; this process owns
    // them from now.
    let (requests, dumps, feedback, dump_link) = unsafe {
        (
            Socket::from_raw_fd(FD_REQUESTS),
            Socket::from_raw_fd(FD_DUMPS),
            OwnedFd::from_raw_fd(FD_FEEDBACK_LINK),
            OwnedFd::from_raw_fd(FD_DUMP_LINK),
        )
    };
    privileges::drop_to(user, privileges::KEPT_BY_BROKER)?;
    let mut refused_logged = false;
    let mut buffer = Zeroizing::new(Vec::new());
    loop {
        let mut polled = [
            libc::pollfd {
                fd: feedback.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: dump_link.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over an array of two pollfds we own.
        if unsafe { libc::poll(polled.as_mut_ptr(), 2, -1) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("xfrm broker: poll");
        }
        if polled[0].revents != 0 {
            if !receive(&feedback, &mut buffer, 0).context("xfrm broker: the feedback link")? {
                return Ok(());
            }
            let failed = match ike_stub::xfrm::feedback::check_feedback(&buffer) {
                Ok(count) => match requests.send(&buffer, 0) {
                    Ok(_) => kernel_refusals(&requests),
                    Err(e) => {
                        tracing::warn!("xfrm broker: feedback not sent: {e}");
                        count
                    }
                },
                Err(why) => {
                    if !refused_logged {
                        tracing::error!("xfrm broker: refused a request of the forwarding process: {why}");
                        refused_logged = true;
                    }
                    1
                }
            };
            zeroize::Zeroize::zeroize(&mut buffer[..]);
            if failed > 0 {
                // Lost if the link is full: only a count.
                let _ = send(&feedback, &failed.to_ne_bytes(), libc::MSG_DONTWAIT);
            }
        }
        if polled[1].revents != 0 {
            if !receive(&dump_link, &mut buffer, 0).context("xfrm broker: the dump link")? {
                return Ok(());
            }
            let request = match buffer[..] {
                [1, s0, s1, s2, s3] => Some((DumpKind::Sa, u32::from_ne_bytes([s0, s1, s2, s3]))),
                [2, s0, s1, s2, s3] => Some((DumpKind::Policy, u32::from_ne_bytes([s0, s1, s2, s3]))),
                _ => None,
            };
            let Some((kind, sequence)) = request else {
                tracing::error!("xfrm broker: refused a malformed dump request");
                continue;
            };
            let relayed = crate::xfrm_source::dump_through(&dumps, kind, sequence, |datagram| {
                send(&dump_link, datagram, 0).is_ok()
            });
            if !relayed {
                let mut abandoned = [DUMP_ABANDONED; 5];
                abandoned[1..].copy_from_slice(&sequence.to_ne_bytes());
                send(&dump_link, &abandoned, 0).context("xfrm broker: the dump link")?;
            }
        }
    }
}

/// The kernel's error answers to what was just sent on `requests` (it
/// answers a request without `NLM_F_ACK` only when it fails, and before
/// `send` returns).
fn kernel_refusals(requests: &Socket) -> u64 {
    let mut failed = 0;
    let mut buffer = Vec::with_capacity(8192);
    loop {
        buffer.clear();
        match requests.recv(&mut buffer, libc::MSG_DONTWAIT) {
            Ok(_) => failed += crate::xfrm_source::refusals(&buffer),
            Err(_) => return failed,
        }
    }
}
