//! Timing loops. Each cell runs batches through the real gateway for a
//! fixed wall-clock slice, several times after a warm-up, and keeps the
//! per-repetition rates; every packet that comes out is checked against
//! what went in, so a fast wrong answer fails the run instead of winning it.

use std::time::{Duration, Instant};

use accel::{Algorithm, Descriptor, DescriptorKind, Direction, Region, Session, Status};
use anyhow::{bail, ensure, Context};
use dataplane::gateway::Output;
use dataplane::{Gateway, PacketBuf, PacketPool, Port, Verdict};
use std::net::Ipv6Addr;

use smoltcp::wire::{IpProtocol, Ipv4Packet, Ipv6Packet};

/// Frames per call into the gateway.
pub const BATCH: usize = 32;

/// Bytes of Ethernet header plus FCS: a 64-byte frame carries 46 bytes of IP.
pub const FRAME_OVERHEAD: usize = 18;

/// The smallest frame size the sweep accepts (an IPv4/UDP header fits).
pub const MIN_FRAME: usize = 64;

/// Ethernet frame (without FCS) holding an IPv4/UDP packet, so that the
/// frame on the wire with FCS is `frame_size` bytes.
pub fn plaintext_frame(frame_size: usize, seed: u8) -> Vec<u8> {
    udp_frame(frame_size, seed, [0x08, 0x00], 20, |packet, ip_len| {
        let mut ip = Ipv4Packet::new_unchecked(packet);
        ip.set_version(4);
        ip.set_header_len(20);
        ip.set_total_len(ip_len as u16);
        ip.set_hop_limit(64);
        ip.set_next_header(IpProtocol::Udp);
        ip.set_src_addr([192, 168, 1, 10].into());
        ip.set_dst_addr([192, 168, 2, 20].into());
        ip.fill_checksum();
    })
}

/// The smallest frame an IPv6/UDP packet fits (48 bytes of IP).
pub const MIN_FRAME6: usize = 40 + 8 + FRAME_OVERHEAD;

/// [`plaintext_frame`] for IPv6: 2001:db8:1::10 to 2001:db8:2::20, UDP;
/// `frame_size` at least [`MIN_FRAME6`].
pub fn plaintext_frame6(frame_size: usize, seed: u8) -> Vec<u8> {
    udp_frame(frame_size, seed, [0x86, 0xdd], 40, |packet, ip_len| {
        let mut ip = Ipv6Packet::new_unchecked(packet);
        ip.set_version(6);
        ip.set_payload_len((ip_len - 40) as u16);
        ip.set_next_header(IpProtocol::Udp);
        ip.set_hop_limit(64);
        ip.set_src_addr(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10));
        ip.set_dst_addr(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x20));
    })
}

/// An Ethernet frame of `frame_size` bytes on the wire (with FCS) of
/// `ethertype`, around an IP packet whose `ip_header_len`-byte header
/// `write_ip` writes (given the packet and its length), carrying UDP from
/// port 4000 to 5000 with a payload patterned by `seed`.
fn udp_frame(
    frame_size: usize,
    seed: u8,
    ethertype: [u8; 2],
    ip_header_len: usize,
    write_ip: impl FnOnce(&mut [u8], usize),
) -> Vec<u8> {
    let ip_len = frame_size - FRAME_OVERHEAD;
    let mut frame = vec![0u8; 14 + ip_len];
    frame[..6].copy_from_slice(&[0x02, 0, 0, 0, 0x01, 0x01]);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0x01, 0x10]);
    frame[12..14].copy_from_slice(&ethertype);
    write_ip(&mut frame[14..], ip_len);
    let udp = &mut frame[14 + ip_header_len..];
    udp[0..2].copy_from_slice(&4000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&5000u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((ip_len - ip_header_len) as u16).to_be_bytes());
    for (i, b) in udp[8..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    frame
}

