//! The few system calls that `accel` and the crates above it make the
//! same way, wrapped once: socket options written and read as plain
//! values, and read-write memory mappings (anonymous, or of a file,
//! shared). Everything returns `io::Result`.
//!
//! It lives in `accel` because that is the lowest crate its users (the
//! shared engine, key memory, `drivers`' AF_PACKET socket and ring, the
//! `espgw` binary) all depend on. Must not know what an option or a
//! mapping is for: that is its callers'.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::ptr::NonNull;

/// Sets socket option `name` at `level` to `value` (`setsockopt(2)` with
/// `value`'s size).
pub fn set_sockopt<T>(fd: impl AsFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points at a live `T` of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads socket option `name` at `level` (`getsockopt(2)` into a zeroed
/// `T`; bytes the kernel does not write stay zero).
///
/// # Safety
///
/// `T` must be plain data for which every bit pattern, all zeros
/// included, is a valid value (an integer or a C struct of them): the
/// kernel fills it with bytes.
pub unsafe fn get_sockopt<T>(fd: impl AsFd, level: libc::c_int, name: libc::c_int) -> io::Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` has room for `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            name,
            value.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed, then written by the kernel; any bytes are a valid
    // `T` by the caller's promise.
    Ok(unsafe { value.assume_init() })
}

/// `len` bytes of fresh zeroed memory, read-write, private to this
/// process; the caller unmaps it (`munmap(2)`).
pub fn map_anonymous(len: usize) -> io::Result<NonNull<u8>> {
    map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
}

/// The first `len` bytes of `fd`, read-write, shared with every other
/// mapping of it; the caller unmaps it (`munmap(2)`) and makes sure the
/// file is that long (a short one faults on access, not here).
pub fn map_shared(fd: impl AsFd, len: usize) -> io::Result<NonNull<u8>> {
    map(len, libc::MAP_SHARED, fd.as_fd().as_raw_fd())
}

fn map(len: usize, flags: libc::c_int, fd: RawFd) -> io::Result<NonNull<u8>> {
    // SAFETY: a new mapping at an address the kernel picks; it replaces
    // nothing (no MAP_FIXED).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    fn udp_socket() -> OwnedFd {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
        // SAFETY: just returned by socket(2).
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// An option set reads back, and a refused one is the kernel's error.
    #[test]
    fn an_option_set_reads_back() {
        let sock = udp_socket();
        set_sockopt(&sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &(5 as libc::c_int)).unwrap();
        // SAFETY: c_int is plain data.
        let low: libc::c_int = unsafe { get_sockopt(&sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT) }.unwrap();
        assert_eq!(low, 5);
        let refused = set_sockopt(&sock, libc::SOL_SOCKET, -1, &(0 as libc::c_int)).unwrap_err();
        assert!(refused.raw_os_error().is_some(), "{refused}");
    }

    /// Both kinds of mapping are zeroed, writable and `len` long.
    #[test]
    fn mappings_are_zeroed_and_writable() {
        let len = 2 * 4096;
        let anon = map_anonymous(len).unwrap();
        // SAFETY: `len` bytes mapped read-write, ours until munmap.
        let bytes = unsafe { std::slice::from_raw_parts_mut(anon.as_ptr(), len) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[len - 1] = 7;
        // SAFETY: the mapping made above, no longer borrowed.
        unsafe { libc::munmap(anon.as_ptr().cast(), len) };

        let file = tempfile_of(len);
        let a = map_shared(&file, len).unwrap();
        let b = map_shared(&file, len).unwrap();
        // SAFETY: two mappings of one file, `len` bytes each, ours until
        // munmap; a write through one is seen through the other.
        unsafe {
            *a.as_ptr().add(100) = 42;
            assert_eq!(*b.as_ptr().add(100), 42);
            libc::munmap(a.as_ptr().cast(), len);
            libc::munmap(b.as_ptr().cast(), len);
        }
    }

    fn tempfile_of(len: usize) -> OwnedFd {
        // SAFETY: plain system call with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"os-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: just returned by memfd_create(2).
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a descriptor we hold.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }, 0);
        fd
    }
}
