//! The live driver: forwards between the two interfaces of a gateway until
//! told to stop, then drains the engine and hands every buffer back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::buffer::PacketPool;
use crate::gateway::{Gateway, Output, Verdict};
use crate::io::afpacket::AfPacket;
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

/// Forwards until `stop` is set. `clock` is the gateway's time since start.
/// `on_tick` is called between batches (and at least every 50 ms) with the
/// gateway and the counters so far: the place for operations requests,
/// which must not block.
pub fn run(
    gateway: &mut Gateway,
    inside: &AfPacket,
    outside: &AfPacket,
    stop: &AtomicBool,
    on_tick: &mut dyn FnMut(&mut Gateway, &RunSummary),
) -> std::io::Result<RunSummary> {
    let mut pool = PacketPool::new(POOL);
    let mut bufs = Vec::with_capacity(BATCH);
    let mut out: Vec<Output> = Vec::with_capacity(BATCH * 4);
    let mut summary = RunSummary::default();
    let start = Instant::now();
    let mut last_timeout = Duration::ZERO;
    let ports = [(Port::Inside, inside), (Port::Outside, outside)];
    let mut fds = [
        libc::pollfd {
            fd: inside.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: outside.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !stop.load(Ordering::Relaxed) {
        let now = start.elapsed();
        let mut idle = true;
        for (port, device) in ports {
            let n = device.recv_batch(&mut pool, &mut bufs, BATCH)?;
            if n > 0 {
                idle = false;
                summary.frames_in += n as u64;
                gateway.handle_batch(now, port, &mut bufs, &mut out, &mut pool);
            }
        }
        gateway.poll(now, &mut out, &mut pool);
        if now.saturating_sub(last_timeout) >= Duration::from_millis(100) {
            gateway.handle_timeout(now, &mut out, &mut pool);
            summary.kernel_drops += inside.kernel_drops() + outside.kernel_drops();
            last_timeout = now;
        }
        transmit(&mut out, &mut pool, inside, outside, &mut summary);
        on_tick(gateway, &summary);
        if idle && gateway.in_flight() == 0 {
            // Nothing to do: sleep until a frame arrives (or 50 ms pass, for timers).
            // SAFETY: fds is a live array of two pollfd.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 50) };
        } else if idle {
            gateway.wait(Duration::from_micros(200));
        }
    }
    summary.kernel_drops += inside.kernel_drops() + outside.kernel_drops();
    gateway.shutdown(start.elapsed(), &mut out, &mut pool);
    transmit(&mut out, &mut pool, inside, outside, &mut summary);
    if pool.in_use() != 0 {
        return Err(std::io::Error::other(format!(
            "{} buffers were not returned",
            pool.in_use()
        )));
    }
    Ok(summary)
}

fn transmit(
    out: &mut Vec<Output>,
    pool: &mut PacketPool,
    inside: &AfPacket,
    outside: &AfPacket,
    summary: &mut RunSummary,
) {
    for (buf, verdict) in out.drain(..) {
        if let Verdict::Forward(port) = verdict {
            let device = match port {
                Port::Inside => inside,
                Port::Outside => outside,
            };
            match device.send(buf.data()) {
                Ok(()) => summary.frames_out += 1,
                Err(_) => summary.send_errors += 1,
            }
        }
        pool.free(buf);
    }
}