/// The IP packet of `frame` after `hops` forwarding hops (IPv4 or IPv6).
pub fn expected_ip(frame: &[u8], hops: u8) -> Vec<u8> {
    let mut ip = frame[14..].to_vec();
    if ip[0] >> 4 == 6 {
        ip[7] -= hops;
        return ip;
    }
    let mut view = Ipv4Packet::new_unchecked(&mut ip[..]);
    view.set_hop_limit(view.hop_limit() - hops);
    view.fill_checksum();
    ip
}

/// Rates of one cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Samples {
    /// Nanoseconds per packet, one per repetition.
    pub ns_per_packet: Vec<f64>,
    /// Packets in the timed repetitions.
    pub packets: u64,
    /// Packets processed in all, warm-up included (engine counters count
    /// these, so per-packet figures from counter deltas divide by this).
    pub processed: u64,
    /// CPU cycles per packet of the measuring thread from the hardware
    /// counter, one per repetition; empty where the kernel offers none.
    pub cycles_per_packet: Vec<f64>,
    /// Wall-clock nanoseconds of the whole cell, warm-up included.
    pub wall_ns: u64,
}

impl Samples {
    /// Median of [`Samples::ns_per_packet`], in ns; NaN with no repetition.
    pub fn median(&self) -> f64 {
        let mut v = self.ns_per_packet.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    /// (max − min) / median, as a fraction.
    pub fn spread(&self) -> f64 {
        let min = self.ns_per_packet.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.ns_per_packet.iter().copied().fold(0.0, f64::max);
        (max - min) / self.median()
    }
}

/// How long and how often to measure.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Wall-clock length of one timed repetition; the warm-up before them
    /// runs for half of it.
    pub slice: Duration,
    /// Timed repetitions after the warm-up, each giving one sample.
    pub repetitions: usize,
}

/// Times the code under test inside a step. The harness's own work around
/// it (refilling buffers from templates, which stands in for a NIC's DMA and
/// costs the host no cycles on real hardware, and checking what came out)
/// stays outside the timed part, so a gateway cell and the raw primitive's
/// row count the same thing: the work done on a packet already in memory.
pub struct Stopwatch<'a> {
    timed: Duration,
    counter: Option<&'a CycleCounter>,
}

impl Stopwatch<'_> {
    /// Runs `work`, adding its wall time (and its cycles, where counted)
    /// to the repetition's timed part, and returns its result.
    #[inline]
    pub fn time<T>(&mut self, work: impl FnOnce() -> T) -> T {
        if let Some(c) = self.counter {
            c.resume();
        }
        let start = Instant::now();
        let result = work();
        self.timed += start.elapsed();
        if let Some(c) = self.counter {
            c.pause();
        }
        result
    }
}

/// Runs `step` (which processes one batch, timing its work on the
/// stopwatch, and returns how many packets it handled) for a warm-up slice
/// and then `repetitions` slices of wall-clock time.
fn time_slices(
    timing: Timing,
    mut step: impl FnMut(&mut Stopwatch) -> anyhow::Result<usize>,
) -> anyhow::Result<Samples> {
    let warm_up = Instant::now();
    let mut processed = 0u64;
    while warm_up.elapsed() < timing.slice / 2 {
        let mut idle = Stopwatch {
            timed: Duration::ZERO,
            counter: None,
        };
        processed += step(&mut idle)? as u64;
    }
    let mut samples = Samples {
        ns_per_packet: Vec::with_capacity(timing.repetitions),
        packets: 0,
        processed: 0,
        cycles_per_packet: Vec::new(),
        wall_ns: 0,
    };
    let counter = CycleCounter::open().ok();
    for _ in 0..timing.repetitions {
        if let Some(c) = &counter {
            c.reset();
        }
        let mut watch = Stopwatch {
            timed: Duration::ZERO,
            counter: counter.as_ref(),
        };
        let start = Instant::now();
        let mut packets = 0usize;
        while start.elapsed() < timing.slice {
            packets += step(&mut watch)?;
        }
        if let Some(cycles) = counter.as_ref().and_then(CycleCounter::read) {
            samples
                .cycles_per_packet
                .push(cycles as f64 / packets.max(1) as f64);
        }
        samples.packets += packets as u64;
        samples
            .ns_per_packet
            .push(watch.timed.as_nanos() as f64 / packets.max(1) as f64);
    }
    samples.processed = processed + samples.packets;
    samples.wall_ns = warm_up.elapsed().as_nanos() as u64;
    Ok(samples)
}

