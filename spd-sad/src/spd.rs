//! The Security Policy Database (RFC 4301 §4.4.1): ordered policies per
//! direction, first match wins, discard when nothing matches.
//!
//! # How a lookup stays flat as the table grows
//!
//! The ordered lists are kept for what RFC 4301 defines (their order *is*
//! the decision), but a packet never walks them. Two structures answer
//! instead, and both give exactly the first-match answer:
//!
//! 1. **A flow cache** ([`Spd::lookup_cached`], the dataplane's call): an
//!    exact-match table on the IPv4 5-tuple and direction, four ways per set,
//!    [`FLOW_CACHE_ENTRIES`] entries allocated once. An entry carries the
//!    SPD generation it was computed under; every change to the SPD bumps
//!    the generation, so an SPD edit invalidates the whole cache in O(1)
//!    and a stale decision is never returned. A hit costs one hash and one
//!    or two compares whatever the table size. IPv6 flows are not cached
//!    (their entries would not fit two to a cache line): they go to the
//!    index.
//! 2. **Tuple-space search** behind it ([`Spd::lookup`]): policies are
//!    grouped by their *shape* (source prefix length, destination prefix
//!    length, whether the protocol is named). Inside a shape, the masked
//!    addresses and the protocol are an exact key into a hash map whose
//!    cell holds that key's policies in decision order, with their port
//!    ranges checked in turn. A lookup probes each shape once, so its cost
//!    grows with the number of distinct shapes (a handful in a real
//!    configuration, at most 33 x 33 x 2 for IPv4 and 129 x 129 x 2 for
//!    IPv6, each family in an index of its own), not with the number of
//!    policies.
//!    Shapes are visited in order of their best (earliest) policy and the
//!    search stops at the first shape that cannot beat what was found,
//!    which keeps the RFC 4301 ordered decision: the answer is the match
//!    with the smallest (priority, insertion) key over all shapes, which is
//!    by construction the first match of the ordered list.
//!
//! Why tuple-space search rather than per-field tries or a decision tree
//! (HiCuts / EffiCuts style), measured with `cargo bench -p bench --bench
//! micro -- spd_lookup` (criterion medians, this 2-core box, random tables
//! of 32 shapes: /16, /24, /28, /32 on either side, protocol named or not):
//! the linear scan took 22 ns at 10 policies, 2.0 µs at 1,000 (and 361
//! µs at 100,000 in an earlier measurement); the index takes 43 ns at 10, 161 ns at
//! 1,000 and 188 ns at 100,000 for a match near the end (4.4x the
//! 10-policy cost), 126 ns for the default discard; a flow-cache hit is
//! 9-12 ns at every size and a miss that refills its entry 151 ns at
//! 100,000 (docs/results.md, "Scale", under load from other work).
//! What grows is the number of shapes probed, bounded by the
//! configuration's prefix-length mix, not by its size. An insert or delete
//! touches one hash cell (plus O(log n) ordering bookkeeping), which a
//! rekey storm of thousands of policy repoints per second needs. A cut
//! tree answers in a bounded number of steps too, but must be rebuilt or
//! rebalanced on edits; per-field tries with bit-vector intersection cost
//! O(n / 64) words per lookup, 1,500 words at 100,000 policies. Neither
//! was built here to compare against. Tuple-space search's weak case is
//! many distinct prefix-length pairs (up to 2,178 shapes), where it
//! degrades to one probe per shape; the flow cache hides that for steady
//! flows.
//!
//! Edits are for the control plane, never per packet: insert, remove by
//! name, repoint and remove-by-SA find their policies through name and SA
//! indexes (no scan), and keep the ordered `Vec` in place (a shift when
//! the new policy does not go at the end of its priority).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rustc_hash::FxHashMap;

use crate::sad::SaId;
use std::net::IpAddr;

use crate::selector::{Family, FlowKey, IpPrefix, PortRange, ProtocolSelector, Selector};
/// Which traffic a policy governs. Its name (the config's `direction`,
/// policy names, JSON) is the variant in lower case, derived for parsing
/// and `Display`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumString, strum::VariantNames, strum::IntoStaticStr,
)]
#[strum(serialize_all = "lowercase")]
pub enum PolicyDirection {
    /// Traffic leaving through the protected (outside) interface.
    Out,
    /// Traffic arriving from the outside interface.
    In,
}

