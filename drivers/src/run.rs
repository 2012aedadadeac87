//! The live driver: forwards between the two interfaces of a gateway until
//! told to stop, then drains the engine and hands every buffer back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use accel::NextCompletion;

use crate::afpacket::{AfPacket, AfPacketError, LinkState, RxScratch, Sent, MAX_BATCH};
use crate::coalesce::Plan;
use crate::offload::OffloadCounters;
use crate::reopen::{Joined, OnDeviceLoss};
use crate::steer::Insn;
use crate::tun::Tun;
use dataplane::buffer::{PacketBuf, PacketPool};
use dataplane::gateway::{DatagramError, Gateway, Output, Verdict};

/// A device frames come from and go to.
pub enum Device {
    /// A packet socket on an Ethernet device.
    Packet(AfPacket),
    /// A TUN device (raw IP packets, no link header); espgw makes one the
    /// inside only.
    Tun(Tun),
}

impl Device {
    fn recv_batch(
        &self,
        pool: &mut PacketPool,
        bufs: &mut Vec<dataplane::buffer::PacketBuf>,
        max: usize,
        scratch: &mut RxScratch,
    ) -> std::io::Result<usize> {
        match self {
            Device::Packet(s) => s.recv_batch(pool, bufs, max, scratch),
            Device::Tun(t) => {
                // Routed into a TUN device without offloads, packets come
                // complete (the stack finished them for a device that
                // cannot).
                scratch.without_headers();
                t.recv_batch(pool, bufs, max)
            }
        }
    }

    /// Sends `frames`; on a packet socket with virtio-net headers,
    /// consecutive TCP segments of a flow as one super-packet
    /// ([`crate::coalesce`]).
    fn send_batch(&self, frames: &mut [&mut [u8]], plan: &mut Plan, offload: &mut OffloadCounters) -> Sent {
        match self {
            Device::Packet(s) => {
                let mut merged = (0, 0);
                let sent = s.send_coalesced(frames, plan, &mut merged);
                offload.coalesced += merged.0;
                offload.coalesced_segments += merged.1;
                sent
            }
            Device::Tun(t) => {
                let mut outcome = Sent::default();
                for frame in frames {
                    match t.send(frame) {
                        Ok(()) => outcome.sent += 1,
                        Err(_) => outcome.failed += 1,
                    }
                }
                outcome
            }
        }
    }

    fn as_raw_fd(&self) -> i32 {
        match self {
            Device::Packet(s) => s.as_raw_fd(),
            Device::Tun(t) => t.as_raw_fd(),
        }
    }

    fn kernel_drops(&self) -> u64 {
        match self {
            Device::Packet(s) => s.kernel_drops(),
            Device::Tun(_) => 0,
        }
    }
}
use dataplane::route::Port;

/// Frames taken from one interface per turn.
pub const BATCH: usize = 64;
/// Buffers the driver owns: several batches plus what the engine, the ARP
/// queue and reassembly may hold.
pub const POOL: usize = 4096;

/// Counts of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunSummary {
    /// Frames read from the devices (a GSO super-packet is one; the
    /// gateway's `rx_packets` counts its segments).
    pub frames_in: u64,
    /// Frames the kernel took to send (a super-packet counts as the
    /// segments merged into it).
    pub frames_out: u64,
    /// Frames forwarded but not sent: refused by the kernel, left over
    /// when the socket or device queue was full, or for a port whose
    /// device is deleted. They are not retried.
    pub send_errors: u64,
    /// Frames the kernel dropped before espgw could read them (socket full).
    pub kernel_drops: u64,
    /// Control datagrams dropped because more than [`CONTROL_QUEUE`]
    /// arrived between two ticks.
    pub control_overflow: u64,
    /// What the driver did with the kernel's offload state: checksums
    /// completed, super-packets segmented, frames it could not make whole.
    pub offload: OffloadCounters,
    /// Pool buffers in use as of the latest tick (a soak watches it for
    /// leaks).
    pub pool_in_use: usize,
    /// Buffers in the worker's pool ([`POOL`]).
    pub pool_capacity: usize,
    /// Turns after which the worker waited for more frames (see
    /// [`Moderation`]).
    pub moderated: u64,
    /// Times an interface's device was found down (or without carrier).
    pub link_downs: u64,
    /// Whether each port's device is down now (by [`Port::index`]): the
    /// worker waits for it without spinning, and forwards again once the
    /// kernel brings its sockets back with it.
    pub link_down: [bool; 2],
    /// Times an interface's device was found deleted, under
    /// [`OnDeviceLoss::Wait`]. Every worker sees the same devices: added
    /// up over workers, the largest count stands for them all.
    pub devices_lost: u64,
    /// Whether each port's device is deleted now, or its sockets are not
    /// all open again (by [`Port::index`]).
    pub device_lost: [bool; 2],
}

