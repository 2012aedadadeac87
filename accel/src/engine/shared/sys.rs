//! The few system calls the shared engine needs, wrapped once: sequenced
//! packet Unix sockets with file descriptors passed alongside
//! (`SCM_RIGHTS`) and their peers' credentials, sealed memfd regions
//! mapped shared, eventfd doorbells, an epoll set, and a buffer kept out
//! of core dumps and swap. Everything returns `io::Result`; nothing here
//! knows the protocol.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::time::Duration;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is longer than the {} bytes a Unix socket address holds",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the descriptor is owned from here on.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2) and is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds a listening sequenced-packet socket at `path` with mode 0600
/// (owner only), or 0660 with group `group`: the umask is tightened around
/// bind(2), and the group is this thread's file-system group while it
/// binds, so the file is created with its final owner, group and mode in
/// one step. Nothing is changed by path afterwards (a chmod or chown of
/// the path could reach another file put there meanwhile), and there is
/// no moment at which another user could connect.
pub(crate) fn listen(path: &Path, group: Option<libc::gid_t>) -> io::Result<OwnedFd> {
    // Bound and listening under a name of its own, then renamed into
    // place: a tenant that finds the path finds a listening socket (a
    // socket file appears at bind(2), before listen(2), and a connect in
    // between would be refused).
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = std::path::PathBuf::from(staged);
    let _ = std::fs::remove_file(&staged);
    let fd = listen_at(&staged, group).inspect_err(|_| {
        let _ = std::fs::remove_file(&staged);
    })?;
    std::fs::rename(&staged, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&staged);
    })?;
    Ok(fd)
}

/// [`listen`] on `path` itself.
fn listen_at(path: &Path, group: Option<libc::gid_t>) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    let mask = if group.is_some() { 0o117 } else { 0o177 };
    // setfsgid(2) is per thread (glibc does not broadcast it) and cannot
    // fail visibly: the previous value comes back either way, so the
    // file's group is checked below.
    // SAFETY: plain system calls; the old group and mask are restored below.
    let old_group = group.map(|g| unsafe { libc::setfsgid(g) });
    // SAFETY: umask never fails; the old mask is restored just below.
    let old = unsafe { libc::umask(mask) };
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    let bound = check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) });
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    if let Some(g) = old_group {
        // SAFETY: as above.
        unsafe { libc::setfsgid(g as libc::gid_t) };
    }
    bound?;
    if let Some(want) = group {
        use std::os::unix::fs::MetadataExt;
        let got = std::fs::symlink_metadata(path)?.gid();
        if got != want {
            let _ = std::fs::remove_file(path);
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the socket was created with group {got}, not {want} (not a member of it, or a \
                     set-group-ID directory)"
                ),
            ));
        }
    }
    // SAFETY: plain system call on our descriptor.
    check(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
    set_nonblocking(fd.as_raw_fd())?;
    Ok(fd)
}

/// Accepts one connection without blocking; `None` if none is waiting.
pub(crate) fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: null address arguments are allowed by accept4(2).
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: accept4 returned a new descriptor that is ours.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Connects to the server's socket (blocking).
pub(crate) fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    Ok(fd)
}

/// Bounds how long a blocking send or receive on `fd` may wait, so that a
/// hung peer turns into an error instead of a hang.
pub(crate) fn set_timeouts(fd: &OwnedFd, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        crate::os::set_sockopt(fd, libc::SOL_SOCKET, opt, &tv)?;
    }
    Ok(())
}

pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// The peer's credentials when it connected (`SO_PEERCRED`: process,
/// user and group IDs, as the kernel recorded them, not as the peer says).
pub(crate) fn peer_cred(fd: &OwnedFd) -> io::Result<libc::ucred> {
    // SAFETY: ucred is plain data (three integers).
    unsafe { crate::os::get_sockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED) }
}

/// Whether the peer was in group `gid` (primary or supplementary) when it
/// connected (`SO_PEERGROUPS`, recorded by the kernel like `SO_PEERCRED`).
pub(crate) fn peer_in_group(fd: &OwnedFd, gid: libc::gid_t) -> io::Result<bool> {
    // NGROUPS_MAX is 65536; a peer with more groups than this first
    // look holds is asked again with room for all of them.
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = std::mem::size_of_val(groups.as_slice()) as libc::socklen_t;
        // SAFETY: `groups` has room for `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / size_of::<libc::gid_t>();
        if r == 0 {
            return Ok(groups[..n.min(groups.len())].contains(&gid));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

/// Bytes this side sent on `fd` that the peer has not read yet (`SIOCOUTQ`):
/// on a Unix socket a message stays charged to its sender until the
/// receiver has taken it, so zero means every reply was read.
pub(crate) fn unread_by_peer(fd: &OwnedFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int into `n`.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut n) })?;
    Ok(n.max(0) as usize)
}

/// Sends one message, with `fds` attached if any. `nonblocking` makes a
/// full socket an `Ok(false)` instead of a wait.
pub(crate) fn send(fd: RawFd, bytes: &[u8], fds: &[RawFd], nonblocking: bool) -> io::Result<bool> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // Room for up to four descriptors, aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        assert!(fds.len() <= 4, "at most four descriptors per message");
        let data_len = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds `space` bytes (64 >= CMSG_SPACE(16)),
        // so the first header and its data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
        }
    }
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(fd, &msg, flags) };
        if n >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock if nonblocking => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// What [`recv`] got.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// A message of this many bytes (truncated messages are reported as
    /// errors, never half-read).
    Message(usize),
    /// Nothing waiting (non-blocking only).
    Empty,
    /// The peer closed the connection.
    Closed,
}

