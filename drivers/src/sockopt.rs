//! Socket options, the one system call both the AF_PACKET socket
//! ([`crate::afpacket`]) and its receive ring ([`crate::ring`]) set up
//! with. It lives apart from both so that the socket depends on the ring
//! and never the other way round.
//!
//! Owns the `setsockopt` call only; which options to set is its callers'.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

pub(crate) fn set_option<T>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: value points at a live T of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
