//! `espgw bench --io` (root): which way of reading frames from, and
//! writing them to, an interface is fastest here. A sender floods one end
//! of a veth pair in a private network namespace; each receiver method
//! drains the other end for the same time, copying every frame into a pool
//! buffer as the gateway needs it:
//! - `recvmmsg`: the AF_PACKET driver espgw uses (batches of 64, with
//!   `PACKET_VNET_HDR` and each frame made complete as the gateway gets it);
//! - `recvmmsg_plain`: the same socket without virtio-net headers;
//! - `ring`: espgw's default, the same socket with a `TPACKET_V2` ring
//!   (`drivers::ring`), frames too large for a slot read from the
//!   queue, each frame made complete as the gateway gets it;
//! - `pnet`: the `pnet_datalink` channel (one frame per call);
//! - `io_uring`: 64 `recvmsg` requests kept queued on an io_uring;
//! - `tpacket_v3`: a PACKET_MMAP TPACKET_V3 receive ring (8 blocks of 1 MiB)
//!   walked in user space.
//!
//! Then each transmit method floods one end for the same time, 64 frames a
//! turn, and counts the frames the kernel took:
//! - `send`: one `send(2)` per frame;
//! - `sendmmsg`: one `sendmmsg(2)` per 64 frames;
//! - `send_vnet`, `sendmmsg_vnet`: the same on a `PACKET_VNET_HDR` socket
//!   (a virtio-net header before each frame), as espgw's sockets are.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dataplane::buffer::MAX_FRAME;
use dataplane::PacketPool;
use drivers::afpacket::{AfPacket, Receive, RxScratch, Sent};
use drivers::offload::OffloadCounters;

const NS: &str = "espgw-iobench";

/// One method's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IoResult {
    /// `receive` or `transmit`.
    pub direction: &'static str,
    /// The method measured: a receiver (`ring`, `recvmmsg`,
    /// `recvmmsg_plain`, `pnet`, `io_uring`, `tpacket_v3`) or a transmitter
    /// (`send`, `sendmmsg`, `send_vnet`, `sendmmsg_vnet`).
    pub method: &'static str,
    /// Ethernet frame size in bytes on the wire, FCS included.
    pub frame_size: usize,
    /// Frames received (or taken by the kernel, for `transmit`) per second
    /// of the timed run.
    pub frames_per_second: f64,
    /// `frames_per_second` × `frame_size` in Gbit/s (10^9 bits per second).
    pub gbit_per_second: f64,
}

fn ip(args: &[&str]) -> Result<()> {
    let status = Command::new("ip").args(args).status().context("running ip")?;
    ensure!(status.success(), "`ip {}` failed", args.join(" "));
    Ok(())
}

fn enter() -> Result<()> {
    let file = File::open(format!("/var/run/netns/{NS}"))?;
    // SAFETY: setns on a namespace file we opened; affects this thread only.
    ensure!(
        unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0,
        "cannot enter {NS}"
    );
    Ok(())
}

struct Namespace;

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", NS]).status();
    }
}

fn setup() -> Result<Namespace> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("espgw bench --io needs root (a network namespace and raw sockets)");
    }
    let _ = Command::new("ip").args(["netns", "del", NS]).status();
    ip(&["netns", "add", NS])?;
    let guard = Namespace;
    ip(&[
        "-n", NS, "link", "add", "io0", "type", "veth", "peer", "name", "io1",
    ])?;
    ip(&["-n", NS, "link", "set", "io0", "up"])?;
    ip(&["-n", NS, "link", "set", "io1", "up"])?;
    Ok(guard)
}

/// A frame the kernel will not answer or forward: to a unicast MAC nobody
/// has, ethertype IPv4, a valid header.
fn frame(size: usize) -> Vec<u8> {
    let mut f = vec![0u8; size - 4];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0x99, 0x99]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0x99, 0x01]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    let ip_len = (size - 18) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f
}

/// Floods io0 until `stop`.
fn sender(size: usize, stop: Arc<AtomicBool>) -> thread::JoinHandle<Result<()>> {
    thread::spawn(move || {
        enter()?;
        let socket = AfPacket::open("io0")?;
        let f = frame(size);
        while !stop.load(Ordering::Relaxed) {
            // A full queue just means the receiver is behind.
            let _ = socket.send(&f);
        }
        Ok(())
    })
}

type Receiver = fn(&AtomicBool, &AtomicU64) -> Result<()>;