/// Receives one message into `buf`, and any descriptors passed with it
/// into `fds` (as owned descriptors; surplus ones are closed).
pub(crate) fn recv(
    fd: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    nonblocking: bool,
) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let flags = libc::MSG_CMSG_CLOEXEC | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let n = loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock if nonblocking => return Ok(Received::Empty),
            io::ErrorKind::ConnectionReset => return Ok(Received::Closed),
            _ => return Err(e),
        }
    };
    // SAFETY: the kernel filled `control` up to msg_controllen; the CMSG
    // macros walk only within it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message larger than the protocol allows",
        ));
    }
    if n == 0 {
        return Ok(Received::Closed);
    }
    Ok(Received::Message(n))
}

/// A counter the other side can wait on (eventfd(2)): the doorbell.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: just returned by eventfd(2).
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn from_fd(fd: OwnedFd) -> io::Result<EventFd> {
        set_nonblocking(fd.as_raw_fd())?;
        Ok(EventFd(fd))
    }

    /// Rings: adds one to the counter, waking a waiter.
    pub(crate) fn ring(&self) {
        let one: u64 = 1;
        // A full counter (2^64 - 2 rings unread) or a closed peer is not
        // worth reporting: the waiter is awake either way.
        // SAFETY: writes eight bytes from a live u64.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Clears the counter without blocking.
    pub(crate) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads eight bytes into a live u64.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut value).cast(), 8) };
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until any of `fds` is readable (or hung up), at most `timeout`.
/// Returns the `revents` in `fds`.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a live slice of pollfd; a null signal mask is allowed.
    let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

pub(crate) fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// The seals a shared region must carry before the side that did not
/// create it maps it: neither side can shrink it (a page the other maps
/// would then fault with SIGBUS on access) or grow it (memory charged to
/// whoever touches it), and nobody can remove the seals or add others.
pub(crate) const REGION_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The seals on `fd` (`F_GET_SEALS`; a file that cannot be sealed has
/// `F_SEAL_SEAL` only).
pub(crate) fn seals(fd: &OwnedFd) -> io::Result<libc::c_int> {
    // SAFETY: fcntl on a descriptor we hold.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// A shared mapping of a memfd: the tenant's rings and data area.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; who may touch which part of it is
// the protocol's business (atomics for the ring indices).
unsafe impl Send for Mapping {}

impl Mapping {
    /// Creates a memfd of `len` bytes, seals it with [`REGION_SEALS`]
    /// before anyone else can hold it, and maps it.
    pub(crate) fn create(name: &str, len: usize) -> io::Result<(OwnedFd, Mapping)> {
        let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: plain system call with a valid C string.
        let fd = check(unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        })?;
        // SAFETY: just returned by memfd_create(2).
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain system call on our descriptor.
        check(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, REGION_SEALS) })?;
        let mapping = Mapping::map(&fd, len)?;
        Ok((fd, mapping))
    }

    /// Maps `len` bytes of `fd` shared, after checking the file is that
    /// long (a short file would fault on access, not fail here).
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: stat is plain data, filled by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is live.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        if (st.st_size as u64) < len as u64 || len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared region is {} bytes, {len} expected", st.st_size),
            ));
        }
        let ptr = crate::os::map_shared(fd, len)?;
        Ok(Mapping { ptr, len })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no reference into it
        // outlives the mapping (the owners hold raw pointers only while
        // they hold the mapping).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// An epoll set (level-triggered): the server's control sockets and its
/// listener, looked at once per tick without a system call per socket.
#[derive(Debug)]
pub(crate) struct Epoll(OwnedFd);

impl Epoll {
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: just returned by epoll_create1(2).
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` for input (and hang-up), reporting `data`.
    pub(crate) fn add(&self, fd: RawFd, data: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: data,
        };
        // SAFETY: `ev` is a live epoll_event.
        check(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(|_| ())
    }

    /// Stops watching `fd` (closing it does as much).
    pub(crate) fn remove(&self, fd: RawFd) {
        // SAFETY: a null event is allowed for EPOLL_CTL_DEL.
        unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }

    /// The ready entries, without waiting; `events` is filled up to its
    /// capacity (the rest are reported next time: level-triggered).
    pub(crate) fn ready(&self, events: &mut Vec<libc::epoll_event>) {
        events.clear();
        let room = events.capacity().min(i32::MAX as usize);
        // SAFETY: the kernel writes at most `room` events into the spare
        // capacity, and says how many.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), room as i32, 0) };
        if n > 0 {
            // SAFETY: the first `n` entries were written by the kernel.
            unsafe { events.set_len(n as usize) };
        }
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A buffer for secrets (the messages that carry keys): its own anonymous
/// mapping, excluded from core dumps (`MADV_DONTDUMP`), locked in memory
/// where the limit allows (`mlock`; an unlocked buffer still works), and
/// wiped before it is unmapped.
#[derive(Debug)]
pub(crate) struct SecretBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value alone.
unsafe impl Send for SecretBuf {}

impl SecretBuf {
    pub(crate) fn new(len: usize) -> io::Result<SecretBuf> {
        let ptr = crate::os::map_anonymous(len)?;
        // SAFETY: advice and locking on the mapping just made; a refusal
        // of either (an old kernel, RLIMIT_MEMLOCK) leaves a working buffer.
        unsafe {
            libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_DONTDUMP);
            libc::mlock(ptr.as_ptr().cast(), len);
        }
        Ok(SecretBuf { ptr, len })
    }

    /// A buffer of no bytes (nothing mapped), to hold a place.
    pub(crate) fn empty() -> SecretBuf {
        SecretBuf {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }
}

impl std::ops::Deref for SecretBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped read-write for as long as `self` lives
        // (or none, with a dangling but aligned pointer).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for SecretBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SecretBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        zeroize::Zeroize::zeroize(&mut **self);
        // SAFETY: unmaps exactly what `new` mapped; nothing refers to it now.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
