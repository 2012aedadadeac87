//! AF_PACKET driver: raw Ethernet frames from and to a Linux interface,
//! received from a `TPACKET_V2` ring ([`crate::ring`]) or in batches
//! with `recvmmsg` straight into pool buffers (at their headroom), and sent
//! in batches with `sendmmsg`, runs of TCP segments as one super-packet
//! ([`crate::coalesce`]).
//!
//! Forwarding sockets read with `PACKET_VNET_HDR`: every frame comes with
//! a virtio-net header saying whether its L4 checksum is still partial and
//! whether it is a GSO super-packet (up to 64 KiB, the part beyond a pool
//! buffer lands in [`RxScratch`]). [`RxScratch::prepare`] makes complete
//! packets of it ([`crate::offload`]) before the gateway sees them, so
//! espgw works with the kernel's default offloads on veth, tap and virtio.
//! Such a socket also expects a header before every frame it sends; espgw
//! writes one that asks nothing of the kernel.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::coalesce::{self, Plan};
use crate::offload::{self, OffloadCounters};
use crate::ring::RxRing;
use crate::sockopt::set_option;
use dataplane::buffer::{PacketBuf, PacketPool, MAX_FRAME};
use dataplane::wire::vnet::HEADER_LEN;

/// Why an interface could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum AfPacketError {
    /// No device bears this name (or the name holds a NUL byte).
    #[error("interface `{0}` does not exist")]
    NoSuchInterface(String),
    /// `socket(2)` was refused (EPERM, EACCES): the process lacks
    /// CAP_NET_RAW.
    #[error("opening a packet socket needs CAP_NET_RAW (run espgw as root): {0}")]
    Permission(io::Error),
    /// Creating, setting up or binding the socket, or mapping its ring,
    /// failed for another reason.
    #[error("cannot open a packet socket on `{device}`: {source}")]
    Io {
        /// The interface the socket was for.
        device: String,
        /// The failed call's error.
        #[source]
        source: io::Error,
    },
}

/// One interface, opened for raw frames in promiscuous mode.
pub struct AfPacket {
    fd: OwnedFd,
    device: String,
    /// The interface index the socket is bound to: a device deleted and
    /// made again under the same name has another, and this socket never
    /// sees its frames.
    ifindex: u32,
    /// `PACKET_VNET_HDR` is on: a virtio-net header precedes every frame,
    /// both ways.
    vnet: bool,
    /// UDP datagrams may go out as UDP GSO super-packets (see
    /// [`udp_gso_supported`]).
    udp_gso: bool,
    /// Frames arrive in a `PACKET_MMAP` ring rather than the socket's queue.
    ring: Option<RxRing>,
    /// How it was opened: what [`reopen`](Self::reopen) repeats.
    options: Options,
    /// Its fanout group, once it is a member.
    group: Option<u16>,
    /// A filter that drops every frame is attached: a reopened socket
    /// waiting for its turn in the fanout group (see
    /// [`reopen`](Self::reopen)).
    held: bool,
}

/// How a socket is set up, kept so that it can be set up again the same
/// way on a device made anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Options {
    ignore_outgoing: bool,
    /// The frames it binds to (`ETH_P_*`).
    protocol: u16,
    /// The fanout group it joins at start and its mode (with flags).
    fanout: Option<(u16, u32)>,
    vnet: bool,
    ring_slots: Option<usize>,
}

/// Whose privileges a socket is set up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// At start, before privileges are dropped.
    Start,
    /// Later, on a socket a helper created (see [`AfPacket::reopen`]).
    Reopen,
}

/// Where a packet socket's device stands (see [`AfPacket::link`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Still the device the socket was bound to, administratively up and
    /// with carrier.
    Up,
    /// Administratively down, or without carrier: frames come again once
    /// it is up.
    Down,
    /// Deleted (or deleted and made again): this socket is done.
    Gone,
}

/// Whether this kernel takes a UDP GSO super-packet (`gso_type` UDP_L4)
/// from a packet socket's virtio-net header: Linux 6.2 and later
/// (`virtio_net_hdr_to_skb` learnt it with USO). An older kernel refuses
/// the message with EINVAL, so UDP is then sent datagram by datagram.
pub fn udp_gso_supported() -> bool {
    // SAFETY: utsname is plain data, filled by uname(2).
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a valid utsname to write into.
    if unsafe { libc::uname(&mut name) } != 0 {
        return false;
    }
    let release: String = name
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    kernel_at_least(&release, (6, 2))
}

/// Whether a kernel release string (`6.18.44-foo`) is `min` or later.
fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (major, minor) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