/// Why a worker stopped on its own: a device it cannot go on without.
#[derive(Debug, thiserror::Error)]
pub enum DeviceLost {
    /// The device was deleted under [`OnDeviceLoss::Exit`]: a packet
    /// socket does not follow a device made again under the same name.
    #[error(
        "device `{device}` of the {port} interface was deleted (or deleted and made again): \
         its sockets cannot follow it; espgw stops so that its service manager starts it again \
         once the device is back"
    )]
    Deleted {
        /// The deleted device's name.
        device: String,
        /// The interface it was.
        port: Port,
    },
    /// A TUN device espgw made was deleted. Whatever `on_device_loss`
    /// says: the device was the process's own (its descriptor now answers
    /// `EBADFD`), and making it again takes `CAP_NET_ADMIN`, which `run`
    /// gave up.
    #[error(
        "TUN device `{device}` of the {port} interface was deleted: it was espgw's own and \
         cannot be waited for; espgw stops so that its service manager starts it again, \
         which makes the device anew"
    )]
    TunDeleted {
        /// The deleted device's name.
        device: String,
        /// The interface it was.
        port: Port,
    },
    /// Under [`OnDeviceLoss::Wait`], a device of the name is back but its
    /// sockets could not be opened on it: no socket from the helper, or
    /// the kernel refused to set one up.
    #[error(
        "device `{device}` of the {port} interface is back, but its sockets cannot be opened again: {source}"
    )]
    Reopen {
        /// The device's name.
        device: String,
        /// The interface it is.
        port: Port,
        /// Why the socket could not be had or set up.
        #[source]
        source: std::io::Error,
    },
}

/// Where a port's sockets stand under [`OnDeviceLoss::Wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortState {
    /// Open on the device (which may be down).
    Present,
    /// The device was deleted: its sockets are not polled, nothing is sent
    /// on them, and each tick looks for a device of that name.
    Lost,
    /// Open again on the device of this index; a socket of a fanout group
    /// waits for its group to be whole (see [`crate::reopen`]).
    Joining { ifindex: u32 },
}

/// Whether an error opening a socket again means the device went (or
/// went down) meanwhile, to be tried again at the next tick, rather than
/// that reopening cannot work.
fn device_moved(error: &AfPacketError) -> bool {
    match error {
        AfPacketError::NoSuchInterface(_) => true,
        AfPacketError::Io { source, .. } => matches!(
            source.raw_os_error(),
            Some(libc::ENODEV | libc::ENXIO | libc::ENETDOWN)
        ),
        AfPacketError::Permission(_) => false,
    }
}

/// A receiving socket reported an error (`POLLERR`, or `ENETDOWN` from a
/// receive): takes the error, so that the next poll waits again rather
/// than returning at once, and looks at the device. Down is waited out
/// (noted in `summary`); deleted ends the worker with [`DeviceLost`] under
/// [`OnDeviceLoss::Exit`], and is waited for under
/// [`OnDeviceLoss::Wait`]. True when the port's state changed.
fn socket_error(
    port: Port,
    device: &Device,
    summary: &mut RunSummary,
    loss: &OnDeviceLoss,
    ports: &mut [PortState; 2],
) -> std::io::Result<bool> {
    let Device::Packet(socket) = device else {
        // A TUN device's errors come back from its reads.
        return Ok(false);
    };
    let _ = socket.take_error();
    match socket.link() {
        LinkState::Up => Ok(false),
        LinkState::Down => {
            if !summary.link_down[port.index()] {
                summary.link_down[port.index()] = true;
                summary.link_downs += 1;
            }
            Ok(false)
        }
        LinkState::Gone => match loss {
            OnDeviceLoss::Exit => Err(std::io::Error::other(DeviceLost::Deleted {
                device: socket.device().to_owned(),
                port,
            })),
            OnDeviceLoss::Wait(_) => Ok(lose(port, summary, ports)),
        },
    }
}

/// A receive failed for good: when a TUN device's descriptor says its
/// device is gone (`EBADFD`), the error names it ([`DeviceLost::TunDeleted`]).
fn tun_deleted(port: Port, device: &Device, error: std::io::Error) -> std::io::Error {
    match device {
        Device::Tun(tun) if error.raw_os_error() == Some(libc::EBADFD) => {
            std::io::Error::other(DeviceLost::TunDeleted {
                device: tun.device().to_owned(),
                port,
            })
        }
        _ => error,
    }
}