/// A batch of pool buffers, refilled from template frames each step as a
/// NIC would DMA fresh frames into them, run through a gateway and waited
/// for (an asynchronous engine keeps the whole batch in flight). The pool
/// has room beyond the batch for the fragments of packets that no longer
/// fit the tunnel's MTU after encapsulation (1518-byte frames).
struct Batch {
    pool: PacketPool,
    bufs: Vec<PacketBuf>,
    out: Vec<Output>,
}

impl Batch {
    fn new() -> Self {
        let mut pool = PacketPool::new(BATCH * 4);
        let bufs = (0..BATCH).filter_map(|_| pool.alloc()).collect();
        Batch {
            pool,
            bufs,
            out: Vec::with_capacity(BATCH * 2),
        }
    }

    /// Fills `n` buffers with `frames` in turn (the fragments of one
    /// datagram, or one whole frame).
    fn fill(&mut self, frames: &[Vec<u8>], n: usize) {
        while self.bufs.len() > n {
            if let Some(buf) = self.bufs.pop() {
                self.pool.free(buf);
            }
        }
        while self.bufs.len() < n {
            match self.pool.alloc() {
                Some(buf) => self.bufs.push(buf),
                None => break,
            }
        }
        for (i, buf) in self.bufs.iter_mut().enumerate() {
            buf.fill(&frames[i % frames.len()]);
        }
    }

    /// Runs the batch through `gateway`; every frame must be forwarded to
    /// `to`, and `expect` frames must come out. The buffers come back in
    /// `bufs`, in completion order.
    fn run(
        &mut self,
        watch: &mut Stopwatch,
        gateway: &mut Gateway,
        from: Port,
        to: Port,
        expect: usize,
    ) -> anyhow::Result<()> {
        // Fragments that reassembly keeps (all but a datagram's last) come
        // back as consumed; nothing else may.
        let may_consume = self.bufs.len() > expect;
        watch.time(|| {
            gateway.handle_batch(
                Duration::ZERO,
                from,
                &mut self.bufs,
                &mut self.out,
                &mut self.pool,
            );
            if gateway.in_flight() > 0 {
                drivers::drive::flush(gateway, Duration::ZERO, &mut self.out, &mut self.pool);
            }
        });
        let mut wrong = None;
        for (buf, verdict) in self.out.drain(..) {
            match verdict {
                Verdict::Forward(port) if port == to => self.bufs.push(buf),
                Verdict::Consumed if may_consume => self.pool.free(buf),
                other => {
                    wrong = Some(other);
                    self.pool.free(buf);
                }
            }
        }
        match wrong {
            None if self.bufs.len() == expect => Ok(()),
            None => bail!(
                "{} frames came out of the gateway, expected {expect}",
                self.bufs.len()
            ),
            Some(verdict) => bail!("expected every packet forwarded to {to}, got {verdict:?}"),
        }
    }

    /// Every frame that came out holds `expected` after its Ethernet
    /// header; `what` says what became of the packets, for the error.
    fn check(&self, expected: &[u8], what: &str) -> anyhow::Result<()> {
        for buf in &self.bufs {
            ensure!(
                buf.data().get(14..) == Some(expected),
                "{what} packet differs from what was sent"
            );
        }
        Ok(())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        for buf in self.bufs.drain(..) {
            self.pool.free(buf);
        }
    }
}

