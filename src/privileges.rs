//! What `espgw run` gives up once its sockets are open, before it reads a
//! packet: every capability but those later steps still use, the bounding
//! and ambient sets, the right to gain privileges (`PR_SET_NO_NEW_PRIVS`),
//! its dumpability (no core dump, no ptrace by its own user), and, with
//! `--user`, root itself.
//!
//! What the running gateway still does, and what that needs:
//! - forwarding, ARP, control datagrams: reading and sending on AF_PACKET
//!   sockets and a TUN already open: nothing;
//! - steering (a classic BPF program attached to the fanout groups,
//!   again at each reload that changes the policies): nothing, on sockets
//!   it owns;
//! - reload: reading the configuration (its owner must be root, the
//!   gateway's user or `--user`'s, see `Config::load_trusting`) and the
//!   devices' MAC and MTU (`SIOCGIFHWADDR`, `SIOCGIFMTU`): nothing;
//! - the control socket, bound before: nothing (its peers are checked by
//!   their credentials, `SO_PEERCRED`);
//! - key memory for SAs that reloads and rekeys install (`mlock`, see
//!   `accel::key_memory`): `CAP_IPC_LOCK`, so that the lock does not
//!   depend on RLIMIT_MEMLOCK. Always kept;
//! - with the `xfrm` keying source, requests to the keying namespace's
//!   kernel (its SAs' counters, volume expiries, on-demand requests, and
//!   the dumps of a resync): `CAP_NET_ADMIN`, which netlink checks at
//!   every send. Not kept here: a broker process of its own holds it
//!   alone, and sends only those requests (`crate::xfrm_broker`);
//! - under `[gateway] on_device_loss = "wait"` (the default), opening
//!   the sockets of a device that was deleted and made again: a new
//!   AF_PACKET socket needs `CAP_NET_RAW`. Not kept here: a broker
//!   process of its own holds it alone and creates only such sockets,
//!   unbound (`crate::socket_broker`); binding one, its ring, fanout
//!   group, steering program and filters need nothing on a socket this
//!   process holds. `SO_RCVBUFFORCE` would need `CAP_NET_ADMIN`: a
//!   reopened socket asks for `SO_RCVBUF` instead (capped at
//!   `net.core.rmem_max`). Under `"exit"` no broker is started.
//!
//! Capabilities are per thread: this must run before any other thread
//! exists (it checks), so that every thread started later inherits the
//! reduced sets. Owns no other part of `run`.

use std::ffi::CString;

use anyhow::{bail, Context, Result};

/// `CAP_IPC_LOCK`, `CAP_NET_ADMIN` and `CAP_NET_RAW` (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
/// The capabilities `run` keeps.
pub const KEPT: &[u32] = &[CAP_IPC_LOCK];
/// What the `xfrm` keying source's broker keeps (`crate::xfrm_broker`),
/// and nothing else.
pub const KEPT_BY_BROKER: &[u32] = &[CAP_NET_ADMIN];
/// What the packet socket broker keeps (`crate::socket_broker`), and
/// nothing else.
pub const KEPT_BY_SOCKET_BROKER: &[u32] = &[CAP_NET_RAW];

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// A user to run as.
#[derive(Debug, Clone)]
pub struct User {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
}

impl User {
    /// Looks `name` up in the passwd database.
    pub fn lookup(name: &str) -> Result<User> {
        let c_name = CString::new(name).with_context(|| format!("user name `{name}`"))?;
        // SAFETY: passwd is plain data; zero is a valid value to be filled.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: getpwnam_r writes into `entry` and `buf` (of the length
        // given) and sets `found` to `&entry` or null.
        let r = unsafe {
            libc::getpwnam_r(
                c_name.as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if r != 0 {
            bail!(
                "looking up user `{name}`: {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
        if found.is_null() {
            bail!("no user `{name}` (--user takes a name from the passwd database)");
        }
        if entry.pw_uid == 0 {
            bail!("--user `{name}` is root (uid 0): name an unprivileged user, or leave --user out");
        }
        Ok(User {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
        })
    }
}

/// What [`drop_privileges`] left, for the log.
#[derive(Debug)]
pub struct Dropped {
    pub uid: libc::uid_t,
    pub kept: Vec<&'static str>,
    /// Capabilities that could not be dropped from the bounding set (a
    /// process without CAP_SETPCAP cannot).
    pub bounding_left: bool,
}

fn capget() -> Result<CapData> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData for version 3, of this thread.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("capget");
    }
    // Every capability up to CAP_CHECKPOINT_RESTORE (40) is below 64; the
    // first word holds 0-31, the second 32-63: only the first matters for
    // what is kept, the second is cleared below.
    Ok(data[0])
}

fn capset(keep: u32) -> Result<()> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        },
        CapData::default(),
    ];
    // SAFETY: capset of this thread with two CapData for version 3.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("capset");
    }
    Ok(())
}