/// Port `port`'s device is gone: its sockets wait for it (see
/// [`PortState::Lost`]). True if it was not lost already.
fn lose(port: Port, summary: &mut RunSummary, ports: &mut [PortState; 2]) -> bool {
    let i = port.index();
    if ports[i] == PortState::Lost {
        return false;
    }
    if ports[i] == PortState::Present {
        summary.devices_lost += 1;
    }
    ports[i] = PortState::Lost;
    summary.device_lost[i] = true;
    // Deleted is not down: a device made again starts afresh.
    summary.link_down[i] = false;
    true
}

/// After a poll: every receiving socket that reported an error. True when
/// a port's state changed (the poll set is made again).
fn poll_errors(
    sockets: &Sockets,
    fds: &[libc::pollfd],
    summary: &mut RunSummary,
    loss: &OnDeviceLoss,
    ports: &mut [PortState; 2],
) -> std::io::Result<bool> {
    let mut changed = false;
    for (i, fd) in fds.iter().enumerate() {
        if fd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            let (port, device) = sockets.receiver(i);
            changed |= socket_error(port, device, summary, loss, ports)?;
        }
    }
    Ok(changed)
}

/// The poll set: every receiving socket, those of a lost device left out
/// (`fd` -1, which `poll` skips), so that a dead socket never wakes the
/// worker.
fn poll_set(sockets: &Sockets, ports: &[PortState; 2], fds: &mut Vec<libc::pollfd>) {
    fds.clear();
    for i in 0..sockets.receiver_count() {
        let (port, device) = sockets.receiver(i);
        fds.push(libc::pollfd {
            fd: if ports[port.index()] == PortState::Lost {
                -1
            } else {
                device.as_raw_fd()
            },
            events: libc::POLLIN,
            revents: 0,
        });
    }
}

/// At a tick, under [`OnDeviceLoss::Wait`]: a lost port whose device is
/// back (a device of its name, up) has every socket opened again, and a
/// joining one takes its turn in its new fanout group. True when a port's
/// state changed.
fn rejoin(
    sockets: &mut Sockets,
    loss: &OnDeviceLoss,
    ports: &mut [PortState; 2],
    summary: &mut RunSummary,
) -> std::io::Result<bool> {
    let OnDeviceLoss::Wait(rejoin) = loss else {
        return Ok(false);
    };
    let mut changed = false;
    for port in [Port::Inside, Port::Outside] {
        let i = port.index();
        let Device::Packet(main) = sockets.transmit_on(port) else {
            continue;
        };
        match ports[i] {
            PortState::Present => continue,
            PortState::Lost => {
                let Some(ifindex) = main.successor() else {
                    continue;
                };
                match sockets.reopen(port, rejoin) {
                    Ok(()) => {}
                    Err(Reopening::Later) => continue,
                    Err(Reopening::Failed(e)) => return Err(sockets.reopen_failed(port, e)),
                }
                ports[i] = PortState::Joining { ifindex };
                changed = true;
            }
            // Deleted again before its sockets were all back.
            PortState::Joining { .. } if main.link() == LinkState::Gone => {
                changed |= lose(port, summary, ports);
                continue;
            }
            PortState::Joining { .. } => {}
        }
        let PortState::Joining { ifindex } = ports[i] else {
            continue;
        };
        let Device::Packet(main) = sockets.transmit_on_mut(port) else {
            continue;
        };
        let joined = if main.fanout_pending() || main.in_fanout() {
            match rejoin.join(port, ifindex, main) {
                Ok(joined) => joined,
                // Down again before its turn: the kernel takes no socket
                // that is not running into a group. At the next tick.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && main.link() != LinkState::Up => continue,
                Err(e) => return Err(sockets.reopen_failed(port, e)),
            }
        } else {
            Joined::Whole
        };
        if joined == Joined::Whole {
            if let Err(e) = main.release() {
                return Err(sockets.reopen_failed(port, e));
            }
            ports[i] = PortState::Present;
            summary.device_lost[i] = false;
            changed = true;
        }
    }
    Ok(changed)
}

/// Why [`Sockets::reopen`] did not.
enum Reopening {
    /// The device went again (or down) meanwhile: at the next tick.
    Later,
    /// It cannot: no socket from the helper, or the kernel refused one.
    Failed(std::io::Error),
}

