//! The driver of the `xfrm` keying source: owns the `NETLINK_XFRM`
//! sockets in the keying namespace and the thread that reads them.
//!
//! The sockets are opened by a short-lived thread that enters the keying
//! namespace (`setns` changes the namespace of the calling thread only; a
//! socket stays in the namespace it was made in), before `espgw run`
//! drops its privileges: that needs `CAP_NET_ADMIN` there, and privileges
//! are dropped while a single thread runs. One socket follows the
//! multicast groups `XFRMNLGRP_SA`, `XFRMNLGRP_POLICY` and
//! `XFRMNLGRP_EXPIRE`; another asks for the dumps (`XFRM_MSG_GETSA`,
//! `XFRM_MSG_GETPOLICY`) when the reading thread starts and after an
//! overrun (`ENOBUFS`). Subscribing before dumping means nothing is missed
//! between the two: a notification older than the dump is applied after
//! it, in order, and changes to the same result. A third socket sends
//! what the kernel is told back (counters, volume expiries, ACQUIRE),
//! from worker 0 between batches, without waiting. The kernel checks
//! `CAP_NET_ADMIN` at every request, so `espgw run` hands the dump and
//! request sockets to its privileged broker (`crate::xfrm_broker`) and
//! asks through it; `espgw xfrm show`, root throughout, asks directly. A
//! refused dump counts as `dump_errors`. The IKE relay's TUN is created
//! by the same short-lived thread, in the keying namespace
//! (`crate::ike_relay`).
//!
//! Datagrams go to worker 0 as they came, in memory wiped when dropped
//! (they carry keys); the translation is `ike_stub::xfrm`'s, between
//! batches. Must not interpret messages beyond finding where a dump ends
//! and which answers are errors.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender};
use ike_stub::xfrm::{DumpKind, XfrmMirror};
use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_packet_xfrm::{
    state::GetDumpMessage, XfrmMessage, XFRMNLGRP_EXPIRE, XFRMNLGRP_POLICY, XFRMNLGRP_SA, XFRM_MSG_GETPOLICY,
};
use netlink_sys::{protocols::NETLINK_XFRM, Socket};
use zeroize::Zeroizing;

use crate::ike_relay::IkeRelay;
use crate::xfrm_broker::{Broker, DumpLink, FeedbackLink};

/// What the reading thread hands worker 0.
pub enum Feed {
    /// A dump of this table starts (the next datagrams answer it).
    Dump(DumpKind),
    /// A datagram as read (notifications or dump replies).
    Datagram(Zeroizing<Vec<u8>>),
    /// The socket overran: notifications were lost; dumps follow.
    Overrun,
    /// The dump in progress was given up (no answer, a read error).
    DumpAbandoned,
}

/// The largest datagram read: netlink dumps fill up to 32 KiB, a
/// notification is a few hundred bytes.
const RECEIVE_BUFFER: usize = 256 * 1024;
/// The kernel's buffer for notifications (`SO_RCVBUFFORCE` as root): a
/// daemon installing thousands of SAs at once should not overrun it.
const SOCKET_BUFFER: libc::c_int = 8 * 1024 * 1024;
/// How often the reading thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(200);
/// How long a dump may take before it is given up.
pub(crate) const DUMP_TIMEOUT: Duration = Duration::from_secs(10);

/// The running source: its feed, the thread behind it, the socket that
/// talks back to the kernel, and the IKE relay.
pub struct XfrmSource {
    feed: Receiver<Feed>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Feedback to the kernel: sent directly, or (`espgw run`) through the
    /// privileged broker.
    requests: Requests,
    relay: Option<IkeRelay>,
}

struct Sockets {
    events: Socket,
    dumps: Dumps,
}

/// Where dump requests go: straight to the kernel (`espgw xfrm show`,
/// root throughout), or through the broker (`espgw run`, which keeps no
/// privilege to ask the kernel itself).
enum Dumps {
    Kernel(Socket),
    Broker(DumpLink),
}

enum Requests {
    Kernel(Socket),
    Broker(FeedbackLink),
}