// Not derived: strum's `Display` honours a width, which would change how
// the `{:<N}` columns of `espgw check-config` print today.
impl fmt::Display for PolicyDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.into())
    }
}

/// What happens to traffic a policy matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Outbound: encapsulate with this SA. Inbound: the traffic must have
    /// arrived through this SA; plaintext matching it is dropped.
    Protect(SaId),
    /// Forward in the clear.
    Bypass,
    /// Drop.
    Discard,
}

/// One SPD entry (RFC 4301 §4.4.1): what traffic it selects and what
/// happens to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Unique in the SPD; how configuration and logs name it.
    pub name: String,
    /// Outbound or inbound traffic.
    pub direction: PolicyDirection,
    /// Lower values are consulted first; equal values keep insertion order.
    pub priority: u32,
    /// Which packets it applies to.
    pub selector: Selector,
    /// What happens to them.
    pub action: Action,
}

/// The result of an SPD lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// What happens to the packet.
    pub action: Action,
    /// The matching policy's number (its place in insertion order: unique
    /// and kept while the policy exists; see [`Spd::numbered`]), or `None`
    /// for the default discard.
    pub policy: Option<u64>,
}

/// Entries of the flow cache (four ways per set, a set in two 64-byte
/// cache lines), allocated once per SPD copy: 65,536 entries, 2 MiB per
/// worker. With one flow per tunnel round robin over 10,000 tunnels, a
/// flow whose set holds four others keeps missing: 0.4 % of them here
/// (measured with `espgw bench --tunnels 10000`: 2-way at 32,768 entries
/// gave 88 % hits, 4-way 94 %).
pub const FLOW_CACHE_ENTRIES: usize = 65_536;
const WAYS: usize = 4;
const FLOW_CACHE_SETS: usize = FLOW_CACHE_ENTRIES / WAYS;

/// Where a policy stands in its direction's decision order: priority
/// first, then insertion (a sequence number that only grows), which is the
/// order a stable sort by priority gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct OrderKey {
    priority: u32,
    seq: u64,
}

impl OrderKey {
    const LAST: OrderKey = OrderKey {
        priority: u32::MAX,
        seq: u64::MAX,
    };
}

/// A policy as the tuple-space index holds it: only what the cell's key
/// does not already decide.
#[derive(Debug, Clone, Copy)]
struct Rule {
    key: OrderKey,
    src_ports: PortRange,
    dst_ports: PortRange,
    /// The policy's action, kept here too so that a lookup reads no
    /// `Policy` (a cache miss per lookup in a large table).
    action: Action,
}

/// The rules of one cell. Most cells hold one policy (a tunnel's subnet
/// pair): kept inline, a lookup follows no pointer.
#[derive(Debug, Clone)]
enum Cell {
    One(Rule),
    /// Two or more, in decision order.
    Many(Vec<Rule>),
}

impl Cell {
    fn rules(&self) -> &[Rule] {
        match self {
            Cell::One(rule) => std::slice::from_ref(rule),
            Cell::Many(rules) => rules,
        }
    }

    fn insert(&mut self, rule: Rule) {
        let rules = match self {
            Cell::One(first) => {
                *self = Cell::Many(vec![*first]);
                match self {
                    Cell::Many(rules) => rules,
                    Cell::One(_) => return,
                }
            }
            Cell::Many(rules) => rules,
        };
        let pos = rules.partition_point(|r| r.key < rule.key);
        rules.insert(pos, rule);
    }

    /// Removes the rule of `key`; true when the cell is left empty.
    fn remove(&mut self, key: OrderKey) -> bool {
        match self {
            Cell::One(rule) => rule.key == key,
            Cell::Many(rules) => {
                rules.retain(|r| r.key != key);
                if let [only] = rules[..] {
                    *self = Cell::One(only);
                    false
                } else {
                    rules.is_empty()
                }
            }
        }
    }

    fn rule_mut(&mut self, key: OrderKey) -> Option<&mut Rule> {
        match self {
            Cell::One(rule) => (rule.key == key).then_some(rule),
            Cell::Many(rules) => rules.iter_mut().find(|r| r.key == key),
        }
    }
}