/// How a forwarding socket takes frames from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Receive {
    /// `recvmmsg` batches from the socket's queue.
    Batch,
    /// A `TPACKET_V2` ring shared with the kernel ([`crate::ring`]).
    #[default]
    Ring,
}

impl Receive {
    /// The ring's slots, if any.
    fn ring_slots(self) -> Option<usize> {
        match self {
            Receive::Batch => None,
            Receive::Ring => Some(crate::ring::SLOTS),
        }
    }

    /// The name `espgw run` logs for this way of receiving (`recvmmsg`,
    /// `ring`).
    pub fn name(self) -> &'static str {
        match self {
            Receive::Batch => "recvmmsg",
            Receive::Ring => "ring",
        }
    }
}

/// The header espgw sends before a frame on a `PACKET_VNET_HDR` socket:
/// all zero, nothing for the kernel to do (the frame is complete).
const COMPLETE_HEADER: [u8; HEADER_LEN] = [0; HEADER_LEN];

/// Bytes of a received frame beyond a pool buffer that still fit: an IPv4
/// GSO super-packet is at most 65,535 bytes plus the Ethernet header.
const TAIL_LEN: usize = 65_536;

/// Per-worker receive state: each batch slot's virtio-net header, and room
/// for what of a super-packet does not fit its pool buffer (allocated
/// once; the kernel's zero pages until a super-packet arrives).
pub struct RxScratch {
    headers: [[u8; HEADER_LEN]; MAX_BATCH],
    /// Bytes each slot's frame has beyond its pool buffer.
    tail_lens: [usize; MAX_BATCH],
    /// Slots whose frame was longer than the buffers or cut short.
    truncated: [bool; MAX_BATCH],
    /// Whether the latest batch came with headers.
    vnet: bool,
    /// Frames the kernel refused to hand over with a virtio-net header
    /// (their reads failed with EINVAL), not yet counted.
    rejected: u64,
    tails: Box<[u8]>,
}

impl Default for RxScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl RxScratch {
    /// Scratch for one worker. Allocates its tails (64 KiB per batch slot,
    /// 4 MiB in all) once: make it at start, not per batch.
    pub fn new() -> RxScratch {
        RxScratch {
            headers: [[0; HEADER_LEN]; MAX_BATCH],
            tail_lens: [0; MAX_BATCH],
            truncated: [false; MAX_BATCH],
            vnet: false,
            rejected: 0,
            tails: vec![0u8; MAX_BATCH * TAIL_LEN].into_boxed_slice(),
        }
    }

    /// For a batch read without headers (a TUN device, a capture socket):
    /// every frame is complete as it is.
    pub fn without_headers(&mut self) {
        self.vnet = false;
    }

    /// Adds the frames the kernel refused since the last call (a GSO type
    /// with no virtio-net form, read as EINVAL) to `counters`.
    pub fn count_rejected(&mut self, counters: &mut OffloadCounters) {
        for _ in 0..std::mem::take(&mut self.rejected) {
            counters.count(offload::OffloadDrop::GsoUnsupported);
        }
    }

    /// Makes complete packets of frame `slot` of the latest batch (`buf`),
    /// appended to `out` (see [`offload::prepare`]).
    pub fn prepare(
        &self,
        slot: usize,
        buf: PacketBuf,
        pool: &mut PacketPool,
        out: &mut Vec<PacketBuf>,
        counters: &mut OffloadCounters,
    ) {
        if !self.vnet || slot >= MAX_BATCH {
            out.push(buf);
            return;
        }
        if self.truncated[slot] {
            counters.count(offload::OffloadDrop::TooLarge);
            pool.free(buf);
            return;
        }
        let tail = &self.tails[slot * TAIL_LEN..slot * TAIL_LEN + self.tail_lens[slot]];
        offload::prepare(&self.headers[slot], buf, tail, pool, out, counters);
    }
}

/// What one [`AfPacket::send_batch`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Frames the kernel took (a super-packet counts as its segments).
    pub sent: usize,
    /// Frames refused, or left unsent once the socket or device queue was
    /// full; they are not retried.
    pub failed: usize,
}

/// Most frames one `recv_batch` takes.
pub const MAX_BATCH: usize = 64;

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = libc::ETH_P_IPV6 as u16;
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_FANOUT_CBPF: u32 = 6;
const PACKET_FANOUT_DATA: libc::c_int = 22;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

impl Options {
    fn new(
        ignore_outgoing: bool,
        protocol: u16,
        fanout: Option<(u16, u32)>,
        vnet: bool,
        ring_slots: Option<usize>,
    ) -> Options {
        Options {
            ignore_outgoing,
            protocol,
            fanout,
            vnet,
            ring_slots,
        }
    }
}