/// The sockets of one worker: where frames come from (several per port
/// with workers: the shared-out IPv4 socket and the private ARP one), and
/// the socket each port transmits on.
pub struct Sockets {
    /// Sockets that only receive, each with the port its frames arrive
    /// on (with several workers: the ARP sockets, and worker 0's IPv6
    /// ones); empty for one worker.
    pub receive: Vec<(Port, Device)>,
    /// The inside interface's device: it receives, and everything
    /// forwarded to the inside leaves by it.
    pub inside: Device,
    /// The outside interface's device: it receives, and everything
    /// forwarded to the outside leaves by it.
    pub outside: Device,
}

impl Sockets {
    /// One worker alone: one socket per interface does everything.
    pub fn single(inside: Device, outside: Device) -> Sockets {
        Sockets {
            receive: Vec::new(),
            inside,
            outside,
        }
    }

    fn transmit_on(&self, port: Port) -> &Device {
        match port {
            Port::Inside => &self.inside,
            Port::Outside => &self.outside,
        }
    }

    fn transmit_on_mut(&mut self, port: Port) -> &mut Device {
        match port {
            Port::Inside => &mut self.inside,
            Port::Outside => &mut self.outside,
        }
    }

    /// How many sockets frames come from: the two that transmit, then
    /// [`receive`](Self::receive).
    fn receiver_count(&self) -> usize {
        2 + self.receive.len()
    }

    /// Receiving socket `i` (below [`receiver_count`](Self::receiver_count)).
    fn receiver(&self, i: usize) -> (Port, &Device) {
        match i {
            0 => (Port::Inside, &self.inside),
            1 => (Port::Outside, &self.outside),
            _ => {
                let (port, device) = &self.receive[i - 2];
                (*port, device)
            }
        }
    }

    fn kernel_drops(&self) -> u64 {
        (0..self.receiver_count())
            .map(|i| self.receiver(i).1.kernel_drops())
            .sum()
    }

    /// Installs `program` as the steering program of `port`'s fanout
    /// group, through this worker's socket of it (nothing for a TUN or a
    /// socket of no group). Under [`OnDeviceLoss::Wait`] it is also kept
    /// for the group the workers make if the device is made anew.
    pub fn steer(&self, port: Port, program: &[Insn], loss: &OnDeviceLoss) -> std::io::Result<()> {
        let Device::Packet(socket) = self.transmit_on(port) else {
            return Ok(());
        };
        let install = |program: &[Insn]| {
            if socket.in_fanout() {
                socket.set_steering(program)
            } else {
                Ok(())
            }
        };
        match loss {
            OnDeviceLoss::Exit => install(program),
            OnDeviceLoss::Wait(rejoin) => rejoin.steer(port, program, install),
        }
    }

    /// Opens every socket of `port` again ([`AfPacket::reopen`]), each on a
    /// fresh socket from `rejoin`'s source; all of them or none.
    fn reopen(&mut self, port: Port, rejoin: &crate::reopen::Rejoin) -> Result<(), Reopening> {
        let mut fresh: Vec<(usize, AfPacket)> = Vec::new();
        for i in 0..self.receiver_count() {
            let (of, Device::Packet(old)) = self.receiver(i) else {
                continue;
            };
            if of != port {
                continue;
            }
            let fd = rejoin.packet_socket().map_err(Reopening::Failed)?;
            match old.reopen(fd) {
                Ok(socket) => fresh.push((i, socket)),
                Err(e) if device_moved(&e) => return Err(Reopening::Later),
                Err(e) => return Err(Reopening::Failed(std::io::Error::other(e))),
            }
        }
        for (i, socket) in fresh {
            let slot = match i {
                0 => &mut self.inside,
                1 => &mut self.outside,
                _ => &mut self.receive[i - 2].1,
            };
            *slot = Device::Packet(socket);
        }
        Ok(())
    }

    /// The error that ends a worker whose `port` could not be opened again.
    fn reopen_failed(&self, port: Port, source: std::io::Error) -> std::io::Error {
        let device = match self.transmit_on(port) {
            Device::Packet(socket) => socket.device().to_owned(),
            Device::Tun(_) => String::new(),
        };
        std::io::Error::other(DeviceLost::Reopen { device, port, source })
    }
}

/// Control datagrams held for the next tick; more in one turn are dropped
/// (and counted in [`RunSummary::control_overflow`]).
pub const CONTROL_QUEUE: usize = 64;