impl Rule {
    fn ports_match(&self, ports: Option<(u16, u16)>) -> bool {
        match ports {
            Some((sp, dp)) => self.src_ports.contains(sp) && self.dst_ports.contains(dp),
            // RFC 4301 §4.4.1.1 OPAQUE: only ANY ports match.
            None => self.src_ports.is_any() && self.dst_ports.is_any(),
        }
    }
}

/// The bits of one address family as an index holds them: IPv4 as
/// `u32`, IPv6 as `u128`, so the IPv4 index keeps its narrow keys.
trait AddrBits: Copy + Eq + std::hash::Hash + fmt::Debug + Default + std::ops::BitAnd<Output = Self> {
    const WIDTH: u32;
    const ALL: Self;
    fn shl(self, n: u32) -> Self;
    /// Feeds a cell key's two addresses to the hasher: IPv4's as one
    /// 64-bit word, so that a probe hashes as few words as it did when
    /// the index held IPv4 only (one FxHash round per word).
    fn hash_pair<H: std::hash::Hasher>(src: Self, dst: Self, state: &mut H);
    /// The network address of a prefix of this family (`any`: zero).
    fn of_prefix(prefix: IpPrefix) -> Self;

    fn mask(len: u8) -> Self {
        if len == 0 {
            Self::default()
        } else {
            Self::ALL.shl(Self::WIDTH - u32::from(len))
        }
    }
}

impl AddrBits for u32 {
    const WIDTH: u32 = 32;
    const ALL: Self = u32::MAX;
    fn shl(self, n: u32) -> Self {
        self << n
    }
    fn hash_pair<H: std::hash::Hasher>(src: Self, dst: Self, state: &mut H) {
        state.write_u64((u64::from(src) << 32) | u64::from(dst));
    }
    fn of_prefix(prefix: IpPrefix) -> Self {
        match prefix {
            IpPrefix::V4(p) => u32::from(p.addr()),
            _ => 0,
        }
    }
}

impl AddrBits for u128 {
    const WIDTH: u32 = 128;
    const ALL: Self = u128::MAX;
    fn shl(self, n: u32) -> Self {
        self << n
    }
    fn hash_pair<H: std::hash::Hasher>(src: Self, dst: Self, state: &mut H) {
        state.write_u128(src);
        state.write_u128(dst);
    }
    fn of_prefix(prefix: IpPrefix) -> Self {
        match prefix {
            IpPrefix::V6(p) => u128::from(p.addr()),
            _ => 0,
        }
    }
}

/// The fields a shape matches exactly: masked addresses and protocol
/// (0 when the shape leaves the protocol open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CellKey<A> {
    src: A,
    dst: A,
    protocol: u8,
}

impl<A: AddrBits> std::hash::Hash for CellKey<A> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        A::hash_pair(self.src, self.dst, state);
        state.write_u8(self.protocol);
    }
}

/// Policies of one shape: prefix lengths and whether a protocol is named.
#[derive(Debug, Clone)]
struct Tuple<A> {
    src_len: u8,
    dst_len: u8,
    named_protocol: bool,
    src_mask: A,
    dst_mask: A,
    /// The earliest policy of the shape (`keys.first()`, kept here so the
    /// lookup need not walk the set).
    best: OrderKey,
    keys: BTreeSet<OrderKey>,
    /// Each cell's rules in decision order.
    cells: FxHashMap<CellKey<A>, Cell>,
}

impl<A: AddrBits> Tuple<A> {
    fn cell_key(&self, src: A, dst: A, protocol: u8) -> CellKey<A> {
        CellKey {
            src: src & self.src_mask,
            dst: dst & self.dst_mask,
            protocol: if self.named_protocol { protocol } else { 0 },
        }
    }
}

fn shape_of(selector: &Selector) -> (u8, u8, bool, u8) {
    let (named, protocol) = match selector.protocol {
        ProtocolSelector::Any => (false, 0),
        ProtocolSelector::Number(n) => (true, n),
    };
    (selector.src.len(), selector.dst.len(), named, protocol)
}

/// Tuple-space search over one direction's policies of one family.
#[derive(Debug, Clone)]
struct Index<A> {
    /// Sorted by `best`, so the search can stop early.
    tuples: Vec<Tuple<A>>,
}

impl<A> Default for Index<A> {
    fn default() -> Self {
        Index { tuples: Vec::new() }
    }
}

