//! Device profiles: the parameters the `sec` model's timeline comes from.
//!
//! A [`DeviceProfile`] names a part and gives, for that part, what each
//! modelled step costs: per-descriptor setup, a pipelined latency, the
//! shared bus's bandwidth, the throughput of each execution-unit kind and
//! how many instances of it there are, the channel count and fetch-FIFO
//! depth, and the host-side costs a real driver of the part pays that this
//! machine cannot show ([`HostCosts`]). Every default cites where it comes
//! from; where a figure is an estimate, the comment says so.
//!
//! This file owns the numbers only. It must not schedule anything, read a
//! clock, or know about jobs; `model.rs` turns these numbers into time.

use std::fmt;
use std::time::Duration;

/// A throughput, in bytes per second, or no limit at all.
///
/// Integer bytes/s so that modelled durations are computed in integer
/// nanoseconds and come out the same on every machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Throughput {
    /// Takes no time, whatever the size (the `none` profile, the null unit).
    Unlimited,
    /// Bytes per second.
    BytesPerSec(u64),
}

impl Throughput {
    /// From megabits per second (how datasheets quote crypto throughput).
    pub const fn mbit(mbit_per_sec: u64) -> Throughput {
        Throughput::BytesPerSec(mbit_per_sec * 1_000_000 / 8)
    }

    /// Nanoseconds to move or process `bytes`, rounded up so that a
    /// non-empty transfer never takes zero time on a finite resource.
    pub fn nanos(self, bytes: u64) -> u64 {
        match self {
            Throughput::Unlimited => 0,
            Throughput::BytesPerSec(0) => u64::MAX,
            Throughput::BytesPerSec(rate) => {
                let ns = (u128::from(bytes) * 1_000_000_000).div_ceil(u128::from(rate));
                u64::try_from(ns).unwrap_or(u64::MAX)
            }
        }
    }
}

/// Host costs a real driver of the part pays and this machine cannot show:
/// there is no device register to write, no interrupt to take, no
/// descriptor written by a device to miss on. The model charges them (as
/// `EngineCounters::modelled_host_ns`) so that the bench can add them to the
/// host time it measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HostCosts {
    /// One doorbell per burst: an uncached MMIO write to the channel's
    /// fetch register.
    pub doorbell: Duration,
    /// One interrupt: entry, the driver's handler (read and acknowledge the
    /// status register, an uncached MMIO read), and exit.
    pub interrupt: Duration,
    /// One cache miss to DRAM.
    pub cache_miss: Duration,
    /// Cache lines the host misses on per completion: the descriptor's
    /// status (done) word, written by the device, and the job-ring entry.
    pub misses_per_completion: u32,
}

impl HostCosts {
    /// A PCIe device driven by a current x86 server core under Linux.
    ///
    /// - `doorbell` 200 ns: an uncached (UC) MMIO store is posted, but the
    ///   core orders UC stores one at a time; Intel's forum thread "Why do
    ///   MemReq TLPs take 100s nanoseconds to be generated after MMIO
    ///   writes?" (community.intel.com, 2020) measures 50–300 ns between
    ///   successive UC writes from the kernel (`writeq`).
    /// - `interrupt` 2 µs: Tsafrir, "The context-switch overhead inflicted
    ///   by hardware interrupts (and the enigma of do-nothing loops)",
    ///   ExpCS 2007, puts the direct cost of an interrupt on Linux/x86 at
    ///   around a microsecond before cache effects; the handler's status
    ///   read is a non-posted PCIe MMIO read, which Miller et al.,
    ///   "Motivating future interconnects: a differential measurement
    ///   analysis of PCI latency", ANCS 2009, measure at several hundred ns
    ///   to over 1 µs. The sum is an estimate, rounded.
    /// - `cache_miss` 90 ns: the idle DRAM load latency of current Xeon
    ///   servers as Intel Memory Latency Checker reports it (80–100 ns);
    ///   Drepper, "What Every Programmer Should Know About Memory", 2007,
    ///   gives the same order (~240 cycles).
    /// - `misses_per_completion` 2: the status word and the ring entry,
    ///   each written by the device and so not in the host's cache.
    pub const fn pcie_x86() -> HostCosts {
        HostCosts {
            doorbell: Duration::from_nanos(200),
            interrupt: Duration::from_nanos(2_000),
            cache_miss: Duration::from_nanos(90),
            misses_per_completion: 2,
        }
    }