/// A new packet socket of protocol 0, nonblocking and close-on-exec:
/// nothing is received until `bind` names a protocol, so that no frame
/// lands in its queue (from any device) before it is set up. What every
/// forwarding socket starts as; creating one needs `CAP_NET_RAW`.
pub fn unbound_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The index of the device named `device`.
fn interface_index(device: &str) -> Result<u32, AfPacketError> {
    let name = CString::new(device).map_err(|_| AfPacketError::NoSuchInterface(device.to_owned()))?;
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(AfPacketError::NoSuchInterface(device.to_owned()));
    }
    Ok(index)
}

/// The flags (`IFF_*`) of the device named `name`, asked on `fd` (any
/// socket); `None` if there is none.
fn device_flags(fd: &OwnedFd, name: &CString) -> Option<i32> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain data; the name fits (checked above) and the
    // zeroed rest terminates it.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads and writes the ifreq we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return None;
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    Some(i32::from(unsafe { req.ifr_ifru.ifru_flags }))
}

/// Attaches a socket filter that drops every frame (`ret #0`).
fn hold(fd: &OwnedFd) -> io::Result<()> {
    let mut drop_all = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: drop_all.as_mut_ptr(),
    };
    set_option(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
}

impl AfPacket {
    /// Opens `device` for forwarding: our own transmissions are not read back.
    pub fn open(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, Options::new(true, ETH_P_ALL, None, true, None))
    }

    /// Like [`open`](Self::open), receiving by `receive`.
    pub fn open_receiving(device: &str, receive: Receive) -> Result<AfPacket, AfPacketError> {
        Self::open_with(
            device,
            Options::new(true, ETH_P_ALL, None, true, receive.ring_slots()),
        )
    }

    /// Like [`open`](Self::open) but without `PACKET_VNET_HDR`: frames
    /// come as the kernel holds them (partial checksums, super-packets
    /// cut to the buffer), for measuring the socket alone.
    pub fn open_plain(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, Options::new(true, ETH_P_ALL, None, false, None))
    }

    /// Opens `device` to watch everything on it, both directions.
    pub fn open_capture(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(device, Options::new(false, ETH_P_ALL, None, false, None))
    }

    /// Opens `device` for one worker of several, IPv4 frames only, in
    /// fanout group `group`, whose workers are chosen by a classic BPF
    /// program (`PACKET_FANOUT_CBPF`): the
    /// `k`-th socket to join is worker `k`, and the program's value modulo
    /// the group's size picks it. Set the program with
    /// [`set_steering`](Self::set_steering) once every worker has joined
    /// (until then every frame goes to the first).
    pub fn open_worker_steered(
        device: &str,
        group: u16,
        receive: Receive,
    ) -> Result<AfPacket, AfPacketError> {
        Self::open_worker(device, (group, PACKET_FANOUT_CBPF), receive)
    }

    /// Like [`open_worker_steered`](Self::open_worker_steered), for the
    /// outside: the kernel reassembles fragments before the program runs
    /// (`PACKET_FANOUT_FLAG_DEFRAG`), so that a datagram's SPI, which only
    /// its first fragment has, decides where all of it goes
    /// ([`crate::steer::outside_program`]).
    pub fn open_worker_outside(
        device: &str,
        group: u16,
        receive: Receive,
    ) -> Result<AfPacket, AfPacketError> {
        let mode = PACKET_FANOUT_CBPF | libc::PACKET_FANOUT_FLAG_DEFRAG;
        Self::open_worker(device, (group, mode), receive)
    }

    /// A worker's IPv4 socket in fanout group `fanout.0`, of mode
    /// `fanout.1`.
    fn open_worker(device: &str, fanout: (u16, u32), receive: Receive) -> Result<AfPacket, AfPacketError> {
        let options = Options::new(true, ETH_P_IP, Some(fanout), true, receive.ring_slots());
        Self::open_with(device, options)
    }

    /// Installs (or replaces) the steering program of this socket's
    /// fanout group (see [`open_worker_steered`](Self::open_worker_steered)).
    pub fn set_steering(&self, program: &[crate::steer::Insn]) -> io::Result<()> {
        let filter: Vec<libc::sock_filter> = program
            .iter()
            .map(|i| libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect();
        let prog = libc::sock_fprog {
            len: u16::try_from(filter.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            filter: filter.as_ptr().cast_mut(),
        };
        set_option(&self.fd, libc::SOL_PACKET, PACKET_FANOUT_DATA, &prog)
    }

    /// Opens `device` for ARP frames only, not shared out: every worker
    /// learns every neighbour. A small ring, so that a worker's look at
    /// it each turn is a load, not a system call (a `recvmmsg` that finds
    /// nothing, and a batch of buffers taken and given back).
    pub fn open_arp(device: &str) -> Result<AfPacket, AfPacketError> {
        Self::open_with(
            device,
            Options::new(true, ETH_P_ARP, None, false, Some(crate::ring::SIDE_SLOTS)),
        )
    }

    /// Opens `device` for IPv6 frames only, not shared out: the one
    /// worker that answers for the gateway's addresses reads them (the
    /// steered sockets of [`open_worker_steered`](Self::open_worker_steered)
    /// take IPv4 only).
    pub fn open_ipv6(device: &str) -> Result<AfPacket, AfPacketError> {
        // It carries IPv6 traffic, not only neighbour discovery: a
        // forwarding socket's ring.
        Self::open_with(
            device,
            Options::new(true, ETH_P_IPV6, None, false, Receive::Ring.ring_slots()),
        )
    }

    fn open_with(device: &str, options: Options) -> Result<AfPacket, AfPacketError> {
        let index = interface_index(device)?;
        let fd = unbound_socket().map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => AfPacketError::Permission(e),
            _ => AfPacketError::Io {
                device: device.to_owned(),
                source: e,
            },
        })?;
        Self::set_up(fd, device, index, options, Setup::Start)
    }

    /// Opens this socket again, the same way, on `fd` (a fresh packet
    /// socket of protocol 0, see [`crate::reopen::SocketSource`]) and the
    /// device now bearing its device's name: for a device deleted and made
    /// again. A socket of a fanout group is not in one yet: it drops every
    /// frame until it has joined a new group
    /// ([`join_fanout`](Self::join_fanout)) and been
    /// [`released`](Self::release), since the old group stays tied to the
    /// old device and the workers must join the new one in their order.
    pub fn reopen(&self, fd: OwnedFd) -> Result<AfPacket, AfPacketError> {
        let index = interface_index(&self.device)?;
        Self::set_up(fd, &self.device, index, self.options, Setup::Reopen)
    }

    /// Everything after `socket(2)`: what [`open_with`](Self::open_with)
    /// and [`reopen`](Self::reopen) share.
    fn set_up(
        fd: OwnedFd,
        device: &str,
        index: u32,
        options: Options,
        setup: Setup,
    ) -> Result<AfPacket, AfPacketError> {
        let io_err = |source| AfPacketError::Io {
            device: device.to_owned(),
            source,
        };
        let one: libc::c_int = 1;
        if options.vnet {
            set_option(&fd, libc::SOL_PACKET, libc::PACKET_VNET_HDR, &one).map_err(io_err)?;
        }
        let ring = match options.ring_slots {
            Some(slots) => Some(RxRing::setup(&fd, slots).map_err(io_err)?),
            None => None,
        };
        // A reopened member of a fanout group must not read frames before
        // it is in the group: bound alone it would see every one.
        let held = setup == Setup::Reopen && options.fanout.is_some();
        if held {
            hold(&fd).map_err(io_err)?;
        }
        // SAFETY: sockaddr_ll is plain data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = options.protocol.to_be();
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
        // Room for bursts while the gateway is busy: at start root may
        // exceed rmem_max. A reopened socket is set up by a process that
        // kept no CAP_NET_ADMIN, which SO_RCVBUFFORCE needs, so it asks
        // for SO_RCVBUF (capped at net.core.rmem_max) alone; the ring, where
        // forwarding sockets take their frames, is as large as at start.
        let rcvbuf: libc::c_int = 8 << 20;
        if setup == Setup::Reopen || set_option(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &rcvbuf).is_err()
        {
            let _ = set_option(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &rcvbuf);
        }
        let mut group = None;
        if let (Some((id, mode)), Setup::Start) = (options.fanout, setup) {
            let arg: u32 = u32::from(id) | (mode << 16);
            set_option(&fd, libc::SOL_PACKET, PACKET_FANOUT, &arg).map_err(io_err)?;
            group = Some(id);
        }
        if options.ignore_outgoing {
            // Our own transmissions must not come back as input.
            set_option(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &one).map_err(io_err)?;
        }
        Ok(AfPacket {
            fd,
            device: device.to_owned(),
            ifindex: index,
            vnet: options.vnet,
            udp_gso: options.vnet && udp_gso_supported(),
            ring,
            options,
            group,
            held,
        })
    }

    /// Whether this socket belongs in a fanout group but is not in one
    /// yet (a [`reopen`](Self::reopen)ed one).
    pub fn fanout_pending(&self) -> bool {
        self.options.fanout.is_some() && self.group.is_none()
    }

    /// Whether this socket is a member of a fanout group.
    pub fn in_fanout(&self) -> bool {
        self.group.is_some()
    }

    /// Joins fanout group `group` with the mode this socket was opened
    /// with, or, with `None`, a group of a new id the kernel picks
    /// (`PACKET_FANOUT_FLAG_UNIQUEID`: no other group of this namespace
    /// has it, another process's included). Returns the group's id, for
    /// the other workers to join. The device must be up (the kernel
    /// refuses a socket that is not running with EINVAL).
    pub fn join_fanout(&mut self, group: Option<u16>) -> io::Result<u16> {
        let Some((_, mode)) = self.options.fanout else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let arg: u32 = match group {
            Some(id) => u32::from(id) | (mode << 16),
            None => (mode | libc::PACKET_FANOUT_FLAG_UNIQUEID) << 16,
        };
        set_option(&self.fd, libc::SOL_PACKET, PACKET_FANOUT, &arg)?;
        let id = match group {
            Some(id) => id,
            None => {
                let mut value: u32 = 0;
                let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
                // SAFETY: value and len are live and sized for PACKET_FANOUT.
                let r = unsafe {
                    libc::getsockopt(
                        self.fd.as_raw_fd(),
                        libc::SOL_PACKET,
                        PACKET_FANOUT,
                        (&mut value as *mut u32).cast(),
                        &mut len,
                    )
                };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                // The id is the low 16 bits, the mode and flags above.
                (value & 0xffff) as u16
            }
        };
        self.group = Some(id);
        Ok(id)
    }

    /// Takes away the filter a [`reopen`](Self::reopen)ed member of a
    /// fanout group drops every frame with, once its group is whole.
    pub fn release(&mut self) -> io::Result<()> {
        if self.held {
            let none: libc::c_int = 0;
            set_option(&self.fd, libc::SOL_SOCKET, libc::SO_DETACH_FILTER, &none)?;
            self.held = false;
        }
        Ok(())
    }

    /// The index of a device that now bears this socket's device's name,
    /// is up, and is not the one this socket is bound to: the successor
    /// of a deleted device, ready for [`reopen`](Self::reopen).
    pub fn successor(&self) -> Option<u32> {
        let name = CString::new(self.device.as_str()).ok()?;
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 || index == self.ifindex {
            return None;
        }
        let flags = device_flags(&self.fd, &name)?;
        (flags & libc::IFF_UP != 0).then_some(index)
    }

    /// The name of the device the socket was opened on.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Takes the socket's pending error (`SO_ERROR`, which reading
    /// clears): the kernel sets `ENETDOWN` on a packet socket when its
    /// device goes down or away, and until it is read every poll returns at
    /// once.
    pub fn take_error(&self) -> Option<io::Error> {
        // SAFETY: SO_ERROR is a c_int, plain data.
        let pending =
            unsafe { crate::sockopt::get_option::<libc::c_int>(&self.fd, libc::SOL_SOCKET, libc::SO_ERROR) };
        match pending {
            Err(e) => Some(e),
            Ok(error) => (error != 0).then(|| io::Error::from_raw_os_error(error)),
        }
    }

    /// Whether the device the socket is bound to still exists, and is up.
    /// A packet socket follows its device down and up again by itself
    /// (the kernel re-attaches it), but not across a deletion.
    pub fn link(&self) -> LinkState {
        let Ok(name) = CString::new(self.device.as_str()) else {
            return LinkState::Gone;
        };
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        if unsafe { libc::if_nametoindex(name.as_ptr()) } != self.ifindex {
            return LinkState::Gone;
        }
        let Some(flags) = device_flags(&self.fd, &name) else {
            return LinkState::Gone;
        };
        if flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0 {
            LinkState::Up
        } else {
            LinkState::Down
        }
    }

    /// The socket's descriptor, to poll; it stays owned by this socket and
    /// is closed when it drops.
    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Receives up to `max` (at most [`MAX_BATCH`]) frames into buffers
    /// from `pool`, appended to `bufs`; returns how many (0 when nothing is
    /// waiting). Frame `i` of the batch is slot `i` of `scratch`, where its
    /// virtio-net header and any bytes beyond the buffer are: hand each to
    /// [`RxScratch::prepare`] before the gateway (or use
    /// [`recv_complete`](Self::recv_complete)). The scatter lists live on
    /// the stack: no allocation.
    pub fn recv_batch(
        &self,
        pool: &mut PacketPool,
        bufs: &mut Vec<PacketBuf>,
        max: usize,
        scratch: &mut RxScratch,
    ) -> io::Result<usize> {
        scratch.vnet = self.vnet;
        if let Some(ring) = &self.ring {
            return self.recv_ring(ring, pool, bufs, max, scratch);
        }
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
        let mut iovecs: [[libc::iovec; 3]; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut headers: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let tails = scratch.tails.as_mut_ptr();
        for i in 0..count {
            let Some(buf) = taken[i].as_mut() else { continue };
            let frame = libc::iovec {
                iov_base: buf.data_mut().as_mut_ptr().cast(),
                iov_len: MAX_FRAME,
            };
            if self.vnet {
                iovecs[i] = [
                    libc::iovec {
                        iov_base: scratch.headers[i].as_mut_ptr().cast(),
                        iov_len: HEADER_LEN,
                    },
                    frame,
                    libc::iovec {
                        // SAFETY: slot i's tail lies inside `tails`.
                        iov_base: unsafe { tails.add(i * TAIL_LEN) }.cast(),
                        iov_len: TAIL_LEN,
                    },
                ];
                headers[i].msg_hdr.msg_iovlen = 3;
            } else {
                iovecs[i][0] = frame;
                headers[i].msg_hdr.msg_iovlen = 1;
            }
            headers[i].msg_hdr.msg_iov = iovecs[i].as_mut_ptr();
        }
        // SAFETY: the first `count` headers point at iovecs that point into
        // live buffers of the lengths given (pool buffers of MAX_FRAME
        // bytes, the scratch's headers and tails).
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
        let head_room = if self.vnet { HEADER_LEN } else { 0 };
        for (i, slot) in taken.iter_mut().enumerate().take(count) {
            let Some(mut buf) = slot.take() else { continue };
            if i < received {
                let len = (headers[i].msg_len as usize).saturating_sub(head_room);
                let cut = headers[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
                // Without headers a frame that filled the buffer may have
                // been cut: the gateway's length checks then refuse it.
                buf.truncate(len.min(MAX_FRAME));
                if i < MAX_BATCH {
                    scratch.tail_lens[i] = if self.vnet {
                        len.saturating_sub(MAX_FRAME)
                    } else {
                        0
                    };
                    scratch.truncated[i] = self.vnet && cut;
                }
                bufs.push(buf);
            } else {
                pool.free(buf);
            }
        }
        match error {
            // A frame whose offload state has no virtio-net form (a GSO
            // type such as a tunnel's) fails its read with EINVAL and is
            // gone; the next read goes on.
            Some(e) if e.raw_os_error() == Some(libc::EINVAL) && self.vnet => {
                scratch.rejected += 1;
                Ok(0)
            }
            Some(e) if !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Err(e),
            _ => Ok(received),
        }
    }

    /// [`recv_batch`](Self::recv_batch) from the ring: each slot the
    /// kernel handed over is copied into a pool buffer (its virtio-net
    /// header into the scratch) and handed back; a frame too large for a
    /// slot is read whole from the socket's queue.
    fn recv_ring(
        &self,
        ring: &RxRing,
        pool: &mut PacketPool,
        bufs: &mut Vec<PacketBuf>,
        max: usize,
        scratch: &mut RxScratch,
    ) -> io::Result<usize> {
        let mut head = ring.head();
        let mut count = 0;
        while count < max.min(MAX_BATCH) {
            let Some(slot) = ring.slot(head) else { break };
            let Some(mut buf) = pool.alloc() else { break };
            buf.reset();
            scratch.tail_lens[count] = 0;
            scratch.truncated[count] = false;
            if slot.copied {
                if !self.recv_one(&mut buf, count, scratch) {
                    scratch.truncated[count] = true;
                }
            } else if slot.cut || slot.frame.len() > MAX_FRAME {
                scratch.truncated[count] = true;
            } else {
                scratch.headers[count].copy_from_slice(slot.header);
                if !buf.fill(slot.frame) {
                    scratch.truncated[count] = true;
                }
            }
            ring.release(head);
            head = head.wrapping_add(1);
            bufs.push(buf);
            count += 1;
        }
        ring.set_head(head);
        Ok(count)
    }

    /// Reads one frame from the socket's queue into `buf` and slot `slot`
    /// of the scratch (header, tail): a ring's oversized frame. False if
    /// there was none or it was cut.
    fn recv_one(&self, buf: &mut PacketBuf, slot: usize, scratch: &mut RxScratch) -> bool {
        if buf.append(MAX_FRAME).is_none() {
            return false;
        }
        let mut iov = [
            libc::iovec {
                iov_base: scratch.headers[slot].as_mut_ptr().cast(),
                iov_len: HEADER_LEN,
            },
            libc::iovec {
                iov_base: buf.data_mut().as_mut_ptr().cast(),
                iov_len: MAX_FRAME,
            },
            libc::iovec {
                iov_base: scratch.tails[slot * TAIL_LEN..(slot + 1) * TAIL_LEN]
                    .as_mut_ptr()
                    .cast(),
                iov_len: TAIL_LEN,
            },
        ];
        // SAFETY: msghdr is plain data; zero is its empty value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        // SAFETY: msg points at iovecs over live buffers of the lengths given.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            buf.truncate(0);
            return false;
        }
        let len = (n as usize).saturating_sub(HEADER_LEN);
        buf.truncate(len.min(MAX_FRAME));
        scratch.tail_lens[slot] = len.saturating_sub(MAX_FRAME);
        msg.msg_flags & libc::MSG_TRUNC == 0
    }

    /// [`recv_batch`](Self::recv_batch) followed by
    /// [`RxScratch::prepare`] of every frame: complete packets in `bufs`.
    /// Returns the frames read (segments may make more packets).
    pub fn recv_complete(
        &self,
        pool: &mut PacketPool,
        bufs: &mut Vec<PacketBuf>,
        max: usize,
        scratch: &mut RxScratch,
        counters: &mut OffloadCounters,
    ) -> io::Result<usize> {
        let start = bufs.len();
        let n = self.recv_batch(pool, bufs, max, scratch)?;
        scratch.count_rejected(counters);
        if !self.vnet {
            return Ok(n);
        }
        let mut raw: [Option<PacketBuf>; MAX_BATCH] = std::array::from_fn(|_| None);
        for (slot, buf) in raw.iter_mut().zip(bufs.drain(start..)) {
            *slot = Some(buf);
        }
        for (i, slot) in raw.iter_mut().enumerate().take(n) {
            if let Some(buf) = slot.take() {
                scratch.prepare(i, buf, pool, bufs, counters);
            }
        }
        Ok(n)
    }

    /// Frames the kernel dropped on this socket because it was full, since
    /// the last call (`PACKET_STATISTICS` resets on read).
    pub fn kernel_drops(&self) -> u64 {
        // SAFETY: tpacket_stats is plain data (two u32s).
        let stats = unsafe {
            crate::sockopt::get_option::<libc::tpacket_stats>(
                &self.fd,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
            )
        };
        stats.map_or(0, |s| u64::from(s.tp_drops))
    }

    /// Sends one frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        let Sent { failed, .. } = self.send_batch(&[frame]);
        if failed > 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `frames` with one `sendmmsg` per [`MAX_BATCH`] of them. A
    /// frame the kernel refuses is counted and skipped; once the socket or
    /// the device queue is full (EAGAIN, ENOBUFS), the rest of the batch
    /// is counted as failed rather than tried frame by frame.
    pub fn send_batch(&self, frames: &[&[u8]]) -> Sent {
        let mut outcome = Sent::default();
        for chunk in frames.chunks(MAX_BATCH) {
            // SAFETY: iovec and mmsghdr are plain data; zero is their empty value.
            let mut iovecs: [[libc::iovec; 2]; MAX_BATCH] = unsafe { std::mem::zeroed() };
            let mut headers: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
            for (i, frame) in chunk.iter().enumerate() {
                let data = libc::iovec {
                    iov_base: frame.as_ptr() as *mut libc::c_void,
                    iov_len: frame.len(),
                };
                if self.vnet {
                    iovecs[i] = [
                        libc::iovec {
                            iov_base: COMPLETE_HEADER.as_ptr() as *mut libc::c_void,
                            iov_len: HEADER_LEN,
                        },
                        data,
                    ];
                    headers[i].msg_hdr.msg_iovlen = 2;
                } else {
                    iovecs[i][0] = data;
                    headers[i].msg_hdr.msg_iovlen = 1;
                }
                headers[i].msg_hdr.msg_iov = iovecs[i].as_mut_ptr();
            }
            let sent = self.send_messages(&mut headers[..chunk.len()], |_| 1);
            outcome.sent += sent.sent;
            outcome.failed += sent.failed;
        }
        outcome
    }

    /// Sends `frames` as [`send_batch`](Self::send_batch) does, except
    /// that on a `PACKET_VNET_HDR` socket consecutive TCP segments of one
    /// flow go out as one GSO super-packet ([`coalesce`]); the first frame
    /// of each has its headers rewritten for it. Counts are in frames;
    /// `merged` gains the super-packets sent and the segments in them.
    pub fn send_coalesced(&self, frames: &mut [&mut [u8]], plan: &mut Plan, merged: &mut (u64, u64)) -> Sent {
        if !self.vnet {
            let mut outcome = Sent::default();
            for chunk in frames.chunks(MAX_BATCH) {
                let mut refs: [&[u8]; MAX_BATCH] = [&[]; MAX_BATCH];
                for (r, f) in refs.iter_mut().zip(chunk) {
                    *r = f;
                }
                let sent = self.send_batch(&refs[..chunk.len()]);
                outcome.sent += sent.sent;
                outcome.failed += sent.failed;
            }
            return outcome;
        }
        let mut outcome = Sent::default();
        for chunk in frames.chunks_mut(coalesce::MAX_FRAMES) {
            coalesce::plan(chunk, plan, self.udp_gso);
            // One header and at most one span per frame.
            // SAFETY: iovec and mmsghdr are plain data; zero is their empty value.
            let mut iovecs: [libc::iovec; 2 * coalesce::MAX_FRAMES] = unsafe { std::mem::zeroed() };
            let mut headers: [libc::mmsghdr; coalesce::MAX_FRAMES] = unsafe { std::mem::zeroed() };
            let mut firsts = [0usize; coalesce::MAX_FRAMES];
            let mut at = 0;
            for (i, m) in plan.messages().iter().enumerate() {
                firsts[i] = at;
                iovecs[at] = libc::iovec {
                    iov_base: m.header.as_ptr() as *mut libc::c_void,
                    iov_len: HEADER_LEN,
                };
                for k in m.start..m.start + m.count {
                    let (from, to) = plan.spans[k];
                    let span = &chunk[k][from..to];
                    iovecs[at + 1 + k - m.start] = libc::iovec {
                        iov_base: span.as_ptr() as *mut libc::c_void,
                        iov_len: span.len(),
                    };
                }
                headers[i].msg_hdr.msg_iovlen = 1 + m.count;
                at += 1 + m.count;
            }
            let base = iovecs.as_mut_ptr();
            for (header, first) in headers.iter_mut().zip(firsts).take(plan.len) {
                // SAFETY: `first` indexes inside `iovecs`.
                header.msg_hdr.msg_iov = unsafe { base.add(first) };
            }
            let messages = plan.messages();
            let sent = self.send_messages(&mut headers[..messages.len()], |i| messages[i].count);
            let (packets, segments) = plan.merged();
            merged.0 += packets;
            merged.1 += segments;
            outcome.sent += sent.sent;
            outcome.failed += sent.failed;
        }
        outcome
    }

    /// One `sendmmsg` loop over prepared messages; message `i` carries
    /// `frames(i)` frames. A message the kernel refuses is counted and
    /// skipped; once the socket or the device queue is full (EAGAIN,
    /// ENOBUFS), the rest are counted as failed rather than tried one by
    /// one.
    fn send_messages(&self, headers: &mut [libc::mmsghdr], frames: impl Fn(usize) -> usize) -> Sent {
        let mut outcome = Sent::default();
        let mut at = 0;
        while at < headers.len() {
            // SAFETY: headers[at..] point at iovecs over live frames (and
            // headers), only read by the call.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    headers[at..].as_mut_ptr(),
                    (headers.len() - at) as u32,
                    0,
                )
            };
            if r > 0 {
                outcome.sent += (at..at + r as usize).map(&frames).sum::<usize>();
                at += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    outcome.failed += (at..headers.len()).map(&frames).sum::<usize>();
                    break;
                }
                _ => {
                    outcome.failed += frames(at);
                    at += 1;
                }
            }
        }
        outcome
    }

    /// Sends `frames` with one `send(2)` each (the way `bench --io`
    /// compares with [`send_batch`](Self::send_batch)).
    pub fn send_each(&self, frames: &[&[u8]]) -> Sent {
        let mut outcome = Sent::default();
        let mut header = COMPLETE_HEADER;
        for frame in frames {
            let r = if self.vnet {
                let mut iov = [
                    libc::iovec {
                        iov_base: header.as_mut_ptr().cast(),
                        iov_len: HEADER_LEN,
                    },
                    libc::iovec {
                        iov_base: frame.as_ptr() as *mut libc::c_void,
                        iov_len: frame.len(),
                    },
                ];
                // SAFETY: msghdr is plain data; it points at live iovecs.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = 2;
                // SAFETY: msg and what it points at live for the call.
                unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, 0) }
            } else {
                // SAFETY: frame is a live, readable slice for the call.
                unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) }
            };
            if r < 0 {
                outcome.failed += 1;
            } else {
                outcome.sent += 1;
            }
        }
        outcome
    }
}

#[cfg(test)]
mod kernel_tests {
    use super::kernel_at_least;

    #[test]
    fn kernel_releases_compare_by_major_then_minor() {
        assert!(kernel_at_least("6.18.44-fc-v669", (6, 2)));
        assert!(kernel_at_least("6.2.0", (6, 2)));
        assert!(kernel_at_least("7.0-rc1", (6, 2)));
        assert!(!kernel_at_least("6.1.0-28-amd64", (6, 2)));
        assert!(!kernel_at_least("5.19.17", (6, 2)));
        assert!(!kernel_at_least("garbage", (6, 2)));
    }
}