impl<A: AddrBits> Index<A> {
    fn insert(&mut self, selector: &Selector, key: OrderKey, action: Action) {
        let (src_len, dst_len, named_protocol, protocol) = shape_of(selector);
        let at = match self
            .tuples
            .iter()
            .position(|t| (t.src_len, t.dst_len, t.named_protocol) == (src_len, dst_len, named_protocol))
        {
            Some(at) => at,
            None => {
                self.tuples.push(Tuple {
                    src_len,
                    dst_len,
                    named_protocol,
                    src_mask: A::mask(src_len),
                    dst_mask: A::mask(dst_len),
                    best: OrderKey::LAST,
                    keys: BTreeSet::new(),
                    cells: FxHashMap::default(),
                });
                self.tuples.len() - 1
            }
        };
        let tuple = &mut self.tuples[at];
        let cell_key = tuple.cell_key(A::of_prefix(selector.src), A::of_prefix(selector.dst), protocol);
        let rule = Rule {
            key,
            src_ports: selector.src_ports,
            dst_ports: selector.dst_ports,
            action,
        };
        match tuple.cells.entry(cell_key) {
            std::collections::hash_map::Entry::Occupied(mut cell) => cell.get_mut().insert(rule),
            std::collections::hash_map::Entry::Vacant(cell) => {
                cell.insert(Cell::One(rule));
            }
        }
        tuple.keys.insert(key);
        let before = tuple.best;
        tuple.best = key.min(before);
        if tuple.best != before {
            self.reorder();
        }
    }

    fn remove(&mut self, selector: &Selector, key: OrderKey) {
        let (src_len, dst_len, named_protocol, protocol) = shape_of(selector);
        let Some(at) = self
            .tuples
            .iter()
            .position(|t| (t.src_len, t.dst_len, t.named_protocol) == (src_len, dst_len, named_protocol))
        else {
            return;
        };
        let tuple = &mut self.tuples[at];
        let cell_key = tuple.cell_key(A::of_prefix(selector.src), A::of_prefix(selector.dst), protocol);
        if tuple
            .cells
            .get_mut(&cell_key)
            .is_some_and(|cell| cell.remove(key))
        {
            tuple.cells.remove(&cell_key);
        }
        tuple.keys.remove(&key);
        if tuple.keys.is_empty() {
            self.tuples.remove(at);
        } else if tuple.best == key {
            tuple.best = tuple.keys.first().copied().unwrap_or(OrderKey::LAST);
            self.reorder();
        }
    }

    /// The rule of the policy with `selector` and `key`.
    fn rule_mut(&mut self, selector: &Selector, key: OrderKey) -> Option<&mut Rule> {
        let (src_len, dst_len, named_protocol, protocol) = shape_of(selector);
        let tuple = self
            .tuples
            .iter_mut()
            .find(|t| (t.src_len, t.dst_len, t.named_protocol) == (src_len, dst_len, named_protocol))?;
        let cell_key = tuple.cell_key(A::of_prefix(selector.src), A::of_prefix(selector.dst), protocol);
        tuple.cells.get_mut(&cell_key)?.rule_mut(key)
    }

    fn reorder(&mut self) {
        // Nearly sorted after one edit: the stable sort runs in linear time.
        self.tuples.sort_by_key(|t| t.best);
    }

    /// The earliest policy whose selector matches `flow` (addresses of
    /// this index's family).
    fn find(&self, src: A, dst: A, flow: &FlowKey) -> Option<Rule> {
        let mut found: Option<Rule> = None;
        for tuple in &self.tuples {
            if found.is_some_and(|f| f.key < tuple.best) {
                // Every later shape starts after what we have.
                break;
            }
            let Some(cell) = tuple.cells.get(&tuple.cell_key(src, dst, flow.protocol)) else {
                continue;
            };
            for rule in cell.rules() {
                if found.is_some_and(|f| f.key < rule.key) {
                    break;
                }
                if rule.ports_match(flow.ports) {
                    found = Some(*rule);
                    break;
                }
            }
        }
        found
    }
}

/// One direction's index: one per family. A policy whose addresses are
/// both `any` is in both.
#[derive(Debug, Clone, Default)]
struct FamilyIndex {
    v4: Index<u32>,
    v6: Index<u128>,
}