    /// An on-chip engine (SEC 2.x on the MPC8548E's CCSR space) driven by
    /// the e500v2 core at 1.33 GHz under Linux.
    ///
    /// - `doorbell` 50 ns: a guarded, cache-inhibited store to the on-chip
    ///   CCSR space over the 533 MHz core complex bus; an estimate of a few
    ///   tens of bus cycles, not a measured figure.
    /// - `interrupt` 3 µs: the same Linux entry/exit and handler path as
    ///   above (Tsafrir, ExpCS 2007) on a core about half as fast, plus the
    ///   OpenPIC acknowledge; an estimate.
    /// - `cache_miss` 120 ns: DDR2-533 behind the e500's L2, the order of
    ///   the MPC8548E's published memory latency; an estimate.
    pub const fn on_chip_e500() -> HostCosts {
        HostCosts {
            doorbell: Duration::from_nanos(50),
            interrupt: Duration::from_nanos(3_000),
            cache_miss: Duration::from_nanos(120),
            misses_per_completion: 2,
        }
    }

    /// No host cost at all (to isolate the device in a comparison).
    pub const fn zero() -> HostCosts {
        HostCosts {
            doorbell: Duration::ZERO,
            interrupt: Duration::ZERO,
            cache_miss: Duration::ZERO,
            misses_per_completion: 0,
        }
    }

    /// What one completion costs the host in cache misses.
    pub fn per_completion(&self) -> Duration {
        self.cache_miss * self.misses_per_completion
    }
}

impl Default for HostCosts {
    fn default() -> Self {
        HostCosts::pcie_x86()
    }
}

/// The execution-unit kinds of a SEC 2.x-class part.
///
/// Names (the engine counters' `eu_busy_ns` keys) are the variants in
/// kebab case, derived.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, strum::VariantArray, strum::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum EuKind {
    /// AES (CBC, and GCM, modelled at the same rate).
    Aesu,
    /// DES and 3DES.
    Deu,
    /// Message digest unit running SHA-1 (HMAC).
    MdeuSha1,
    /// Message digest unit running SHA-256 (HMAC).
    MdeuSha256,
    /// No cipher: data passes through (ESP-NULL).
    Null,
}

impl EuKind {
    /// Every kind, in the order of [`DeviceProfile::units`].
    pub const ALL: [EuKind; <EuKind as strum::VariantArray>::VARIANTS.len()] =
        crate::variant_array(<EuKind as strum::VariantArray>::VARIANTS);

    /// The kind's place in [`ALL`](Self::ALL) and [`DeviceProfile::units`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The counters' name of the kind (`aesu`, `mdeu-sha1`, ...).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// One execution-unit kind's speed and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EuRate {
    /// Bytes per second one instance walks.
    pub throughput: Throughput,
    /// Instances of the unit; a descriptor takes whichever is free first.
    pub instances: u32,
}

/// A modelled part; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceProfile {
    /// The name the command line and the config use.
    pub name: &'static str,
    /// One line for reports: what part the numbers describe.
    pub summary: &'static str,
    /// Per-descriptor work that occupies the channel: header decode,
    /// execution-unit reset and key load.
    pub setup: Duration,
    /// Per-descriptor delay that occupies nothing (pipelined DMA round
    /// trips, firmware queueing of a PCIe part): added to each completion.
    pub latency: Duration,
    /// The bus between the device and memory, shared by all channels.
    pub bus: Throughput,
    /// By [`EuKind::index`].
    pub units: [EuRate; EuKind::ALL.len()],
    /// Channels (job rings) of the part: the `SecConfig` default.
    pub channels: usize,
    /// Descriptors a channel's fetch FIFO holds: the `SecConfig` default.
    pub fifo_depth: usize,
    /// Host costs the part's driver incurs that this machine cannot show.
    pub host: HostCosts,
}

