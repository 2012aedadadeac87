//! AF_PACKET driver: raw Ethernet frames from and to a Linux interface,
//! received in batches with `recvmmsg` straight into pool buffers (at their
//! headroom) and sent with `sendmmsg`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::buffer::{PacketBuf, PacketPool, MAX_FRAME};

/// Why an interface could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum AfPacketError {
    #[error("interface `{0}` does not exist")]
    NoSuchInterface(String),
    #[error("opening a packet socket needs CAP_NET_RAW (run espgw as root): {0}")]
    Permission(io::Error),
    #[error("cannot open a packet socket on `{device}`: {source}")]
    Io {
        device: String,
        #[source]
        source: io::Error,
    },
}

/// One interface, opened for raw frames in promiscuous mode.
pub struct AfPacket {
    fd: OwnedFd,
    device: String,
}

/// Most frames one `recv_batch` takes.
pub const MAX_BATCH: usize = 64;

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_FANOUT_HASH: u32 = 0;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

impl AfPacket {
    /// Opens `device` for forwarding: our own transmissions are not read back.
    pub fn open(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, true, ETH_P_ALL, None)
    }

    /// Opens `device` to watch everything on it, both directions.
    pub fn open_capture(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, false, ETH_P_ALL, None)
    }

    /// Opens `device` for one worker of several: IPv4 frames only, spread
    /// over the workers of fanout `group` by the kernel's flow hash, so a
    /// flow (and every packet of one ESP tunnel: same outer addresses)
    /// always reaches the same worker.
    pub fn open_worker(device: &str, group: u16) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, true, ETH_P_IP, Some(group))
    }

    /// Opens `device` for ARP frames only, not shared out: every worker
    /// learns every neighbour.
    pub fn open_arp(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, true, ETH_P_ARP, None)
    }

    fn open_with(
        device: &str,
        ignore_outgoing: bool,
        protocol: u16,
        fanout: Option<u16>,
    ) -> Result<AfPacket, AfPacketError> {
        let name = CString::new(device).map_err(|_| AfPacketError::NoSuchInterface(device.to_owned()))?;
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(AfPacketError::NoSuchInterface(device.to_owned()));
        }
        let io_err = |source| AfPacketError::Io {
            device: device.to_owned(),
            source,
        };
        // SAFETY: plain socket(2).
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(protocol.to_be()),
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => AfPacketError::Permission(e),
                _ => io_err(e),
            });
        }
        // SAFETY: raw is a fresh descriptor owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol.to_be();
        addr.sll_ifindex = index as i32;
        // SAFETY: addr is a valid sockaddr_ll of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
        // Frames for the peers' MACs, not only ours: the gateway answers for
        // its own addresses itself.
        let mreq = libc::packet_mreq {
            mr_ifindex: index as i32,
            mr_type: libc::PACKET_MR_PROMISC as u16,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        set_option(&fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq).map_err(io_err)?;
        // Room for bursts while the gateway is busy (root may exceed rmem_max).
        let rcvbuf: libc::c_int = 8 << 20;
        if set_option(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &rcvbuf).is_err() {
            let _ = set_option(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &rcvbuf);
        }
        if let Some(group) = fanout {
            let arg: u32 = u32::from(group) | (PACKET_FANOUT_HASH << 16);
            set_option(&fd, libc::SOL_PACKET, PACKET_FANOUT, &arg).map_err(io_err)?;
        }
        if ignore_outgoing {
            // Our own transmissions must not come back as input.
            let one: libc::c_int = 1;
            set_option(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &one).map_err(io_err)?;
        }
        Ok(AfPacket {
            fd,
            device: device.to_owned(),
        })
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Receives up to `max` (at most [`MAX_BATCH`]) frames into buffers
    /// from `pool`, appended to `bufs`; returns how many (0 when nothing is
    /// waiting). The scatter lists live on the stack: no allocation.
    pub fn recv_batch(
        &self,
        pool: &mut PacketPool,
        bufs: &mut Vec<PacketBuf>,
        max: usize,
    ) -> io::Result<usize> {
        let mut taken: [Option<PacketBuf>; MAX_BATCH] = std::array::from_fn(|_| None);
        let mut count = 0;
        while count < max.min(MAX_BATCH) {
            let Some(mut buf) = pool.alloc() else { break };
            buf.reset();
            if buf.append(MAX_FRAME).is_none() {
                pool.free(buf);
                break;
            }
            taken[count] = Some(buf);
            count += 1;
        }
        if count == 0 {
            return Ok(0);
        }
        // SAFETY: iovec and mmsghdr are plain data; zero is their empty value.
        let mut iovecs: [libc::iovec; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut headers: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..count {
            if let Some(buf) = taken[i].as_mut() {
                iovecs[i] = libc::iovec {
                    iov_base: buf.data_mut().as_mut_ptr().cast(),
                    iov_len: MAX_FRAME,
                };
            }
            headers[i].msg_hdr.msg_iov = &mut iovecs[i];
            headers[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the first `count` headers point at iovecs that point into
        // live buffers of MAX_FRAME bytes.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                headers.as_mut_ptr(),
                count as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        // Read errno before anything else can touch it.
        let error = (n < 0).then(io::Error::last_os_error);
        let received = if n < 0 { 0 } else { n as usize };
        for (i, slot) in taken.iter_mut().enumerate().take(count) {
            let Some(mut buf) = slot.take() else { continue };
            if i < received {
                // A frame that filled the buffer may have been cut: the
                // gateway's length checks then refuse it.
                buf.truncate((headers[i].msg_len as usize).min(MAX_FRAME));
                bufs.push(buf);
            } else {
                pool.free(buf);
            }
        }
        match error {
            Some(e) if !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Err(e),
            _ => Ok(received),
        }
    }

    /// Frames the kernel dropped on this socket because it was full, since
    /// the last call (`PACKET_STATISTICS` resets on read).
    pub fn kernel_drops(&self) -> u64 {
        let mut stats = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: stats and len are live and sized for PACKET_STATISTICS.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r < 0 {
            0
        } else {
            u64::from(stats.tp_drops)
        }
    }

    /// Sends one frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: frame is a live, readable slice for the call.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn set_option<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
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