impl FamilyIndex {
    /// The families a selector is indexed under; none for one that mixes
    /// families (which the config refuses, and which matches nothing).
    fn families(selector: &Selector) -> &'static [Family] {
        selector.families().unwrap_or(&[])
    }

    fn insert(&mut self, selector: &Selector, key: OrderKey, action: Action) {
        for family in Self::families(selector) {
            match family {
                Family::V4 => self.v4.insert(selector, key, action),
                Family::V6 => self.v6.insert(selector, key, action),
            }
        }
    }

    fn remove(&mut self, selector: &Selector, key: OrderKey) {
        for family in Self::families(selector) {
            match family {
                Family::V4 => self.v4.remove(selector, key),
                Family::V6 => self.v6.remove(selector, key),
            }
        }
    }

    fn set_action(&mut self, selector: &Selector, key: OrderKey, action: Action) {
        for family in Self::families(selector) {
            let rule = match family {
                Family::V4 => self.v4.rule_mut(selector, key),
                Family::V6 => self.v6.rule_mut(selector, key),
            };
            if let Some(rule) = rule {
                rule.action = action;
            }
        }
    }

    fn find(&self, flow: &FlowKey) -> Option<Rule> {
        match (flow.src, flow.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => self.v4.find(u32::from(src), u32::from(dst), flow),
            (IpAddr::V6(src), IpAddr::V6(dst)) => self.v6.find(u128::from(src), u128::from(dst), flow),
            // No packet carries addresses of two families.
            _ => None,
        }
    }

    fn shapes(&self) -> usize {
        self.v4.tuples.len() + self.v6.tuples.len()
    }
}

/// One cached decision. `generation` 0 marks an empty entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CacheEntry {
    src: u32,
    dst: u32,
    ports: u32,
    protocol: u8,
    /// Bit 0: inbound; bit 1: the flow carries ports.
    flags: u8,
    /// 0 discard, 1 bypass, 2 protect.
    action: u8,
    generation: u32,
    sa: u32,
    /// `u32::MAX`: the default discard.
    policy: u32,
}

impl CacheEntry {
    /// The key of an IPv4 flow; `None` for IPv6, which the cache does not
    /// hold (its entries stay two to a cache line).
    fn key_of(direction: PolicyDirection, flow: &FlowKey) -> Option<(u32, u32, u32, u8, u8)> {
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (flow.src, flow.dst) else {
            return None;
        };
        let (ports, has_ports) = match flow.ports {
            Some((sp, dp)) => ((u32::from(sp) << 16) | u32::from(dp), 2),
            None => (0, 0),
        };
        let dir = match direction {
            PolicyDirection::Out => 0,
            PolicyDirection::In => 1,
        };
        Some((
            u32::from(src),
            u32::from(dst),
            ports,
            flow.protocol,
            dir | has_ports,
        ))
    }

    fn matches(&self, key: (u32, u32, u32, u8, u8), generation: u32) -> bool {
        self.generation == generation && (self.src, self.dst, self.ports, self.protocol, self.flags) == key
    }

    fn decision(&self) -> Decision {
        Decision {
            action: match self.action {
                2 => Action::Protect(SaId(self.sa)),
                1 => Action::Bypass,
                _ => Action::Discard,
            },
            policy: (self.policy != u32::MAX).then_some(u64::from(self.policy)),
        }
    }
}

/// Hit and miss counts of the flow cache (this SPD copy's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to walk the SPD.
    pub misses: u64,
}

/// One set: four ways, most recent first, aligned to cache lines (a hit
/// on the first two touches one).
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
struct CacheSet([CacheEntry; WAYS]);

/// The flow cache: [`FLOW_CACHE_SETS`] sets of [`WAYS`] ways.
#[derive(Clone)]
struct FlowCache {
    entries: Box<[CacheSet]>,
    stats: FlowCacheStats,
}

impl Default for FlowCache {
    fn default() -> Self {
        // Zeroed memory from the allocator: the OS maps pages as lookups
        // first touch them, so a small configuration's cache costs little
        // resident memory, and building an SPD writes nothing.
        let entries = Box::<[CacheSet]>::new_zeroed_slice(FLOW_CACHE_SETS);
        // SAFETY: a `CacheSet` is integers only, so all-zero bytes are a
        // valid value: every entry empty (generation 0).
        let entries = unsafe { entries.assume_init() };
        FlowCache {
            entries,
            stats: FlowCacheStats::default(),
        }
    }
}