/// What the control plane sees between batches: the gateway, the time, the
/// counters so far, the control datagrams received since the last tick
/// (IPv4 packets), and a way to send its own.
pub struct Tick<'a> {
    /// The worker's gateway, to read and to command.
    pub gateway: &'a mut Gateway,
    /// The worker's clock: time since its run started, the `now` its
    /// gateway is handed.
    pub now: Duration,
    /// The worker's counters, as of this tick.
    pub summary: &'a RunSummary,
    /// Control datagrams (the gateway's [`Verdict::Control`] outputs)
    /// received since the last tick, at most [`CONTROL_QUEUE`]; their
    /// buffers go back to the pool after the callback.
    pub received: &'a [PacketBuf],
    out: &'a mut Vec<Output>,
    pool: &'a mut PacketPool,
    sockets: &'a Sockets,
    loss: &'a OnDeviceLoss,
}

impl Tick<'_> {
    /// Installs the steering program of `port`'s fanout group (see
    /// [`Sockets::steer`]), on this worker's socket of it as it is now.
    pub fn steer(&self, port: Port, program: &[Insn]) -> std::io::Result<()> {
        self.sockets.steer(port, program, self.loss)
    }

    /// Sends a UDP datagram from the gateway (see [`Gateway::send_datagram`]).
    pub fn send_datagram(
        &mut self,
        ports: (u16, u16),
        to: std::net::IpAddr,
        payload: &[u8],
    ) -> Result<(), DatagramError> {
        self.gateway
            .send_datagram(self.now, ports, to, payload, self.out, self.pool)
    }
}

/// Receive moderation, as a NIC's adaptive interrupt coalescing
/// (`ethtool -C adaptive-rx on rx-usecs`): while frames keep arriving (the
/// previous turn had some too) but a turn brings fewer than
/// [`MODERATE_BELOW`], the worker waits before the next, so that the
/// per-turn costs (a sleep and its wake-up, system calls, the control
/// plane's tick) are shared by more packets. The wait adapts to the rate:
/// it doubles while waits bring fewer than half of [`MODERATE_BELOW`], and
/// halves once turns come full, between an eighth of `max` and `max`. A
/// lone packet after an idle turn is never delayed, and the wait starts
/// low again after one, so a ping or a handshake pays nothing; a flood
/// pays at most `max` of latency. Zero turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moderation {
    /// The longest wait after a turn; zero turns moderation off.
    pub max: Duration,
}

/// Packets per turn under which a busy worker waits (a quarter batch).
pub const MODERATE_BELOW: usize = BATCH / 4;

/// One worker's adaptive wait (see [`Moderation`]): a pure state machine
/// over the packets each turn handed on, so that its rule is tested
/// without a clock.
#[derive(Debug, Clone)]
pub struct Moderator {
    max: Duration,
    current: Duration,
    was_busy: bool,
}

impl Moderator {
    /// A moderator as after an idle turn: the next busy turn is not
    /// delayed, and the wait starts at an eighth of `max`.
    pub fn new(moderation: Moderation) -> Moderator {
        Moderator {
            max: moderation.max,
            current: Self::floor(moderation.max),
            was_busy: false,
        }
    }

    fn floor(max: Duration) -> Duration {
        max / 8
    }

    /// How long to wait after a turn that handed `handed` packets on
    /// (`None`: go on at once).
    pub fn after_turn(&mut self, handed: usize) -> Option<Duration> {
        let busy = handed > 0;
        let was_busy = std::mem::replace(&mut self.was_busy, busy);
        if !busy || self.max.is_zero() {
            // Traffic paused: the next burst starts at the lowest wait.
            self.current = Self::floor(self.max);
            return None;
        }
        if handed >= BATCH / 2 {
            self.current = (self.current / 2).max(Self::floor(self.max));
        }
        if !was_busy || handed >= MODERATE_BELOW {
            return None;
        }
        let wait = self.current;
        if handed < MODERATE_BELOW / 2 {
            self.current = (self.current * 2).min(self.max);
        }
        Some(wait)
    }
}

/// The period of the driver's own tick: the kernel's drop count, and the
/// state of a device that was found down. (The gateway's timers are its
/// own: [`Gateway::poll_timeout`].)
const TICK: Duration = Duration::from_millis(100);
/// The longest idle sleep: control-plane commands other workers wait on
/// are looked at this often.
const IDLE_WAIT_MS: i32 = 10;

/// How long an idle turn may sleep: until the gateway's next deadline
/// (rounded up to the millisecond `poll` counts in), at most
/// [`IDLE_WAIT_MS`].
fn idle_wait_ms(now: Duration, deadline: Option<Duration>) -> i32 {
    let Some(deadline) = deadline else {
        return IDLE_WAIT_MS;
    };
    let left = deadline.saturating_sub(now);
    let ms = left.as_micros().div_ceil(1000);
    i32::try_from(ms).map_or(IDLE_WAIT_MS, |ms| ms.min(IDLE_WAIT_MS))
}

