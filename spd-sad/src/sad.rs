//! The Security Association Database (RFC 4301 §4.4.2): per-SA sequence
//! state, anti-replay window, lifetimes and counters, looked up by SPI on the
//! way in and by policy on the way out.
//!
//! Generic over `C`, the crypto context an SA carries (an `accel` session in
//! espgw), so this crate stays free of cryptography. Dropping an SA drops its
//! context, which is where keys are zeroized.

use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::drop::DropReason;
use crate::replay::{ReplayError, ReplayWindow};
use crate::selector::{FlowKey, Selector};

/// Names one SA of a database while it exists: a slot (low
/// [`SaId::SLOT_BITS`] bits) and the slot's generation (the high bits).
/// A slot is reused after its SA is removed, under a new generation, so a
/// job still in flight for a removed SA finds nothing rather than the SA
/// that took its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SaId(pub u32);

impl SaId {
    /// Up to 2^20 SAs at once; 4096 generations before a slot's ids repeat.
    pub const SLOT_BITS: u32 = 20;
    const SLOT_MASK: u32 = (1 << Self::SLOT_BITS) - 1;

    fn new(slot: usize, generation: u32) -> SaId {
        SaId((generation << Self::SLOT_BITS) | (slot as u32 & Self::SLOT_MASK))
    }

    /// The table slot: dense, for side tables indexed by SA (check the
    /// whole id before trusting an entry; slots are reused).
    pub fn slot(self) -> usize {
        (self.0 & Self::SLOT_MASK) as usize
    }

    fn generation(self) -> u32 {
        self.0 >> Self::SLOT_BITS
    }
}

/// An SA's direction. Its name (the config's `direction`, SA names, JSON)
/// is written once, beside the variant; parsing and `Display` derive from it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumString, strum::VariantNames, strum::IntoStaticStr,
)]
pub enum SaDirection {
    /// We encapsulate with it.
    #[strum(serialize = "out")]
    Outbound,
    /// We decapsulate with it.
    #[strum(serialize = "in")]
    Inbound,
}

// Not derived: strum's `Display` honours a width, which would change how
// the `{:<N}` columns of `espgw check-config` print today.
impl fmt::Display for SaDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.into())
    }
}

/// An SA's mode; its name (the config's `mode`, JSON) is the variant in
/// lower case, derived for parsing and `Display`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumString, strum::VariantNames, strum::IntoStaticStr,
)]
#[strum(serialize_all = "lowercase")]
pub enum Mode {
    /// The whole inner IP packet is protected and a new outer header added.
    Tunnel,
    /// ESP is inserted after the packet's own IP header.
    Transport,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.into())
    }
}

/// Limits of one kind (soft or hard); `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Bytes of protected (inner) data.
    pub bytes: Option<u64>,
    /// Packets protected or verified.
    pub packets: Option<u64>,
    /// Seconds since the SA was installed.
    pub seconds: Option<u64>,
    /// Seconds since the SA's last packet (since its installation before
    /// the first): an idle SA is retired or rekeyed like any other.
    pub idle_seconds: Option<u64>,
}

impl Limits {
    /// The earliest time one of the time limits could be reached, for an
    /// SA installed at `installed_at` whose last packet (over every copy,
    /// as far as known) was at `last_active`. Idle limits move later with
    /// every packet, so this is a lower bound, looked at again when it comes.
    fn next_deadline(&self, installed_at: Duration, last_active: Duration) -> Option<Duration> {
        let after = |base: Duration, seconds: Option<u64>| {
            seconds.and_then(|s| base.checked_add(Duration::from_secs(s)))
        };
        [
            after(installed_at, self.seconds),
            after(last_active, self.idle_seconds),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn reached(&self, bytes: u64, packets: u64, age: Duration, idle: Duration) -> bool {
        self.bytes.is_some_and(|b| bytes >= b)
            || self.packets.is_some_and(|p| packets >= p)
            || self.seconds.is_some_and(|s| age >= Duration::from_secs(s))
            || self.idle_seconds.is_some_and(|s| idle >= Duration::from_secs(s))
    }
}

/// RFC 4301 §4.4.2.1 lifetimes: whichever limit comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lifetime {
    /// Reaching one of these starts a rekey; the SA goes on working.
    pub soft: Limits,
    /// Reaching one of these ends the SA.
    pub hard: Limits,
}

/// Where an SA is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaState {
    /// In use, no limit reached.
    Active,
    /// A soft limit was reached; the SA still works and a rekey should start.
    SoftExpired,
    /// A hard limit was reached (or the sequence space is used up); the SA
    /// must not be used again.
    HardExpired,
}

/// Things the control plane should hear about. Produced only on state
/// transitions, never per packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaEvent {
    /// A soft limit was reached: rekey.
    SoftExpired(SaId),
    /// A hard limit was reached: the SA no longer carries traffic.
    HardExpired(SaId),
}

/// The drop reasons an SA's own packets can meet, in the order `espgw
/// stats`, `espgw sa list` and the per-SA metrics list them, each shown
/// even while it is 0. Only these are counted per SA: the others are
/// decided before a packet has an SA, or have nothing to do with one.
pub const SA_DROP_REASONS: [DropReason; 9] = [
    DropReason::AuthFailed,
    DropReason::ReplayDuplicate,
    DropReason::ReplayTooOld,
    DropReason::SeqZero,
    DropReason::PolicyMismatch,
    DropReason::Malformed,
    DropReason::SaExpired,
    DropReason::SeqOverflow,
    DropReason::SeqNotReserved,
];

/// Where each reason's count sits in [`SaCounters`]: its position in
/// [`SA_DROP_REASONS`], or [`NOT_PER_SA`] for the others. Only those nine
/// take room, as every SA (and every worker's copy of it) has counters.
const SA_SLOTS: [u8; DropReason::COUNT] = {
    let mut slots = [NOT_PER_SA; DropReason::COUNT];
    let mut i = 0;
    while i < SA_DROP_REASONS.len() {
        slots[SA_DROP_REASONS[i].index()] = i as u8;
        i += 1;
    }
    slots
};

/// The slot of a reason no SA counts.
const NOT_PER_SA: u8 = u8::MAX;

/// Per-SA counters: its traffic, and its drops under the same
/// [`DropReason`]s as the gateway's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaCounters {
    /// Packets protected (outbound) or verified (inbound).
    pub packets: u64,
    /// Bytes of protected (inner) data.
    pub bytes: u64,
    /// By the reason's position in [`SA_DROP_REASONS`].
    drops: [u64; SA_DROP_REASONS.len()],
}

impl SaCounters {
    /// Counts one packet dropped for `reason`, which must be one of
    /// [`SA_DROP_REASONS`]: another is a bug (caught in debug builds) and
    /// is not counted, as it would never be reported.
    pub fn count(&mut self, reason: DropReason) {
        match SA_SLOTS[reason.index()] {
            NOT_PER_SA => debug_assert!(false, "{reason} is not counted per SA"),
            slot => self.drops[usize::from(slot)] += 1,
        }
    }

    /// Packets dropped for `reason` (0 for a reason not counted per SA).
    pub fn get(&self, reason: DropReason) -> u64 {
        match SA_SLOTS[reason.index()] {
            NOT_PER_SA => 0,
            slot => self.drops[usize::from(slot)],
        }
    }

    /// The drops by reason, every one of [`SA_DROP_REASONS`] (zero or
    /// not), in that order.
    pub fn drops(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        SA_DROP_REASONS.iter().copied().zip(self.drops.iter().copied())
    }

    /// Counts an anti-replay refusal under its kind (RFC 4303 §3.4.3).
    pub fn count_replay(&mut self, e: ReplayError) {
        self.count(e.into());
    }

    /// Every anti-replay refusal.
    pub fn replay(&self) -> u64 {
        self.drops().filter(|(r, _)| r.is_replay()).map(|(_, n)| n).sum()
    }
}

/// The UDP ports of an RFC 3948 encapsulated SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpEncap {
    /// Ours: the source port outbound, the destination port inbound.
    pub local_port: u16,
    /// The peer's, until an authenticated packet shows that its NAT mapped
    /// it to another (see the dataplane's peer learning).
    pub remote_port: u16,
}

impl UdpEncap {
    /// RFC 3948 §2: port 4500 both ways.
    pub const NAT_T: UdpEncap = UdpEncap {
        local_port: 4500,
        remote_port: 4500,
    };
}

/// The configuration an SA is created from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaParams {
    /// Unique in the database; how configuration, logs and `espgw sa` name it.
    pub name: String,
    /// Which way its traffic goes.
    pub direction: SaDirection,
    /// The Security Parameter Index in its ESP headers (RFC 4303 §2.1).
    pub spi: u32,
    /// Tunnel or transport.
    pub mode: Mode,
    /// Our end (outer source for outbound, expected outer destination for inbound).
    pub local: IpAddr,
    /// The peer's end (outer destination for outbound, expected outer source
    /// for inbound).
    pub remote: IpAddr,
    /// Extended (64-bit) sequence numbers (RFC 4303 §2.2.1).
    pub esn: bool,
    /// Inbound: the anti-replay window's size, in packets (0: no replay check).
    pub replay_window: u32,
    /// When the SA must be rekeyed and when it ends.
    pub lifetime: Lifetime,
    /// RFC 3948 UDP encapsulation: ESP inside UDP between these ports, for
    /// peers behind a NAT. `None`: raw ESP (IP protocol 50). An SA of one
    /// kind refuses packets of the other, as Linux XFRM does.
    pub encap: Option<UdpEncap>,
    /// For inbound SAs: what may arrive through this SA (RFC 4301 §5.2
    /// step 4). Empty admits nothing, and [`Sad::insert`] refuses an
    /// inbound SA without selectors: an SA that admits anything says so
    /// with [`Selector::ANY`]. Outbound SAs leave this empty.
    pub selectors: Vec<Selector>,
}

/// Sequence numbers an outbound SA keeps in reserve: once fewer are left, it
/// is soft-expired so that a rekey can finish before the counter runs out.
pub const SEQUENCE_RESERVE: u64 = 1 << 24;

/// Sequence numbers an outbound SA that no other worker shares takes from
/// its counter at once, so that the fast path touches the atomic once a
/// block rather than once a packet (DPDK's per-burst reservation); the
/// numbers stay consecutive. Copies shared by several workers take one at a
/// time (see `next_sequence`).
pub const SEQUENCE_BLOCK: u64 = 32;

/// Packets a copy counts locally before adding them to the shared usage
/// (sooner when a lifetime limit is nearer than that).
pub const USAGE_BATCH: u64 = 32;

