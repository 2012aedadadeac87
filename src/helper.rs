//! Forking a privileged helper of `espgw run`: a process of its own,
//! started before the gateway drops its privileges, that keeps one
//! capability and takes narrow requests over socket pairs. The `xfrm`
//! keying source's broker (`crate::xfrm_broker`) and the packet socket
//! broker (`crate::socket_broker`) are two.
//!
//! Owns the fork, the descriptors a helper keeps (placed at 3, 4, ...;
//! every other one it inherited is closed), its name, its death with its
//! parent, and ending it. What a helper keeps and serves is its module's.
//! (A fork rather than an exec: the binary may run through its dynamic
//! loader, where `/proc/self/exe` is the loader.)

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{bail, Context, Result};

use crate::privileges;

/// Where a helper finds the first descriptor handed to it; the others
/// follow.
pub const FIRST_FD: RawFd = 3;

/// A `SOCK_SEQPACKET` socket pair: message boundaries kept, and a closed
/// end reads as the end (0 bytes).
pub fn seqpacket_pair(what: &str) -> Result<(OwnedFd, OwnedFd)> {
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
        return Err(std::io::Error::last_os_error()).with_context(|| format!("socketpair for {what}"));
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A helper process, killed and reaped when this is dropped.
#[derive(Debug)]
pub struct Helper {
    pid: libc::pid_t,
}

impl Helper {
    /// Forks a helper called `name` (`what` in errors) that keeps
    /// `handed`, at [`FIRST_FD`] and on in their order, and runs `serve`,
    /// exiting 0 if it returns `Ok` and 1 (having logged why) otherwise.
    /// The parent's copies of `handed` are closed. Call it as root, before
    /// privileges are dropped, while one thread runs (it checks).
    pub fn fork(
        name: &CStr,
        what: &str,
        handed: Vec<OwnedFd>,
        serve: impl FnOnce() -> Result<()>,
    ) -> Result<Helper> {
        if let Err(threads) = privileges::single_threaded() {
            bail!("starting {what} with {threads} threads running: a fork keeps only one");
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: fork in a process with one thread (checked above): the
        // child may do anything the parent could.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("forking {what}"));
        }
        if pid == 0 {
            let fds: Vec<RawFd> = handed.iter().map(AsRawFd::as_raw_fd).collect();
            let code = match become_helper(parent, &fds, name, what).and_then(|()| serve()) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!("{what}: {e:#}");
                    1
                }
            };
            // SAFETY: leaves at once, running none of the parent's
            // destructors or exit handlers twice.
            unsafe { libc::_exit(code) };
        }
        // Its copies live in the helper now; closing ours lets either side
        // see the other go.
        drop(handed);
        Ok(Helper { pid })
    }

    /// The helper's process id (for the log line that says who holds
    /// what).
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // SAFETY: signals and reaps our own child, by its pid.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// In the forked child: puts the descriptors it keeps at [`FIRST_FD`] and
/// on, closes every other one it inherited (the gateway's packet sockets,
/// TUN, control socket, state directory, the other helper's links),
/// names itself, and dies with its parent.
fn become_helper(parent: libc::pid_t, handed: &[RawFd], name: &CStr, what: &str) -> Result<()> {
    // Out of the way first, so that no dup2 below overwrites a
    // descriptor still to be moved.
    let mut high = Vec::with_capacity(handed.len());
    for from in handed {
        // SAFETY: fcntl on a descriptor this process holds.
        let fd = unsafe { libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 64) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("moving the descriptors of {what}"));
        }
        high.push(fd);
    }
    for (to, fd) in (FIRST_FD..).zip(&high) {
        // SAFETY: dup2 onto a fixed number this process owns from now.
        if unsafe { libc::dup2(*fd, to) } < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("placing the descriptors of {what}"));
        }
    }
    // Everything else goes (the moved copies at 64 and up included).
    let kept = FIRST_FD + handed.len() as RawFd;
    // SAFETY: close_range closes descriptors only.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, kept as libc::c_uint, libc::c_uint::MAX, 0) };
    if closed != 0 {
        // Before Linux 5.9: one by one.
        let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
            .with_context(|| format!("listing the descriptors of {what}"))?
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
        libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error()).context("PR_SET_PDEATHSIG");
        }
        // The parent may have gone before the line above.
        if libc::getppid() != parent {
            bail!("espgw run ended before {what} started");
        }
    }
    Ok(())
}
