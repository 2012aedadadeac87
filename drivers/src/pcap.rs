//! Offline driver: every frame of a capture is handled as if it arrived on
//! one port; what the gateway transmits (on either port) is written to an
//! output capture of the same link type, in the order the gateway transmits
//! it, stamped with the capture time at which it left. Optionally it also
//! writes one JSON line per input frame saying what became of it (see
//! `dataplane::fate`), and calls the caller back before each frame (espgw's
//! sequence ledger makes its reservations durable there).

use std::io::{Read, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;

use crate::frame_log::{FrameLog, FrameLogError};
use dataplane::buffer::{PacketPool, MAX_FRAME};
use dataplane::gateway::{Gateway, LinkLayer, Output, Verdict};
use dataplane::route::Port;
use dataplane::stats::DropReason;

/// Buffers per batch of frames; the pool holds several batches so an
/// asynchronous engine can keep many packets in flight.
pub const BATCH: usize = 32;

/// Why a capture could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum PcapDriverError {
    /// The input's header or a frame record could not be read or parsed.
    #[error("cannot read the input capture: {0}")]
    Read(#[source] pcap_file::PcapError),
    /// The output capture's header or a frame could not be written.
    #[error("cannot write the output capture: {0}")]
    Write(#[source] pcap_file::PcapError),
    /// The input is neither Ethernet nor raw IPv4.
    #[error(
        "input link type {0:?} is not supported; espgw reads Ethernet (linktype 1) and raw IPv4 (linktypes 101 and 228)"
    )]
    UnsupportedLinkType(DataLink),
    /// No buffer was free for the next frame and the gateway had nothing
    /// in flight to give one back.
    #[error("every packet buffer is held by the engine and none came back")]
    PoolExhausted,
    /// The run ended with this many buffers not back in the pool: the
    /// gateway or its engine kept them after shutting down.
    #[error("{0} packet buffers did not come back from the engine")]
    BuffersLost(usize),
    /// The per-frame log refused a frame or could not be written.
    #[error(transparent)]
    Verdicts(#[from] FrameLogError),
    /// The caller's [`BeforeFrame`] failed; the run stopped there.
    #[error("{0}")]
    BeforeFrame(#[source] std::io::Error),
}

/// What the caller does before each frame (and whenever packets wait in
/// the gateway), given the gateway's time: durable work the next frame
/// may depend on. An error stops the run.
pub type BeforeFrame<'a> = &'a mut dyn FnMut(Duration) -> std::io::Result<()>;

/// The link layer of a capture's link type, if espgw reads it.
pub fn link_layer_of(datalink: DataLink) -> Option<LinkLayer> {
    match datalink {
        DataLink::ETHERNET => Some(LinkLayer::Ethernet),
        DataLink::RAW | DataLink::IPV4 => Some(LinkLayer::RawIp),
        _ => None,
    }
}

/// Reads the header of a capture and tells its link layer, so the caller
/// can build a gateway of the right kind before [`run`].
pub fn open<R: Read>(input: R) -> Result<(PcapReader<R>, LinkLayer), PcapDriverError> {
    let reader = PcapReader::new(input).map_err(PcapDriverError::Read)?;
    let datalink = reader.header().datalink;
    let link = link_layer_of(datalink).ok_or(PcapDriverError::UnsupportedLinkType(datalink))?;
    Ok((reader, link))
}

/// Counts of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PcapRun {
    /// Frames read from the input, those too long for a buffer (dropped
    /// as malformed) included.
    pub frames_in: u64,
    /// Frames written to the output capture: everything the gateway
    /// forwarded, on either port.
    pub frames_out: u64,
}

/// Feeds every frame of `reader` to `gateway` as arriving on `from` and
/// writes transmitted frames to `output`. Time as seen by the gateway is
/// the capture's timestamps, relative to its first frame.
pub fn run<R: Read, W: Write>(
    gateway: &mut Gateway,
    from: Port,
    reader: PcapReader<R>,
    output: W,
) -> Result<PcapRun, PcapDriverError> {
    run_inner(gateway, from, reader, output, None, None)
}

/// [`run`], and one JSON line per input frame to `verdicts`, in frame
/// order: its index, port, fate (`forwarded`, `consumed`, `dropped`), drop
/// reason, SA, SPI and sequence number where known, and how many frames
/// left because of it ([`crate::frame_log::FrameVerdict`]). Every frame gets
/// exactly one line; over a run, the drop reasons of the lines (with their
/// `more_drops`) add up to the drop counters.
pub fn run_with_verdicts<R: Read, W: Write>(
    gateway: &mut Gateway,
    from: Port,
    reader: PcapReader<R>,
    output: W,
    verdicts: &mut dyn Write,
) -> Result<PcapRun, PcapDriverError> {
    let mut log = FrameLog::new();
    run_inner(gateway, from, reader, output, Some((&mut log, verdicts)), None)
}

/// [`run`] or [`run_with_verdicts`], calling `before_frame` before each
/// frame is handed in, whenever packets wait in the gateway after a batch
/// (then the gateway is polled again), and before the gateway stops.
pub fn run_with<R: Read, W: Write>(
    gateway: &mut Gateway,
    from: Port,
    reader: PcapReader<R>,
    output: W,
    verdicts: Option<&mut dyn Write>,
    before_frame: BeforeFrame<'_>,
) -> Result<PcapRun, PcapDriverError> {
    let mut log = FrameLog::new();
    let sink: VerdictSink<'_> = match verdicts {
        Some(w) => Some((&mut log, w)),
        None => None,
    };
    run_inner(gateway, from, reader, output, sink, Some(before_frame))
}