/// What one SA's state may take, in bytes, with a replay window of up to
/// 1,024 packets, a name of up to 32 bytes and one selector, apart from
/// its crypto context's heap (see [`SecurityAssociation::state_bytes`]; a
/// test holds it).
pub const SA_STATE_BOUND: usize = 800;

/// SAs a tick adds up, and deadlines it looks at, at most (some 50-100 µs
/// of cold SAs here), so that a tick is never a long pause for the dataplane
/// whatever the table's size; the rest go to the next call.
pub const TICK_BUDGET: usize = 1024;

/// How far ahead of the SA it adds up the tick loads the next ones.
const PREFETCH_AHEAD: usize = 6;

/// Bytes one packet can add to an SA's usage, at most (a jumbo-free frame).
const BIGGEST_PACKET: u64 = 2048;

/// Why an outbound SA cannot give out another sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    /// RFC 4303 §3.3.3: the counter must not cycle; the SA needs rekeying.
    #[error("sequence number space exhausted; the SA must be rekeyed")]
    Exhausted,
    /// The next number lies beyond the SA's durable ceiling (see
    /// [`SaShared::raise_ceiling`]): the driver has not yet made it
    /// durable, so it may not be sent (it could be sent again after a
    /// restart).
    #[error("the next sequence number is not reserved in the state directory yet")]
    NotReserved,
}

/// An SA's sequence state, handed from an SA to its successor when a
/// reload changes the SA but keeps its keys.
#[derive(Debug, Clone)]
pub struct SequenceState {
    /// Outbound: the last sequence number any copy reserved or used.
    pub last_reserved: u64,
    /// Inbound: the anti-replay window.
    pub window: ReplayWindow,
}

/// The part of an SA that every worker's copy shares: the outbound
/// sequence counter (so numbers stay unique across workers) and the usage
/// that lifetimes are measured against. Copies reserve numbers a block at a
/// time and add their usage in batches (see [`SEQUENCE_BLOCK`],
/// [`USAGE_BATCH`]), so no packet touches these on its own.
///
/// With static keys, the driver keeps the SA's sequence numbers in a
/// state directory: it reads how far the SA has got here
/// ([`reserved`](Self::reserved), [`inbound_seen`](Self::inbound_seen)),
/// makes a higher ceiling durable, and only then raises
/// [`ceiling`](Self::ceiling). Copies compare against a cached ceiling
/// and look here only when a number would pass it.
#[derive(Debug)]
pub struct SaShared {
    /// Outbound: last sequence number reserved by any copy (the first
    /// packet gets 1).
    last_seq: AtomicU64,
    /// Outbound: the highest number any copy had sent at its last flush
    /// (for `sa show`: the owner may be a worker other than the one asked).
    last_sent: AtomicU64,
    packets: AtomicU64,
    bytes: AtomicU64,
    /// The latest packet any copy had counted at its last flush, in
    /// nanoseconds of the caller's clock (0: none yet).
    last_active_ns: AtomicU64,
    /// The highest sequence number any copy may send (outbound) or accept
    /// (inbound): what the driver has made durable. `u64::MAX`: no limit
    /// (keys that are new at every start need none).
    ceiling: AtomicU64,
    /// Inbound: the window's top at the owner's last flush, or the highest
    /// authenticated number refused for lying beyond the ceiling (the peer
    /// resumed above it), whichever is higher: what the driver reserves
    /// from.
    inbound_seen: AtomicU64,
}

impl Default for SaShared {
    fn default() -> Self {
        SaShared {
            last_seq: AtomicU64::new(0),
            last_sent: AtomicU64::new(0),
            packets: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            last_active_ns: AtomicU64::new(0),
            ceiling: AtomicU64::new(u64::MAX),
            inbound_seen: AtomicU64::new(0),
        }
    }
}

impl SaShared {
    /// The SA's durable ceiling (`u64::MAX`: none).
    pub fn ceiling(&self) -> u64 {
        self.ceiling.load(Ordering::Acquire)
    }

    /// Lets every copy use numbers up to `ceiling` (never lowers it). The
    /// driver calls this only once `ceiling` is durable.
    pub fn raise_ceiling(&self, ceiling: u64) {
        self.ceiling.fetch_max(ceiling, Ordering::AcqRel);
    }

    /// Outbound: the last sequence number any copy has reserved (used or
    /// about to be).
    pub fn reserved(&self) -> u64 {
        self.last_seq.load(Ordering::Relaxed)
    }

    /// Inbound: the highest number accepted as of the owner's last flush,
    /// or refused only for lying beyond the ceiling, whichever is higher.
    pub fn inbound_seen(&self) -> u64 {
        self.inbound_seen.load(Ordering::Relaxed)
    }
}

/// One security association.
pub struct SecurityAssociation<C> {
    params: SaParams,
    shared: Arc<SaShared>,
    /// Inbound: owned by the one worker that receives this SA's packets.
    replay: ReplayWindow,
    installed_at: Duration,
    /// When this copy last counted a packet (its installation before).
    last_active: Duration,
    state: SaState,
    /// This copy's drop counters (packets and bytes live in `shared`).
    counters: SaCounters,
    /// Inbound packets of this SA between prepare and finish, and the
    /// highest sequence number among them: what the window may still move
    /// to before the next packet's turn (see [`Self::inference_settled`]).
    inbound_in_flight: u32,
    in_flight_top: u64,
    /// Outbound: this copy's reserved block of sequence numbers,
    /// `seq_next..=seq_end` (empty when `seq_next > seq_end`), and the last
    /// one it used.
    seq_next: u64,
    seq_end: u64,
    last_used: u64,
    /// This copy's view of the shared ceiling: numbers up to it need no
    /// look at the shared state.
    ceiling: u64,
    /// With several workers placed (see [`Sad::place`]): whether the driver
    /// steers this SA's packets to this copy's worker (outbound: by the
    /// outer addresses, [`owner_worker`]; inbound: by SPI,
    /// [`inbound_owner`]). `None` (not placed): a copy alone is treated as
    /// the owner.
    owner: Option<bool>,
    /// Usage counted here and not yet added to `shared`, and how much may
    /// gather before it must be (a batch, or less when a limit is near).
    unflushed_packets: u64,
    unflushed_bytes: u64,
    flush_packets: u64,
    flush_bytes: u64,
    /// Within a batch per copy of a byte or packet limit: count every
    /// packet at once and check the shared usage before each.
    near_limit: bool,
    /// Whether the database's list of SAs used since the last tick holds
    /// this one (see [`Sad::account`]).
    listed: bool,
    /// The deadline of this SA's entry in the database's timer heap, if it
    /// has one; an entry with any other deadline is stale.
    scheduled: Option<Duration>,
    crypto: C,
}