/// The largest datagram of feedback messages sent at once (the kernel
/// takes up to its socket buffer; this stays well under).
const FEEDBACK_DATAGRAM: usize = 32 * 1024;

/// Enters `/run/netns/NAME` on this thread.
fn enter_netns(name: &str) -> Result<()> {
    let path = format!("/run/netns/{name}");
    let file = File::open(&path).with_context(|| {
        format!("cannot open {path}: no network namespace `{name}` (`ip netns add {name}`)")
    })?;
    // SAFETY: setns on a descriptor we own; it changes this thread's
    // network namespace only.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot enter {path} (needs root)"));
    }
    Ok(())
}

/// `SO_RCVTIMEO` on `socket` (a netlink socket here, the broker's links).
pub(crate) fn set_timeout(socket: impl AsFd, timeout: Duration) -> std::io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    accel::os::set_sockopt(socket, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
}

fn open_sockets() -> Result<Sockets> {
    let mut events =
        Socket::new(NETLINK_XFRM).context("cannot open a NETLINK_XFRM socket (xfrm_user module?)")?;
    events
        .bind_auto()
        .context("binding the XFRM notification socket")?;
    for group in [XFRMNLGRP_SA, XFRMNLGRP_POLICY, XFRMNLGRP_EXPIRE] {
        events
            .add_membership(group)
            .with_context(|| format!("joining XFRM multicast group {group} (needs CAP_NET_ADMIN)"))?;
    }
    // Root may go past rmem_max; otherwise the plain option is the next best.
    if accel::os::set_sockopt(&events, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &SOCKET_BUFFER).is_err() {
        let _ = events.set_rx_buf_sz(SOCKET_BUFFER);
    }
    set_timeout(&events, POLL)?;
    let mut dumps = Socket::new(NETLINK_XFRM).context("cannot open a NETLINK_XFRM socket")?;
    dumps.bind_auto().context("binding the XFRM dump socket")?;
    set_timeout(&dumps, DUMP_TIMEOUT)?;
    Ok(Sockets {
        events,
        dumps: Dumps::Kernel(dumps),
    })
}

/// A dump request for `kind`.
fn dump_request(kind: DumpKind, sequence: u32) -> Vec<u8> {
    let message = match kind {
        DumpKind::Sa => XfrmMessage::GetDumpSa(GetDumpMessage::default()),
        // The kernel's policy dump reads nothing of the request's payload.
        DumpKind::Policy => XfrmMessage::Other((XFRM_MSG_GETPOLICY, Vec::new())),
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = sequence;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    m.finalize();
    let mut out = vec![0u8; m.buffer_len()];
    m.serialize(&mut out);
    out
}

/// Whether `datagram` ends a dump (holds `NLMSG_DONE` or an error).
pub(crate) fn ends_dump(datagram: &[u8]) -> bool {
    let mut at = 0;
    while let Ok(buffer) = NetlinkBuffer::new_checked(&datagram[at..]) {
        if matches!(buffer.message_type(), NLMSG_DONE | NLMSG_ERROR) {
            return true;
        }
        let length = buffer.length() as usize;
        if length == 0 {
            break;
        }
        at += length.div_ceil(4) * 4;
        if at >= datagram.len() {
            break;
        }
    }
    false
}

/// Reads one datagram into `buffer` and returns a wiped copy of exactly
/// its bytes.
fn receive(socket: &Socket, buffer: &mut Zeroizing<Vec<u8>>) -> std::io::Result<Zeroizing<Vec<u8>>> {
    buffer.clear();
    let len = socket.recv(&mut **buffer, libc::MSG_TRUNC)?;
    if len > buffer.len() {
        return Err(std::io::Error::other(format!(
            "a datagram of {len} bytes, larger than the {} read",
            buffer.len()
        )));
    }
    let datagram = Zeroizing::new(buffer[..len].to_vec());
    zeroize::Zeroize::zeroize(&mut buffer[..len]);
    Ok(datagram)
}

struct Reader {
    sockets: Sockets,
    feed: Sender<Feed>,
    stop: Arc<AtomicBool>,
    buffer: Zeroizing<Vec<u8>>,
    sequence: u32,
}

/// Hands `item` to worker 0, waiting while its queue is full (the
/// kernel's buffer fills meanwhile, and an overrun resyncs); false once
/// stopped or worker 0 is gone.
fn hand(feed: &Sender<Feed>, stop: &AtomicBool, mut item: Feed) -> bool {
    loop {
        match feed.send_timeout(item, POLL) {
            Ok(()) => return true,
            Err(SendTimeoutError::Disconnected(_)) => return false,
            Err(SendTimeoutError::Timeout(back)) => {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                item = back;
            }
        }
    }
}

/// Asks the kernel for a dump of `kind` on `socket` and hands `forward`
/// every datagram of the answer up to its end; false if the dump could
/// not be asked for or stopped, or `forward` refused a datagram. The
/// buffer is wiped (dumps carry keys).
pub(crate) fn dump_through(
    socket: &Socket,
    kind: DumpKind,
    sequence: u32,
    mut forward: impl FnMut(&[u8]) -> bool,
) -> bool {
    if let Err(e) = socket.send(&dump_request(kind, sequence), 0) {
        tracing::error!("xfrm: cannot ask for the {kind:?} dump: {e}");
        return false;
    }
    let mut buffer = Zeroizing::new(Vec::with_capacity(RECEIVE_BUFFER));
    loop {
        let datagram = match receive(socket, &mut buffer) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("xfrm: the {kind:?} dump stopped: {e}");
                return false;
            }
        };
        if !forward(&datagram) {
            return false;
        }
        if ends_dump(&datagram) {
            return true;
        }
    }
}