fn with_recvmmsg(stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    recvmmsg_on(AfPacket::open("io1")?, stop, count)
}

fn with_ring(stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    recvmmsg_on(AfPacket::open_receiving("io1", Receive::Ring)?, stop, count)
}

fn with_recvmmsg_plain(stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    recvmmsg_on(AfPacket::open_plain("io1")?, stop, count)
}

fn recvmmsg_on(socket: AfPacket, stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    let mut pool = PacketPool::new(256);
    let mut bufs = Vec::with_capacity(128);
    let mut scratch = RxScratch::new();
    let mut offload = OffloadCounters::default();
    while !stop.load(Ordering::Relaxed) {
        let n = socket.recv_complete(&mut pool, &mut bufs, 64, &mut scratch, &mut offload)?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        for buf in bufs.drain(..) {
            pool.free(buf);
        }
    }
    Ok(())
}

type Transmitter = fn(&AtomicBool, &AtomicU64, usize) -> Result<()>;

/// Floods io0 with 64 frames a turn through `send`, counting what the
/// kernel took.
fn transmit_on(
    socket: AfPacket,
    stop: &AtomicBool,
    count: &AtomicU64,
    size: usize,
    send: fn(&AfPacket, &[&[u8]]) -> Sent,
) -> Result<()> {
    let f = frame(size);
    let frames: Vec<&[u8]> = (0..64).map(|_| f.as_slice()).collect();
    while !stop.load(Ordering::Relaxed) {
        let sent = send(&socket, &frames);
        count.fetch_add(sent.sent as u64, Ordering::Relaxed);
    }
    Ok(())
}

fn with_send(stop: &AtomicBool, count: &AtomicU64, size: usize) -> Result<()> {
    transmit_on(
        AfPacket::open_plain("io0")?,
        stop,
        count,
        size,
        AfPacket::send_each,
    )
}

fn with_sendmmsg(stop: &AtomicBool, count: &AtomicU64, size: usize) -> Result<()> {
    transmit_on(
        AfPacket::open_plain("io0")?,
        stop,
        count,
        size,
        AfPacket::send_batch,
    )
}

fn with_send_vnet(stop: &AtomicBool, count: &AtomicU64, size: usize) -> Result<()> {
    transmit_on(AfPacket::open("io0")?, stop, count, size, AfPacket::send_each)
}

fn with_sendmmsg_vnet(stop: &AtomicBool, count: &AtomicU64, size: usize) -> Result<()> {
    transmit_on(AfPacket::open("io0")?, stop, count, size, AfPacket::send_batch)
}