type VerdictSink<'a> = Option<(&'a mut FrameLog, &'a mut dyn Write)>;

fn run_inner<R: Read, W: Write>(
    gateway: &mut Gateway,
    from: Port,
    mut reader: PcapReader<R>,
    output: W,
    verdicts: VerdictSink<'_>,
    mut before_frame: Option<BeforeFrame<'_>>,
) -> Result<PcapRun, PcapDriverError> {
    let hooked = before_frame.is_some();
    let mut before = |now: Duration| match before_frame.as_mut() {
        Some(hook) => hook(now).map_err(PcapDriverError::BeforeFrame),
        None => Ok(()),
    };
    let in_header = reader.header();
    let out_header = PcapHeader {
        datalink: in_header.datalink,
        ..PcapHeader::default()
    };
    let mut capture = CaptureOut {
        writer: PcapWriter::with_header(output, out_header).map_err(PcapDriverError::Write)?,
        run: PcapRun::default(),
        verdicts,
    };
    // Room for a batch being read plus everything the engine may hold.
    let mut pool = PacketPool::new(BATCH * 8);
    let mut bufs = Vec::with_capacity(BATCH);
    let mut out: Vec<Output> = Vec::with_capacity(BATCH * 8);
    let mut epoch: Option<Duration> = None;
    let mut clock = Duration::ZERO;
    while let Some(packet) = reader.next_packet() {
        let packet = packet.map_err(PcapDriverError::Read)?;
        capture.run.frames_in += 1;
        let start = *epoch.get_or_insert(packet.timestamp);
        // Offline, each frame keeps its own capture time; time never runs
        // backwards for the gateway even if the capture is out of order.
        clock = packet.timestamp.saturating_sub(start).max(clock);
        if packet.data.len() > MAX_FRAME {
            gateway.count_driver_drop(DropReason::Malformed);
            if let Some((log, _)) = capture.verdicts.as_mut() {
                log.refused(from, DropReason::Malformed)?;
            }
            continue;
        }
        let mut buf = loop {
            match pool.alloc() {
                Some(buf) => break buf,
                // Every buffer is with the engine: wait for some to come back.
                None => {
                    if hooked {
                        before(clock)?;
                        gateway.poll(clock, &mut out, &mut pool);
                    }
                    crate::drive::flush(gateway, clock, &mut out, &mut pool);
                    capture.write_out(gateway, &mut pool, &mut out, clock + start)?;
                    if pool.available() == 0 && gateway.in_flight() == 0 {
                        return Err(PcapDriverError::PoolExhausted);
                    }
                }
            }
        };
        buf.fill(&packet.data);
        if let Some((log, _)) = capture.verdicts.as_mut() {
            log.received(gateway, from, &mut buf)?;
        }
        bufs.push(buf);
        before(clock)?;
        gateway.handle_timeout(clock, &mut out, &mut pool);
        gateway.handle_batch(clock, from, &mut bufs, &mut out, &mut pool);
        if hooked && gateway.in_flight() > 0 {
            // Packets may wait for what the caller does (a ceiling made
            // durable): let it, then let them go on.
            before(clock)?;
            gateway.poll(clock, &mut out, &mut pool);
        }
        capture.write_out(gateway, &mut pool, &mut out, clock + start)?;
    }
    if hooked {
        before(clock)?;
        gateway.poll(clock, &mut out, &mut pool);
    }
    crate::drive::shutdown(gateway, clock, &mut out, &mut pool);
    let stamp = clock + epoch.unwrap_or_default();
    capture.write_out(gateway, &mut pool, &mut out, stamp)?;
    if pool.in_use() != 0 {
        return Err(PcapDriverError::BuffersLost(pool.in_use()));
    }
    Ok(capture.run)
}

/// Where a run's output goes: the output capture, its counts, and the
/// verdict log if there is one.
struct CaptureOut<'a, W: Write> {
    writer: PcapWriter<W>,
    run: PcapRun,
    verdicts: VerdictSink<'a>,
}

impl<W: Write> CaptureOut<'_, W> {
    /// Writes forwarded frames and returns every buffer to the pool; with
    /// verdicts, folds each output into its frame's record, and writes the
    /// records out once the gateway holds no buffer (then they are final).
    fn write_out(
        &mut self,
        gateway: &Gateway,
        pool: &mut PacketPool,
        out: &mut Vec<Output>,
        stamp: Duration,
    ) -> Result<(), PcapDriverError> {
        for (buf, verdict) in out.drain(..) {
            if let Some((log, _)) = self.verdicts.as_mut() {
                log.output(gateway, &buf, verdict);
            }
            if let Verdict::Forward(_) = verdict {
                let packet = PcapPacket::new(stamp, buf.len() as u32, buf.data());
                self.writer
                    .write_packet(&packet)
                    .map_err(PcapDriverError::Write)?;
                self.run.frames_out += 1;
            }
            pool.free(buf);
        }
        if let Some((log, sink)) = self.verdicts.as_mut() {
            if pool.in_use() == 0 {
                log.flush(gateway, &mut **sink)?;
            }
        }
        Ok(())
    }
}
