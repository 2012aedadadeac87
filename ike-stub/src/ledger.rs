//! The sequence ledger of SAs with static keys: how far each key's
//! sequence numbers have gone, so that after a restart, a reload or a crash
//! an SA never sends a number it may have sent under the same key (with an
//! AEAD the number is the nonce) and never accepts one it accepted.
//!
//! Every SA whose keys come from the file (see
//! [`KeySource::File`](dataplane::command::KeySource)) has an entry: a
//! *ceiling*, the highest number it may use. The driver makes a ceiling
//! durable before any copy of the SA may use a number up to it, so that
//! whatever the process had used is at or below the ceiling in the file;
//! at the next start the SA resumes above it (outbound: the counter goes
//! on after it; inbound: everything up to it counts as received).
//!
//! A ceiling is ahead of what the SA used, so a receiver restarted alone
//! would refuse its peer's next packets up to it. A clean stop therefore
//! *settles* the ledger: once no copy of any SA can use another number,
//! each tracked SA's ceiling comes down to the exact number it reached,
//! and the file says so. After a crash the reserved ceilings stand.
//!
//! Sans-IO: the fingerprints entries are keyed by, the file's text form
//! (encoded and decoded here; the driver reads, writes and syncs it), and
//! [`Reservations`], which says which SA's ceiling must go how far, from
//! the numbers the SAs have reached and the time the driver passes in.
//! Owns no file, no clock and no SA; must not touch packets.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use rand::Rng;
use sha2::{Digest, Sha256};
use spd_sad::SaDirection;

use dataplane::command::{KeySource, SaSetup};

/// The first line of a ledger file: its format and version.
pub const MAGIC: &str = "espgw sequence ledger 1";

/// Bytes of the salt the fingerprints are keyed with.
pub const SALT_LEN: usize = 32;

/// An outbound reservation covers this many seconds of the SA's rate, and
/// at least [`OUT_FLOOR`] numbers; a new one is made durable when half is
/// left. At a steady rate that is a write every two seconds per busy SA
/// (the driver writes every SA's in one go), and a restart skips at most
/// that many numbers, which the peer's window takes as a gap.
pub const OUT_HORIZON: Duration = Duration::from_secs(4);
/// The smallest outbound reservation.
pub const OUT_FLOOR: u64 = 4096;
/// An inbound reservation covers a quarter of what an outbound one does
/// at the same rate, so that a receiver's ceiling stays below the point
/// its sender resumes from (the sender keeps at least half a reservation
/// ahead of what it sent): after both ends restart, nothing the sender
/// sends is refused. The price of never accepting a number twice: after a
/// restart of the receiver alone, the numbers between what it had accepted
/// and its ceiling, about one second of traffic or [`IN_FLOOR`] packets,
/// whichever is more, are refused as already received.
pub const IN_HORIZON: Duration = Duration::from_secs(1);
/// The smallest inbound reservation: small, because it is what a receiver
/// restarted alone refuses of a slow SA's traffic; a burst beyond it waits
/// for the next reservation, which the rate then sizes.
pub const IN_FLOOR: u64 = 64;
// What the receiver may reserve stays within half of what its sender
// keeps ahead, at the floor as at any rate.
const _: () = assert!(IN_FLOOR * 2 <= OUT_FLOOR && IN_HORIZON.as_secs() * 2 <= OUT_HORIZON.as_secs());
/// The largest reservation of either kind: a restart never skips more than
/// this of a 2^32 space.
pub const MAX_BLOCK: u64 = 1 << 26;

/// Why a ledger file was refused. Nothing in it is trusted then: the
/// driver stops rather than start from numbers it cannot vouch for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The first line is not the ledger's magic: another file.
    #[error("not an espgw sequence ledger (the first line is not `{MAGIC}`)")]
    NotALedger,
    /// No well-formed checksum line at the end.
    #[error("the file ends before its checksum line: it was cut short (torn write or a full disk)")]
    Torn,
    /// The checksum does not match what it covers.
    #[error("its checksum does not match its contents: the file was damaged or edited")]
    Checksum,
    /// A line under a good checksum that does not parse (a file of
    /// another version, or one written wrongly).
    #[error("line {line}: {what}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What was expected there.
        what: String,
    },
}

/// The random key of a directory's fingerprints. It lives in the ledger
/// file itself, so that a fingerprint means nothing without the file and
/// the file never holds a plain hash of a key, which could be checked
/// against guesses offline.
#[derive(Clone, PartialEq, Eq)]
pub struct Salt([u8; SALT_LEN]);