fn with_pnet(stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    let interface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == "io1")
        .context("io1 not found")?;
    let config = pnet_datalink::Config {
        read_timeout: Some(Duration::from_millis(20)),
        ..Default::default()
    };
    let mut rx = match pnet_datalink::channel(&interface, config)? {
        pnet_datalink::Channel::Ethernet(_, rx) => rx,
        _ => bail!("pnet offered no Ethernet channel"),
    };
    let mut pool = PacketPool::new(4);
    while !stop.load(Ordering::Relaxed) {
        if let Ok(data) = rx.next() {
            if let Some(mut buf) = pool.alloc() {
                buf.fill(data);
                pool.free(buf);
            }
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn with_io_uring(stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    const DEPTH: usize = 64;
    let socket = AfPacket::open("io1")?;
    let mut ring = io_uring::IoUring::new(DEPTH as u32 * 2)?;
    let mut pool = PacketPool::new(DEPTH);
    let mut bufs: Vec<dataplane::PacketBuf> = (0..DEPTH).filter_map(|_| pool.alloc()).collect();
    let mut iovecs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| {
            b.reset();
            let room = b
                .append(MAX_FRAME)
                .map_or(std::ptr::null_mut(), |r| r.as_mut_ptr());
            libc::iovec {
                iov_base: room.cast(),
                iov_len: MAX_FRAME,
            }
        })
        .collect();
    // SAFETY: msghdr is plain data.
    let mut headers: Vec<libc::msghdr> = iovecs
        .iter_mut()
        .map(|iov| {
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = iov;
            h.msg_iovlen = 1;
            h
        })
        .collect();
    let fd = io_uring::types::Fd(socket.as_raw_fd());
    let push = |ring: &mut io_uring::IoUring, headers: &mut [libc::msghdr], i: usize| {
        let entry = io_uring::opcode::RecvMsg::new(fd, &mut headers[i])
            .build()
            .user_data(i as u64);
        // SAFETY: the header, iovec and buffer live until the completion is reaped.
        let _ = unsafe { ring.submission().push(&entry) };
    };
    for i in 0..DEPTH {
        push(&mut ring, &mut headers, i);
    }
    let ts = io_uring::types::Timespec::from(Duration::from_millis(20));
    while !stop.load(Ordering::Relaxed) {
        let args = io_uring::types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (i, result) in done {
            if result > 0 {
                count.fetch_add(1, Ordering::Relaxed);
            }
            push(&mut ring, &mut headers, i);
        }
    }
    // Drain: cancel by closing the socket after the ring is gone.
    drop(ring);
    for buf in bufs {
        pool.free(buf);
    }
    Ok(())
}

/// TPACKET_V3 receive ring: the kernel fills blocks of frames in shared
/// memory; user space walks a block and hands it back.
fn with_tpacket_v3(stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    const BLOCK_SIZE: usize = 1 << 20;
    const BLOCKS: usize = 8;
    const FRAME_SIZE: usize = 2048;
    const TPACKET_V3: libc::c_int = 2;
    const TP_STATUS_USER: u32 = 1;
    let name = std::ffi::CString::new("io1")?;
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    ensure!(index != 0, "io1 not found");
    // SAFETY: plain socket(2); closed below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(0x0003u16.to_be())) };
    ensure!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
    let set = |name: libc::c_int, value: *const libc::c_void, len: usize| -> Result<()> {
        // SAFETY: value points at `len` readable bytes.
        let r = unsafe { libc::setsockopt(fd, libc::SOL_PACKET, name, value, len as u32) };
        ensure!(r == 0, "setsockopt {name}: {}", std::io::Error::last_os_error());
        Ok(())
    };
    let result = (|| -> Result<()> {
        set(
            libc::PACKET_VERSION,
            (&TPACKET_V3 as *const libc::c_int).cast(),
            4,
        )?;
        // struct tpacket_req3
        let req: [u32; 7] = [
            BLOCK_SIZE as u32,
            BLOCKS as u32,
            FRAME_SIZE as u32,
            (BLOCK_SIZE / FRAME_SIZE * BLOCKS) as u32,
            10, // retire a block after 10 ms even if not full
            0,
            0,
        ];
        set(
            libc::PACKET_RX_RING,
            req.as_ptr().cast(),
            std::mem::size_of_val(&req),
        )?;
        // SAFETY: mapping the ring the kernel just allocated for this socket.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCK_SIZE * BLOCKS,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        ensure!(
            ring != libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: sockaddr_ll is plain data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = 0x0003u16.to_be();
        addr.sll_ifindex = index as i32;
        // SAFETY: addr is a valid sockaddr_ll.
        let bound = unsafe {
            libc::bind(
                fd,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        ensure!(bound == 0, "bind: {}", std::io::Error::last_os_error());
        let base = ring.cast::<u8>();
        let mut pool = PacketPool::new(4);
        let mut block = 0usize;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: every offset below stays inside the mapped ring, as laid
            // out by struct tpacket_block_desc / tpacket3_hdr; the block
            // status word is shared with the kernel, hence volatile access.
            unsafe {
                let desc = base.add(block * BLOCK_SIZE);
                let status = desc.add(8).cast::<u32>();
                if std::ptr::read_volatile(status) & TP_STATUS_USER == 0 {
                    libc::poll(&mut pfd, 1, 20);
                    continue;
                }
                std::sync::atomic::fence(Ordering::Acquire);
                let packets = std::ptr::read_volatile(desc.add(12).cast::<u32>());
                let mut at = desc.add(std::ptr::read_volatile(desc.add(16).cast::<u32>()) as usize);
                for _ in 0..packets {
                    let next = std::ptr::read_volatile(at.cast::<u32>()) as usize;
                    let snaplen = std::ptr::read_volatile(at.add(12).cast::<u32>()) as usize;
                    let mac = std::ptr::read_volatile(at.add(24).cast::<u16>()) as usize;
                    let frame = std::slice::from_raw_parts(at.add(mac), snaplen.min(MAX_FRAME));
                    if let Some(mut buf) = pool.alloc() {
                        buf.fill(frame);
                        pool.free(buf);
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    at = at.add(next);
                }
                std::sync::atomic::fence(Ordering::Release);
                std::ptr::write_volatile(status, 0);
            }
            block = (block + 1) % BLOCKS;
        }
        // SAFETY: unmapping what we mapped above.
        unsafe { libc::munmap(ring, BLOCK_SIZE * BLOCKS) };
        Ok(())
    })();
    // SAFETY: closing the socket opened above.
    unsafe { libc::close(fd) };
    result
}

/// Runs each method for `duration` per frame size.
pub fn compare(sizes: &[usize], duration: Duration) -> Result<Vec<IoResult>> {
    let _namespace = setup()?;
    let methods: [(&'static str, Receiver); 6] = [
        ("ring", with_ring),
        ("recvmmsg", with_recvmmsg),
        ("recvmmsg_plain", with_recvmmsg_plain),
        ("pnet", with_pnet),
        ("io_uring", with_io_uring),
        ("tpacket_v3", with_tpacket_v3),
    ];
    let mut results = Vec::new();
    for &size in sizes {
        for (name, method) in methods {
            let stop = Arc::new(AtomicBool::new(false));
            let count = Arc::new(AtomicU64::new(0));
            let (rx_stop, rx_count) = (Arc::clone(&stop), Arc::clone(&count));
            let receiver = thread::spawn(move || -> Result<()> {
                enter()?;
                method(&rx_stop, &rx_count)
            });
            thread::sleep(Duration::from_millis(100));
            let send = sender(size, Arc::clone(&stop));
            thread::sleep(Duration::from_millis(100));
            let before = count.load(Ordering::Relaxed);
            let start = Instant::now();
            thread::sleep(duration);
            let received = count.load(Ordering::Relaxed) - before;
            let elapsed = start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            send.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
            receiver
                .join()
                .map_err(|_| anyhow::anyhow!("{name} panicked"))??;
            let fps = received as f64 / elapsed;
            results.push(IoResult {
                direction: "receive",
                method: name,
                frame_size: size,
                frames_per_second: fps,
                gbit_per_second: fps * size as f64 * 8.0 / 1e9,
            });
        }
    }
    let transmitters: [(&'static str, Transmitter); 4] = [
        ("send", with_send),
        ("sendmmsg", with_sendmmsg),
        ("send_vnet", with_send_vnet),
        ("sendmmsg_vnet", with_sendmmsg_vnet),
    ];
    for &size in sizes {
        for (name, method) in transmitters {
            let stop = Arc::new(AtomicBool::new(false));
            let count = Arc::new(AtomicU64::new(0));
            let (tx_stop, tx_count) = (Arc::clone(&stop), Arc::clone(&count));
            let sender = thread::spawn(move || -> Result<()> {
                enter()?;
                method(&tx_stop, &tx_count, size)
            });
            thread::sleep(Duration::from_millis(100));
            let before = count.load(Ordering::Relaxed);
            let start = Instant::now();
            thread::sleep(duration);
            let sent = count.load(Ordering::Relaxed) - before;
            let elapsed = start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            sender.join().map_err(|_| anyhow::anyhow!("{name} panicked"))??;
            let fps = sent as f64 / elapsed;
            results.push(IoResult {
                direction: "transmit",
                method: name,
                frame_size: size,
                frames_per_second: fps,
                gbit_per_second: fps * size as f64 * 8.0 / 1e9,
            });
        }
    }
    Ok(results)
}

/// The comparison as a table, with the verdict.
pub fn table(results: &[IoResult]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (direction, title) in [
        (
            "receive",
            "frame receive methods on a veth pair (sender and receiver share this machine):",
        ),
        (
            "transmit",
            "frame transmit methods on a veth pair (frames the kernel took):",
        ),
    ] {
        let rows: Vec<&IoResult> = results.iter().filter(|r| r.direction == direction).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}");
        let mut table = crate::table::plain_table(&["method", "bytes", "kframes/s", "Gbit/s"], &[1, 2, 3]);
        for r in &rows {
            table.add_row([
                r.method.to_string(),
                r.frame_size.to_string(),
                format!("{:.0}", r.frames_per_second / 1e3),
                format!("{:.2}", r.gbit_per_second),
            ]);
        }
        out.push_str(&crate::table::table_text(&table));
        let mut sizes: Vec<usize> = rows.iter().map(|r| r.frame_size).collect();
        sizes.dedup();
        for size in sizes {
            if let Some(best) = rows
                .iter()
                .filter(|r| r.frame_size == size)
                .max_by(|a, b| a.frames_per_second.total_cmp(&b.frames_per_second))
            {
                let _ = writeln!(out, "fastest {direction} at {size} B: {}", best.method);
            }
        }
    }
    out
}