/// Forwards until `stop` is set. `on_tick` is called between batches (and
/// at least every 10 ms): the place for the control plane and operations
/// requests, which must not block. A device deleted meanwhile ends the run
/// or is waited for, as `loss` says.
pub fn run(
    gateway: &mut Gateway,
    sockets: &mut Sockets,
    stop: &AtomicBool,
    moderation: Moderation,
    loss: &OnDeviceLoss,
    on_tick: &mut dyn FnMut(&mut Tick<'_>),
) -> std::io::Result<RunSummary> {
    let mut pool = PacketPool::new(POOL);
    let mut scratch = RxScratch::new();
    let mut raw = Vec::with_capacity(BATCH);
    // Room for a batch of segments from one more super-packet.
    let mut bufs = Vec::with_capacity(BATCH * 2);
    let mut out: Vec<Output> = Vec::with_capacity(BATCH * 4);
    let mut tx = Transmit {
        control: Vec::with_capacity(CONTROL_QUEUE),
        plan: Plan::default(),
        lost: [false; 2],
    };
    let mut summary = RunSummary::default();
    let start = Instant::now();
    let mut last_timeout = Duration::ZERO;
    let mut ports = [PortState::Present; 2];
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(sockets.receiver_count());
    poll_set(sockets, &ports, &mut fds);
    let mut moderator = Moderator::new(moderation);
    while !stop.load(Ordering::Relaxed) {
        let wall = Instant::now();
        let now = wall.saturating_duration_since(start);
        // An engine that confirms its timeouts in real time hears the
        // clock once a turn, also when traffic never lets this loop wait.
        gateway.engine_mut().observe_clock(wall);
        let mut idle = true;
        // Packets handed to the gateway this turn (segments, not frames:
        // one super-packet is a full turn's work).
        let mut handed = 0;
        // A port's state changed: the poll set is made again.
        let mut moved = false;
        for i in 0..sockets.receiver_count() {
            let (port, device) = sockets.receiver(i);
            if ports[port.index()] == PortState::Lost {
                continue;
            }
            let n = match device.recv_batch(&mut pool, &mut raw, BATCH, &mut scratch) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENETDOWN) => {
                    moved |= socket_error(port, device, &mut summary, loss, &mut ports)?;
                    continue;
                }
                Err(e) => return Err(tun_deleted(port, device, e)),
            };
            scratch.count_rejected(&mut summary.offload);
            if n == 0 {
                continue;
            }
            idle = false;
            summary.frames_in += n as u64;
            for (slot, buf) in raw.drain(..).enumerate() {
                scratch.prepare(slot, buf, &mut pool, &mut bufs, &mut summary.offload);
                // Super-packets can make many segments: hand them on a
                // batch at a time and send what comes out, so the pool
                // is not drained by one receive.
                if bufs.len() >= BATCH {
                    handed += bufs.len();
                    gateway.handle_batch(now, port, &mut bufs, &mut out, &mut pool);
                    tx.send(&mut out, &mut pool, sockets, &mut summary);
                }
            }
            if !bufs.is_empty() {
                handed += bufs.len();
                gateway.handle_batch(now, port, &mut bufs, &mut out, &mut pool);
            }
        }
        gateway.poll(now, &mut out, &mut pool);
        if gateway.poll_timeout().is_some_and(|t| t <= now) {
            gateway.handle_timeout(now, &mut out, &mut pool);
        }
        if now.saturating_sub(last_timeout) >= TICK {
            summary.kernel_drops += sockets.kernel_drops();
            last_timeout = now;
            // A device that was down: up again (its sockets came back with
            // it), or gone meanwhile.
            for port in [Port::Inside, Port::Outside] {
                let device = sockets.transmit_on(port);
                if let (true, Device::Packet(socket)) = (summary.link_down[port.index()], device) {
                    match socket.link() {
                        LinkState::Up => summary.link_down[port.index()] = false,
                        LinkState::Down => {}
                        LinkState::Gone => {
                            moved |= socket_error(port, device, &mut summary, loss, &mut ports)?;
                        }
                    }
                }
            }
            // A device that was deleted: back, its sockets opened again.
            moved |= rejoin(sockets, loss, &mut ports, &mut summary)?;
        }
        if moved {
            poll_set(sockets, &ports, &mut fds);
            tx.lost = ports.map(|p| p == PortState::Lost);
        }
        tx.send(&mut out, &mut pool, sockets, &mut summary);
        summary.pool_in_use = pool.in_use();
        summary.pool_capacity = pool.capacity();
        on_tick(&mut Tick {
            gateway,
            now,
            summary: &summary,
            received: &tx.control,
            out: &mut out,
            pool: &mut pool,
            sockets,
            loss,
        });
        for buf in tx.control.drain(..) {
            pool.free(buf);
        }
        tx.send(&mut out, &mut pool, sockets, &mut summary);
        // A turn of frames that made no packet (all refused) counts as busy.
        if let Some(wait) = moderator.after_turn(if idle { 0 } else { handed.max(1) }) {
            summary.moderated += 1;
            std::thread::sleep(wait);
        }
        let polled = if idle && gateway.in_flight() == 0 {
            // Nothing to do: sleep until a frame arrives, the gateway's next
            // deadline, or 10 ms pass: commands from the control plane that
            // other workers wait on.
            let wait = idle_wait_ms(now, gateway.poll_timeout());
            // SAFETY: fds is a live array of pollfd of the length given.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) > 0 }
        } else {
            idle && wait_for_engine(gateway, now, &mut fds)
        };
        if polled && poll_errors(sockets, &fds, &mut summary, loss, &mut ports)? {
            poll_set(sockets, &ports, &mut fds);
            tx.lost = ports.map(|p| p == PortState::Lost);
        }
    }
    summary.kernel_drops += sockets.kernel_drops();
    crate::drive::shutdown(gateway, start.elapsed(), &mut out, &mut pool);
    tx.send(&mut out, &mut pool, sockets, &mut summary);
    for buf in tx.control.drain(..) {
        pool.free(buf);
    }
    if pool.in_use() != 0 {
        return Err(std::io::Error::other(format!(
            "{} buffers were not returned",
            pool.in_use()
        )));
    }
    Ok(summary)
}