impl Salt {
    /// A fresh salt from the operating system's generator.
    pub fn random() -> Salt {
        let mut bytes = [0u8; SALT_LEN];
        let mut rng: rand::rngs::StdRng = rand::make_rng();
        rng.fill_bytes(&mut bytes);
        Salt(bytes)
    }

    /// The salt of these bytes: fingerprints that are the same at every
    /// run, for tests.
    pub fn from_bytes(bytes: [u8; SALT_LEN]) -> Salt {
        Salt(bytes)
    }
}

impl fmt::Debug for Salt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Salt(..)")
    }
}

/// What names one SA's keying in the ledger: HMAC-SHA-256 under the
/// directory's salt of its direction and keys (and its SPI where the
/// number is no nonce: see [`Ledger::fingerprint`]). Its name is not in it:
/// a renamed SA with the same keys resumes where it was.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &hex::encode(&self.0[..6]))
    }
}

/// One key's entry: its direction (for whoever reads the file) and its
/// ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    direction: SaDirection,
    ceiling: u64,
}

/// A state directory's ledger, in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    salt: Salt,
    entries: BTreeMap<Fingerprint, Entry>,
    /// Whether the tracked SAs' ceilings are the exact numbers they reached
    /// when their process stopped cleanly ([`Reservations::settle`]);
    /// cleared by the first raise after it.
    settled: bool,
}

/// The line that marks a settled ledger, just before its checksum.
const SETTLED: &str = "settled";

/// Whether `sa` needs an entry: keys from the file or from the kernel's
/// XFRM SAD (which an IKE daemon keeps across espgw's restarts), and,
/// inbound, a replay window (without one the SA accepts anything anyway).
pub fn needs_entry(sa: &SaSetup) -> bool {
    matches!(sa.key_source, KeySource::File | KeySource::Xfrm { .. })
        && !(sa.params.direction == SaDirection::Inbound && sa.params.replay_window == 0)
}

impl Ledger {
    /// An empty ledger under `salt`.
    pub fn new(salt: Salt) -> Ledger {
        Ledger {
            salt,
            entries: BTreeMap::new(),
            settled: false,
        }
    }