fn prctl(option: libc::c_int, arg: libc::c_ulong, what: &str) -> Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            option,
            arg,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error()).with_context(|| what.to_owned());
    }
    Ok(())
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

/// Waits (up to a second) until this process runs one thread, and says
/// how many run if it does not. A thread that was just joined may still
/// be listed in `/proc/self/task` for a moment: joining waits for the
/// thread to finish, not for the kernel to release it (on a slow or
/// emulated machine, milliseconds).
pub fn single_threaded() -> Result<(), usize> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let n = threads();
        if n == 1 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(n);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Gives up what `run` no longer needs (see the module documentation):
/// with `user`, becomes that user (its primary group alone); keeps
/// [`KEPT`] of what it holds; empties the bounding and ambient sets; sets
/// no-new-privileges and makes the process non-dumpable.
pub fn drop_privileges(user: Option<&User>) -> Result<Dropped> {
    drop_to(user, KEPT)
}

/// [`drop_privileges`], keeping `kept` (of what the process holds)
/// instead: the broker's way to keep `CAP_NET_ADMIN` alone.
pub fn drop_to(user: Option<&User>, kept: &[u32]) -> Result<Dropped> {
    if let Err(threads) = single_threaded() {
        bail!("dropping privileges with {threads} threads running: the others would keep theirs");
    }
    let held = capget()?;
    let keep = kept.iter().fold(0u32, |m, &c| m | 1 << c) & held.permitted;
    // The bounding set limits what an execve could give; it needs
    // CAP_SETPCAP, so it goes first.
    let mut bounding_left = false;
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            bounding_left = true;
        }
    }
    // Before 4.3 kernels had no ambient set: nothing to clear.
    if let Err(e) = prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        "clearing the ambient capabilities",
    ) {
        if e.downcast_ref::<std::io::Error>().and_then(|e| e.raw_os_error()) != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    if let Some(user) = user {
        // Keep the permitted set across setuid, to reduce it below.
        prctl(libc::PR_SET_KEEPCAPS, 1, "PR_SET_KEEPCAPS")?;
        // SAFETY: setgroups/setgid/setuid with plain ids (glibc applies
        // them to every thread; there is one).
        unsafe {
            if libc::setgroups(1, &user.gid) != 0 {
                return Err(std::io::Error::last_os_error()).context("setgroups");
            }
            if libc::setgid(user.gid) != 0 {
                return Err(std::io::Error::last_os_error()).with_context(|| format!("setgid {}", user.gid));
            }
            if libc::setuid(user.uid) != 0 {
                return Err(std::io::Error::last_os_error()).with_context(|| format!("setuid {}", user.uid));
            }
        }
        prctl(libc::PR_SET_KEEPCAPS, 0, "PR_SET_KEEPCAPS")?;
        // SAFETY: getresuid writes the three ids.
        let (mut r, mut e, mut s) = (0, 0, 0);
        unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
        if [r, e, s] != [user.uid; 3] {
            bail!("still uid {r}/{e}/{s} after setuid({})", user.uid);
        }
    }
    capset(keep)?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")?;
    // Last: a change of credentials resets it.
    prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE")?;
    let held = capget()?;
    if held.permitted & !keep != 0 || held.effective != keep {
        bail!(
            "capabilities left after dropping: permitted {:#x}, effective {:#x}",
            held.permitted,
            held.effective
        );
    }
    Ok(Dropped {
        // SAFETY: getuid has no preconditions.
        uid: unsafe { libc::getuid() },
        kept: kept
            .iter()
            .filter(|&&c| keep & 1 << c != 0)
            .map(|&c| match c {
                CAP_IPC_LOCK => "cap_ipc_lock",
                CAP_NET_ADMIN => "cap_net_admin",
                CAP_NET_RAW => "cap_net_raw",
                _ => "?",
            })
            .collect(),
        bounding_left,
    })
}
