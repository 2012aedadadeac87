//! Test and benchmark support: a tenant that misbehaves on purpose (the
//! hostile tenant of the server's threat model), speaking the protocol by
//! hand. It owns one control connection and, once attached over `shm`, the
//! region's memfd and the two doorbells, so that it can do what a hostile
//! process can: flood its control socket, leave replies unread, stay idle
//! without attaching, or resize the shared region under the server.
//! [`UnsealedServer`] is the other way round: a server that hands out a
//! region anyone could resize, which a tenant must refuse.
//!
//! Nothing here is used by the gateway or by `espgw engine serve`; the
//! tests in `accel/tests/shared_engine.rs` and `tests/shared_engine_cli.rs`
//! and `espgw bench --tenants --hostile` are its users.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use super::sys::{self, Received};
use super::wire::{self, layout, Reply, Transport, MAX_MESSAGE};

/// One hostile connection to a server.
#[derive(Debug)]
pub struct RawTenant {
    sock: OwnedFd,
    /// The shared region's memfd (shm, once attached).
    region: Option<OwnedFd>,
    region_len: u64,
    /// The doorbell the server sleeps on (shm, once attached).
    to_server: Option<OwnedFd>,
    /// The tenant ID the server gave (0 before attaching).
    pub tenant: u32,
}

impl RawTenant {
    /// Connects without attaching: an idle connection, or an operator's query.
    pub fn connect(path: &Path) -> io::Result<RawTenant> {
        Ok(RawTenant {
            sock: sys::connect(path)?,
            region: None,
            region_len: 0,
            to_server: None,
            tenant: 0,
        })
    }

    /// Connects and attaches as an honest tenant would, keeping the
    /// region's descriptor that an honest tenant closes once mapped.
    pub fn attach(path: &Path, transport: Transport, entries: u32, slot_size: u32) -> io::Result<RawTenant> {
        let mut t = RawTenant::connect(path)?;
        sys::set_timeouts(&t.sock, Duration::from_secs(5))?;
        let mut msg = Vec::new();
        wire::attach(&mut msg, transport, entries, slot_size);
        sys::send(t.sock.as_raw_fd(), &msg, &[], false)?;
        let mut rx = vec![0u8; MAX_MESSAGE];
        let mut fds = Vec::new();
        let n = match sys::recv(t.sock.as_raw_fd(), &mut rx, &mut fds, false)? {
            Received::Message(n) => n,
            _ => return Err(io::Error::from(io::ErrorKind::ConnectionAborted)),
        };
        match Reply::parse(&rx[..n]) {
            Ok(Reply::Attached {
                tenant, region_len, ..
            }) => {
                t.tenant = tenant;
                t.region_len = region_len;
            }
            other => return Err(io::Error::other(format!("not attached: {other:?}"))),
        }
        let mut fds = fds.into_iter();
        t.region = fds.next();
        t.to_server = fds.next();
        Ok(t)
    }

    /// The control socket, for raw sends the protocol would not make.
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Bounds how long a blocking send or receive waits (an error of kind
    /// `WouldBlock` then).
    pub fn set_timeouts(&self, timeout: Duration) -> io::Result<()> {
        sys::set_timeouts(&self.sock, timeout)
    }

    /// The shared region's length as the server announced it.
    pub fn region_len(&self) -> u64 {
        self.region_len
    }

    /// Sends one message without waiting; `Ok(false)` if the socket is full.
    pub fn send(&self, msg: &[u8]) -> io::Result<bool> {
        sys::send(self.sock.as_raw_fd(), msg, &[], true)
    }

    /// Sends one message, waiting for room.
    pub fn send_blocking(&self, msg: &[u8]) -> io::Result<()> {
        sys::send(self.sock.as_raw_fd(), msg, &[], false).map(|_| ())
    }

    /// Sends `msg` until the socket takes no more (or `most` are sent);
    /// how many were sent.
    pub fn fill(&self, msg: &[u8], most: usize) -> usize {
        let mut n = 0;
        while n < most && matches!(self.send(msg), Ok(true)) {
            n += 1;
        }
        n
    }

    /// Receives one message without waiting: `Ok(None)` if none is
    /// waiting, an error of kind `ConnectionAborted` once the server has
    /// closed the connection.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut fds = Vec::new();
        match sys::recv(self.sock.as_raw_fd(), buf, &mut fds, true)? {
            Received::Message(n) => Ok(Some(n)),
            Received::Empty => Ok(None),
            Received::Closed => Err(io::Error::from(io::ErrorKind::ConnectionAborted)),
        }
    }