impl FlowCache {
    fn set_of(key: (u32, u32, u32, u8, u8)) -> usize {
        let (src, dst, ports, protocol, flags) = key;
        let mut h = (u64::from(src) << 32) | u64::from(dst);
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= (u64::from(ports) << 16) | (u64::from(protocol) << 8) | u64::from(flags);
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 40) as usize % FLOW_CACHE_SETS
    }

    fn clear(&mut self) {
        self.entries.fill(CacheSet::default());
    }
}

/// Ordered policies for both directions, their index and the flow cache.
#[derive(Clone)]
pub struct Spd {
    /// Each direction's policies by order key: adding or removing one is a
    /// tree update, never a shift of the policies after it (100,000 of
    /// them in a big SPD).
    out: BTreeMap<OrderKey, Policy>,
    inbound: BTreeMap<OrderKey, Policy>,
    index: [FamilyIndex; 2],
    /// Policies by name (duplicates allowed): direction (0 out, 1 in), key.
    names: FxHashMap<String, BTreeSet<(u8, OrderKey)>>,
    /// Policies that protect with each SA.
    by_sa: FxHashMap<SaId, BTreeSet<(u8, OrderKey)>>,
    next_seq: u64,
    /// Bumped by every change; 0 is never current (it marks empty cache
    /// entries).
    generation: u32,
    cache: FlowCache,
}

impl fmt::Debug for Spd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spd")
            .field("out", &self.out.len())
            .field("in", &self.inbound.len())
            .field("shapes", &[self.index[0].shapes(), self.index[1].shapes()])
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

fn dir_index(direction: PolicyDirection) -> usize {
    match direction {
        PolicyDirection::Out => 0,
        PolicyDirection::In => 1,
    }
}

fn dir_of(index: u8) -> PolicyDirection {
    if index == 0 {
        PolicyDirection::Out
    } else {
        PolicyDirection::In
    }
}

impl Default for Spd {
    fn default() -> Self {
        Spd {
            out: BTreeMap::new(),
            inbound: BTreeMap::new(),
            index: [FamilyIndex::default(), FamilyIndex::default()],
            names: FxHashMap::default(),
            by_sa: FxHashMap::default(),
            next_seq: 0,
            generation: 1,
            cache: FlowCache::default(),
        }
    }
}