impl<C> fmt::Debug for SecurityAssociation<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecurityAssociation")
            .field("name", &self.params.name)
            .field("spi", &format_args!("{:#010x}", self.params.spi))
            .field("direction", &self.params.direction)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<C> SecurityAssociation<C> {
    /// An SA installed at `now`, with its crypto context, sequence numbers from
    /// 1 and an empty replay window.
    pub fn new(params: SaParams, crypto: C, now: Duration) -> Self {
        SecurityAssociation {
            replay: ReplayWindow::new(params.replay_window, params.esn),
            params,
            shared: Arc::new(SaShared::default()),
            installed_at: now,
            last_active: now,
            state: SaState::Active,
            counters: SaCounters::default(),
            inbound_in_flight: 0,
            in_flight_top: 0,
            seq_next: 1,
            seq_end: 0,
            last_used: 0,
            ceiling: u64::MAX,
            owner: None,
            unflushed_packets: 0,
            unflushed_bytes: 0,
            flush_packets: 1,
            flush_bytes: 1,
            near_limit: true,
            listed: false,
            scheduled: None,
            crypto,
        }
    }

    /// What the SA was created from.
    pub fn params(&self) -> &SaParams {
        &self.params
    }

    /// The SA's unique name.
    pub fn name(&self) -> &str {
        &self.params.name
    }

    /// The SA's SPI.
    pub fn spi(&self) -> u32 {
        self.params.spi
    }

    /// The crypto context the SA carries (keys live there).
    pub fn crypto(&self) -> &C {
        &self.crypto
    }

    /// The crypto context, for the gateway that registers it with its own
    /// engine (a fork for another worker).
    pub fn crypto_mut(&mut self) -> &mut C {
        &mut self.crypto
    }

    /// Where the SA is in its life.
    pub fn state(&self) -> SaState {
        self.state
    }

    /// The anti-replay window (inbound; unused outbound).
    pub fn replay_window(&self) -> &ReplayWindow {
        &self.replay
    }

    /// Starts the outbound counter after `seq` (tests use this to cross 2^32).
    pub fn set_last_sequence(&mut self, seq: u64) {
        self.shared.last_seq.store(seq, Ordering::Relaxed);
        self.shared.last_sent.store(seq, Ordering::Relaxed);
        self.seq_next = 1;
        self.seq_end = 0;
        self.last_used = seq;
    }

    /// Counters: packets and bytes over every worker (as far as the other
    /// copies have added theirs: at least once a batch and at every tick),
    /// drops of this copy.
    pub fn counters(&self) -> SaCounters {
        let (bytes, packets) = self.usage();
        SaCounters {
            packets,
            bytes,
            ..self.counters
        }
    }

    /// Bytes and packets: the shared usage plus this copy's unflushed part.
    fn usage(&self) -> (u64, u64) {
        (
            self.shared.bytes.load(Ordering::Relaxed) + self.unflushed_bytes,
            self.shared.packets.load(Ordering::Relaxed) + self.unflushed_packets,
        )
    }

    /// Adds this copy's usage to the shared one and works out how much may
    /// gather before the next time: a batch, but never past a byte or
    /// packet limit, so that a single worker's lifetimes stay exact.
    pub fn flush_usage(&mut self) {
        let bytes = self
            .shared
            .bytes
            .fetch_add(self.unflushed_bytes, Ordering::Relaxed)
            + self.unflushed_bytes;
        let packets = self
            .shared
            .packets
            .fetch_add(self.unflushed_packets, Ordering::Relaxed)
            + self.unflushed_packets;
        self.unflushed_bytes = 0;
        self.unflushed_packets = 0;
        if self.last_used > 0 {
            self.shared.last_sent.fetch_max(self.last_used, Ordering::Relaxed);
        }
        // For the driver that reserves inbound ceilings (once a batch,
        // like the usage).
        if self.ceiling != u64::MAX && self.replay.top() > 0 {
            self.shared
                .inbound_seen
                .fetch_max(self.replay.top(), Ordering::Relaxed);
        }
        if self.last_active > self.installed_at {
            let ns = u64::try_from(self.last_active.as_nanos()).unwrap_or(u64::MAX);
            self.shared.last_active_ns.fetch_max(ns, Ordering::Relaxed);
        }
        let lifetime = &self.params.lifetime;
        let before = |used: u64, limits: [Option<u64>; 2]| {
            limits
                .into_iter()
                .flatten()
                .filter(|l| *l > used)
                .map(|l| l - used)
                .min()
        };
        // Every copy may gather a batch unseen by the others: batch only
        // while the nearest limit is further off than all of them together
        // could go, and count each packet at once near it, so that limits
        // hold over all workers too.
        let copies = Arc::strong_count(&self.shared) as u64;
        let packets_near = before(packets, [lifetime.soft.packets, lifetime.hard.packets])
            .is_some_and(|left| left <= copies * USAGE_BATCH);
        let bytes_near = before(bytes, [lifetime.soft.bytes, lifetime.hard.bytes])
            .is_some_and(|left| left <= copies * USAGE_BATCH * BIGGEST_PACKET);
        self.near_limit = packets_near || bytes_near;
        (self.flush_packets, self.flush_bytes) = if self.near_limit {
            (1, 1)
        } else {
            (USAGE_BATCH, USAGE_BATCH * BIGGEST_PACKET)
        };
    }

    /// This copy's drop counters, to count into.
    pub fn counters_mut(&mut self) -> &mut SaCounters {
        &mut self.counters
    }

    /// A copy for another worker: same parameters, keys and shared
    /// counters; its own replay window (only one worker receives an
    /// inbound SA's packets), its own block of sequence numbers and its
    /// own drop counters.
    pub fn fork(&self) -> SecurityAssociation<C>
    where
        C: Clone,
    {
        // What a copy keeps of its own (counters, in-flight marks, its
        // sequence block, owner, flush thresholds, its place in the tick)
        // starts as in a new SA; the rest is this one's.
        SecurityAssociation {
            shared: Arc::clone(&self.shared),
            replay: self.replay.clone(),
            last_active: self.last_active,
            state: self.state,
            last_used: self.last_used,
            ceiling: self.ceiling,
            ..SecurityAssociation::new(self.params.clone(), self.crypto.clone(), self.installed_at)
        }
    }

    fn place(&mut self, worker: usize, workers: usize) {
        if self.params.direction == SaDirection::Inbound {
            self.owner = Some(inbound_owner(self.params.spi, workers) == worker);
        }
        if self.params.direction == SaDirection::Outbound {
            self.owner = Some(owner_worker(self.params.local, self.params.remote, workers) == worker);
            // A block reserved before the placement may belong to a worker
            // that no longer sends: give it up.
            if self.owner == Some(false) {
                self.seq_next = 1;
                self.seq_end = 0;
            }
        }
    }

    /// Whether this copy's worker is the one the SA's packets are steered to
    /// (see [`Sad::place`]); `None` when the copies are not placed.
    pub fn owner(&self) -> Option<bool> {
        self.owner
    }

    /// What a successor with the same keys takes over (see
    /// [`SecurityAssociation::resume`]).
    pub fn sequence_state(&self) -> SequenceState {
        SequenceState {
            last_reserved: self.reserved_sequence().max(self.last_used),
            window: self.replay.clone(),
        }
    }

    /// Continues where the SA that had the same keys stopped: outbound,
    /// after every number any copy of it reserved; inbound, with its replay
    /// window (resized to this SA's), so that no (key, sequence number) is
    /// sent or accepted twice.
    pub fn resume(&mut self, state: &SequenceState) {
        match self.params.direction {
            SaDirection::Outbound => {
                let after = state.last_reserved.max(self.reserved_sequence());
                self.set_last_sequence(after);
            }
            SaDirection::Inbound => self.replay = state.window.resized(self.params.replay_window),
        }
    }

    /// Resumes the inbound window at `top`.
    pub fn set_replay_top(&mut self, top: u64) {
        self.replay = ReplayWindow::with_top(self.params.replay_window, self.params.esn, top);
    }

    /// Puts the SA under a durable ceiling, for keys that are the same at
    /// every start: it resumes above `mark`, the highest number it may
    /// have sent or accepted before (outbound: the counter goes on after
    /// it; inbound: every number up to it counts as received), and uses
    /// no number beyond its ceiling, which stays at the resume point until
    /// the driver raises it ([`SaShared::raise_ceiling`]). Call before the
    /// SA is forked or used.
    pub fn resume_above(&mut self, mark: u64) {
        let resume = match self.params.direction {
            SaDirection::Outbound => {
                let resume = mark.max(self.reserved_sequence());
                self.set_last_sequence(resume);
                resume
            }
            SaDirection::Inbound => {
                let resume = mark.max(self.replay.top());
                self.replay = ReplayWindow::resumed(self.params.replay_window, self.params.esn, resume);
                resume
            }
        };
        self.shared.ceiling.store(resume, Ordering::Release);
        self.ceiling = resume;
    }

    /// The state every copy shares, for a driver that keeps a reference to
    /// it (a `Weak` one leaves the copies' count alone).
    pub fn shared(&self) -> &Arc<SaShared> {
        &self.shared
    }

    /// The durable ceiling, if the SA has one (see [`Self::resume_above`]).
    pub fn ceiling(&self) -> Option<u64> {
        Some(self.shared.ceiling()).filter(|&c| c != u64::MAX)
    }

    /// Inbound: whether the authenticated number `seq` is within the
    /// durable ceiling and may be accepted. One comparison with this
    /// copy's cached ceiling; the shared one is looked at only when `seq`
    /// passes it, and a number still beyond it is noted for the driver to
    /// reserve (see [`SaShared::inbound_seen`]).
    #[inline]
    pub fn inbound_within_ceiling(&mut self, seq: u64) -> bool {
        if seq <= self.ceiling {
            return true;
        }
        self.ceiling = self.shared.ceiling();
        if seq <= self.ceiling {
            return true;
        }
        self.shared.inbound_seen.fetch_max(seq, Ordering::Relaxed);
        false
    }

    /// The last sequence number this copy sent, or another copy had sent
    /// when it last added its usage (every batch and every tick), if
    /// higher: for `sa show`, asked of worker 0 while another worker may
    /// own the SA.
    pub fn last_sequence(&self) -> u64 {
        self.last_used.max(self.shared.last_sent.load(Ordering::Relaxed))
    }

    /// The last sequence number reserved by any copy.
    fn reserved_sequence(&self) -> u64 {
        self.shared.last_seq.load(Ordering::Relaxed)
    }

    /// Time since the SA was installed.
    pub fn age(&self, now: Duration) -> Duration {
        now.saturating_sub(self.installed_at)
    }

    /// The memory this copy holds for the SA, in bytes, apart from what
    /// its crypto context `C` owns on the heap: the struct itself, the
    /// shared part (counted whole by every copy), the replay bitmap, the
    /// name and the selectors. Bounded by [`SA_STATE_BOUND`] plus the
    /// name, the selectors and a window above 1,024 packets.
    pub fn state_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + std::mem::size_of::<SaShared>()
            // Its places in the database's timer heap and list of SAs used.
            + std::mem::size_of::<Reverse<Timer>>()
            + std::mem::size_of::<SaId>()
            + self.replay.bitmap_bytes()
            + self.params.name.capacity()
            + self.params.selectors.capacity() * std::mem::size_of::<Selector>()
    }

    /// Time since the last packet of any copy (as far as the others have
    /// added theirs: every batch and every tick), or since installation.
    pub fn idle(&self, now: Duration) -> Duration {
        let shared = Duration::from_nanos(self.shared.last_active_ns.load(Ordering::Relaxed));
        now.saturating_sub(self.last_active.max(shared))
    }

    /// True once this copy of an outbound SA can send no more: its block is
    /// used up and the shared counter has reached the last number.
    pub fn sequence_exhausted(&self) -> bool {
        self.seq_next > self.seq_end && self.reserved_sequence() >= self.sequence_limit()
    }

    fn sequence_limit(&self) -> u64 {
        if self.params.esn {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        }
    }

    /// Takes the next outbound sequence number. Without ESN the last usable
    /// one is 2^32 − 1; with ESN, 2^64 − 1. With a durable ceiling (see
    /// [`Self::resume_above`]), none beyond it: [`SequenceError::NotReserved`].
    pub fn next_sequence(&mut self) -> Result<u64, SequenceError> {
        if self.seq_next <= self.seq_end {
            let seq = self.seq_next;
            self.seq_next += 1;
            self.last_used = seq;
            return Ok(seq);
        }
        let limit = self.sequence_limit();
        // The copy on the worker that all of the SA's packets are steered
        // to (or a copy alone) reserves a block; other copies that share
        // the counter take one number at a time, because a block reserved
        // by a worker that then sends little would come out long after the
        // others' numbers and fall behind the peer's window. A placed
        // non-owner sends only what the gateway generates itself, so the
        // owner's block lags by a few numbers at most.
        let owner = self.owner.unwrap_or_else(|| Arc::strong_count(&self.shared) == 1);
        let block = if owner { SEQUENCE_BLOCK } else { 1 };
        loop {
            // A block never passes the durable ceiling: numbers beyond it
            // could be sent again after a restart.
            let bound = limit.min(self.ceiling);
            let claimed = self
                .shared
                .last_seq
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                    (last < bound).then(|| last.saturating_add(block).min(bound))
                });
            match claimed {
                Ok(last) => {
                    self.seq_end = last.saturating_add(block).min(bound);
                    self.seq_next = last + 2;
                    self.last_used = last + 1;
                    return Ok(last + 1);
                }
                Err(last) if last >= limit => {
                    self.counters.count(DropReason::SeqOverflow);
                    return Err(SequenceError::Exhausted);
                }
                Err(last) => {
                    // At the cached ceiling: has the driver raised it?
                    let ceiling = self.shared.ceiling();
                    if ceiling <= self.ceiling || ceiling <= last {
                        self.ceiling = ceiling;
                        self.counters.count(DropReason::SeqNotReserved);
                        return Err(SequenceError::NotReserved);
                    }
                    self.ceiling = ceiling;
                }
            }
        }
    }

    /// Inbound: infers and checks the sequence number without changing state.
    pub fn check_replay(&self, seq_low: u32) -> Result<u64, ReplayError> {
        self.replay.check(seq_low)
    }

    /// Inbound: records an authenticated sequence number.
    pub fn accept_sequence(&mut self, seq: u64) {
        self.replay.update(seq);
    }

    /// Inbound: the highest sequence number accepted so far.
    pub fn highest_accepted(&self) -> u64 {
        self.replay.top()
    }

    /// Inbound: whether the 64-bit sequence number inferred for `seq_low`
    /// now is the one the window will give it when its turn comes, whatever
    /// the packets still in flight turn out to be. Inference is monotonic in
    /// the window's top (RFC 4303 Appendix A2.2), and the packets in flight
    /// can move the top at most to `in_flight_top`, so agreement at both
    /// ends means agreement everywhere between. Without ESN, or with nothing
    /// in flight, it always holds.
    pub fn inference_settled(&self, seq_low: u32) -> bool {
        if !self.params.esn || self.inbound_in_flight == 0 || self.in_flight_top <= self.replay.top() {
            return true;
        }
        self.replay.infer_at(seq_low, self.replay.top()) == self.replay.infer_at(seq_low, self.in_flight_top)
    }

    /// Inbound: whether a copy of `seq`, a duplicate for the window as it
    /// is, stays one whatever the packets in flight turn out to be. If
    /// they could move the top `replay_window` or more past it, the copy
    /// may be too old by its turn instead, and only the window at finish
    /// can say which.
    pub fn duplicate_settled(&self, seq: u64) -> bool {
        self.inbound_in_flight == 0 || self.in_flight_top.saturating_sub(seq) < u64::from(self.replay.size())
    }

    /// Inbound: a packet with sequence number `seq` went to the engine.
    pub fn note_inbound_started(&mut self, seq: u64) {
        self.inbound_in_flight += 1;
        self.in_flight_top = self.in_flight_top.max(seq);
    }

    /// Inbound: a packet's trip through the engine ended (whatever its
    /// verdict). Returns true when none of the SA's packets is in flight.
    pub fn note_inbound_finished(&mut self) -> bool {
        self.inbound_in_flight = self.inbound_in_flight.saturating_sub(1);
        if self.inbound_in_flight == 0 {
            self.in_flight_top = 0;
        }
        self.inbound_in_flight == 0
    }

    /// Inbound packets of this SA in flight.
    pub fn inbound_in_flight(&self) -> u32 {
        self.inbound_in_flight
    }

    /// True while the SA may carry traffic at time `now`. Byte and packet
    /// limits move the state when usage is added up (`account`, exact for
    /// one worker); time is checked here.
    pub fn is_usable(&self, now: Duration) -> bool {
        if self.state == SaState::HardExpired {
            return false;
        }
        let hard = &self.params.lifetime.hard;
        if self.near_limit {
            // Other workers' packets count too: read the shared usage.
            let (bytes, packets) = self.usage();
            return !hard.reached(bytes, packets, self.age(now), self.idle(now));
        }
        hard.seconds
            .is_none_or(|s| self.age(now) < Duration::from_secs(s))
            && hard
                .idle_seconds
                .is_none_or(|s| self.idle(now) < Duration::from_secs(s))
    }

    /// Whether an inner packet may have arrived through this SA: only
    /// what one of its selectors matches, so an SA without selectors
    /// admits nothing (fails closed).
    pub fn admits(&self, flow: &FlowKey) -> bool {
        self.params.selectors.iter().any(|s| s.matches(flow))
    }

    /// Replaces what may arrive through this inbound SA, keeping its
    /// sequence state and counters (a reload that changed only the
    /// policies naming it).
    pub fn set_selectors(&mut self, selectors: Vec<Selector>) -> Result<(), SadError> {
        if self.params.direction == SaDirection::Inbound && selectors.is_empty() {
            return Err(SadError::NoSelectors(self.params.name.clone()));
        }
        self.params.selectors = selectors;
        Ok(())
    }

    /// Counts one packet of `bytes` and moves the lifetime state on; returns
    /// the transition, if any.
    /// In a database, count through [`Sad::account`], which lists the SA
    /// for the next tick.
    pub fn account(&mut self, bytes: usize, now: Duration) -> Option<SaState> {
        self.last_active = self.last_active.max(now);
        self.unflushed_packets += 1;
        self.unflushed_bytes += bytes as u64;
        if self.unflushed_packets < self.flush_packets && self.unflushed_bytes < self.flush_bytes {
            return None;
        }
        self.flush_usage();
        self.refresh_state(now)
    }

    /// When this SA's next time-based transition could come, if any: the
    /// limits of the states it has not reached yet.
    fn next_deadline(&self) -> Option<Duration> {
        let last_active = self.last_active.max(Duration::from_nanos(
            self.shared.last_active_ns.load(Ordering::Relaxed),
        ));
        let lifetime = &self.params.lifetime;
        let hard = lifetime.hard.next_deadline(self.installed_at, last_active);
        match self.state {
            SaState::Active => [lifetime.soft.next_deadline(self.installed_at, last_active), hard]
                .into_iter()
                .flatten()
                .min(),
            SaState::SoftExpired => hard,
            SaState::HardExpired => None,
        }
    }

    /// Re-evaluates lifetimes at `now`; returns a transition, if any.
    pub fn refresh_state(&mut self, now: Duration) -> Option<SaState> {
        let age = self.age(now);
        let idle = self.idle(now);
        let (bytes, packets) = self.usage();
        let exhausted = self.sequence_exhausted();
        // Without ESN the counter runs out; rekey while 2^24 numbers are left.
        let nearly_exhausted =
            self.reserved_sequence() >= self.sequence_limit().saturating_sub(SEQUENCE_RESERVE);
        let new_state = if self.params.lifetime.hard.reached(bytes, packets, age, idle) || exhausted {
            SaState::HardExpired
        } else if self.params.lifetime.soft.reached(bytes, packets, age, idle) || nearly_exhausted {
            SaState::SoftExpired
        } else {
            SaState::Active
        };
        let rank = |s: SaState| match s {
            SaState::Active => 0,
            SaState::SoftExpired => 1,
            SaState::HardExpired => 2,
        };
        // States only move forward.
        if rank(new_state) > rank(self.state) {
            self.state = new_state;
            Some(new_state)
        } else {
            None
        }
    }

    /// Marks the SA unusable now (sequence exhaustion, operator action).
    pub fn expire(&mut self) -> bool {
        let changed = self.state != SaState::HardExpired;
        self.state = SaState::HardExpired;
        changed
    }
}

