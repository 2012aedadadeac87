//! The documents a gateway publishes about itself, as types: the control
//! socket's answers (`stats`, `sa list`, `sa show NAME`, `reload`), the
//! `--stats` file `espgw run` and `espgw pcap` leave, and `espgw xfrm
//! show`'s listing.
//!
//! The gateway side builds them typed (`crate::report`, `crate::daemon`,
//! `crate::xfrm_source`), `crate::control` turns them into JSON, and every
//! reader (the CLI's tables, the demo, the soak, the lab, the veth bench)
//! deserialises the same types: a field renamed on one side fails to parse
//! on the other instead of reading as nothing.
//!
//! Owns the documents' shapes only: what goes into them is `report`'s,
//! the framing on the wire `control`'s. The JSON is published (scripts and
//! the tests read it by key): a change here must not rename a key or change
//! a value's form.

use std::collections::BTreeMap;

use accel::EngineCounters;
use drivers::offload::OffloadCounters;
use ike_stub::xfrm::{MirrorCounters, MirroredPolicyStatus, MirroredSaStatus};
use ike_stub::{ControlCounters, ReloadReport, TunnelStatus};
use serde::{Deserialize, Serialize};
use spd_sad::DropReason;

use crate::ike_relay::RelayCounters;

/// What an SA is: the fields `espgw sa list` and `espgw xfrm show` both
/// show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaSummary {
    pub name: String,
    /// `0x` and eight hex digits.
    pub spi: String,
    /// `in` or `out`.
    pub direction: String,
    pub mode: String,
    /// The algorithm's keyword (`aes128gcm16`, ...).
    pub proposal: String,
    pub local: String,
    pub remote: String,
    /// Where the SA came from (see `report::sa_source`); absent from
    /// `espgw pcap`'s document, which has no keying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// What is left of one set of an SA's lifetime limits (`None`: no such
/// limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remaining {
    pub bytes: Option<u64>,
    pub packets: Option<u64>,
    pub seconds: Option<u64>,
    pub idle_seconds: Option<u64>,
}

/// An SA's soft and hard limits, as what remains of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifetimeRemaining {
    pub soft: Remaining,
    pub hard: Remaining,
}

/// An inbound SA's anti-replay window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayWindowStatus {
    pub size: u32,
    /// The highest sequence number received.
    pub top: u64,
    /// How many numbers of the window have arrived.
    pub received_in_window: usize,
}

/// One SA as `espgw stats`, `sa list` and `sa show` describe it; never
/// its keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaStatus {
    #[serde(flatten)]
    pub summary: SaSummary,
    /// `SaState` in lower case (`active`, `softexpired`, ...).
    pub state: String,
    pub age_seconds: f64,
    pub idle_seconds: f64,
    /// Over every worker.
    pub packets: u64,
    pub bytes: u64,
    pub lifetime_remaining: LifetimeRemaining,
    pub esn: bool,
    pub last_sequence: u64,
    /// Static keys with a state directory: the highest number made
    /// durable (none otherwise).
    pub sequence_ceiling: Option<u64>,
    pub replay_top: u64,
    pub replay_window: ReplayWindowStatus,
    /// Every one of `spd_sad::SA_DROP_REASONS`, zero or not.
    pub drops: BTreeMap<DropReason, u64>,
}

/// The crypto engine a gateway runs and what it counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStatus {
    pub kind: String,
    pub style: String,
    pub counters: EngineCounters,
}

/// Pool buffers in use, of how many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    pub in_use: usize,
    pub capacity: usize,
}

/// `espgw pcap --stats`: one gateway's counters, SAs and engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PcapStats {
    #[serde(flatten)]
    pub gateway: dataplane::Stats,
    pub sas: Vec<SaStatus>,
    pub engine: EngineStatus,
}

/// Where an interface's device stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum DeviceState {
    /// Up: frames flow.
    Up,
    /// Down or without carrier: waited for, frames to it are dropped.
    Down,
    /// Deleted: waited for (`on_device_loss = "wait"`) until a device of
    /// its name is back, when its sockets are opened again.
    Deleted,
}

/// One interface's device in the `stats` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// `inside` or `outside`.
    pub interface: dataplane::Port,
    /// Where it stands.
    pub state: DeviceState,
}

