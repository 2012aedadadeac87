//! The `xfrm` keying source's privileged broker: a small process of its
//! own that alone holds `CAP_NET_ADMIN` once `espgw run` has dropped its
//! privileges, so that the process parsing packets from the network has
//! none it could turn against the keying namespace's SAD and SPD.
//!
//! The kernel checks `CAP_NET_ADMIN` at every XFRM netlink request, and
//! `run` makes two kinds after its start: feedback (the SAs' counters,
//! volume expiries, on-demand requests: `ike_stub::xfrm::feedback`) and
//! the dumps of a resync after a notification overrun. `run` forks the
//! broker (a process named `espgw-broker`) before it drops its
//! privileges, while it runs one thread, handing it the two netlink
//! sockets those requests go out on and one end of two socket pairs; the
//! broker closes every other descriptor it inherited, and `run` keeps no
//! netlink socket that can send. (A fork rather than an exec: the binary
//! may run through its dynamic loader, where `/proc/self/exe` is the
//! loader.)
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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ike_stub::xfrm::DumpKind;
use netlink_sys::Socket;
use zeroize::Zeroizing;

use crate::privileges::{self, User};

/// Where the broker keeps what `run` hands it.
const FD_REQUESTS: RawFd = 3;
const FD_DUMPS: RawFd = 4;
const FD_FEEDBACK_LINK: RawFd = 5;
const FD_DUMP_LINK: RawFd = 6;

/// The largest message on a link: a dump datagram (the kernel fills up to
/// 32 KiB) or a feedback datagram (`FEEDBACK_DATAGRAM`).
const LINK_MESSAGE: usize = 64 * 1024;
/// What says the broker gave a dump up: this byte and the dump's
/// sequence number (a netlink datagram is never five bytes long).
const DUMP_ABANDONED: u8 = 0;

/// A `SOCK_SEQPACKET` socket pair: message boundaries kept, and a closed
/// end reads as the end (0 bytes).
fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error()).context("socketpair for the xfrm broker");
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

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
    pid: libc::pid_t,
    feedback: OwnedFd,
    dumps: OwnedFd,
}

impl Broker {
    /// Forks the broker with `requests` and `dumps` (netlink sockets of
    /// the keying namespace) as its own, to become `user` (uid and gid)
    /// if given. Call it as root, before privileges are dropped, while one
    /// thread runs (it checks).
    pub fn spawn(requests: Socket, dumps: Socket, user: Option<&User>) -> Result<Broker> {
        if let Err(threads) = privileges::single_threaded() {
            bail!("starting the xfrm broker with {threads} threads running: a fork keeps only one");
        }
        let (feedback, feedback_child) = seqpacket_pair()?;
        let (dump_link, dump_child) = seqpacket_pair()?;
        let user = user.cloned();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: fork in a process with one thread (checked above): the
        // child may do anything the parent could.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("forking the xfrm broker");
        }
        if pid == 0 {
            drop((feedback, dump_link));
            let handed = [
                (requests.as_raw_fd(), FD_REQUESTS),
                (dumps.as_raw_fd(), FD_DUMPS),
                (feedback_child.as_raw_fd(), FD_FEEDBACK_LINK),
                (dump_child.as_raw_fd(), FD_DUMP_LINK),
            ];
            let code = match become_broker(parent, handed).and_then(|()| serve(user.as_ref())) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!("xfrm broker: {e:#}");
                    1
                }
            };
            // SAFETY: leaves at once, running none of the parent's
            // destructors or exit handlers twice.
            unsafe { libc::_exit(code) };
        }
        // Its ends live in the broker now; closing ours lets either side
        // see the other go.
        drop((requests, dumps, feedback_child, dump_child));
        crate::xfrm_source::set_timeout(
            &dump_link,
            crate::xfrm_source::DUMP_TIMEOUT + Duration::from_secs(1),
        )?;
        Ok(Broker {
            pid,
            feedback,
            dumps: dump_link,
        })
    }

    /// The broker's process id (for the log line that says who holds
    /// `CAP_NET_ADMIN`).
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Splits the broker into its feedback side (worker 0's) and its dump
    /// side (the reading thread's).
    pub fn split(self) -> (FeedbackLink, DumpLink) {
        (
            FeedbackLink {
                link: self.feedback,
                pid: self.pid,
            },
            DumpLink { link: self.dumps },
        )
    }
}

/// Worker 0's side: hands feedback datagrams to the broker without
/// waiting, and collects its answers.
pub struct FeedbackLink {
    link: OwnedFd,
    pid: libc::pid_t,
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

impl Drop for FeedbackLink {
    fn drop(&mut self) {
        // SAFETY: signals and reaps our own child, by its pid.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
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

/// In the forked child: puts the four descriptors it keeps at 3 to 6,
/// closes every other one it inherited (the gateway's packet sockets,
/// TUN, control socket, state directory), names itself, and dies with
/// its parent.
fn become_broker(parent: libc::pid_t, handed: [(RawFd, RawFd); 4]) -> Result<()> {
    // Out of the way first, so that no dup2 below overwrites a
    // descriptor still to be moved.
    let mut high = [0; 4];
    for (i, (from, _)) in handed.iter().enumerate() {
        // SAFETY: fcntl on a descriptor this process holds.
        high[i] = unsafe { libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 64) };
        if high[i] < 0 {
            return Err(std::io::Error::last_os_error()).context("moving the broker's descriptors");
        }
    }
    for (i, (_, to)) in handed.iter().enumerate() {
        // SAFETY: dup2 onto a fixed number this process owns from now.
        if unsafe { libc::dup2(high[i], *to) } < 0 {
            return Err(std::io::Error::last_os_error()).context("placing the broker's descriptors");
        }
    }
    // Everything else goes (the moved copies at 64 and up included).
    let kept = FD_DUMP_LINK + 1;
    // SAFETY: close_range closes descriptors only.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, kept as libc::c_uint, libc::c_uint::MAX, 0) };
    if closed != 0 {
        // Before Linux 5.9: one by one.
        let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
            .context("listing the broker's descriptors")?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd >= kept)
            .collect();
        for fd in open {
            // SAFETY: closes a descriptor this process holds.
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: prctl with integer and string arguments.
    unsafe {
        libc::prctl(
            libc::PR_SET_NAME,
            c"espgw-broker".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error()).context("PR_SET_PDEATHSIG");
        }
        // The parent may have gone before the line above.
        if libc::getppid() != parent {
            bail!("espgw run ended before its broker started");
        }
    }
    Ok(())
}

/// The broker's loop: gives up all but `CAP_NET_ADMIN` (and root, for
/// `user`), then serves both links until `run` closes them.
fn serve(user: Option<&User>) -> Result<()> {
    // SAFETY: `become_broker` put these four in place; this process owns
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