/// Why an SA could not be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SadError {
    /// Inbound SAs are found by SPI: two cannot share one.
    #[error("SPI {spi:#x} is already used by inbound SA `{existing}`")]
    DuplicateSpi {
        /// The SPI asked for.
        spi: u32,
        /// The name of the inbound SA that has it.
        existing: String,
    },
    #[error("an SA named `{0}` already exists")]
    /// Another SA already has this name.
    DuplicateName(String),
    #[error("SPIs 0-255 are reserved (RFC 4303 §2.1); {0:#x} cannot be used")]
    /// An SPI in the range RFC 4303 §2.1 reserves.
    ReservedSpi(u32),
    #[error("the SA database is full ({0} SAs)")]
    /// Every slot is taken (at most 2^[`SaId::SLOT_BITS`] SAs at once).
    Full(usize),
    /// RFC 4301 §5.2: an inbound SA must say what may arrive through it.
    #[error("inbound SA `{0}` has no selectors, so it would admit nothing; give it the selectors of the inbound policies naming it, or `Selector::ANY` to admit every inner packet")]
    NoSelectors(String),
}

/// One place in the database: its current generation and SA, if any.
struct Slot<C> {
    generation: u32,
    sa: Option<SecurityAssociation<C>>,
}

/// All SAs of a gateway.
pub struct Sad<C> {
    slots: Vec<Slot<C>>,
    /// Empty slots, reused last-freed first: an install takes one without a
    /// scan.
    free: Vec<usize>,
    /// SA names (unique) to ids: `find`, the duplicate check and the
    /// control plane's commands without a scan.
    by_name: FxHashMap<String, SaId>,
    /// SPI to SA: Fx hashing, since SPIs are chosen by the peer but looked
    /// up per packet, and SipHash's flood resistance costs more than a
    /// lookup here (the table is bounded by the SAs we installed).
    by_spi: FxHashMap<u32, SaId>,
    events: VecDeque<SaEvent>,
    /// This database's worker and how many there are, once placed.
    placement: Option<(usize, usize)>,
    /// SAs that counted a packet since the last tick: the tick adds up
    /// their usage, and only theirs, so that its cost follows the SAs in
    /// use rather than the table. Its capacity is kept at the table's size
    /// so that listing one never allocates on the packet path.
    used: VecDeque<SaId>,
    /// How many of `used` the last tick left for the next (past its
    /// budget); the oldest first.
    carried: usize,
    /// Whether deadlines due by the last tick were left for the next.
    timers_due: bool,
    /// Time-based lifetime deadlines, earliest first, one live entry per
    /// SA with a time limit left (the one its `scheduled` names);
    /// entries of removed SAs or of moved deadlines are skipped when they
    /// come, and swept out when they outnumber the live ones.
    timers: BinaryHeap<Reverse<Timer>>,
}

/// An SA's next time-based lifetime deadline in [`Sad::timers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    deadline: Duration,
    sa: SaId,
}

/// Starts loading the cache line at `at` (a hint: reads and writes nothing
/// the program can see, so any address will do).
pub(crate) fn prefetch_line(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch neither faults nor changes memory.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The worker, of `workers`, that owns outbound SAs between `local` and
/// `remote`: the driver steers every packet for such an SA there, and only
/// that worker's copy reserves sequence blocks. A function of the outer
/// addresses alone, so that a rekeyed SA keeps its predecessor's worker
/// and one peer's tunnels send from one worker.
pub fn owner_worker(local: IpAddr, remote: IpAddr, workers: usize) -> usize {
    // IPv6 addresses are folded to 32 bits first; IPv4 keys are as before.
    let fold = |addr: IpAddr| match addr {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            (bits ^ (bits >> 32) ^ (bits >> 64) ^ (bits >> 96)) as u32
        }
    };
    let key = fold(local).rotate_left(16) ^ fold(remote);
    // Fibonacci hashing: neighbouring addresses land on different workers.
    let mixed = key.wrapping_mul(0x9e37_79b1) >> 8;
    mixed as usize % workers.max(1)
}

/// The worker, of `workers`, that owns the inbound SA of `spi`: the
/// outside steering sends every packet carrying that SPI there (the
/// kernel takes the SPI modulo the group's size), so that one replay
/// window sees them all. Other workers' copies refuse the SA's packets.
pub fn inbound_owner(spi: u32, workers: usize) -> usize {
    spi as usize % workers.max(1)
}

impl<C> Default for Sad<C> {
    fn default() -> Self {
        Sad {
            slots: Vec::new(),
            free: Vec::new(),
            by_name: FxHashMap::default(),
            by_spi: FxHashMap::default(),
            events: VecDeque::new(),
            placement: None,
            used: VecDeque::new(),
            carried: 0,
            timers_due: false,
            timers: BinaryHeap::new(),
        }
    }
}

