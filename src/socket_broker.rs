//! The packet socket broker: a small process of its own that alone keeps
//! `CAP_NET_RAW` once `espgw run` has dropped its privileges, so that a
//! gateway waiting for a deleted device (`[gateway] on_device_loss =
//! "wait"`) can open its sockets again without the process that parses
//! the network's packets holding that capability.
//!
//! `run` forks it (a process named `espgw-sockets`, see `crate::helper`)
//! before it drops its privileges, handing it one end of a socket pair.
//! The broker takes one request, [`REQUEST`], and nothing else: for each
//! it creates `socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC,
//! 0)` (`drivers::afpacket::unbound_socket`) and passes the descriptor
//! back (`SCM_RIGHTS`). It neither binds
//! nor configures it: the worker does, as at start
//! (`drivers::afpacket::AfPacket::reopen`). Protocol 0, not `ETH_P_ALL`:
//! a packet socket of a protocol receives every frame of every device
//! until it is bound, which would put other devices' frames in the queue
//! the worker reads; of protocol 0 it receives nothing until its `bind`
//! names the device and protocol.
//!
//! The broker drops everything but `CAP_NET_RAW` (and root, with
//! `--user`), refuses (and logs once) any other message, and exits when
//! `run` closes its end (the kernel also kills it when its parent dies).
//! It is spawned only under `on_device_loss = "wait"`.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use anyhow::{Context, Result};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::helper::{self, Helper};
use crate::privileges::{self, User};

/// The one request: a fresh packet socket, please. (An empty message
/// reads as the end of the link.)
pub const REQUEST: &[u8] = b"espgw packet socket v1";
/// The answers: a socket (with its descriptor), or why not (with the
/// `errno`, 4 bytes in native order, after the tag).
const GRANTED: u8 = 0;
const FAILED: u8 = 1;
const REFUSED: u8 = 2;

/// Where the broker keeps its end of the link.
const FD_LINK: RawFd = helper::FIRST_FD;

/// Why the broker refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a message of {0} bytes that is not the packet socket request")]
    NotTheRequest(usize),
    #[error("a message carrying descriptors or other control data")]
    ControlData,
}

/// Whether `message` (with `control` saying whether it carried control
/// data) is the one request the broker serves.
pub fn check_request(message: &[u8], control: bool) -> Result<(), Refusal> {
    if control {
        return Err(Refusal::ControlData);
    }
    if message != REQUEST {
        return Err(Refusal::NotTheRequest(message.len()));
    }
    Ok(())
}

/// `run`'s side of the broker: the link, one request at a time (workers
/// reopening at once take turns), and the broker's process.
pub struct SocketBroker {
    link: Mutex<OwnedFd>,
    helper: Helper,
}

impl SocketBroker {
    /// Forks the broker, to become `user` (uid and gid) if given. Call it
    /// as root, before privileges are dropped, while one thread runs (it
    /// checks).
    pub fn spawn(user: Option<&User>) -> Result<SocketBroker> {
        let (link, child) = helper::seqpacket_pair("the packet socket broker")?;
        let user = user.cloned();
        let helper = Helper::fork(c"espgw-sockets", "the packet socket broker", vec![child], || {
            // SAFETY: `Helper::fork` put the link here; this process owns
            // it from now.
            let link = unsafe { OwnedFd::from_raw_fd(FD_LINK) };
            privileges::drop_to(user.as_ref(), privileges::KEPT_BY_SOCKET_BROKER)?;
            serve(&link)
        })?;
        Ok(SocketBroker {
            link: Mutex::new(link),
            helper,
        })
    }

    /// The broker's process id (for the log line that says who holds
    /// `CAP_NET_RAW`).
    pub fn pid(&self) -> u32 {
        self.helper.pid()
    }
}

impl drivers::reopen::SocketSource for SocketBroker {
    fn packet_socket(&self) -> std::io::Result<OwnedFd> {
        let link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        ask(&link)
    }
}

/// Sends the request on `link` and takes the answer.
fn ask(link: &OwnedFd) -> std::io::Result<OwnedFd> {
    sendmsg::<()>(
        link.as_raw_fd(),
        &[IoSlice::new(REQUEST)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    let mut answer = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut answer)];
    let message = recvmsg::<()>(
        link.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: descriptors the kernel just installed in this
            // process for us, each owned once from here on.
            fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let len = message.bytes;
    let answer = &answer[..len.min(answer.len())];
    match (answer, fds.len()) {
        ([GRANTED], 1) => fds.pop().ok_or_else(|| std::io::Error::other("no descriptor")),
        (&[FAILED, a, b, c, d], 0) => Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes([
            a, b, c, d,
        ]))),
        ([REFUSED], 0) => Err(std::io::Error::other(
            "the packet socket broker refused the request",
        )),
        ([], 0) => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the packet socket broker is gone",
        )),
        _ => Err(std::io::Error::other(
            "the packet socket broker answered something else",
        )),
    }
}