/// One gateway's outbound path (A, inside → outside); each packet leaves
/// as `fragments` frames.
pub fn encapsulate(
    gateway: &mut Gateway,
    frame: &[u8],
    fragments: usize,
    timing: Timing,
) -> anyhow::Result<Samples> {
    let mut batch = Batch::new();
    let frames = [frame.to_vec()];
    time_slices(timing, |watch| {
        batch.fill(&frames, BATCH);
        batch.run(watch, gateway, Port::Inside, Port::Outside, BATCH * fragments)?;
        Ok(BATCH)
    })
}

/// One gateway's inbound path (B, outside → inside) over copies of one
/// ESP packet (its fragments in order, if it was fragmented); B's replay
/// window must be off so the copies are accepted. Every output is
/// compared with the original packet.
pub fn decapsulate(
    gateway: &mut Gateway,
    esp_frames: &[Vec<u8>],
    expected: &[u8],
    timing: Timing,
) -> anyhow::Result<Samples> {
    let mut batch = Batch::new();
    let fragments = esp_frames.len().max(1);
    let packets = (BATCH / fragments).max(1);
    time_slices(timing, |watch| {
        batch.fill(esp_frames, packets * fragments);
        batch.run(watch, gateway, Port::Outside, Port::Inside, packets)?;
        batch.check(expected, "decapsulated")?;
        Ok(packets)
    })
}

/// A then B, in memory, with B's replay window on; every packet checked.
pub fn round_trip(
    a: &mut Gateway,
    b: &mut Gateway,
    frame: &[u8],
    fragments: usize,
    expected: &[u8],
    timing: Timing,
) -> anyhow::Result<Samples> {
    let mut batch = Batch::new();
    let frames = [frame.to_vec()];
    time_slices(timing, |watch| {
        batch.fill(&frames, BATCH);
        batch.run(watch, a, Port::Inside, Port::Outside, BATCH * fragments)?;
        batch.run(watch, b, Port::Outside, Port::Inside, BATCH)?;
        batch.check(expected, "round-tripped")?;
        Ok(BATCH)
    })
}

/// The frames A makes of `frame`: one ESP frame, or its fragments when the
/// ESP packet does not fit the outside MTU (for the decapsulation cell).
pub fn esp_frames(a: &mut Gateway, frame: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut pool = PacketPool::new(8);
    let Some(mut buf) = pool.alloc() else {
        bail!("no buffer");
    };
    buf.fill(frame);
    let outputs = drivers::drive::handle_frame(a, Duration::ZERO, Port::Inside, buf, &mut pool);
    if outputs.is_empty() {
        bail!("the engine did not return the frame");
    }
    let mut frames = Vec::new();
    let mut wrong = None;
    for (buf, verdict) in outputs {
        if verdict != Verdict::Forward(Port::Outside) {
            wrong = Some(verdict);
        }
        frames.push(buf.data().to_vec());
        pool.free(buf);
    }
    match wrong {
        None => Ok(frames),
        Some(other) => bail!("site A did not encapsulate: {other:?}"),
    }
}