    /// Whether the process that wrote the ledger stopped cleanly after
    /// settling it: the SAs it tracked resume exactly where they stopped,
    /// not at a reservation's end.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// The fingerprint of `sa`'s keying. The algorithm is left out on
    /// purpose: one key under two proposals of one cipher (GCM and GMAC
    /// build their nonces alike) must go on counting, not start again; so
    /// is ESN, which changes the window, not the numbers. Inbound SAs add
    /// their SPI (what the peer's packets carry, and what a replay must
    /// match), and so do outbound ones without an AEAD, whose number is no
    /// nonce (and whose keys two SAs may share).
    pub fn fingerprint(&self, sa: &SaSetup) -> Fingerprint {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&self.salt.0).unwrap_or_else(|_| unreachable!());
        mac.update(b"espgw ledger fingerprint 1\0");
        let direction: &str = sa.params.direction.into();
        mac.update(direction.as_bytes());
        for key in [&sa.enc_key[..], &sa.auth_key[..]] {
            mac.update(&(key.len() as u32).to_be_bytes());
            mac.update(key);
        }
        if sa.params.direction == SaDirection::Inbound || !sa.algorithm.is_aead() {
            mac.update(&sa.params.spi.to_be_bytes());
        }
        Fingerprint(mac.finalize().into_bytes().into())
    }

    /// The ceiling of `fingerprint`: the highest number its keys may have
    /// been used with (0: never used).
    pub fn ceiling(&self, fingerprint: &Fingerprint) -> u64 {
        self.entries.get(fingerprint).map_or(0, |e| e.ceiling)
    }

    /// Raises the ceiling of `fingerprint` to `to`; a ceiling never goes
    /// down. Returns whether it moved.
    pub fn raise(&mut self, fingerprint: Fingerprint, direction: SaDirection, to: u64) -> bool {
        let entry = self.entries.entry(fingerprint).or_insert(Entry {
            direction,
            ceiling: 0,
        });
        let moved = to > entry.ceiling;
        entry.ceiling = entry.ceiling.max(to);
        self.settled &= !moved;
        moved
    }

    /// Forgets `fingerprint`'s entry: for a key that can never be used
    /// again (an IKE daemon's SA replaced by its rekey and deleted), so
    /// that the file does not grow by every rekey. Returns whether there
    /// was one.
    pub fn forget(&mut self, fingerprint: &Fingerprint) -> bool {
        self.entries.remove(fingerprint).is_some()
    }

    /// How many keys have an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file's text: the magic line, the salt, one line per key
    /// (`out`/`in`, fingerprint, ceiling), then a SHA-256 of everything
    /// before it, so that a file cut short or damaged is refused rather
    /// than read as lower ceilings.
    pub fn encode(&self) -> String {
        let mut text = format!("{MAGIC}\nsalt {}\n", hex::encode(self.salt.0));
        for (fingerprint, entry) in &self.entries {
            let direction: &str = entry.direction.into();
            text.push_str(&format!("{direction} {fingerprint} {}\n", entry.ceiling));
        }
        if self.settled {
            text.push_str(SETTLED);
            text.push('\n');
        }
        let sum = Sha256::digest(text.as_bytes());
        text.push_str(&format!("sha256 {}\n", hex::encode(sum)));
        text
    }

    /// Reads [`encode`](Self::encode)'s text back, refusing anything else.
    pub fn decode(text: &str) -> Result<Ledger, LedgerError> {
        if !text.starts_with(&format!("{MAGIC}\n")) {
            return Err(LedgerError::NotALedger);
        }
        let Some(at) = text.rfind("sha256 ") else {
            return Err(LedgerError::Torn);
        };
        let (body, trailer) = text.split_at(at);
        let Some(sum) = trailer.strip_prefix("sha256 ").and_then(|t| t.strip_suffix('\n')) else {
            return Err(LedgerError::Torn);
        };
        if !body.ends_with('\n') || sum.len() != 64 || sum.contains('\n') {
            return Err(LedgerError::Torn);
        }
        let mut expected = [0u8; 32];
        hex::decode_to_slice(sum, &mut expected).map_err(|_| LedgerError::Checksum)?;
        if Sha256::digest(body.as_bytes())[..] != expected[..] {
            return Err(LedgerError::Checksum);
        }
        let bad = |line: usize, what: &str| LedgerError::Line {
            line,
            what: what.to_owned(),
        };
        let mut lines = body.lines().enumerate().skip(1);
        let salt = match lines.next() {
            Some((i, line)) => {
                let mut salt = [0u8; SALT_LEN];
                line.strip_prefix("salt ")
                    .and_then(|hex| hex::decode_to_slice(hex, &mut salt).ok())
                    .ok_or_else(|| bad(i + 1, "expected `salt` and 64 hex digits"))?;
                Salt(salt)
            }
            None => return Err(bad(2, "no salt")),
        };
        let mut ledger = Ledger::new(salt);
        let mut settled = false;
        for (i, line) in lines {
            if settled {
                return Err(bad(
                    i + 1,
                    "a line after `settled`, which must be the last before the checksum",
                ));
            }
            if line == SETTLED {
                settled = true;
                continue;
            }
            let fields: Vec<&str> = line.split(' ').collect();
            let [direction, fingerprint, ceiling] = fields[..] else {
                return Err(bad(i + 1, "expected a direction, a fingerprint and a ceiling"));
            };
            let direction: SaDirection = direction
                .parse()
                .map_err(|_| bad(i + 1, "the direction is neither `out` nor `in`"))?;
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(fingerprint, &mut bytes)
                .map_err(|_| bad(i + 1, "the fingerprint is not 64 hex digits"))?;
            let ceiling: u64 = ceiling
                .parse()
                .map_err(|_| bad(i + 1, "the ceiling is not a number"))?;
            let fingerprint = Fingerprint(bytes);
            if ledger.entries.contains_key(&fingerprint) {
                return Err(bad(i + 1, "a fingerprint listed twice"));
            }
            ledger.raise(fingerprint, direction, ceiling);
        }
        ledger.settled = settled;
        Ok(ledger)
    }
}

/// How far ahead of one SA its ceiling is kept: reservations sized from
/// the SA's rate over a horizon, with a floor; a new one is due when less
/// than half of the last is left. The rate is the higher of the one
/// between the last two reservations and the one over the driver's last
/// look at the SA (at least [`RATE_WINDOW`] ago): after a quiet spell the
/// first is far too low for a burst, which the second sees at once.
#[derive(Debug, Clone)]
pub struct Reservation {
    direction: SaDirection,
    /// The last number the SA may ever use (2^32 − 1 without ESN).
    limit: u64,
    block: u64,
    /// When the last reservation was made, and the number the SA had
    /// reached then.
    last: Option<(Duration, u64)>,
    /// When the driver last measured the SA's recent rate, and the number
    /// it had reached then.
    seen: Option<(Duration, u64)>,
    /// That recent rate, in numbers a second.
    recent: f64,
}