/// The broker's loop: one answer per request, until `run` closes the link.
fn serve(link: &OwnedFd) -> Result<()> {
    let mut refused_logged = false;
    loop {
        // Room for one byte more than the request, so that a longer
        // message is not cut to look like it.
        let mut message = [0u8; REQUEST.len() + 1];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut message)];
        let received = match recvmsg::<()>(
            link.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(received) => received,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("the packet socket broker's link"),
        };
        let len = received.bytes;
        // Descriptors passed to the broker are closed, never used.
        let mut control = received.flags.contains(MsgFlags::MSG_CTRUNC);
        for cmsg in received.cmsgs().into_iter().flatten() {
            control = true;
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for fd in fds {
                    // SAFETY: a descriptor the kernel installed for us.
                    drop(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        // `run` closed its end (an empty message reads the same, and ends
        // the broker too).
        if len == 0 && !control {
            return Ok(());
        }
        // A longer message fills the buffer, one byte more than the
        // request, and is refused as such.
        let reply = match check_request(&message[..len.min(message.len())], control) {
            Err(why) => {
                if !refused_logged {
                    tracing::error!(
                        "packet socket broker: refused a request of the forwarding process: {why}"
                    );
                    refused_logged = true;
                }
                answer(link, &[REFUSED], None)
            }
            Ok(()) => match drivers::afpacket::unbound_socket() {
                Ok(socket) => answer(link, &[GRANTED], Some(&socket)),
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EIO).to_ne_bytes();
                    answer(link, &[FAILED, errno[0], errno[1], errno[2], errno[3]], None)
                }
            },
        };
        reply.context("the packet socket broker's answer")?;
    }
}

fn answer(link: &OwnedFd, bytes: &[u8], socket: Option<&OwnedFd>) -> nix::Result<usize> {
    let fds = socket.map(|s| [s.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage<'_>> = fds
        .as_ref()
        .map(|f| ControlMessage::ScmRights(f))
        .into_iter()
        .collect();
    sendmsg::<()>(
        link.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_request_itself_is_served() {
        assert_eq!(check_request(REQUEST, false), Ok(()));
        assert_eq!(check_request(REQUEST, true), Err(Refusal::ControlData));
        assert_eq!(check_request(b"", false), Err(Refusal::NotTheRequest(0)));
        let longer = [REQUEST, b"x"].concat();
        assert_eq!(
            check_request(&longer, false),
            Err(Refusal::NotTheRequest(longer.len()))
        );
        assert_eq!(
            check_request(&REQUEST[..REQUEST.len() - 1], false),
            Err(Refusal::NotTheRequest(REQUEST.len() - 1))
        );
        let mut other = REQUEST.to_vec();
        other[0] ^= 1;
        assert!(check_request(&other, false).is_err());
    }

    /// The loop itself, over a socket pair in this process (without the
    /// fork and the privileges): a request gets a packet socket as root
    /// and the kernel's refusal otherwise, anything else is refused and
    /// the link stays usable, and a closed link ends the loop.
    #[test]
    fn the_loop_answers_requests_refuses_the_rest_and_ends_with_the_link() {
        let (ours, theirs) = helper::seqpacket_pair("the test").unwrap();
        let server = std::thread::spawn(move || serve(&theirs));
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        match ask(&ours) {
            Ok(socket) => {
                let mut domain: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: domain and len are live and sized for SO_DOMAIN.
                let r = unsafe {
                    libc::getsockopt(
                        socket.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_DOMAIN,
                        (&mut domain as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                assert_eq!((r, domain), (0, libc::AF_PACKET));
            }
            Err(e) => assert!(
                !root && e.raw_os_error() == Some(libc::EPERM),
                "root gets a socket, others EPERM: {e}"
            ),
        }
        for wrong in [&b"espgw packet socket v2"[..], b"x", &[REQUEST, b"!"].concat()] {
            sendmsg::<()>(
                ours.as_raw_fd(),
                &[IoSlice::new(wrong)],
                &[],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .unwrap();
            let mut answer = [0u8; 8];
            // SAFETY: a read into a live buffer of its length.
            let n = unsafe { libc::recv(ours.as_raw_fd(), answer.as_mut_ptr().cast(), answer.len(), 0) };
            assert_eq!(&answer[..n as usize], [REFUSED], "{wrong:?}");
        }
        // A request carrying a descriptor is refused too.
        let pass = [ours.as_raw_fd()];
        sendmsg::<()>(
            ours.as_raw_fd(),
            &[IoSlice::new(REQUEST)],
            &[ControlMessage::ScmRights(&pass)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .unwrap();
        let mut answer = [0u8; 8];
        // SAFETY: a read into a live buffer of its length.
        let n = unsafe { libc::recv(ours.as_raw_fd(), answer.as_mut_ptr().cast(), answer.len(), 0) };
        assert_eq!(&answer[..n as usize], [REFUSED]);
        // Still serving after refusals.
        assert!(ask(&ours).is_ok() || !root);
        drop(ours);
        server.join().unwrap().unwrap();
    }
}