/// Asks for a dump of `kind` and hands `sink` its start and every reply
/// up to its end; false if `sink` refused one (stopped).
fn dump(dumps: &Dumps, kind: DumpKind, sequence: u32, mut sink: impl FnMut(Feed) -> bool) -> bool {
    if !sink(Feed::Dump(kind)) {
        return false;
    }
    let mut stopped = false;
    let done = match dumps {
        Dumps::Kernel(socket) => dump_through(socket, kind, sequence, |datagram| {
            stopped = !sink(Feed::Datagram(Zeroizing::new(datagram.to_vec())));
            !stopped
        }),
        Dumps::Broker(link) => match link.dump(kind, sequence, |datagram| {
            stopped = !sink(Feed::Datagram(datagram));
            !stopped
        }) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("xfrm: the {kind:?} dump through the broker stopped: {e}");
                false
            }
        },
    };
    if stopped {
        return false;
    }
    done || sink(Feed::DumpAbandoned)
}

impl Reader {
    fn hand(&self, item: Feed) -> bool {
        hand(&self.feed, &self.stop, item)
    }

    fn dump(&mut self, kind: DumpKind) -> bool {
        self.sequence = self.sequence.wrapping_add(1);
        let (feed, stop) = (&self.feed, &self.stop);
        dump(&self.sockets.dumps, kind, self.sequence, |item| {
            hand(feed, stop, item)
        })
    }