/// The shortest interval a recent rate is measured over.
pub const RATE_WINDOW: Duration = Duration::from_millis(5);

impl Reservation {
    /// The first reservation of an SA of `direction`, the floor's size,
    /// never past the end of its sequence space (64 bits with `esn`, else
    /// 32).
    pub fn new(direction: SaDirection, esn: bool) -> Reservation {
        Reservation {
            direction,
            limit: if esn { u64::MAX } else { u64::from(u32::MAX) },
            block: Self::floor(direction),
            last: None,
            seen: None,
            recent: 0.0,
        }
    }

    fn floor(direction: SaDirection) -> u64 {
        match direction {
            SaDirection::Outbound => OUT_FLOOR,
            SaDirection::Inbound => IN_FLOOR,
        }
    }

    /// The size of the next reservation.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// The ceiling to make durable next, if one is due: the SA has reached
    /// `used` (outbound: numbers taken; inbound: the window's top or a
    /// number refused for lying beyond it) and may go up to `ceiling`.
    /// Called at every look at the SA, due or not.
    pub fn plan(&mut self, now: Duration, used: u64, ceiling: u64) -> Option<u64> {
        let rate = |since: Duration, from: u64| {
            let elapsed = now.saturating_sub(since);
            // Two looks in the same instant (a capture's clock) say
            // nothing about the rate.
            (!elapsed.is_zero()).then(|| used.saturating_sub(from) as f64 / elapsed.as_secs_f64())
        };
        match self.seen {
            Some((at, _)) if now.saturating_sub(at) < RATE_WINDOW => {}
            Some((at, from)) => {
                self.recent = rate(at, from).unwrap_or(self.recent);
                self.seen = Some((now, used));
            }
            None => self.seen = Some((now, used)),
        }
        if ceiling >= self.limit || ceiling.saturating_sub(used) >= self.block / 2 {
            return None;
        }
        if let Some(since_last) = self.last.and_then(|(at, from)| rate(at, from)) {
            let horizon = match self.direction {
                SaDirection::Outbound => OUT_HORIZON,
                SaDirection::Inbound => IN_HORIZON,
            };
            let wanted = (since_last.max(self.recent) * horizon.as_secs_f64()).min(MAX_BLOCK as f64) as u64;
            self.block = wanted.clamp(Self::floor(self.direction), MAX_BLOCK);
        }
        self.last = Some((now, used));
        let target = used.saturating_add(self.block).min(self.limit);
        (target > ceiling).then_some(target)
    }
}

/// The SAs a driver keeps ceilings for, each with a handle `H` of the
/// driver's (espgw's: a weak reference to the SA's shared state) through
/// which it reads how far the SA has got and raises its ceiling.
#[derive(Debug)]
pub struct Reservations<H> {
    tracked: Vec<Tracked<H>>,
}

#[derive(Debug)]
struct Tracked<H> {
    fingerprint: Fingerprint,
    direction: SaDirection,
    /// The mark the SA resumed above: it never settles below it, whatever
    /// its handle says before the SA's first flush.
    start: u64,
    reservation: Reservation,
    handle: H,
}

/// What an SA's handle says: how far it has got and its ceiling now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Outbound, the last number taken; inbound, the replay window's top
    /// (or a number refused for lying beyond the ceiling).
    pub used: u64,
    /// The highest number the SA may use now, as the ledger last made it
    /// durable.
    pub ceiling: u64,
}

impl<H> Default for Reservations<H> {
    fn default() -> Self {
        Reservations { tracked: Vec::new() }
    }
}

impl<H: Clone> Reservations<H> {
    /// Starts keeping the ceiling of the SA behind `handle`, installed
    /// from `sa` with [`SaSetup::ledger_mark`] set to the ledger's ceiling
    /// of its fingerprint. An SA tracked under the same fingerprint before
    /// (the one a reload replaced) gets no more reservations: the new one
    /// resumed above everything it was ever given.
    pub fn track(&mut self, ledger: &Ledger, sa: &SaSetup, handle: H) {
        let fingerprint = ledger.fingerprint(sa);
        self.tracked.retain(|t| t.fingerprint != fingerprint);
        self.tracked.push(Tracked {
            fingerprint,
            direction: sa.params.direction,
            start: sa.ledger_mark.unwrap_or(0),
            reservation: Reservation::new(sa.params.direction, sa.params.esn),
            handle,
        });
    }

