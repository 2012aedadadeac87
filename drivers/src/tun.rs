//! TUN driver: bare IP packets (no link header) to and
//! from a Linux TUN device, for hosts that route their own traffic into
//! espgw (`ip route add ... dev TUN`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use dataplane::buffer::{PacketBuf, PacketPool, MAX_FRAME};

/// Why a TUN device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunError {
    /// `/dev/net/tun` could not be opened.
    #[error("cannot open /dev/net/tun ({0}); the kernel needs CONFIG_TUN and espgw needs CAP_NET_ADMIN")]
    Open(io::Error),
    /// The name is longer than 15 bytes, or the kernel refused to attach
    /// to or create the device (`TUNSETIFF`; creating one needs
    /// CAP_NET_ADMIN).
    #[error("cannot create TUN device `{device}`: {source}")]
    Create {
        /// The device asked for.
        device: String,
        /// Why it was refused.
        #[source]
        source: io::Error,
    },
}

// The ioctl and its flags from libc (their values differ by architecture).
const IFF_TUN: libc::c_short = libc::IFF_TUN as libc::c_short;
const IFF_NO_PI: libc::c_short = libc::IFF_NO_PI as libc::c_short;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A TUN device opened (and created if needed) by name.
pub struct Tun {
    fd: OwnedFd,
    device: String,
}

impl Tun {
    /// Attaches to the TUN device named `device`, creating it if there is
    /// none, without the packet-information prefix (`IFF_NO_PI`): each read
    /// and write is one bare IP packet. The descriptor is non-blocking.
    /// Bringing the device up and routing to it are left to the caller.
    pub fn open(device: &str) -> Result<Tun, TunError> {
        let path = CString::new("/dev/net/tun").map_err(|e| TunError::Open(io::Error::other(e)))?;
        // SAFETY: open(2) with a NUL-terminated path.
        let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(TunError::Open(io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh descriptor owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI,
            _pad: [0; 22],
        };
        let create_err = |source| TunError::Create {
            device: device.to_owned(),
            source,
        };
        if device.len() >= libc::IFNAMSIZ {
            return Err(create_err(io::Error::other("name longer than 15 characters")));
        }
        for (slot, byte) in req.name.iter_mut().zip(device.bytes()) {
            *slot = byte as libc::c_char;
        }
        // SAFETY: TUNSETIFF reads and writes an ifreq we own.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
        if r < 0 {
            return Err(create_err(io::Error::last_os_error()));
        }
        Ok(Tun {
            fd,
            device: device.to_owned(),
        })
    }

    /// The device's name, as given to [`open`](Self::open).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The descriptor, to poll; it stays owned by this device and is
    /// closed when it drops.
    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Reads up to `max` packets into buffers from `pool`.
    pub fn recv_batch(
        &self,
        pool: &mut PacketPool,
        bufs: &mut Vec<PacketBuf>,
        max: usize,
    ) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(mut buf) = pool.alloc() else { break };
            buf.reset();
            let Some(room) = buf.append(MAX_FRAME) else {
                pool.free(buf);
                break;
            };
            // SAFETY: room is a live, writable buffer of the length given.
            let got = unsafe { libc::read(self.fd.as_raw_fd(), room.as_mut_ptr().cast(), room.len()) };
            if got <= 0 {
                pool.free(buf);
                let e = io::Error::last_os_error();
                return match (got, e.kind()) {
                    (0, _) | (_, io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(n),
                    _ => Err(e),
                };
            }
            buf.truncate(got as usize);
            bufs.push(buf);
            n += 1;
        }
        Ok(n)
    }

    /// Writes one IP packet to the device, for the kernel to take as
    /// received on it; the error is `write(2)`'s.
    pub fn send(&self, packet: &[u8]) -> io::Result<()> {
        // SAFETY: packet is a live, readable slice for the call.
        let r = unsafe { libc::write(self.fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