/// A profile name that is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device profile `{0}`; expected one of: {names}", names = DeviceProfile::NAMES.join(", "))]
pub struct UnknownProfile(pub String);

impl DeviceProfile {
    /// Every profile `by_name` knows, for the command line.
    pub const NAMES: [&'static str; 3] = ["none", "sec2-266mhz", "qat-class"];

    /// The profile named `name`, one of [`NAMES`](Self::NAMES).
    pub fn by_name(name: &str) -> Result<DeviceProfile, UnknownProfile> {
        DeviceProfile::all()
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| UnknownProfile(name.to_owned()))
    }

    /// Every known profile.
    pub fn all() -> [DeviceProfile; 3] {
        [
            DeviceProfile::none(),
            DeviceProfile::sec2_266mhz(),
            DeviceProfile::qat_class(),
        ]
    }

    /// An infinitely fast engine: every descriptor completes at the `now`
    /// it was submitted at. What remains is the boundary's host cost alone
    /// (the software path, measured, and [`HostCosts::pcie_x86`], modelled).
    pub fn none() -> DeviceProfile {
        let unlimited = EuRate {
            throughput: Throughput::Unlimited,
            instances: 1,
        };
        DeviceProfile {
            name: "none",
            summary: "infinitely fast engine: the boundary's host cost alone",
            setup: Duration::ZERO,
            latency: Duration::ZERO,
            bus: Throughput::Unlimited,
            units: [unlimited; EuKind::ALL.len()],
            channels: 4,
            fifo_depth: 24,
            host: HostCosts::pcie_x86(),
        }
    }

    /// Freescale MPC8548E, SEC 2.1 at 266 MHz, e500v2 host at 1.33 GHz.
    ///
    /// - 4 channels with a 24-entry fetch FIFO each, one instance of each
    ///   execution unit: the MPC8548E example of the Linux device-tree
    ///   binding `Documentation/devicetree/bindings/crypto/fsl,sec2.0.yaml`
    ///   (`fsl,num-channels = <4>`, `fsl,channel-fifo-len = <24>`,
    ///   `fsl,exec-units-mask = <0xfe>`).
    /// - AESU 1 Gbit/s, DEU (3DES) 440 Mbit/s, MDEU SHA-1 1 Gbit/s, SHA-256
    ///   0.88 Gbit/s, a 64-bit bus at ~1 GB/s effective, ~1 µs setup per
    ///   descriptor: carried over unchanged from the earlier
    ///   `RateModel::sec2_266mhz`, which rounded Freescale's published SEC
    ///   2.x throughput figures for the part class (application notes on
    ///   PowerQUICC security performance); not re-verified against a
    ///   datasheet in this change.
    /// - The MDEU snoops the cipher unit's input or output FIFO (the SEC
    ///   reference manuals' "in-snooping"/"out-snooping"), which is why a
    ///   single-pass descriptor costs the slower unit's time, not the sum.
    pub fn sec2_266mhz() -> DeviceProfile {
        let one = |throughput| EuRate {
            throughput,
            instances: 1,
        };
        DeviceProfile {
            name: "sec2-266mhz",
            summary: "Freescale MPC8548E SEC 2.1 at 266 MHz (on-chip, e500v2 host)",
            setup: Duration::from_nanos(1_000),
            latency: Duration::ZERO,
            bus: Throughput::BytesPerSec(1_000_000_000),
            units: [
                one(Throughput::BytesPerSec(125_000_000)),
                one(Throughput::BytesPerSec(55_000_000)),
                one(Throughput::BytesPerSec(125_000_000)),
                one(Throughput::BytesPerSec(110_000_000)),
                one(Throughput::Unlimited),
            ],
            channels: 4,
            fifo_depth: 24,
            host: HostCosts::on_chip_e500(),
        }
    }