    /// Stops keeping the ceiling of the SA tracked under `sa`'s
    /// fingerprint, if any: call it when `sa` is about to take the
    /// ledger's ceiling as its mark, so that nothing raises the one before
    /// it past that mark while some worker may still hold a copy of it.
    pub fn retire(&mut self, ledger: &Ledger, sa: &SaSetup) {
        let fingerprint = ledger.fingerprint(sa);
        self.tracked.retain(|t| t.fingerprint != fingerprint);
    }

    /// Stops keeping the ceilings of the SAs whose handles `which` picks,
    /// and forgets their entries in `ledger`: only for keys that will
    /// never be installed again. Returns how many were forgotten.
    pub fn forget(&mut self, ledger: &mut Ledger, which: impl Fn(&H) -> bool) -> usize {
        let before = self.tracked.len();
        self.tracked.retain(|t| {
            if which(&t.handle) {
                ledger.forget(&t.fingerprint);
                false
            } else {
                true
            }
        });
        before - self.tracked.len()
    }

    /// How many SAs are tracked.
    pub fn len(&self) -> usize {
        self.tracked.len()
    }

    /// True when no SA is tracked.
    pub fn is_empty(&self) -> bool {
        self.tracked.is_empty()
    }

    /// Works out the ceilings due at `now`, reading each SA through
    /// `progress` (`None`: the SA is gone, and is forgotten), and raises
    /// them in `ledger`. Returns the handles to raise, with their new
    /// ceilings, once the ledger is durable; nothing if none is due.
    pub fn plan(
        &mut self,
        ledger: &mut Ledger,
        now: Duration,
        progress: impl Fn(&H) -> Option<Progress>,
    ) -> Vec<(H, u64)> {
        let mut raises = Vec::new();
        self.tracked.retain_mut(|t| {
            let Some(p) = progress(&t.handle) else {
                return false;
            };
            if let Some(target) = t.reservation.plan(now, p.used, p.ceiling) {
                // Never below what the file already promised (an SA the
                // one before it may have taken further).
                let target = target.max(ledger.ceiling(&t.fingerprint));
                ledger.raise(t.fingerprint, t.direction, target);
                raises.push((t.handle.clone(), target));
            }
            true
        });
        raises
    }