/// The raw primitive over `payload_len` bytes laid out as ESP would lay
/// them out, without any ESP work: single-pass encrypt, then verify+decrypt.
pub fn raw_crypto(
    algorithm: Algorithm,
    payload_len: usize,
    timing: Timing,
) -> anyhow::Result<(Samples, Samples)> {
    let enc_key: Vec<u8> = (0..algorithm.enc_key_len()).map(|i| i as u8 * 3 + 1).collect();
    let auth_key: Vec<u8> = (0..algorithm.auth_key_len()).map(|i| i as u8 * 5 + 2).collect();
    let session = Session::new(algorithm, &enc_key, &auth_key).context("raw crypto session")?;
    let align = algorithm.pad_align();
    let cipher_len = (payload_len + 2).div_ceil(align) * align;
    let iv_len = algorithm.iv_len();
    let total = 8 + iv_len + cipher_len + algorithm.icv_len();
    let descriptor = |direction| Descriptor {
        kind: DescriptorKind::SinglePass,
        direction,
        auth_only: Region::new(0, 8),
        esn_high: None,
        iv: Region::new(8, iv_len),
        cipher: Region::new(8 + iv_len, cipher_len),
        icv: Region::new(8 + iv_len + cipher_len, algorithm.icv_len()),
        status: Status::Pending,
    };
    // One pass of the primitive over `buf`, in place; whether it succeeded.
    let pass = |direction, buf: &mut [u8]| {
        let mut desc = descriptor(direction);
        accel::primitive::process(&session, &mut desc, buf);
        desc.status == Status::Done
    };
    let plain: Vec<u8> = (0..total).map(|i| i as u8).collect();
    let mut bufs = vec![plain.clone(); BATCH];
    let mut counter = 0u64;
    let encrypt = time_slices(timing, |watch| {
        let done = watch.time(|| {
            bufs.iter_mut().all(|buf| {
                counter += 1;
                buf[8..8 + iv_len.min(8)].copy_from_slice(&counter.to_be_bytes()[..iv_len.min(8)]);
                pass(Direction::Encrypt, buf)
            })
        });
        ensure!(done, "raw encrypt failed");
        Ok(BATCH)
    })?;
    let mut sealed = plain.clone();
    pass(Direction::Encrypt, &mut sealed);
    let mut check = sealed.clone();
    ensure!(
        pass(Direction::Decrypt, &mut check)
            && check[..8 + iv_len + cipher_len] == plain[..8 + iv_len + cipher_len],
        "raw decrypt does not invert encrypt"
    );
    let decrypt = time_slices(timing, |watch| {
        for buf in &mut bufs {
            buf.copy_from_slice(&sealed);
        }
        let done = watch.time(|| bufs.iter_mut().all(|buf| pass(Direction::Decrypt, buf)));
        ensure!(done, "raw decrypt failed");
        Ok(BATCH)
    })?;
    Ok((encrypt, decrypt))
}

/// The CPU-cycles hardware counter of the calling thread (perf_event_open),
/// where the kernel and the (virtual) CPU offer one.
pub struct CycleCounter {
    fd: std::os::fd::OwnedFd,
}

impl CycleCounter {
    /// Opens the counter, or says why there is none.
    pub fn open() -> Result<CycleCounter, String> {
        use perf_event_open_sys::bindings;
        use std::os::fd::FromRawFd;
        let mut attr = bindings::perf_event_attr {
            type_: bindings::PERF_TYPE_HARDWARE,
            size: std::mem::size_of::<bindings::perf_event_attr>() as u32,
            config: u64::from(bindings::PERF_COUNT_HW_CPU_CYCLES),
            ..Default::default()
        };
        attr.set_disabled(1);
        attr.set_exclude_hv(1);
        // SAFETY: perf_event_open reads the attribute block we own; pid 0
        // and cpu -1 mean this thread on any CPU.
        let fd = unsafe { perf_event_open_sys::perf_event_open(&mut attr, 0, -1, -1, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        // SAFETY: fd is a fresh descriptor owned from here on.
        Ok(CycleCounter {
            fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
        })
    }

    fn reset(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: perf ioctl on our own counter.
        unsafe {
            perf_event_open_sys::ioctls::RESET(self.fd.as_raw_fd(), 0);
        }
    }

    fn resume(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: perf ioctl on our own counter.
        unsafe {
            perf_event_open_sys::ioctls::ENABLE(self.fd.as_raw_fd(), 0);
        }
    }

    fn pause(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: perf ioctl on our own counter.
        unsafe {
            perf_event_open_sys::ioctls::DISABLE(self.fd.as_raw_fd(), 0);
        }
    }

    fn read(&self) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let mut value = 0u64;
        // SAFETY: an 8-byte read into a u64 we own.
        let got = unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
        (got == 8).then_some(value)
    }
}