/// Idle with jobs in flight: the driver's wait. A real device is waited on
/// (its completion interrupt, `Engine::wait`); a modelled one completes at
/// a time on the same clock as `now`, so the wait is until then (and the
/// model paces live traffic), or until a frame arrives, whichever is first.
/// Whether the sockets were polled and some have events.
fn wait_for_engine(gateway: &mut Gateway, now: Duration, fds: &mut [libc::pollfd]) -> bool {
    match gateway.next_completion() {
        NextCompletion::Ready => false,
        NextCompletion::External => {
            gateway.engine_mut().wait(Duration::from_micros(200));
            false
        }
        NextCompletion::At(_) | NextCompletion::Idle => {
            let wake = gateway
                .poll_timeout()
                .map_or(Duration::from_millis(10), |t| t.saturating_sub(now))
                .min(Duration::from_millis(10));
            let timeout = libc::timespec {
                tv_sec: 0,
                tv_nsec: wake.subsec_nanos() as libc::c_long,
            };
            // SAFETY: fds is a live array of pollfd of the length given;
            // the timespec lives across the call; no signal mask change.
            let ready = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &timeout,
                    std::ptr::null(),
                )
            };
            ready > 0
        }
    }
}

/// The transmit side's state of a worker: control datagrams held for the
/// next tick, and the coalescing plan reused for every batch.
struct Transmit {
    control: Vec<PacketBuf>,
    plan: Plan,
    /// Ports whose device is deleted: what would go out there is counted
    /// as not sent, without a system call per frame on a dead socket.
    lost: [bool; 2],
}

impl Transmit {
    /// Sends what the gateway forwards, keeps control datagrams for the
    /// next tick, and frees everything else.
    fn send(
        &mut self,
        out: &mut Vec<Output>,
        pool: &mut PacketPool,
        sockets: &Sockets,
        summary: &mut RunSummary,
    ) {
        let (control, plan) = (&mut self.control, &mut self.plan);
        for port in [Port::Inside, Port::Outside] {
            if self.lost[port.index()] {
                summary.send_errors +=
                    out.iter().filter(|(_, v)| *v == Verdict::Forward(port)).count() as u64;
                continue;
            }
            let device = sockets.transmit_on(port);
            let mut frames: [&mut [u8]; MAX_BATCH] = std::array::from_fn(|_| &mut [][..]);
            let mut n = 0;
            let mut flush = |frames: &mut [&mut [u8]]| {
                let Sent { sent, failed } = device.send_batch(frames, plan, &mut summary.offload);
                summary.frames_out += sent as u64;
                summary.send_errors += failed as u64;
            };
            for (buf, verdict) in out.iter_mut() {
                if *verdict == Verdict::Forward(port) {
                    frames[n] = buf.data_mut();
                    n += 1;
                    if n == MAX_BATCH {
                        flush(&mut frames);
                        n = 0;
                    }
                }
            }
            if n > 0 {
                flush(&mut frames[..n]);
            }
        }
        for (buf, verdict) in out.drain(..) {
            match verdict {
                Verdict::Control if control.len() < CONTROL_QUEUE => {
                    control.push(buf);
                    continue;
                }
                Verdict::Control => summary.control_overflow += 1,
                Verdict::Forward(_) | Verdict::Consumed | Verdict::Drop(_) => {}
            }
            pool.free(buf);
        }
    }
}