impl Spd {
    /// An empty SPD: it discards everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one change: every cached decision is stale from now on.
    fn changed(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // After 2^32 changes an old entry's generation could come back:
            // start the cache afresh instead.
            self.cache.clear();
            self.generation = 1;
        }
    }

    /// The number of changes made so far (wrapping): flow cache entries
    /// from another generation are never used.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Adds a policy, keeping each direction sorted by priority (stable).
    pub fn insert(&mut self, policy: Policy) {
        let d = dir_index(policy.direction);
        self.next_seq += 1;
        let key = OrderKey {
            priority: policy.priority,
            seq: self.next_seq,
        };
        // The new key is the largest of its priority: it goes after them.
        self.index[d].insert(&policy.selector, key, policy.action);
        self.names
            .entry(policy.name.clone())
            .or_default()
            .insert((d as u8, key));
        if let Action::Protect(sa) = policy.action {
            self.by_sa.entry(sa).or_default().insert((d as u8, key));
        }
        self.list_mut(policy.direction).insert(key, policy);
        self.changed();
    }

    /// Removes the policy of direction `d` with key `key`.
    fn remove_at(&mut self, d: u8, key: OrderKey) -> Option<Policy> {
        let policy = self.list_mut(dir_of(d)).remove(&key)?;
        self.index[usize::from(d)].remove(&policy.selector, key);
        if let Some(set) = self.names.get_mut(&policy.name) {
            set.remove(&(d, key));
            if set.is_empty() {
                self.names.remove(&policy.name);
            }
        }
        if let Action::Protect(sa) = policy.action {
            self.forget_sa(sa, d, key);
        }
        Some(policy)
    }

    fn forget_sa(&mut self, sa: SaId, d: u8, key: OrderKey) {
        if let Some(set) = self.by_sa.get_mut(&sa) {
            set.remove(&(d, key));
            if set.is_empty() {
                self.by_sa.remove(&sa);
            }
        }
    }

    /// Removes every policy whose action protects with `sa`.
    pub fn remove_for_sa(&mut self, sa: SaId) {
        let Some(set) = self.by_sa.remove(&sa) else {
            return;
        };
        for (d, key) in set {
            self.remove_at(d, key);
        }
        self.changed();
    }

    /// The first policy called `name`: outbound ones first, each direction
    /// in lookup order.
    fn find_name(&self, name: &str) -> Option<(u8, OrderKey)> {
        self.names.get(name).and_then(|set| set.first().copied())
    }

    /// Removes the policy called `name`; returns it if there was one.
    pub fn remove(&mut self, name: &str) -> Option<Policy> {
        let (d, key) = self.find_name(name)?;
        let policy = self.remove_at(d, key);
        self.changed();
        policy
    }

    /// Points the policy called `name` at a new action (a rekeyed SA);
    /// false if there is no such policy.
    pub fn set_action(&mut self, name: &str, action: Action) -> bool {
        let Some((d, key)) = self.find_name(name) else {
            return false;
        };
        let Some(policy) = self.list_mut(dir_of(d)).get_mut(&key) else {
            return false;
        };
        let old = std::mem::replace(&mut policy.action, action);
        let selector = policy.selector;
        self.index[usize::from(d)].set_action(&selector, key, action);
        if let Action::Protect(sa) = old {
            self.forget_sa(sa, d, key);
        }
        if let Action::Protect(sa) = action {
            self.by_sa.entry(sa).or_default().insert((d, key));
        }
        self.changed();
        true
    }

    /// The policy called `name`.
    pub fn get(&self, name: &str) -> Option<&Policy> {
        let (d, key) = self.find_name(name)?;
        self.list(dir_of(d)).get(&key)
    }

    fn list_mut(&mut self, direction: PolicyDirection) -> &mut BTreeMap<OrderKey, Policy> {
        match direction {
            PolicyDirection::Out => &mut self.out,
            PolicyDirection::In => &mut self.inbound,
        }
    }

    fn list(&self, direction: PolicyDirection) -> &BTreeMap<OrderKey, Policy> {
        match direction {
            PolicyDirection::Out => &self.out,
            PolicyDirection::In => &self.inbound,
        }
    }

    /// The policies of a direction in the order they are consulted.
    pub fn policies(&self, direction: PolicyDirection) -> impl ExactSizeIterator<Item = &Policy> + '_ {
        self.list(direction).values()
    }

    /// The policies of a direction in the order they are consulted, each
    /// with its number (what a [`Decision`] names it by).
    pub fn numbered(&self, direction: PolicyDirection) -> impl ExactSizeIterator<Item = (u64, &Policy)> + '_ {
        self.list(direction).iter().map(|(key, policy)| (key.seq, policy))
    }

    /// First matching policy; discard when none matches (RFC 4301 §4.4.1).
    /// Answered by the tuple-space index, not by walking the list.
    pub fn lookup(&self, direction: PolicyDirection, flow: &FlowKey) -> Decision {
        let d = dir_index(direction);
        self.index[d]
            .find(flow)
            .map(|rule| Decision {
                action: rule.action,
                policy: Some(rule.key.seq),
            })
            .unwrap_or(Decision {
                action: Action::Discard,
                policy: None,
            })
    }

    /// [`lookup`](Self::lookup) through the flow cache: the same answer,
    /// from the cache when this flow was looked up since the last change.
    /// The dataplane's call: no allocation, no lock.
    pub fn lookup_cached(&mut self, direction: PolicyDirection, flow: &FlowKey) -> Decision {
        let Some(key) = CacheEntry::key_of(direction, flow) else {
            return self.lookup(direction, flow);
        };
        let set = FlowCache::set_of(key);
        let generation = self.generation;
        let ways = &self.cache.entries[set].0;
        if let Some(hit) = ways.iter().find(|e| e.matches(key, generation)) {
            let decision = hit.decision();
            self.cache.stats.hits += 1;
            return decision;
        }
        self.cache.stats.misses += 1;
        let decision = self.lookup(direction, flow);
        let policy = match decision.policy {
            None => u32::MAX,
            Some(i) => match u32::try_from(i) {
                Ok(i) if i != u32::MAX => i,
                // Beyond what an entry holds: answer without caching.
                _ => return decision,
            },
        };
        let (action, sa) = match decision.action {
            Action::Discard => (0, 0),
            Action::Bypass => (1, 0),
            Action::Protect(SaId(sa)) => (2, sa),
        };
        let (src, dst, ports, protocol, flags) = key;
        let ways = &mut self.cache.entries[set].0;
        // Most recent first; the least recent falls out.
        ways.copy_within(0..WAYS - 1, 1);
        ways[0] = CacheEntry {
            src,
            dst,
            ports,
            protocol,
            flags,
            action,
            generation,
            sa,
            policy,
        };
        decision
    }

    /// Starts loading `flow`'s flow-cache set into the CPU cache, for a
    /// caller that sees a batch before it classifies it: the set's memory
    /// miss then overlaps other work instead of stalling the lookup (with
    /// 10,000 tunnels round robin, every set is a cold line). A hint only:
    /// it changes no answer, and does nothing off x86-64.
    #[inline]
    pub fn prefetch(&self, direction: PolicyDirection, flow: &FlowKey) {
        let Some(key) = CacheEntry::key_of(direction, flow) else {
            return;
        };
        let set = FlowCache::set_of(key);
        let Some(line) = self.cache.entries.get(set) else {
            return;
        };
        crate::sad::prefetch_line((line as *const CacheSet).cast::<u8>());
    }

    /// Flow cache hits and misses of this copy so far.
    pub fn cache_stats(&self) -> FlowCacheStats {
        self.cache.stats
    }

    /// Distinct selector shapes (prefix lengths, protocol named or not) of
    /// a direction: what one uncached lookup probes at most.
    pub fn shapes(&self, direction: PolicyDirection) -> usize {
        self.index[dir_index(direction)].shapes()
    }

    /// How many policies there are, both directions.
    pub fn len(&self) -> usize {
        self.out.len() + self.inbound.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{PortRange, ProtocolSelector};

    /// The names are config values and parts of policy names: deriving
    /// them must not rename one.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        use strum::VariantNames;
        assert_eq!(PolicyDirection::VARIANTS, ["out", "in"]);
        let both = [PolicyDirection::Out, PolicyDirection::In];
        assert_eq!(both.map(|d| d.to_string()), ["out", "in"]);
        assert_eq!(["out", "in"].map(|n| n.parse().ok()), both.map(Some));
    }

    fn policy(name: &str, priority: u32, src: &str, dst: &str, action: Action) -> Policy {
        Policy {
            name: name.into(),
            direction: PolicyDirection::Out,
            priority,
            selector: Selector {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                protocol: ProtocolSelector::Any,
                src_ports: PortRange::ANY,
                dst_ports: PortRange::ANY,
            },
            action,
        }
    }

    fn flow(src: &str, dst: &str) -> FlowKey {
        FlowKey {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 17,
            ports: Some((1, 2)),
        }
    }

    #[test]
    fn priority_orders_lookup_and_default_is_discard() {
        let mut spd = Spd::new();
        spd.insert(policy("wide", 200, "10.0.0.0/8", "any", Action::Protect(SaId(0))));
        spd.insert(policy("narrow", 100, "10.1.0.0/16", "any", Action::Bypass));
        spd.insert(policy("also-200", 200, "any", "any", Action::Discard));
        let names: Vec<_> = spd
            .policies(PolicyDirection::Out)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["narrow", "wide", "also-200"]);
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.1.2.3", "1.1.1.1"))
                .action,
            Action::Bypass
        );
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Protect(SaId(0))
        );
        let none = spd.lookup(PolicyDirection::In, &flow("10.9.2.3", "1.1.1.1"));
        assert_eq!(none.action, Action::Discard);
        assert_eq!(none.policy, None);
        spd.remove_for_sa(SaId(0));
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Discard
        );
    }

    #[test]
    fn policies_are_repointed_and_removed_by_name() {
        let mut spd = Spd::new();
        spd.insert(policy(
            "t-out",
            100,
            "10.0.0.0/8",
            "any",
            Action::Protect(SaId(0)),
        ));
        spd.insert(policy("other", 200, "any", "any", Action::Bypass));
        assert!(spd.set_action("t-out", Action::Protect(SaId(7))));
        assert!(!spd.set_action("missing", Action::Discard));
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Protect(SaId(7))
        );
        assert_eq!(spd.get("t-out").map(|p| p.priority), Some(100));
        assert_eq!(spd.remove("t-out").map(|p| p.name), Some("t-out".to_owned()));
        assert!(spd.remove("t-out").is_none());
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Bypass
        );
    }
}