    /// Reads whatever the server sent until it closes the connection or
    /// `within` passes: the messages read, with `true` if it closed.
    pub fn drain_until_closed(&self, within: Duration) -> (Vec<Vec<u8>>, bool) {
        let until = Instant::now() + within;
        let mut got = Vec::new();
        let mut buf = vec![0u8; MAX_MESSAGE];
        while Instant::now() < until {
            match self.recv(&mut buf) {
                Ok(Some(n)) => got.push(buf[..n].to_vec()),
                Ok(None) => {
                    let mut fds = [sys::pollfd(self.sock.as_raw_fd())];
                    let _ = sys::poll(&mut fds, Duration::from_millis(10));
                }
                Err(_) => return (got, true),
            }
        }
        (got, false)
    }

    /// Resizes the shared region (`ftruncate` on its memfd): what a hostile
    /// tenant does to make the server fault on its next access.
    pub fn truncate(&self, len: u64) -> io::Result<()> {
        let fd = self
            .region
            .as_ref()
            .ok_or_else(|| io::Error::other("no shared region (not attached over shm)"))?;
        // SAFETY: plain system call on a descriptor we hold.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Rings the server's doorbell, waking it to look at the ring.
    pub fn ring(&self) {
        if let Some(fd) = &self.to_server {
            let one: u64 = 1;
            // SAFETY: writes eight bytes from a live u64 to an eventfd we hold.
            let _ = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }
}

/// A server that answers one Attach with a region it has not sealed (a
/// memfd anyone holding it may resize): what a tenant must refuse to map.
pub struct UnsealedServer {
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl UnsealedServer {
    /// Listens at `path` and serves one tenant's Attach in a thread.
    pub fn start(path: &Path) -> io::Result<UnsealedServer> {
        let listener = sys::listen(path, None)?;
        let thread = std::thread::spawn(move || -> io::Result<()> {
            let until = Instant::now() + Duration::from_secs(10);
            let sock = loop {
                if let Some(sock) = sys::accept(&listener)? {
                    break sock;
                }
                if Instant::now() > until {
                    return Err(io::Error::from(io::ErrorKind::TimedOut));
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            sys::set_nonblocking(sock.as_raw_fd())?;
            let mut rx = vec![0u8; MAX_MESSAGE];
            let mut fds = Vec::new();
            let (entries, slot_size) = loop {
                match sys::recv(sock.as_raw_fd(), &mut rx, &mut fds, true)? {
                    Received::Message(n) => match wire::Request::parse(&rx[..n]) {
                        Ok(wire::Request::Attach {
                            entries, slot_size, ..
                        }) => break (entries, slot_size),
                        _ => return Err(io::Error::other("expected an Attach")),
                    },
                    Received::Empty if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                    _ => return Err(io::Error::from(io::ErrorKind::ConnectionAborted)),
                }
            };
            let (.., len) = layout::offsets(entries as usize, slot_size as usize);
            // SAFETY: plain system call with a valid C string; the
            // descriptor is owned from here on.
            let memfd = unsafe {
                let fd = libc::memfd_create(c"espgw-unsealed".as_ptr(), libc::MFD_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                OwnedFd::from_raw_fd(fd)
            };
            // SAFETY: plain system call on our descriptor.
            if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let bells = [sys::EventFd::new()?, sys::EventFd::new()?];
            let mut reply = Vec::new();
            Reply::Attached {
                transport: Transport::Shm,
                tenant: 1,
                entries,
                slot_size,
                region_len: len as u64,
            }
            .emit(&mut reply);
            sys::send(
                sock.as_raw_fd(),
                &reply,
                &[memfd.as_raw_fd(), bells[0].raw(), bells[1].raw()],
                false,
            )?;
            // Stay connected until the tenant has made up its mind.
            let mut fds = [sys::pollfd(sock.as_raw_fd())];
            let _ = sys::poll(&mut fds, Duration::from_secs(5));
            Ok(())
        });
        Ok(UnsealedServer { thread: Some(thread) })
    }

    /// Waits for the serving thread; its error, if any.
    pub fn finish(mut self) -> io::Result<()> {
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("the unsealed server panicked")),
            None => Ok(()),
        }
    }
}