impl RunSummary {
    /// Adds another worker's summary: counts and pool sizes add up, a
    /// port is down or lost if it is for any worker, and
    /// [`devices_lost`](Self::devices_lost) takes the larger count.
    pub fn add(&mut self, other: &RunSummary) {
        self.frames_in += other.frames_in;
        self.frames_out += other.frames_out;
        self.send_errors += other.send_errors;
        self.kernel_drops += other.kernel_drops;
        self.control_overflow += other.control_overflow;
        self.offload.add(&other.offload);
        self.pool_in_use += other.pool_in_use;
        self.pool_capacity += other.pool_capacity;
        self.moderated += other.moderated;
        // Every worker watches the same devices and counts the same
        // changes: the run's count is one worker's, not their sum.
        self.link_downs = self.link_downs.max(other.link_downs);
        for (mine, theirs) in self.link_down.iter_mut().zip(other.link_down) {
            *mine |= theirs;
        }
        self.devices_lost = self.devices_lost.max(other.devices_lost);
        for (mine, theirs) in self.device_lost.iter_mut().zip(other.device_lost) {
            *mine |= theirs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(100);

    fn moderator() -> Moderator {
        Moderator::new(Moderation { max: MAX })
    }

    #[test]
    fn a_packet_after_an_idle_turn_is_never_delayed() {
        let mut m = moderator();
        for _ in 0..3 {
            assert_eq!(m.after_turn(0), None);
            assert_eq!(m.after_turn(1), None, "the first busy turn goes on at once");
        }
    }

    #[test]
    fn a_slow_flood_doubles_the_wait_up_to_the_bound_and_an_idle_turn_resets_it() {
        let mut m = moderator();
        assert_eq!(m.after_turn(1), None);
        let waits: Vec<Duration> = (0..6).filter_map(|_| m.after_turn(2)).collect();
        assert_eq!(
            waits,
            [MAX / 8, MAX / 4, MAX / 2, MAX, MAX, MAX],
            "an eighth of the bound, doubling to the bound"
        );
        assert_eq!(m.after_turn(0), None);
        assert_eq!(m.after_turn(2), None);
        assert_eq!(m.after_turn(2), Some(MAX / 8), "back at the floor after a pause");
    }

    #[test]
    fn turns_that_come_half_full_or_more_go_on_at_once_and_shrink_the_wait() {
        let mut m = moderator();
        m.after_turn(1);
        for _ in 0..4 {
            m.after_turn(1);
        }
        assert_eq!(
            m.after_turn(MODERATE_BELOW - 1),
            Some(MAX),
            "the wait grew to the bound"
        );
        assert_eq!(m.after_turn(MODERATE_BELOW), None, "a quarter batch: no wait");
        assert_eq!(m.after_turn(BATCH / 2), None);
        assert_eq!(m.after_turn(BATCH), None);
        assert_eq!(m.after_turn(MODERATE_BELOW - 1), Some(MAX / 4), "halved twice");
        assert_eq!(
            m.after_turn(MODERATE_BELOW / 2),
            Some(MAX / 4),
            "a wait that brought half the threshold keeps its length"
        );
    }

    #[test]
    fn an_idle_turn_sleeps_until_the_next_deadline_at_most_ten_ms() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert_eq!(idle_wait_ms(ms(5), None), 10);
        assert_eq!(idle_wait_ms(ms(5), Some(ms(5))), 0, "due: no sleep");
        assert_eq!(idle_wait_ms(ms(5), Some(ms(1))), 0, "past: no sleep");
        assert_eq!(
            idle_wait_ms(ms(5), Some(ms(5) + us(1))),
            1,
            "rounded up, never early"
        );
        assert_eq!(idle_wait_ms(ms(5), Some(ms(8))), 3);
        assert_eq!(idle_wait_ms(ms(5), Some(ms(500))), 10);
        assert_eq!(idle_wait_ms(ms(5), Some(Duration::MAX)), 10);
    }

    #[test]
    fn zero_turns_moderation_off() {
        let mut m = Moderator::new(Moderation { max: Duration::ZERO });
        for handed in [1, 1, 1, 2, 5, 0, 1, 1] {
            assert_eq!(m.after_turn(handed), None);
        }
    }
}