impl<C> Sad<C> {
    /// An empty database.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs a new SA created from `params` at `now`; its id, or why it was
    /// refused.
    pub fn insert(&mut self, params: SaParams, crypto: C, now: Duration) -> Result<SaId, SadError> {
        self.adopt(SecurityAssociation::new(params, crypto, now))
    }

    /// Takes in an SA made elsewhere: a [`SecurityAssociation::fork`] of
    /// another worker's, which keeps sharing its sequence counter and usage.
    pub fn adopt(&mut self, sa: SecurityAssociation<C>) -> Result<SaId, SadError> {
        let params = &sa.params;
        if params.spi < 256 {
            return Err(SadError::ReservedSpi(params.spi));
        }
        if self.by_name.contains_key(&params.name) {
            return Err(SadError::DuplicateName(params.name.clone()));
        }
        if params.direction == SaDirection::Inbound && params.selectors.is_empty() {
            return Err(SadError::NoSelectors(params.name.clone()));
        }
        if params.direction == SaDirection::Inbound {
            if let Some(existing) = self.by_spi.get(&params.spi).and_then(|id| self.get(*id)) {
                return Err(SadError::DuplicateSpi {
                    spi: params.spi,
                    existing: existing.name().to_owned(),
                });
            }
        }
        let slot = match self.free.pop() {
            Some(free) => free,
            None if self.slots.len() > SaId::SLOT_MASK as usize => {
                return Err(SadError::Full(self.slots.len()))
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    sa: None,
                });
                self.slots.len() - 1
            }
        };
        let mut sa = sa;
        if let Some((worker, workers)) = self.placement {
            sa.place(worker, workers);
        }
        let entry = &mut self.slots[slot];
        let id = SaId::new(slot, entry.generation);
        if sa.params.direction == SaDirection::Inbound {
            self.by_spi.insert(sa.params.spi, id);
        }
        self.by_name.insert(sa.params.name.clone(), id);
        entry.sa = Some(sa);
        self.used
            .reserve(self.slots.len().saturating_sub(self.used.len()));
        self.schedule(id);
        Ok(id)
    }

    /// Gives SA `id` a timer entry for its next time-based deadline, unless
    /// it has one as early already (a later deadline is found when that
    /// one comes).
    fn schedule(&mut self, id: SaId) {
        let Some(sa) = self.get_mut(id) else {
            return;
        };
        let Some(deadline) = sa.next_deadline() else {
            return;
        };
        if sa.scheduled.is_some_and(|at| at <= deadline) {
            return;
        }
        sa.scheduled = Some(deadline);
        self.timers.push(Reverse(Timer { deadline, sa: id }));
        // Removed SAs and moved deadlines leave entries behind: sweep them
        // out once they outnumber the live ones.
        if self.timers.len() > 2 * self.len() + 64 {
            let slots = &self.slots;
            self.timers.retain(|Reverse(t)| {
                slots
                    .get(t.sa.slot())
                    .filter(|s| s.generation == t.sa.generation())
                    .and_then(|s| s.sa.as_ref())
                    .is_some_and(|sa| sa.scheduled == Some(t.deadline))
            });
        }
    }

    /// A copy of the whole database for another worker (see
    /// [`SecurityAssociation::fork`]).
    pub fn fork(&self) -> Sad<C>
    where
        C: Clone,
    {
        let mut fork = Sad {
            slots: self
                .slots
                .iter()
                .map(|s| Slot {
                    generation: s.generation,
                    sa: s.sa.as_ref().map(SecurityAssociation::fork),
                })
                .collect(),
            free: self.free.clone(),
            by_name: self.by_name.clone(),
            by_spi: self.by_spi.clone(),
            events: VecDeque::new(),
            placement: None,
            used: VecDeque::with_capacity(self.slots.len()),
            carried: 0,
            timers_due: false,
            timers: BinaryHeap::new(),
        };
        let ids: Vec<SaId> = fork.iter().map(|(id, _)| id).collect();
        for id in ids {
            fork.schedule(id);
        }
        fork
    }

    /// Says that this database is worker `worker`'s of `workers`, whose
    /// driver steers each outbound SA's packets to [`owner_worker`]: that
    /// copy reserves sequence blocks, the others take one number at a
    /// time. Applies to the SAs here and to every one added later.
    pub fn place(&mut self, worker: usize, workers: usize) {
        self.placement = Some((worker, workers));
        for slot in &mut self.slots {
            if let Some(sa) = slot.sa.as_mut() {
                sa.place(worker, workers);
            }
        }
    }

    /// Removes an SA; its crypto context is dropped (and zeroized) with it.
    pub fn remove(&mut self, id: SaId) -> Option<SecurityAssociation<C>> {
        let slot = self
            .slots
            .get_mut(id.slot())
            .filter(|s| s.generation == id.generation())?;
        let sa = slot.sa.take()?;
        // Ids of the removed SA must never name the next one in this slot.
        slot.generation = (slot.generation + 1) & (u32::MAX >> SaId::SLOT_BITS);
        if sa.params.direction == SaDirection::Inbound && self.by_spi.get(&sa.params.spi) == Some(&id) {
            self.by_spi.remove(&sa.params.spi);
        }
        if self.by_name.get(&sa.params.name) == Some(&id) {
            self.by_name.remove(&sa.params.name);
        }
        self.free.push(id.slot());
        Some(sa)
    }

    /// Starts loading SA `id`'s state into the CPU cache, every line of
    /// it, so that a batch's SAs arrive while earlier packets are worked
    /// on: with thousands of tunnels each packet's SA is otherwise a miss
    /// (the dataplane does this for a whole batch before it encapsulates).
    pub fn prefetch(&self, id: SaId) {
        let Some(slot) = self.slots.get(id.slot()) else {
            return;
        };
        let start = (slot as *const Slot<C>).cast::<u8>();
        for offset in (0..std::mem::size_of::<Slot<C>>()).step_by(64) {
            prefetch_line(start.wrapping_add(offset));
        }
    }

    /// The SA `id` names, unless it has been removed since.
    pub fn get(&self, id: SaId) -> Option<&SecurityAssociation<C>> {
        let slot = self.slots.get(id.slot())?;
        (slot.generation == id.generation())
            .then_some(slot.sa.as_ref())
            .flatten()
    }

    /// The SA `id` names, to change, unless it has been removed since.
    pub fn get_mut(&mut self, id: SaId) -> Option<&mut SecurityAssociation<C>> {
        let slot = self.slots.get_mut(id.slot())?;
        (slot.generation == id.generation())
            .then_some(slot.sa.as_mut())
            .flatten()
    }

    /// The id of the SA named `name`.
    pub fn find(&self, name: &str) -> Option<SaId> {
        self.by_name.get(name).copied()
    }

    /// Inbound lookup (RFC 4301 §4.1): by SPI. A tunnel-mode packet must
    /// also be addressed to the SA's local end; a transport-mode packet keeps
    /// its own destination (a host behind us when we protect forwarded
    /// traffic), and for unicast the SPI alone identifies the SA.
    pub fn lookup_inbound(&self, spi: u32, dst: IpAddr) -> Option<SaId> {
        let id = *self.by_spi.get(&spi)?;
        let sa = self.get(id)?;
        // Transport mode keeps the hosts' addresses: any destination of
        // the SA's family.
        let transport = sa.params.mode == Mode::Transport && sa.params.local.is_ipv6() == dst.is_ipv6();
        (transport || sa.params.local == dst).then_some(id)
    }

    /// Every SA, to change (their crypto state; the indexes stay as they are).
    /// Adds every SA's unflushed usage, and how far it got, to the state
    /// its copies share: for a driver that has stopped this copy's worker
    /// and reads the shared state last (a clean stop's exact sequence
    /// marks).
    pub fn flush_all_usage(&mut self) {
        for slot in &mut self.slots {
            if let Some(sa) = slot.sa.as_mut() {
                sa.flush_usage();
            }
        }
    }

    /// Every SA with its id, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (SaId, &mut SecurityAssociation<C>)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| {
            let generation = s.generation;
            s.sa.as_mut().map(|sa| (SaId::new(i, generation), sa))
        })
    }

    /// Every SA with its id, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (SaId, &SecurityAssociation<C>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.sa.as_ref().map(|sa| (SaId::new(i, s.generation), sa)))
    }

    /// How many SAs there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a lifetime transition of `id` for the control plane.
    pub fn note_transition(&mut self, id: SaId, state: SaState) {
        match state {
            SaState::SoftExpired => self.events.push_back(SaEvent::SoftExpired(id)),
            SaState::HardExpired => self.events.push_back(SaEvent::HardExpired(id)),
            SaState::Active => {}
        }
    }

    /// Counts one packet of `bytes` on SA `id` (see
    /// [`SecurityAssociation::account`]) and records its transition, if
    /// any. The first packet since the last tick adds the SA's usage to the
    /// other workers' at once (so that how near a limit it is was looked at
    /// again) and lists the SA for the next tick.
    pub fn account(&mut self, id: SaId, bytes: usize, now: Duration) -> Option<SaState> {
        let sa = self.get_mut(id)?;
        if !sa.listed {
            sa.listed = true;
            sa.flush_packets = 1;
            self.used.push_back(id);
        }
        let sa = self.get_mut(id)?;
        let state = sa.account(bytes, now)?;
        self.note_transition(id, state);
        Some(state)
    }

    /// The tick: adds up the usage of the SAs used since the last one, and
    /// re-evaluates lifetimes where that usage or a time limit due by `now`
    /// may have moved them. Its cost follows the SAs used and the deadlines
    /// due, not the size of the table, and is bounded: at most
    /// [`TICK_BUDGET`] SAs of each kind, the oldest first; the rest wait for
    /// the next call ([`Self::tick_backlog`]).
    pub fn handle_timeout(&mut self, now: Duration) {
        let listed = self.used.len();
        let taken = listed.min(TICK_BUDGET);
        for _ in 0..taken {
            // The SAs are cold by now: load a few ahead while this one is
            // added up.
            if let Some(&ahead) = self.used.get(PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            if let Some(sa) = self.used.get(PREFETCH_AHEAD / 2).and_then(|&id| self.get(id)) {
                prefetch_line(Arc::as_ptr(&sa.shared).cast());
            }
            let Some(id) = self.used.pop_front() else {
                break;
            };
            let Some(sa) = self.get_mut(id) else {
                continue;
            };
            sa.listed = false;
            // Tick time: this copy's usage joins the other workers'.
            sa.flush_usage();
            if let Some(state) = sa.refresh_state(now) {
                self.note_transition(id, state);
            }
        }
        self.carried = listed - taken;
        for _ in 0..TICK_BUDGET {
            let Some(&Reverse(timer)) = self.timers.peek() else {
                break;
            };
            if timer.deadline > now {
                break;
            }
            self.timers.pop();
            let Some(sa) = self.get_mut(timer.sa) else {
                continue;
            };
            if sa.scheduled != Some(timer.deadline) {
                continue;
            }
            sa.scheduled = None;
            if let Some(state) = sa.refresh_state(now) {
                self.note_transition(timer.sa, state);
            }
            self.schedule(timer.sa);
        }
        self.timers_due = self.timers.peek().is_some_and(|Reverse(t)| t.deadline <= now);
    }

    /// Whether the last tick left work past its budget: call
    /// [`Self::handle_timeout`] again soon rather than at the next tick.
    pub fn tick_backlog(&self) -> bool {
        self.carried > 0 || self.timers_due
    }

    /// Next pending lifetime event, oldest first.
    pub fn poll_event(&mut self) -> Option<SaEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are config values and parts of SA names: deriving them
    /// must not rename one.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        use strum::VariantNames;
        assert_eq!(SaDirection::VARIANTS, ["out", "in"]);
        assert_eq!(Mode::VARIANTS, ["tunnel", "transport"]);
        for (d, name) in [(SaDirection::Outbound, "out"), (SaDirection::Inbound, "in")] {
            assert_eq!(d.to_string(), name);
            assert_eq!(name.parse::<SaDirection>(), Ok(d));
        }
        for (m, name) in [(Mode::Tunnel, "tunnel"), (Mode::Transport, "transport")] {
            assert_eq!(m.to_string(), name);
            assert_eq!(name.parse::<Mode>(), Ok(m));
        }
        assert!("Tunnel".parse::<Mode>().is_err());
    }

    fn params(name: &str, direction: SaDirection, spi: u32) -> SaParams {
        SaParams {
            name: name.into(),
            direction,
            spi,
            mode: Mode::Tunnel,
            local: "10.0.0.1".parse().unwrap(),
            remote: "10.0.0.2".parse().unwrap(),
            esn: false,
            replay_window: 64,
            lifetime: Lifetime::default(),
            encap: None,
            selectors: match direction {
                SaDirection::Inbound => vec![Selector::ANY],
                SaDirection::Outbound => vec![],
            },
        }
    }

    /// A duplicate is settled as one unless the packets in flight could
    /// carry the window's top a whole window past it.
    #[test]
    fn duplicates_are_settled_unless_the_window_may_pass_them() {
        let mut sad: Sad<()> = Sad::new();
        let id = sad
            .insert(params("in", SaDirection::Inbound, 0x1000), (), Duration::ZERO)
            .unwrap();
        let sa = sad.get_mut(id).unwrap();
        for seq in 1..=10 {
            sa.accept_sequence(seq);
        }
        assert_eq!(sa.check_replay(5), Err(ReplayError::Duplicate(5)));
        assert!(sa.duplicate_settled(5), "nothing in flight");
        sa.note_inbound_started(68);
        assert!(sa.duplicate_settled(5), "68 - 5 < 64: 5 stays in the window");
        sa.note_inbound_started(69);
        assert!(!sa.duplicate_settled(5), "if 69 verifies, 5 is too old");
        assert!(sa.duplicate_settled(6));
        sa.note_inbound_finished();
        assert!(sa.note_inbound_finished());
        assert!(sa.duplicate_settled(5));
    }

    #[test]
    fn inbound_lookup_by_spi_and_destination() {
        let mut sad: Sad<()> = Sad::new();
        let id = sad
            .insert(params("in", SaDirection::Inbound, 0x1000), (), Duration::ZERO)
            .unwrap();
        let out = sad
            .insert(params("out", SaDirection::Outbound, 0x1000), (), Duration::ZERO)
            .unwrap();
        assert_ne!(id, out);
        assert_eq!(sad.lookup_inbound(0x1000, "10.0.0.1".parse().unwrap()), Some(id));
        assert_eq!(sad.lookup_inbound(0x1000, "10.0.0.9".parse().unwrap()), None);
        assert_eq!(sad.lookup_inbound(0x1001, "10.0.0.1".parse().unwrap()), None);
        assert!(matches!(
            sad.insert(params("in2", SaDirection::Inbound, 0x1000), (), Duration::ZERO),
            Err(SadError::DuplicateSpi { .. })
        ));
        assert!(matches!(
            sad.insert(params("x", SaDirection::Inbound, 7), (), Duration::ZERO),
            Err(SadError::ReservedSpi(7))
        ));
        assert!(sad.remove(id).is_some());
        assert_eq!(sad.lookup_inbound(0x1000, "10.0.0.1".parse().unwrap()), None);
        assert_eq!(sad.find("out"), Some(out));
    }

    #[test]
    fn inbound_sas_admit_only_what_their_selectors_match() {
        let flow = |src: &str| FlowKey {
            src: src.parse().unwrap(),
            dst: "192.168.1.5".parse().unwrap(),
            protocol: 17,
            ports: Some((1000, 53)),
        };
        let mut sad: Sad<()> = Sad::new();
        let unselected = SaParams {
            selectors: vec![],
            ..params("bare", SaDirection::Inbound, 0x1000)
        };
        assert_eq!(
            sad.insert(unselected.clone(), (), Duration::ZERO),
            Err(SadError::NoSelectors("bare".into()))
        );
        // Built around the database, an SA without selectors still admits nothing.
        let mut bare = SecurityAssociation::new(unselected, (), Duration::ZERO);
        assert!(!bare.admits(&flow("192.168.2.7")));
        assert_eq!(
            bare.set_selectors(vec![]),
            Err(SadError::NoSelectors("bare".into()))
        );

        let any = SecurityAssociation::new(params("any", SaDirection::Inbound, 0x1001), (), Duration::ZERO);
        assert!(any.admits(&flow("192.168.2.7")) && any.admits(&flow("172.16.0.1")));

        let narrow = Selector {
            src: "192.168.2.0/24".parse().unwrap(),
            ..Selector::ANY
        };
        bare.set_selectors(vec![narrow]).unwrap();
        assert!(bare.admits(&flow("192.168.2.7")));
        assert!(!bare.admits(&flow("172.16.0.1")));
    }

    #[test]
    fn removed_ids_never_name_the_sa_that_reuses_their_slot() {
        let mut sad: Sad<u8> = Sad::new();
        let first = sad
            .insert(params("a", SaDirection::Inbound, 0x1000), 1, Duration::ZERO)
            .unwrap();
        let keep = sad
            .insert(params("b", SaDirection::Outbound, 0x1001), 2, Duration::ZERO)
            .unwrap();
        assert_eq!(sad.remove(first).map(|sa| *sa.crypto()), Some(1));
        let second = sad
            .insert(params("c", SaDirection::Inbound, 0x1002), 3, Duration::ZERO)
            .unwrap();
        assert_ne!(first, second, "the reused slot has a new generation");
        assert!(sad.get(first).is_none());
        assert!(sad.remove(first).is_none(), "a stale id removes nothing");
        assert_eq!(sad.get(second).map(|sa| *sa.crypto()), Some(3));
        assert_eq!(sad.get(keep).map(|sa| *sa.crypto()), Some(2));
        assert_eq!(
            sad.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            vec![second, keep]
        );
        assert_eq!(
            sad.lookup_inbound(0x1002, "10.0.0.1".parse().unwrap()),
            Some(second)
        );
        assert_eq!(sad.lookup_inbound(0x1000, "10.0.0.1".parse().unwrap()), None);
    }

    #[test]
    fn soft_expiry_before_the_sequence_counter_runs_out() {
        let mut sa = SecurityAssociation::new(params("o", SaDirection::Outbound, 0x1000), (), Duration::ZERO);
        sa.set_last_sequence(u64::from(u32::MAX) - SEQUENCE_RESERVE - 1);
        assert_eq!(sa.refresh_state(Duration::ZERO), None);
        assert!(sa.next_sequence().is_ok());
        assert_eq!(sa.refresh_state(Duration::ZERO), Some(SaState::SoftExpired));
        assert!(sa.is_usable(Duration::ZERO));
    }

    #[test]
    fn sequence_numbers_start_at_one_and_stop_before_wrapping() {
        let mut sa = SecurityAssociation::new(params("o", SaDirection::Outbound, 0x1000), (), Duration::ZERO);
        assert_eq!(sa.next_sequence(), Ok(1));
        assert_eq!(sa.next_sequence(), Ok(2));
        sa.set_last_sequence(u64::from(u32::MAX) - 1);
        assert_eq!(sa.next_sequence(), Ok(u64::from(u32::MAX)));
        assert_eq!(sa.next_sequence(), Err(SequenceError::Exhausted));
        assert_eq!(sa.refresh_state(Duration::ZERO), Some(SaState::HardExpired));
        let mut esn = SecurityAssociation::new(
            SaParams {
                esn: true,
                ..params("e", SaDirection::Outbound, 0x1001)
            },
            (),
            Duration::ZERO,
        );
        esn.set_last_sequence(u64::from(u32::MAX));
        assert_eq!(esn.next_sequence(), Ok(1 << 32));
    }

    #[test]
    fn lifetimes_soft_then_hard_whichever_first() {
        let mut p = params("o", SaDirection::Outbound, 0x1000);
        p.lifetime = Lifetime {
            soft: Limits {
                bytes: Some(1000),
                packets: None,
                seconds: Some(50),
                idle_seconds: None,
            },
            hard: Limits {
                bytes: None,
                packets: Some(20),
                seconds: Some(60),
                idle_seconds: None,
            },
        };
        let mut sa = SecurityAssociation::new(p.clone(), (), Duration::from_secs(100));
        assert_eq!(sa.account(500, Duration::from_secs(101)), None);
        assert_eq!(
            sa.account(500, Duration::from_secs(101)),
            Some(SaState::SoftExpired)
        );
        assert!(sa.is_usable(Duration::from_secs(101)));
        for _ in 0..17 {
            assert_eq!(sa.account(1, Duration::from_secs(102)), None);
        }
        assert_eq!(
            sa.account(1, Duration::from_secs(102)),
            Some(SaState::HardExpired)
        );
        assert!(!sa.is_usable(Duration::from_secs(102)));

        let mut timed = SecurityAssociation::new(p, (), Duration::from_secs(100));
        assert_eq!(timed.refresh_state(Duration::from_secs(149)), None);
        assert_eq!(
            timed.refresh_state(Duration::from_secs(150)),
            Some(SaState::SoftExpired)
        );
        assert!(!timed.is_usable(Duration::from_secs(160)));
        assert_eq!(
            timed.refresh_state(Duration::from_secs(160)),
            Some(SaState::HardExpired)
        );
    }

    #[test]
    fn timeouts_raise_events() {
        let mut p = params("o", SaDirection::Outbound, 0x1000);
        p.lifetime.soft.seconds = Some(1);
        p.lifetime.hard.seconds = Some(2);
        let mut sad = Sad::new();
        let id = sad.insert(p, (), Duration::ZERO).unwrap();
        sad.handle_timeout(Duration::from_millis(1500));
        sad.handle_timeout(Duration::from_millis(1600));
        sad.handle_timeout(Duration::from_secs(3));
        assert_eq!(sad.poll_event(), Some(SaEvent::SoftExpired(id)));
        assert_eq!(sad.poll_event(), Some(SaEvent::HardExpired(id)));
        assert_eq!(sad.poll_event(), None);
    }

    /// Under a durable ceiling an outbound SA resumes after the mark, sends
    /// nothing beyond the ceiling (blocks stop at it, every copy's), and
    /// goes on once the driver raises it; the refusal is not exhaustion.
    #[test]
    fn outbound_numbers_stop_at_the_durable_ceiling() {
        let mut sad: Sad<()> = Sad::new();
        let id = sad
            .insert(params("out", SaDirection::Outbound, 0x1000), (), Duration::ZERO)
            .unwrap();
        sad.get_mut(id).unwrap().resume_above(100);
        let mut other = sad.fork();
        let sa = sad.get_mut(id).unwrap();
        assert_eq!(sa.ceiling(), Some(100));
        assert_eq!(sa.next_sequence(), Err(SequenceError::NotReserved));
        assert_eq!(sa.counters().get(DropReason::SeqNotReserved), 1);
        assert!(!sa.sequence_exhausted());
        sa.shared().raise_ceiling(110);
        let sent: Vec<u64> = (0..10).map(|_| sa.next_sequence().unwrap()).collect();
        assert_eq!(
            sent,
            (101..=110).collect::<Vec<_>>(),
            "a block stops at the ceiling"
        );
        assert_eq!(sa.next_sequence(), Err(SequenceError::NotReserved));
        // The fork shares the ceiling and the counter.
        let copy = other.get_mut(id).unwrap();
        assert_eq!(copy.next_sequence(), Err(SequenceError::NotReserved));
        copy.shared().raise_ceiling(105);
        assert_eq!(
            copy.next_sequence(),
            Err(SequenceError::NotReserved),
            "never lowered"
        );
        copy.shared().raise_ceiling(200);
        assert_eq!(copy.next_sequence(), Ok(111));
        assert_eq!(sad.get_mut(id).unwrap().next_sequence(), Ok(112));
        assert_eq!(sad.get(id).unwrap().shared().reserved(), 112);
        // Without a ceiling nothing changes.
        let mut free =
            SecurityAssociation::new(params("f", SaDirection::Outbound, 0x1001), (), Duration::ZERO);
        assert_eq!(free.ceiling(), None);
        assert_eq!(free.next_sequence(), Ok(1));
    }

    /// Inbound: the window resumes with everything up to the mark taken,
    /// and a number beyond the ceiling is refused and noted for the driver,
    /// until it raises the ceiling.
    #[test]
    fn inbound_numbers_beyond_the_durable_ceiling_are_noted_not_accepted() {
        let mut sa = SecurityAssociation::new(params("in", SaDirection::Inbound, 0x1000), (), Duration::ZERO);
        assert!(sa.inbound_within_ceiling(u64::MAX), "no ceiling without a ledger");
        sa.accept_sequence(7);
        sa.resume_above(50);
        assert_eq!(sa.highest_accepted(), 50);
        assert!(sa.check_replay(50).is_err() && sa.check_replay(7).is_err() && sa.check_replay(20).is_err());
        let seq = sa.check_replay(51).unwrap();
        assert!(!sa.inbound_within_ceiling(seq));
        assert_eq!(sa.shared().inbound_seen(), 51);
        sa.shared().raise_ceiling(60);
        assert!(sa.inbound_within_ceiling(51));
        sa.accept_sequence(51);
        for _ in 0..USAGE_BATCH {
            sa.account(1, Duration::ZERO);
        }
        assert_eq!(sa.shared().inbound_seen(), 51);
        assert!(!sa.inbound_within_ceiling(61));
        assert_eq!(sa.shared().inbound_seen(), 61);
    }

    /// Placed copies: only the owner reserves blocks, the other takes the
    /// number after the owner's block, and either shows the higher last
    /// number once the other has flushed (a tick).
    #[test]
    fn placed_copies_reserve_blocks_only_at_the_owner() {
        let mut first: Sad<()> = Sad::new();
        let id = first
            .insert(params("out", SaDirection::Outbound, 0x1000), (), Duration::ZERO)
            .unwrap();
        let mut second = first.fork();
        let owner = owner_worker("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), 2);
        first.place(0, 2);
        second.place(1, 2);
        let (own, other) = if owner == 0 {
            (&mut first, &mut second)
        } else {
            (&mut second, &mut first)
        };
        let seqs: Vec<u64> = (0..3)
            .map(|_| own.get_mut(id).unwrap().next_sequence().unwrap())
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(own.get(id).unwrap().owner(), Some(true));
        assert_eq!(other.get(id).unwrap().owner(), Some(false));
        assert_eq!(other.get_mut(id).unwrap().next_sequence(), Ok(SEQUENCE_BLOCK + 1));
        assert_eq!(other.get_mut(id).unwrap().next_sequence(), Ok(SEQUENCE_BLOCK + 2));
        assert_eq!(own.get_mut(id).unwrap().next_sequence(), Ok(4));
        assert_eq!(own.get(id).unwrap().last_sequence(), 4);
        // The packets are counted as the dataplane does, which lists the
        // SA for the tick.
        for _ in 0..2 {
            other.account(id, 64, Duration::ZERO);
        }
        for _ in 0..4 {
            own.account(id, 64, Duration::ZERO);
        }
        other.handle_timeout(Duration::ZERO);
        assert_eq!(own.get(id).unwrap().last_sequence(), SEQUENCE_BLOCK + 2);
        own.handle_timeout(Duration::ZERO);
        assert_eq!(other.get(id).unwrap().last_sequence(), SEQUENCE_BLOCK + 2);
        // Unplaced copies keep the old rule: shared, one number at a time.
        let mut a: Sad<()> = Sad::new();
        let id = a
            .insert(params("out", SaDirection::Outbound, 0x1000), (), Duration::ZERO)
            .unwrap();
        let mut b = a.fork();
        assert_eq!(a.get_mut(id).unwrap().next_sequence(), Ok(1));
        assert_eq!(b.get_mut(id).unwrap().next_sequence(), Ok(2));
        assert_eq!(a.get_mut(id).unwrap().next_sequence(), Ok(3));
        assert_eq!(a.get(id).unwrap().owner(), None);
    }

    /// Idle lifetimes under a virtual clock: soft, then hard, counted from
    /// the last packet (from installation before the first); traffic
    /// pushes both back; a packet after the hard idle limit finds the SA
    /// unusable even before the tick that notices.
    #[test]
    fn idle_lifetimes_soft_then_hard_from_the_last_packet() {
        let secs = Duration::from_secs;
        let mut p = params("o", SaDirection::Outbound, 0x1000);
        p.lifetime.soft.idle_seconds = Some(10);
        p.lifetime.hard.idle_seconds = Some(30);
        let mut sad: Sad<()> = Sad::new();
        let id = sad.insert(p, (), secs(100)).unwrap();
        // Idle since installation.
        sad.handle_timeout(secs(109));
        assert_eq!(sad.poll_event(), None);
        assert_eq!(sad.get(id).unwrap().idle(secs(109)), secs(9));
        // A packet at 109 restarts the count.
        assert_eq!(sad.account(id, 100, secs(109)), None);
        sad.handle_timeout(secs(118));
        assert_eq!(sad.poll_event(), None, "9 s since the last packet");
        sad.handle_timeout(secs(119));
        assert_eq!(sad.poll_event(), Some(SaEvent::SoftExpired(id)));
        assert_eq!(sad.get(id).unwrap().state(), SaState::SoftExpired);
        // Soft-expired but usable; traffic keeps it from the hard limit.
        assert!(sad.get(id).unwrap().is_usable(secs(130)));
        sad.account(id, 100, secs(130));
        let sa = sad.get(id).unwrap();
        assert!(sa.is_usable(secs(159)));
        assert!(!sa.is_usable(secs(160)), "30 s idle: unusable before any tick");
        sad.handle_timeout(secs(159));
        assert_eq!(sad.poll_event(), None);
        sad.handle_timeout(secs(160));
        assert_eq!(sad.poll_event(), Some(SaEvent::HardExpired(id)));
        assert!(!sad.get(id).unwrap().is_usable(secs(161)));
    }

    /// Another worker's packets keep a copy from idling out once that
    /// worker has added its usage (a batch or a tick).
    #[test]
    fn idle_time_counts_every_copy() {
        let secs = Duration::from_secs;
        let mut p = params("o", SaDirection::Outbound, 0x1000);
        p.lifetime.hard.idle_seconds = Some(5);
        let mut first: Sad<()> = Sad::new();
        let id = first.insert(p, (), Duration::ZERO).unwrap();
        let mut second = first.fork();
        second.account(id, 64, secs(4));
        second.handle_timeout(secs(4));
        first.handle_timeout(secs(6));
        assert_eq!(first.poll_event(), None, "the other copy sent at 4 s");
        assert_eq!(first.get(id).unwrap().idle(secs(6)), secs(2));
        first.handle_timeout(secs(9));
        assert_eq!(first.poll_event(), Some(SaEvent::HardExpired(id)));
    }

    /// Each of the SA's reasons has a slot of its own, and they are
    /// listed under the names `espgw stats` and the metrics have always
    /// shown, in that order.
    #[test]
    fn sa_counters_count_by_reason() {
        let mut c = SaCounters::default();
        for (i, &reason) in SA_DROP_REASONS.iter().enumerate() {
            for _ in 0..=i {
                c.count(reason);
            }
        }
        let named: Vec<(&str, u64)> = c.drops().map(|(r, n)| (r.name(), n)).collect();
        assert_eq!(
            named,
            [
                ("auth_failed", 1),
                ("replay_duplicate", 2),
                ("replay_too_old", 3),
                ("seq_zero", 4),
                ("policy_mismatch", 5),
                ("malformed", 6),
                ("sa_expired", 7),
                ("seq_overflow", 8),
                ("seq_not_reserved", 9),
            ]
        );
        assert_eq!(c.replay(), 2 + 3 + 4);
        c.count_replay(ReplayError::TooOld(1));
        assert_eq!(c.get(DropReason::ReplayTooOld), 4);
        assert_eq!(c.get(DropReason::NoRoute), 0, "not counted per SA");
    }

    /// The memory an SA's state takes is stated and bounded.
    #[test]
    fn sa_state_memory_is_bounded() {
        let mut p = params("a-tunnel-name-of-32-bytes-000000", SaDirection::Inbound, 0x1000);
        p.replay_window = 1024;
        assert_eq!(p.name.len(), 32);
        let sa = SecurityAssociation::new(p, (), Duration::ZERO);
        let bytes = sa.state_bytes();
        assert!(bytes <= SA_STATE_BOUND, "{bytes} bytes per SA");
        // The window is the part that scales: 65,536 packets is 8 KiB more.
        let mut big = params("b", SaDirection::Inbound, 0x1001);
        big.replay_window = crate::replay::MAX_WINDOW;
        let big = SecurityAssociation::new(big, (), Duration::ZERO);
        assert!(
            big.state_bytes() <= SA_STATE_BOUND + 8192,
            "{}",
            big.state_bytes()
        );
    }

    /// Installs, finds and deletes by name and SPI stay exact through
    /// churn at 10,000 SAs (no scan: a quadratic install would make this
    /// test slow, not wrong; the rate is `espgw bench --tunnels`'s).
    #[test]
    fn ten_thousand_sas_install_find_and_delete() {
        let mut sad: Sad<u32> = Sad::new();
        let mut ids = Vec::new();
        for i in 0..10_000u32 {
            let dir = if i % 2 == 0 {
                SaDirection::Inbound
            } else {
                SaDirection::Outbound
            };
            let id = sad
                .insert(params(&format!("sa{i}"), dir, 0x1000 + i), i, Duration::ZERO)
                .unwrap();
            ids.push(id);
        }
        assert_eq!(sad.len(), 10_000);
        assert_eq!(
            sad.insert(
                params("sa7", SaDirection::Outbound, 0x9999_9999),
                0,
                Duration::ZERO
            ),
            Err(SadError::DuplicateName("sa7".into()))
        );
        // Delete every third, then reinstall them under new names.
        for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
            assert_eq!(sad.remove(*id).map(|sa| *sa.crypto()), Some(i as u32));
        }
        assert_eq!(sad.len(), 10_000 - 3334);
        assert_eq!(sad.find("sa3"), None);
        assert_eq!(sad.lookup_inbound(0x1000 + 6, "10.0.0.1".parse().unwrap()), None);
        for i in (0..10_000u32).filter(|i| i % 3 == 0) {
            let id = sad
                .insert(
                    params(&format!("re{i}"), SaDirection::Inbound, 0x10_0000 + i),
                    i,
                    Duration::ZERO,
                )
                .unwrap();
            assert!(!ids.contains(&id), "a reused slot has a new generation");
        }
        assert_eq!(sad.len(), 10_000);
        assert_eq!(sad.slots.len(), 10_000, "freed slots were reused");
        for i in 0..10_000u32 {
            let (name, spi) = if i % 3 == 0 {
                (format!("re{i}"), 0x10_0000 + i)
            } else {
                (format!("sa{i}"), 0x1000 + i)
            };
            let id = sad.find(&name).expect("installed");
            assert_eq!(sad.get(id).map(|sa| *sa.crypto()), Some(i));
            let inbound = i % 3 == 0 || i % 2 == 0;
            assert_eq!(
                sad.lookup_inbound(spi, "10.0.0.1".parse().unwrap()),
                inbound.then_some(id),
                "{name}"
            );
        }
    }

    /// What the tick did before it followed only the SAs used and the
    /// deadlines due: add up and re-evaluate every SA.
    fn sweep_every_sa(sad: &mut Sad<()>, now: Duration) {
        let ids: Vec<SaId> = sad.iter().map(|(id, _)| id).collect();
        for id in ids {
            let sa = sad.get_mut(id).unwrap();
            sa.flush_usage();
            if let Some(state) = sa.refresh_state(now) {
                sad.note_transition(id, state);
            }
        }
    }

    fn drain_events(sad: &mut Sad<()>) -> Vec<(u32, bool)> {
        let mut events: Vec<(u32, bool)> = std::iter::from_fn(|| sad.poll_event())
            .map(|e| match e {
                SaEvent::SoftExpired(id) => (id.0, false),
                SaEvent::HardExpired(id) => (id.0, true),
            })
            .collect();
        events.sort_unstable();
        events
    }

    /// The tick's bookkeeping (the list of SAs used, the deadline heap)
    /// gives the same events by every tick, and the same states, as the
    /// sweep over every SA did, over random time, idle and packet limits,
    /// random traffic and SAs removed and added meanwhile.
    #[test]
    fn the_tick_finds_what_a_sweep_over_every_sa_finds() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let mut tracked: Sad<()> = Sad::new();
        let mut swept: Sad<()> = Sad::new();
        let random_limits = |random: &mut dyn FnMut(u64) -> u64| {
            let mut maybe = |scale: u64| (random(3) == 0).then(|| 1 + random(scale));
            Limits {
                bytes: None,
                packets: maybe(400),
                seconds: maybe(60),
                idle_seconds: maybe(20),
            }
        };
        let mut names = 0u32;
        let mut install =
            |at: Duration, tracked: &mut Sad<()>, swept: &mut Sad<()>, random: &mut dyn FnMut(u64) -> u64| {
                names += 1;
                let mut p = params(&format!("sa{names}"), SaDirection::Outbound, 0x1000 + names);
                p.lifetime.soft = random_limits(random);
                p.lifetime.hard = random_limits(random);
                let a = tracked.insert(p.clone(), (), at).unwrap();
                let b = swept.insert(p, (), at).unwrap();
                assert_eq!(a, b);
            };
        for _ in 0..300 {
            install(Duration::ZERO, &mut tracked, &mut swept, &mut random);
        }
        let (mut soft, mut hard) = (0, 0);
        for tick in 1..=240u64 {
            let now = Duration::from_millis(250 * tick);
            let ids: Vec<SaId> = tracked.iter().map(|(id, _)| id).collect();
            for &id in &ids {
                if random(4) != 0 {
                    continue;
                }
                for _ in 0..random(40) {
                    let at = now - Duration::from_millis(100);
                    tracked.account(id, 100, at);
                    if let Some(state) = swept.get_mut(id).unwrap().account(100, at) {
                        swept.note_transition(id, state);
                    }
                }
            }
            if random(5) == 0 {
                let id = ids[random(ids.len() as u64) as usize];
                assert!(tracked.remove(id).is_some() && swept.remove(id).is_some());
                install(now, &mut tracked, &mut swept, &mut random);
            }
            tracked.handle_timeout(now);
            sweep_every_sa(&mut swept, now);
            let events = drain_events(&mut tracked);
            assert_eq!(events, drain_events(&mut swept), "tick {tick}");
            soft += events.iter().filter(|e| !e.1).count();
            hard += events.iter().filter(|e| e.1).count();
            for (id, sa) in tracked.iter() {
                assert_eq!(sa.state(), swept.get(id).unwrap().state(), "tick {tick}");
                assert_eq!(sa.counters(), swept.get(id).unwrap().counters(), "tick {tick}");
            }
        }
        // The run reached both kinds of transition, not only quiet ticks.
        assert!(soft > 50 && hard > 50, "{soft} soft, {hard} hard");
    }

    /// SAs removed and added by the thousand leave the timer heap no more
    /// than about twice the SAs it holds.
    #[test]
    fn churn_keeps_the_timer_heap_bounded() {
        let mut sad: Sad<()> = Sad::new();
        let mut p = params("o", SaDirection::Outbound, 0x1000);
        p.lifetime.hard.seconds = Some(3600);
        p.lifetime.soft.idle_seconds = Some(600);
        for i in 0..10_000u32 {
            p.name = format!("o{i}");
            let id = sad
                .insert(p.clone(), (), Duration::from_millis(u64::from(i)))
                .unwrap();
            sad.remove(id).unwrap();
            assert!(
                sad.timers.len() <= 2 * sad.len() + 66,
                "{} entries",
                sad.timers.len()
            );
        }
        let id = sad.insert(p, (), Duration::ZERO).unwrap();
        sad.handle_timeout(Duration::from_secs(600));
        assert_eq!(sad.poll_event(), Some(SaEvent::SoftExpired(id)));
        sad.handle_timeout(Duration::from_secs(3600));
        assert_eq!(sad.poll_event(), Some(SaEvent::HardExpired(id)));
        assert_eq!(sad.poll_event(), None);
        assert!(sad.timers.is_empty(), "nothing left to time");
    }

    /// A tick adds up at most [`TICK_BUDGET`] SAs and raises at most as
    /// many deadlines, the oldest first, and says that it left the rest.
    #[test]
    fn a_tick_takes_at_most_its_budget_and_says_what_is_left() {
        let secs = Duration::from_secs;
        let n = 2 * TICK_BUDGET + 100;
        let mut first: Sad<()> = Sad::new();
        let mut p = params("o", SaDirection::Outbound, 0x1000);
        p.lifetime.hard.seconds = Some(10);
        let ids: Vec<SaId> = (0..n)
            .map(|i| {
                p.name = format!("o{i}");
                first.insert(p.clone(), (), Duration::ZERO).unwrap()
            })
            .collect();
        let second = first.fork();
        // The first packet after a tick is added up at once; the second
        // waits for the tick.
        for &id in &ids {
            first.account(id, 100, secs(1));
            first.account(id, 100, secs(1));
        }
        let seen = |id: SaId| second.get(id).unwrap().counters().packets;
        assert!(ids.iter().all(|&id| seen(id) == 1));
        for round in 1..=3 {
            first.handle_timeout(secs(2));
            let flushed = ids.iter().filter(|&&id| seen(id) == 2).count();
            assert_eq!(flushed, (round * TICK_BUDGET).min(n), "round {round}");
            assert_eq!(first.tick_backlog(), flushed < n, "round {round}");
            // Oldest first: the flushed ones are a prefix.
            assert!(ids[..flushed].iter().all(|&id| seen(id) == 2));
        }
        let mut expired = 0;
        for round in 1..=3 {
            first.handle_timeout(secs(10));
            expired += std::iter::from_fn(|| first.poll_event()).count();
            assert_eq!(expired, (round * TICK_BUDGET).min(n), "round {round}");
            assert_eq!(first.tick_backlog(), expired < n, "round {round}");
        }
    }
}