    /// Brings each tracked SA's ceiling in `ledger` down to the number it
    /// reached, read through `progress` (`None`: the SA is gone, and its
    /// reserved ceiling stands), and marks the ledger settled. Only for a
    /// clean stop: call it once no copy of any tracked SA can use another
    /// number (every worker has stopped and flushed its usage), and write
    /// the ledger before exiting. Never below the mark an SA resumed
    /// above, so an SA that was replaced by a reload (whose copies stayed
    /// at or below that mark) is covered too.
    pub fn settle(&mut self, ledger: &mut Ledger, progress: impl Fn(&H) -> Option<Progress>) -> usize {
        let mut settled = 0;
        for t in &self.tracked {
            let Some(p) = progress(&t.handle) else {
                continue;
            };
            let exact = p.used.max(t.start);
            if let Some(entry) = ledger.entries.get_mut(&t.fingerprint) {
                entry.ceiling = exact;
            } else {
                ledger.raise(t.fingerprint, t.direction, exact);
            }
            settled += 1;
        }
        self.tracked.clear();
        ledger.settled = true;
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use accel::{Algorithm, SecretBytes};
    use spd_sad::{Lifetime, Mode, SaParams};

    fn sa(direction: SaDirection, spi: u32, key: u8) -> SaSetup {
        SaSetup {
            params: SaParams {
                name: format!("sa-{spi:x}"),
                direction,
                spi,
                mode: Mode::Tunnel,
                local: "10.0.0.1".parse().unwrap(),
                remote: "10.0.0.2".parse().unwrap(),
                esn: false,
                replay_window: 64,
                lifetime: Lifetime::default(),
                encap: None,
                selectors: Vec::new(),
            },
            algorithm: Algorithm::Aes128Gcm16,
            enc_key: SecretBytes::new(&[key; 20]),
            auth_key: SecretBytes::new(&[]),
            initial_seq: 0,
            key_source: KeySource::File,
            ledger_mark: None,
        }
    }

    fn ledger() -> Ledger {
        Ledger::new(Salt::from_bytes([7; SALT_LEN]))
    }

    #[test]
    fn fingerprints_differ_by_key_direction_and_salt_not_by_name() {
        let l = ledger();
        let out = sa(SaDirection::Outbound, 0x1001, 1);
        let renamed = SaSetup {
            params: SaParams {
                name: "renamed".into(),
                ..out.params.clone()
            },
            ..out.clone()
        };
        assert_eq!(
            l.fingerprint(&out),
            l.fingerprint(&renamed),
            "a renamed SA resumes"
        );
        assert_ne!(
            l.fingerprint(&out),
            l.fingerprint(&sa(SaDirection::Outbound, 0x1001, 2))
        );
        assert_ne!(
            l.fingerprint(&out),
            l.fingerprint(&sa(SaDirection::Inbound, 0x1001, 1))
        );
        // An AEAD's counter is its nonce: a new SPI does not start it again.
        assert_eq!(
            l.fingerprint(&out),
            l.fingerprint(&sa(SaDirection::Outbound, 0x2002, 1))
        );
        // Inbound, the SPI is what a replay must match.
        assert_ne!(
            l.fingerprint(&sa(SaDirection::Inbound, 0x1001, 1)),
            l.fingerprint(&sa(SaDirection::Inbound, 0x2002, 1))
        );
        let other = Ledger::new(Salt::from_bytes([8; SALT_LEN]));
        assert_ne!(l.fingerprint(&out), other.fingerprint(&out), "keyed by the salt");
        // Not a plain hash of the key.
        let plain: [u8; 32] = Sha256::digest(&out.enc_key[..]).into();
        assert_ne!(l.fingerprint(&out).0, plain);
    }

    #[test]
    fn the_file_round_trips_and_ceilings_never_go_down() {
        let mut l = ledger();
        let a = l.fingerprint(&sa(SaDirection::Outbound, 0x1001, 1));
        let b = l.fingerprint(&sa(SaDirection::Inbound, 0x1002, 2));
        assert_eq!(l.ceiling(&a), 0);
        assert!(l.raise(a, SaDirection::Outbound, 4096));
        assert!(l.raise(b, SaDirection::Inbound, u64::from(u32::MAX)));
        assert!(!l.raise(a, SaDirection::Outbound, 100), "never lowered");
        assert_eq!(l.ceiling(&a), 4096);
        let text = l.encode();
        assert!(text.starts_with(MAGIC) && text.ends_with('\n'));
        assert_eq!(Ledger::decode(&text), Ok(l.clone()));
        assert!(!text.contains(&hex::encode(vec![1u8; 20])), "no key in the file");
    }

    #[test]
    fn a_torn_or_damaged_file_is_refused() {
        let mut l = ledger();
        l.raise(
            l.fingerprint(&sa(SaDirection::Outbound, 0x1001, 1)),
            SaDirection::Outbound,
            123_456,
        );
        let text = l.encode();
        // Cut anywhere: refused, never read as lower ceilings.
        for cut in 0..text.len() - 1 {
            assert!(Ledger::decode(&text[..cut]).is_err(), "cut at {cut} accepted");
        }
        assert_eq!(Ledger::decode(""), Err(LedgerError::NotALedger));
        assert_eq!(Ledger::decode("\0\0\0garbage"), Err(LedgerError::NotALedger));
        let lower = text.replace("123456", "023456");
        assert_eq!(Ledger::decode(&lower), Err(LedgerError::Checksum));
        // A file that lost its checksum line to a torn write.
        let torn = &text[..text.rfind("sha256").unwrap()];
        assert_eq!(Ledger::decode(torn), Err(LedgerError::Torn));
        // Well-formed checksum over a malformed line: named by line.
        let body = format!("{MAGIC}\nsalt {}\nout xyz 5\n", hex::encode([7; 32]));
        let forged = format!("{body}sha256 {}\n", hex::encode(Sha256::digest(body.as_bytes())));
        let err = Ledger::decode(&forged).unwrap_err();
        assert_eq!(
            err,
            LedgerError::Line {
                line: 3,
                what: "the fingerprint is not 64 hex digits".into()
            }
        );
        assert_eq!(err.to_string(), "line 3: the fingerprint is not 64 hex digits");
    }

    /// Reservations: due at half a block left, from the number reached;
    /// sized from the rate between two of them with a floor; an inbound
    /// one at most half an outbound one at the same rate; never past the
    /// sequence space.
    #[test]
    fn reservations_follow_the_rate_and_keep_inbound_below_half_of_outbound() {
        let ms = Duration::from_millis;
        let mut out = Reservation::new(SaDirection::Outbound, false);
        assert_eq!(out.plan(ms(0), 0, 0), Some(OUT_FLOOR));
        assert_eq!(out.plan(ms(1), 1000, OUT_FLOOR), None, "more than half left");
        // 2,100 numbers in 10 ms: 210,000 a second, 4 s of it.
        let next = out.plan(ms(10), 2100, OUT_FLOOR).unwrap();
        assert_eq!(out.block(), 840_000);
        assert_eq!(next, 2100 + 840_000);
        let mut inn = Reservation::new(SaDirection::Inbound, false);
        assert_eq!(inn.plan(ms(0), 0, 0), Some(IN_FLOOR));
        inn.plan(ms(10), 2100, IN_FLOOR).unwrap();
        assert_eq!(inn.block(), 210_000);
        assert!(inn.block() * 2 <= out.block());
        // A slower rate shrinks it again, to the floor at most.
        assert!(out.plan(ms(1_000_000), 840_000, next).is_some());
        assert_eq!(out.block(), OUT_FLOOR);
        // Without ESN the last reservation stops at 2^32 - 1.
        let mut end = Reservation::new(SaDirection::Outbound, false);
        let top = u64::from(u32::MAX);
        assert_eq!(end.plan(ms(0), top - 10, top - 10), Some(top));
        assert_eq!(end.plan(ms(1), top, top), None);
        // Inbound, a number beyond the ceiling is reserved past.
        let mut jump = Reservation::new(SaDirection::Inbound, true);
        assert_eq!(jump.plan(ms(0), 9000, 1024), Some(9000 + IN_FLOOR));
        // A burst after a quiet second: sized from what the last look saw
        // (1,000 numbers in 10 ms), not from the quiet second's average.
        let mut burst = Reservation::new(SaDirection::Inbound, false);
        assert_eq!(burst.plan(ms(0), 0, 0), Some(IN_FLOOR));
        assert_eq!(burst.plan(ms(1000), 10, IN_FLOOR), None, "a quiet look");
        let next = burst.plan(ms(1010), 1010, IN_FLOOR).unwrap();
        assert_eq!(burst.block(), 100_000);
        assert_eq!(next, 1010 + 100_000);
    }

    /// The driver's round: only due SAs are raised, in the ledger first;
    /// a gone SA is forgotten; a reload's new SA takes over its
    /// fingerprint, and its reservations start from the file's ceiling.
    #[test]
    fn a_round_raises_due_sas_in_the_ledger_and_forgets_gone_ones() {
        use std::cell::RefCell;
        use std::collections::HashMap;
        let mut l = ledger();
        let out = sa(SaDirection::Outbound, 0x1001, 1);
        let inn = sa(SaDirection::Inbound, 0x1002, 2);
        let state: RefCell<HashMap<u32, Progress>> = RefCell::new(HashMap::new());
        let read = |h: &u32| state.borrow().get(h).copied();
        let mut r: Reservations<u32> = Reservations::default();
        r.track(&l, &out, 1);
        r.track(&l, &inn, 2);
        state.borrow_mut().insert(1, Progress { used: 0, ceiling: 0 });
        state.borrow_mut().insert(2, Progress { used: 0, ceiling: 0 });
        let raises = r.plan(&mut l, Duration::ZERO, read);
        assert_eq!(raises, vec![(1, OUT_FLOOR), (2, IN_FLOOR)]);
        assert_eq!(l.ceiling(&l.fingerprint(&out)), OUT_FLOOR);
        state.borrow_mut().insert(
            1,
            Progress {
                used: 10,
                ceiling: OUT_FLOOR,
            },
        );
        state.borrow_mut().insert(
            2,
            Progress {
                used: 10,
                ceiling: IN_FLOOR,
            },
        );
        assert!(r.plan(&mut l, Duration::from_millis(5), read).is_empty());
        // A reload replaces the outbound SA (handle 3): handle 1 is no
        // longer planned for, and 3 is raised above the file's ceiling.
        r.track(&l, &out, 3);
        state.borrow_mut().insert(
            3,
            Progress {
                used: OUT_FLOOR,
                ceiling: OUT_FLOOR,
            },
        );
        state.borrow_mut().insert(
            1,
            Progress {
                used: OUT_FLOOR,
                ceiling: OUT_FLOOR,
            },
        );
        let raises = r.plan(&mut l, Duration::from_millis(6), read);
        assert_eq!(raises.len(), 1);
        assert_eq!(raises[0].0, 3);
        assert!(raises[0].1 > OUT_FLOOR);
        state.borrow_mut().remove(&2);
        r.plan(&mut l, Duration::from_millis(7), read);
        assert_eq!(r.len(), 1, "the gone SA is forgotten");
        // An SA about to take the file's ceiling as its mark: the one
        // before it is raised no more, however far it has got.
        let mark = l.ceiling(&l.fingerprint(&out));
        r.retire(&l, &out);
        state.borrow_mut().insert(
            3,
            Progress {
                used: mark,
                ceiling: mark,
            },
        );
        assert!(r.plan(&mut l, Duration::from_millis(8), read).is_empty());
        assert_eq!(l.ceiling(&l.fingerprint(&out)), mark);
    }

    /// A clean stop settles: each tracked SA's ceiling comes down to the
    /// number it reached (never below the mark it resumed above), a gone
    /// SA keeps its reservation, the file says so and reads back settled,
    /// and the next raise (the next start's first reservation) unsettles.
    #[test]
    fn a_clean_stop_settles_ceilings_to_the_numbers_reached() {
        use std::collections::HashMap;
        let mut l = ledger();
        let out = sa(SaDirection::Outbound, 0x1001, 1);
        let inn = SaSetup {
            ledger_mark: Some(500),
            ..sa(SaDirection::Inbound, 0x1002, 2)
        };
        let gone = sa(SaDirection::Inbound, 0x1003, 3);
        let mut state: HashMap<u32, Progress> = HashMap::new();
        let mut r: Reservations<u32> = Reservations::default();
        for (handle, sa) in [(1, &out), (2, &inn), (3, &gone)] {
            r.track(&l, sa, handle);
            state.insert(handle, Progress { used: 0, ceiling: 0 });
        }
        l.raise(l.fingerprint(&inn), SaDirection::Inbound, 500);
        state.insert(
            2,
            Progress {
                used: 500,
                ceiling: 500,
            },
        );
        r.plan(&mut l, Duration::ZERO, |h| state.get(h).copied());
        assert!(!l.is_settled());
        assert_eq!(l.ceiling(&l.fingerprint(&inn)), 500 + IN_FLOOR);
        // The outbound SA sent 1,234; the inbound one has not flushed a
        // number yet (its copies resumed above 500); the third is gone.
        state.insert(
            1,
            Progress {
                used: 1234,
                ceiling: OUT_FLOOR,
            },
        );
        state.insert(
            2,
            Progress {
                used: 0,
                ceiling: 500 + IN_FLOOR,
            },
        );
        state.remove(&3);
        assert_eq!(r.settle(&mut l, |h| state.get(h).copied()), 2);
        assert!(l.is_settled() && r.is_empty());
        assert_eq!(l.ceiling(&l.fingerprint(&out)), 1234);
        assert_eq!(
            l.ceiling(&l.fingerprint(&inn)),
            500,
            "never below its resume point"
        );
        assert_eq!(
            l.ceiling(&l.fingerprint(&gone)),
            IN_FLOOR,
            "a gone SA's reservation stands"
        );
        let text = l.encode();
        assert!(text.contains("\nsettled\nsha256 "), "{text}");
        let back = Ledger::decode(&text).unwrap();
        assert_eq!(back, l);
        // The next start's first reservation unsettles it.
        let mut next = back;
        assert!(next.raise(next.fingerprint(&out), SaDirection::Outbound, 1234 + OUT_FLOOR));
        assert!(!next.is_settled() && !next.encode().contains("settled"));
        // `settled` anywhere but last is refused.
        let body = format!(
            "{MAGIC}\nsalt {}\nsettled\nout {} 5\n",
            "07".repeat(SALT_LEN),
            "ab".repeat(32)
        );
        let forged = format!("{body}sha256 {}\n", hex::encode(Sha256::digest(body.as_bytes())));
        assert!(matches!(
            Ledger::decode(&forged),
            Err(LedgerError::Line { line: 4, .. })
        ));
    }

    /// Forgetting: the picked SAs are tracked no more and their entries
    /// leave the ledger (and the file); the others stay as they were.
    #[test]
    fn forgotten_keys_leave_the_ledger() {
        let mut l = ledger();
        let old = sa(SaDirection::Outbound, 0x1001, 1);
        let new = sa(SaDirection::Outbound, 0x1002, 2);
        let mut r: Reservations<u32> = Reservations::default();
        r.track(&l, &old, 1);
        r.track(&l, &new, 2);
        let zero = Progress { used: 0, ceiling: 0 };
        r.plan(&mut l, Duration::ZERO, |_| Some(zero));
        assert_eq!(l.len(), 2);
        assert_eq!(r.forget(&mut l, |h| *h == 1), 1);
        assert_eq!((l.len(), r.len()), (1, 1));
        assert_eq!(l.ceiling(&l.fingerprint(&old)), 0);
        assert_eq!(l.ceiling(&l.fingerprint(&new)), OUT_FLOOR);
        let text = l.encode();
        assert!(!text.contains(&l.fingerprint(&old).to_string()), "{text}");
        assert_eq!(r.forget(&mut l, |h| *h == 1), 0, "forgotten once");
    }
}