    /// A modern PCIe look-aside part of the Intel QuickAssist 8970 class.
    ///
    /// - ~100 Gbit/s aggregate bulk crypto: the Intel QuickAssist Adapter
    ///   8970 product brief ("up to 100 Gbps" symmetric crypto), modelled as
    ///   8 instances per unit kind at 12.5 Gbit/s each, so that one packet
    ///   sees one slice's speed and many in flight see the aggregate. 3DES
    ///   at a tenth of AES is an estimate (DES is not quoted).
    /// - PCIe Gen3 x16 bus, ~12 GB/s effective of 15.75 GB/s raw.
    /// - 3 µs pipelined latency per request (descriptor and data DMA round
    ///   trips over PCIe, firmware dispatch): an estimate of the order Intel's
    ///   QAT Performance Optimization Guide (330687) implies when it asks
    ///   for many requests in flight per ring to reach throughput; 100 ns of
    ///   per-descriptor setup on the ring.
    /// - 8 rings (channels) of 128 entries: an estimate of a typical
    ///   per-process ring configuration.
    pub fn qat_class() -> DeviceProfile {
        let slices = |mbit| EuRate {
            throughput: Throughput::mbit(mbit),
            instances: 8,
        };
        DeviceProfile {
            name: "qat-class",
            summary: "PCIe look-aside part of the Intel QAT 8970 class (~100 Gbit/s, µs latency)",
            setup: Duration::from_nanos(100),
            latency: Duration::from_nanos(3_000),
            bus: Throughput::BytesPerSec(12_000_000_000),
            units: [
                slices(12_500),
                slices(1_250),
                slices(12_500),
                slices(12_500),
                EuRate {
                    throughput: Throughput::Unlimited,
                    instances: 8,
                },
            ],
            channels: 8,
            fifo_depth: 128,
            host: HostCosts::pcie_x86(),
        }
    }

    /// The speed and count of the units of `kind`.
    pub fn unit(&self, kind: EuKind) -> EuRate {
        self.units[kind.index()]
    }
}

impl Default for DeviceProfile {
    fn default() -> Self {
        DeviceProfile::sec2_266mhz()
    }
}

impl fmt::Display for DeviceProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl std::str::FromStr for DeviceProfile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeviceProfile::by_name(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `NAMES` is the command line's and the config's list: it must be
    /// `all()`'s names, in order, and keep every published one.
    #[test]
    fn names_round_trip_and_unknown_lists_them() {
        assert_eq!(DeviceProfile::all().map(|p| p.name), DeviceProfile::NAMES);
        assert_eq!(DeviceProfile::NAMES, ["none", "sec2-266mhz", "qat-class"]);
        for (name, profile) in DeviceProfile::NAMES.iter().zip(DeviceProfile::all()) {
            assert_eq!(profile.name, *name);
            assert_eq!(DeviceProfile::by_name(name), Ok(profile));
        }
        let err = DeviceProfile::by_name("sec3").unwrap_err().to_string();
        for name in DeviceProfile::NAMES {
            assert!(err.contains(name), "{err}");
        }
    }

    /// The unit names are keys of the engine counters' `eu_busy_ns`.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        let names: Vec<&str> = EuKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["aesu", "deu", "mdeu-sha1", "mdeu-sha256", "null"]);
        for (i, kind) in EuKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), i);
        }
    }

    #[test]
    fn throughput_rounds_up_in_integer_nanoseconds() {
        let gbyte = Throughput::BytesPerSec(1_000_000_000);
        assert_eq!(gbyte.nanos(0), 0);
        assert_eq!(gbyte.nanos(1), 1);
        assert_eq!(gbyte.nanos(64), 64);
        assert_eq!(Throughput::BytesPerSec(3).nanos(1), 333_333_334);
        assert_eq!(Throughput::Unlimited.nanos(u64::MAX), 0);
        assert_eq!(Throughput::mbit(8), Throughput::BytesPerSec(1_000_000));
    }
}