    fn run(mut self) {
        // The first dumps: the notification socket joined its groups
        // before, so nothing between the two is missed.
        if !(self.dump(DumpKind::Sa) && self.dump(DumpKind::Policy)) {
            return;
        }
        while !self.stop.load(Ordering::Relaxed) {
            match receive(&self.sockets.events, &mut self.buffer) {
                Ok(datagram) => {
                    if !self.hand(Feed::Datagram(datagram)) {
                        return;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!("xfrm: notifications lost (ENOBUFS): dumping the SAD and SPD afresh");
                    if !(self.hand(Feed::Overrun) && self.dump(DumpKind::Sa) && self.dump(DumpKind::Policy)) {
                        return;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    tracing::error!("xfrm: reading notifications failed, the mirror stops following: {e}");
                    return;
                }
            }
        }
    }
}

/// The sockets, open in the keying namespace: what needs privileges,
/// done; [`OpenedXfrm::start`] follows from there.
pub struct OpenedXfrm {
    sockets: Sockets,
    requests: Requests,
    relay: Option<IkeRelay>,
}

/// A non-blocking socket for the requests that tell the kernel what espgw
/// did (see `ike_stub::xfrm::feedback`); the kernel answers only errors.
fn open_requests() -> Result<Socket> {
    let mut requests = Socket::new(NETLINK_XFRM).context("cannot open a NETLINK_XFRM socket")?;
    requests.bind_auto().context("binding the XFRM request socket")?;
    requests.set_non_blocking(true)?;
    Ok(requests)
}

impl XfrmSource {
    /// Opens the sockets in namespace `netns` (`None`: this process's) on
    /// a thread that is gone when this returns, creates the IKE relay's
    /// TUN there with `relay`'s addresses (the gateway's outside ones): all
    /// that needs privileges besides the requests, which
    /// [`OpenedXfrm::with_broker`] hands on.
    pub fn open(netns: Option<&str>, relay: Option<ike_stub::xfrm::relay::Outside>) -> Result<OpenedXfrm> {
        let netns = netns.map(str::to_owned);
        let (sockets, requests, relay) = std::thread::Builder::new()
            .name("xfrm-open".into())
            .spawn(move || -> Result<_> {
                netns.as_deref().map_or(Ok(()), enter_netns)?;
                let relay = relay
                    .map(|outside| IkeRelay::open(crate::ike_relay::DEFAULT_DEVICE, outside))
                    .transpose()?;
                Ok((open_sockets()?, open_requests()?, relay))
            })
            .context("starting the thread that enters the keying namespace")?
            .join()
            .map_err(|_| anyhow!("the thread entering the keying namespace panicked"))??;
        Ok(OpenedXfrm {
            sockets,
            requests: Requests::Kernel(requests),
            relay,
        })
    }
}

impl OpenedXfrm {
    /// Hands the sockets that ask the kernel for something (feedback and
    /// dumps) to the privileged broker (`crate::xfrm_broker`), which is
    /// to become `user`; from then on this process needs no privilege
    /// for the `xfrm` source. Returns the broker's process id. Call it as
    /// root, while one thread runs, before dropping privileges.
    pub fn with_broker(self, user: Option<&crate::privileges::User>) -> Result<(OpenedXfrm, u32)> {
        let (Requests::Kernel(requests), Dumps::Kernel(dumps)) = (self.requests, self.sockets.dumps) else {
            anyhow::bail!("the xfrm source already has a broker");
        };
        let broker = Broker::spawn(requests, dumps, user)?;
        let pid = broker.pid();
        let (feedback, dump_link) = broker.split();
        Ok((
            OpenedXfrm {
                sockets: Sockets {
                    events: self.sockets.events,
                    dumps: Dumps::Broker(dump_link),
                },
                requests: Requests::Broker(feedback),
                relay: self.relay,
            },
            pid,
        ))
    }

    /// Starts the reading thread: the first dumps, then every
    /// notification, go to the returned source's feed.
    pub fn start(self) -> Result<XfrmSource> {
        let (feed_tx, feed) = bounded(4096);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = Reader {
            sockets: self.sockets,
            feed: feed_tx,
            stop: stop.clone(),
            buffer: Zeroizing::new(Vec::with_capacity(RECEIVE_BUFFER)),
            sequence: 0,
        };
        let thread = std::thread::Builder::new()
            .name("xfrm".into())
            .spawn(move || reader.run())
            .context("starting the xfrm thread")?;
        Ok(XfrmSource {
            feed,
            stop,
            thread: Some(thread),
            requests: self.requests,
            relay: self.relay,
        })
    }
}

impl XfrmSource {
    /// Feeds `mirror` what has arrived; returns whether anything did.
    pub fn drain(&self, mirror: &mut XfrmMirror, now: Duration) -> bool {
        let mut any = false;
        while let Ok(item) = self.feed.try_recv() {
            any = true;
            match item {
                Feed::Dump(kind) => mirror.begin_dump(kind),
                Feed::Overrun => mirror.note_overrun(),
                Feed::DumpAbandoned => mirror.abandon_dump(),
                Feed::Datagram(datagram) => mirror.handle_datagram(now, &datagram),
            }
        }
        any
    }

    /// Waits up to `timeout` for something to arrive, then drains.
    pub fn wait_and_drain(&self, mirror: &mut XfrmMirror, now: Duration, timeout: Duration) -> bool {
        match self.feed.recv_timeout(timeout) {
            Ok(item) => {
                match item {
                    Feed::Dump(kind) => mirror.begin_dump(kind),
                    Feed::Overrun => mirror.note_overrun(),
                    Feed::DumpAbandoned => mirror.abandon_dump(),
                    Feed::Datagram(datagram) => mirror.handle_datagram(now, &datagram),
                }
                self.drain(mirror, now);
                true
            }
            Err(_) => false,
        }
    }
}

impl XfrmSource {
    /// The IKE relay, when the source has a keying namespace.
    pub fn relay(&mut self) -> Option<&mut IkeRelay> {
        self.relay.as_mut()
    }

    /// Sends `messages` (whole netlink messages, one after another) to the
    /// kernel without waiting, and returns how many failed: the kernel
    /// answers a request without `NLM_F_ACK` only when it fails, and
    /// answers before `send` returns.
    /// Through the broker, the failures of a datagram are counted when
    /// its answer has come back, at this call or a later one.
    pub fn send_feedback(&self, messages: &[u8]) -> u64 {
        let mut failed = 0;
        let mut at = 0;
        while at < messages.len() {
            let end = datagram_end(messages, at, FEEDBACK_DATAGRAM);
            let sent = match &self.requests {
                Requests::Kernel(socket) => socket
                    .send(&messages[at..end], 0)
                    .map_err(|e| tracing::warn!("xfrm: feedback to the kernel not sent: {e}"))
                    .is_ok(),
                Requests::Broker(link) => link.send(&messages[at..end]),
            };
            if !sent {
                failed += count_messages(&messages[at..end]);
            }
            at = end;
        }
        match &self.requests {
            Requests::Kernel(socket) => {
                let mut buffer = Vec::with_capacity(8192);
                loop {
                    buffer.clear();
                    match socket.recv(&mut buffer, 0) {
                        Ok(_) => failed += refusals(&buffer),
                        Err(_) => break,
                    }
                }
            }
            Requests::Broker(link) => failed += link.failures(),
        }
        failed
    }
}

/// Where the datagram that starts at `at` ends: after as many whole
/// messages as fit in `most` bytes (at least one).
fn datagram_end(messages: &[u8], at: usize, most: usize) -> usize {
    let mut end = at;
    while let Ok(buffer) = NetlinkBuffer::new_checked(&messages[end..]) {
        let length = (buffer.length() as usize).div_ceil(4) * 4;
        if length == 0 || (end > at && end + length - at > most) {
            break;
        }
        end = (end + length).min(messages.len());
        if end >= messages.len() {
            break;
        }
    }
    if end == at {
        messages.len()
    } else {
        end
    }
}

fn count_messages(messages: &[u8]) -> u64 {
    let mut n = 0;
    let mut at = 0;
    while at < messages.len() {
        let end = datagram_end(messages, at, 0);
        n += 1;
        at = end;
    }
    n
}

/// The error answers in a datagram from the kernel (an error code other
/// than 0).
pub(crate) fn refusals(datagram: &[u8]) -> u64 {
    let mut n = 0;
    let mut at = 0;
    while let Ok(buffer) = NetlinkBuffer::new_checked(&datagram[at..]) {
        if buffer.message_type() == NLMSG_ERROR {
            let code = buffer
                .payload()
                .get(..4)
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
            if code.is_some_and(|c| c != 0) {
                tracing::debug!("xfrm: the kernel refused feedback: error {}", code.unwrap_or(0));
                n += 1;
            }
        }
        let length = (buffer.length() as usize).div_ceil(4) * 4;
        if length == 0 {
            break;
        }
        at += length;
        if at >= datagram.len() {
            break;
        }
    }
    n
}

impl Drop for XfrmSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the mirror needs of `config`: the outside interface's addresses,
/// and whether sequence numbers survive a restart (`state_dir`).
pub fn mirror_settings(config: &ike_stub::Config, durable: bool) -> ike_stub::xfrm::MirrorSettings {
    let mut local_addresses = vec![std::net::IpAddr::V4(config.outside.address)];
    if let Some((a, _)) = config.outside.address6 {
        local_addresses.push(std::net::IpAddr::V6(a));
    }
    ike_stub::xfrm::MirrorSettings {
        local_addresses,
        durable_sequences: durable,
    }
}

/// The namespace to mirror: `flag` (`--keying-netns`), else the file's.
pub fn netns_of(config: &ike_stub::Config, flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned).or(match &config.keying {
        ike_stub::Keying::Xfrm { netns } => netns.clone(),
        ike_stub::Keying::Config => None,
    })
}

/// `espgw xfrm show`'s flags.
// Its field docs are the CLI's help, where `[gateway]` and `[keying]` name
// the configuration's tables, not Rust items.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
pub struct ShowArgs {
    /// The gateway configuration (TOML): its outside addresses tell
    /// inbound from outbound SAs; its state directory (or --state-dir's
    /// presence) whether SAs from before the start can be used.
    #[arg(long)]
    pub config: std::path::PathBuf,
    /// The keying namespace (default: the file's [keying] netns, else
    /// this process's).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Follow notifications this long after the dumps.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    pub follow: f64,
    /// As with a state directory (outbound SAs from before the start are
    /// used).
    #[arg(long)]
    pub state_dir: bool,
}

/// `espgw xfrm show`: mirrors the namespace's SAD and SPD into an offline
/// gateway of the configuration (dumps, then notifications for
/// `--follow`), and prints what it holds: every SA with its source,
/// every mirrored policy, and the mirror's counters (JSON).
pub fn show(args: &ShowArgs) -> Result<()> {
    let config = ike_stub::Config::load(&args.config)?;
    let netns = netns_of(&config, args.netns.as_deref());
    let durable = args.state_dir || config.state_dir.is_some();
    let mut mirror = XfrmMirror::new(mirror_settings(&config, durable));
    let source = XfrmSource::open(netns.as_deref(), None)?.start()?;
    let engine = accel::build_engine(&config.engine).context("building the crypto engine")?;
    let started = std::time::Instant::now();
    let mut gateway = dataplane::Gateway::with_commands(
        config.setup(dataplane::LinkLayer::Ethernet, config.style),
        engine,
        &config.commands(),
        Duration::ZERO,
    )?;
    let follow = Duration::try_from_secs_f64(args.follow.max(0.0)).unwrap_or(Duration::ZERO);
    let mut commands = Vec::new();
    loop {
        let dumped = mirror.counters().dumps + mirror.counters().dump_errors >= 2;
        let elapsed = started.elapsed();
        if dumped && elapsed >= follow {
            break;
        }
        if !dumped && elapsed >= DUMP_TIMEOUT * 2 {
            return Err(anyhow!("the kernel did not answer the dumps"));
        }
        source.wait_and_drain(&mut mirror, elapsed, POLL);
        mirror.take_commands(&mut commands);
        for command in commands.drain(..) {
            if let Err(e) = gateway.apply(&command, elapsed) {
                mirror.note_apply_failed(&command, &e);
            }
        }
    }
    let sas = gateway
        .sad()
        .iter()
        .map(|(_, sa)| {
            let source = crate::report::sa_source(sa.name(), None, Some(&mirror));
            crate::report::sa_summary(sa, Some(source))
        })
        .collect();
    let doc = crate::status::XfrmShow {
        netns,
        sas,
        mirrored: mirror.sas(),
        policies: mirror.policies(),
        gateway_policies: gateway.spd().len(),
        counters: mirror.counters().clone(),
    };
    println!("{}", crate::control::encode(&doc, true)?);
    Ok(())
}
