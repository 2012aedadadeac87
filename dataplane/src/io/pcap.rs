//! Offline driver: every frame of a capture is handled as if it arrived on
//! one port; what the gateway transmits (on either port) is written to an
//! output capture of the same link type, in order, with the input frame's
//! timestamp.

use std::io::{Read, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;

use crate::buffer::{PacketPool, MAX_FRAME};
use crate::gateway::{Gateway, LinkLayer, Verdict};
use crate::route::Port;
use crate::stats::DropReason;

/// Frames handled per call into the gateway.
pub const BATCH: usize = 32;

/// Why a capture could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum PcapDriverError {
    #[error("cannot read the input capture: {0}")]
    Read(#[source] pcap_file::PcapError),
    #[error("cannot write the output capture: {0}")]
    Write(#[source] pcap_file::PcapError),
    #[error(
        "input link type {0:?} is not supported; espgw reads Ethernet (linktype 1) and raw IPv4 (linktypes 101 and 228)"
    )]
    UnsupportedLinkType(DataLink),
}

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
    pub frames_in: u64,
    pub frames_out: u64,
}

/// Feeds every frame of `reader` to `gateway` as arriving on `from` and
/// writes transmitted frames to `output`. Time as seen by the gateway is
/// the capture's timestamps, relative to its first frame.
pub fn run<R: Read, W: Write>(
    gateway: &mut Gateway,
    from: Port,
    mut reader: PcapReader<R>,
    output: W,
) -> Result<PcapRun, PcapDriverError> {
    let in_header = reader.header();
    let out_header = PcapHeader {
        datalink: in_header.datalink,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(output, out_header).map_err(PcapDriverError::Write)?;
    let mut pool = PacketPool::new(BATCH);
    let mut bufs = Vec::with_capacity(BATCH);
    let mut stamps = Vec::with_capacity(BATCH);
    let mut verdicts = [Verdict::Consumed; BATCH];
    let mut epoch: Option<Duration> = None;
    let mut clock = Duration::ZERO;
    let mut run = PcapRun::default();
    let mut done = false;
    while !done {
        while bufs.len() < BATCH {
            let Some(packet) = reader.next_packet() else {
                done = true;
                break;
            };
            let packet = packet.map_err(PcapDriverError::Read)?;
            run.frames_in += 1;
            epoch.get_or_insert(packet.timestamp);
            if packet.data.len() > MAX_FRAME {
                gateway.count_driver_drop(DropReason::Malformed);
                continue;
            }
            // The batch never holds more buffers than the pool has.
            let Some(mut buf) = pool.alloc() else { break };
            buf.fill(&packet.data);
            bufs.push(buf);
            stamps.push(packet.timestamp);
        }
        if bufs.is_empty() {
            break;
        }
        let start = epoch.unwrap_or_default();
        let n = bufs.len();
        // Offline, each frame keeps its own capture time; time never runs
        // backwards for the gateway even if the capture is out of order.
        for ((buf, verdict), stamp) in bufs.iter_mut().zip(verdicts.iter_mut()).zip(&stamps) {
            let now = stamp.saturating_sub(start).max(clock);
            clock = now;
            gateway.handle_timeout(now);
            *verdict = gateway.handle_frame(now, from, buf);
        }
        for ((buf, verdict), stamp) in bufs.drain(..).zip(&verdicts[..n]).zip(stamps.drain(..)) {
            if let Verdict::Forward(_) = verdict {
                let packet = PcapPacket::new(stamp, buf.len() as u32, buf.data());
                writer.write_packet(&packet).map_err(PcapDriverError::Write)?;
                run.frames_out += 1;
            }
            pool.free(buf);
        }
    }
    Ok(run)
}