impl DeviceStatus {
    /// Both interfaces' devices, from the run's flags (by port index).
    pub fn from_run(run: &drivers::run::RunSummary) -> Vec<DeviceStatus> {
        [dataplane::Port::Inside, dataplane::Port::Outside]
            .into_iter()
            .map(|port| {
                let i = port.index();
                let state = if run.device_lost[i] {
                    DeviceState::Deleted
                } else if run.link_down[i] {
                    DeviceState::Down
                } else {
                    DeviceState::Up
                };
                DeviceStatus {
                    interface: port,
                    state,
                }
            })
            .collect()
    }
}

/// The answer to `stats`: every worker's gateway counters added up, the
/// SAs (from worker 0, whose packet and byte counts are every worker's),
/// the run's own counters and, where they run, the keying source's and
/// the control plane's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    #[serde(flatten)]
    pub gateway: dataplane::Stats,
    pub sas: Vec<SaStatus>,
    pub engine: EngineStatus,
    /// Frames the kernel dropped before espgw read them.
    pub kernel_drops: u64,
    /// Times a device was found down (or without carrier).
    #[serde(default)]
    pub link_downs: u64,
    /// Times a device was deleted under the running gateway.
    #[serde(default)]
    pub devices_lost: u64,
    /// Each interface's device as the workers last saw it.
    #[serde(default)]
    pub devices: Vec<DeviceStatus>,
    pub frames_in: u64,
    pub frames_out: u64,
    /// Control datagrams dropped, the queue to worker 0 being full.
    pub control_overflow: u64,
    pub rx_moderated: u64,
    pub offload: OffloadCounters,
    pub pool: PoolStats,
    /// The `xfrm` keying source's mirror, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xfrm: Option<MirrorCounters>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlCounters>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnels: Option<Vec<TunnelStatus>>,
    /// The IKE relay beside the `xfrm` source (socket answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ike_relay: Option<RelayCounters>,
}

/// The `--stats` file `espgw run` writes as it stops: the last `stats`
/// answer and what only the end of a run knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalStats {
    #[serde(flatten)]
    pub stats: StatsReply,
    pub send_errors: u64,
    pub workers: usize,
}

/// The answer to `sa list` (every SA and tunnel) and `sa show NAME` (the
/// SA of that name, or the tunnel and every SA it has now).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SasReply {
    pub sas: Vec<SaStatus>,
    /// Absent (outer `None`) when `sa show` named an SA; `null` (inner
    /// `None`) from `sa list` without a control plane. See
    /// [`tunnels`](Self::tunnels).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub tunnels: Option<Option<Vec<TunnelStatus>>>,
}

impl SasReply {
    /// The tunnels the answer shows, if any.
    pub fn tunnels(&self) -> &[TunnelStatus] {
        self.tunnels
            .as_ref()
            .and_then(Option::as_deref)
            .unwrap_or_default()
    }
}

/// A field that is there, `null` or not: absent stays the outer `None`
/// (`default`), which plain `Option<Option<T>>` would not tell from `null`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// The answer to a `reload` that was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadReply {
    /// Always true: a refused reload is an [`ErrorReply`].
    pub reloaded: bool,
    pub report: ReloadReport,
}

/// A request the gateway did not answer with what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: String,
}

/// Any answer of the control socket. Serialised as the document it holds
/// (no tag): a client knows what it asked, and reads the answer as that
/// document's type (`control::ask`), after checking for an `error`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Stats(Box<StatsReply>),
    Sas(SasReply),
    Reload(ReloadReply),
    Error(ErrorReply),
}

impl Reply {
    pub fn error(message: impl Into<String>) -> Reply {
        Reply::Error(ErrorReply {
            error: message.into(),
        })
    }
}

/// `espgw xfrm show`: what the `xfrm` keying source mirrors into a gateway
/// it builds for the purpose. Printed for people and scripts only (espgw
/// reads it nowhere), so it is not read back: the mirror's listings borrow
/// their names.
#[derive(Debug, Clone, Serialize)]
pub struct XfrmShow {
    pub netns: Option<String>,
    pub sas: Vec<SaSummary>,
    pub mirrored: Vec<MirroredSaStatus>,
    pub policies: Vec<MirroredPolicyStatus>,
    pub gateway_policies: usize,
    pub counters: MirrorCounters,
}

#[cfg(test)]
mod tests {
    use super::DeviceState;

    /// The text table and the JSON name a device's state with one word.
    #[test]
    fn a_device_state_has_one_name_in_text_and_json() {
        for state in [DeviceState::Up, DeviceState::Down, DeviceState::Deleted] {
            let json = serde_json::to_value(state).expect("a state serialises");
            assert_eq!(json.as_str(), Some(<&str>::from(state)), "{state:?}");
        }
    }
}
