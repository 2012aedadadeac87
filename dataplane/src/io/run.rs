//! The live driver: forwards between the two interfaces of a gateway until
//! told to stop, then drains the engine and hands every buffer back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::buffer::PacketPool;
use crate::gateway::{Gateway, Output, Verdict};
use crate::io::afpacket::AfPacket;
use crate::io::tun::Tun;

/// A device frames come from and go to.
pub enum Device {
    Packet(AfPacket),
    Tun(Tun),
}

impl Device {
    fn recv_batch(
        &self,
        pool: &mut PacketPool,
        bufs: &mut Vec<crate::buffer::PacketBuf>,
        max: usize,
    ) -> std::io::Result<usize> {
        match self {
            Device::Packet(s) => s.recv_batch(pool, bufs, max),
            Device::Tun(t) => t.recv_batch(pool, bufs, max),
        }
    }

    fn send(&self, frame: &[u8]) -> std::io::Result<()> {
        match self {
            Device::Packet(s) => s.send(frame),
            Device::Tun(t) => t.send(frame),
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
use crate::route::Port;

/// Frames taken from one interface per turn.
pub const BATCH: usize = 64;
/// Buffers the driver owns: several batches plus what the engine, the ARP
/// queue and reassembly may hold.
pub const POOL: usize = 4096;

/// Counts of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunSummary {
    pub frames_in: u64,
    pub frames_out: u64,
    pub send_errors: u64,
    /// Frames the kernel dropped before espgw could read them (socket full).
    pub kernel_drops: u64,
}

/// The sockets of one worker: where frames come from (several per port
/// with workers: the shared-out IPv4 socket and the private ARP one), and
/// the socket each port transmits on.
pub struct Sockets {
    pub receive: Vec<(Port, Device)>,
    pub inside: Device,
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

    fn receivers(&self) -> Vec<(Port, &Device)> {
        let mut list = vec![(Port::Inside, &self.inside), (Port::Outside, &self.outside)];
        list.extend(self.receive.iter().map(|(p, d)| (*p, d)));
        list
    }

    fn kernel_drops(&self) -> u64 {
        self.receivers().iter().map(|(_, s)| s.kernel_drops()).sum()
    }
}

/// Forwards until `stop` is set. `on_tick` is called between batches (and
/// at least every 50 ms) with the gateway and the counters so far: the
/// place for operations requests, which must not block.
pub fn run(
    gateway: &mut Gateway,
    sockets: &Sockets,
    stop: &AtomicBool,
    on_tick: &mut dyn FnMut(&mut Gateway, &RunSummary),
) -> std::io::Result<RunSummary> {
    let mut pool = PacketPool::new(POOL);
    let mut bufs = Vec::with_capacity(BATCH);
    let mut out: Vec<Output> = Vec::with_capacity(BATCH * 4);
    let mut summary = RunSummary::default();
    let start = Instant::now();
    let mut last_timeout = Duration::ZERO;
    let receivers = sockets.receivers();
    let mut fds: Vec<libc::pollfd> = receivers
        .iter()
        .map(|(_, s)| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let now = start.elapsed();
        let mut idle = true;
        for (port, device) in &receivers {
            let n = device.recv_batch(&mut pool, &mut bufs, BATCH)?;
            if n > 0 {
                idle = false;
                summary.frames_in += n as u64;
                gateway.handle_batch(now, *port, &mut bufs, &mut out, &mut pool);
            }
        }
        gateway.poll(now, &mut out, &mut pool);
        if now.saturating_sub(last_timeout) >= Duration::from_millis(100) {
            gateway.handle_timeout(now, &mut out, &mut pool);
            summary.kernel_drops += sockets.kernel_drops();
            last_timeout = now;
        }
        transmit(&mut out, &mut pool, sockets, &mut summary);
        on_tick(gateway, &summary);
        if idle && gateway.in_flight() == 0 {
            // Nothing to do: sleep until a frame arrives (or 50 ms pass, for timers).
            // SAFETY: fds is a live array of pollfd of the length given.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        } else if idle {
            gateway.wait(Duration::from_micros(200));
        }
    }
    summary.kernel_drops += sockets.kernel_drops();
    gateway.shutdown(start.elapsed(), &mut out, &mut pool);
    transmit(&mut out, &mut pool, sockets, &mut summary);
    if pool.in_use() != 0 {
        return Err(std::io::Error::other(format!(
            "{} buffers were not returned",
            pool.in_use()
        )));
    }
    Ok(summary)
}

fn transmit(out: &mut Vec<Output>, pool: &mut PacketPool, sockets: &Sockets, summary: &mut RunSummary) {
    for (buf, verdict) in out.drain(..) {
        if let Verdict::Forward(port) = verdict {
            match sockets.transmit_on(port).send(buf.data()) {
                Ok(()) => summary.frames_out += 1,
                Err(_) => summary.send_errors += 1,
            }
        }
        pool.free(buf);
    }
}

impl RunSummary {
    pub fn add(&mut self, other: &RunSummary) {
        self.frames_in += other.frames_in;
        self.frames_out += other.frames_out;
        self.send_errors += other.send_errors;
        self.kernel_drops += other.kernel_drops;
    }
}
