//! The control plane (`ike_stub::ControlPlane`: `handle_datagram`, the
//! keying exchanges behind it, timeouts and SA lifetime events) as site B
//! (10.0.0.2, side High) of a tunnel `t` with a secret, against a model of
//! its peer, site A (10.0.0.1, side Low), and an attacker on the path,
//! driven by a sequence of operations decoded from the input.
//!
//! The peer model holds the secret and keeps what a real site A keeps,
//! learnt from the datagrams B sends as a peer would read them: the INIT
//! requests it sent, every control SA it made with B (both keys, its role,
//! its next message ID, the child pair last switched to, B's answer to its
//! latest rekey), B's INIT requests and B's latest request under a control
//! SA. So a few bytes take B through the states behind authentication:
//! connecting as the initiator (A answers B's INIT) or as the responder (A
//! sends one and confirms), then rekeying as either.
//!
//! Operations, `op % 12` (field bytes after the operation byte):
//! - 0: a raw datagram (length byte, bytes) as the gateway would hand it
//!   over: IPv4/UDP parsing;
//! - 1: the bytes (length byte, bytes) as the UDP payload of a packet from
//!   the peer;
//! - 2: a message A seals under one of its control SAs, fields relative to
//!   its state (8 bytes): `f[0]` bits 0-1 kind (rekey, switched, init,
//!   rekey), bit 2 response, bit 3 the initiator flag flipped, bit 4 sealed
//!   with the other direction's key, bit 5 for tunnel `u`, bits 6-7 which
//!   control SA from the newest; `f[1]` the message ID's signed offset from
//!   A's next one (a response: from B's latest request); `f[2]` the child's
//!   signed offset from the last switched to; `f[3..7]` the SPI; `f[7]`
//!   the nonce's byte;
//! - 3: time passes (byte × 10 ms) and timeouts run; the first connects B
//!   (its INIT request);
//! - 4: a soft or hard expiry (byte: bit 0 hard, the rest which SA) of one
//!   of the SAs the gateway holds;
//! - 5: the last datagram B sent, reflected back to it as if from the peer;
//! - 6: a UDP packet from the peer with the input's IPv4 total length and
//!   UDP length (4 bytes), then a length byte and the payload;
//! - 7: A sends an INIT request (7 bytes): SPI byte, nonce byte, child SPI,
//!   tweaks (bit 0 sealed with B's side's key, 1 a responder SPI, 2 message
//!   ID 1, 3 child 1, 4 the initiator flag cleared, 5 the response flag,
//!   6 tunnel `u`);
//! - 8: A answers one of B's INIT requests (7 bytes): responder SPI byte
//!   (0: a zero SPI), nonce byte, child SPI, tweaks (bit 0 sealed with the
//!   initiator's key, 1 message ID 1, 2 child 1, 3 the initiator flag set,
//!   bits 6-7 which request from the newest);
//! - 9: A answers B's latest request under a control SA as a peer does
//!   (5 bytes: SPI, nonce byte);
//! - 10: A's next step as the initiator of an exchange under its newest
//!   control SA (5 bytes: SPI, nonce byte): it confirms the INIT B answered,
//!   or switches to the child B's rekey answer made, or asks a rekey;
//! - 11: an attacker replays one of A's last messages (byte: which, from
//!   the newest).
//!
//! Commands are applied to a gateway built from the same configuration.
//! Checks:
//! - nothing panics, and every command applies;
//! - `received` counts every datagram;
//! - before any authentic input (a message the peer model sealed or sent
//!   before, or an input's bytes that verify under a key of A's), the plane
//!   issues no command, and all it sends are its own INIT requests (and
//!   their retransmissions): B's reflected messages, unauthenticated bytes
//!   and time move nothing else;
//! - every SA installed, and every SA the gateway holds, is one of tunnel
//!   `t`'s (`t-out`, `t-in`, `t-out.N`, `t-in.N`), between B and A; the
//!   current ones (`sa show`) are in the gateway;
//! - every datagram goes to the peer, on port 500 at both ends;
//! - the SAs the gateway holds that `sa show` does not list (neither
//!   current nor retiring) are at most `2 × MAX_HALF_OPEN + 2`: the pairs
//!   of INITs answered but not confirmed, capped per tunnel, and the pair
//!   of a rekey answered (or the old inbound SA of a switch not yet
//!   confirmed). The retiring ones are not bounded by a constant: every
//!   completed exchange retires the SAs it replaced for the grace period,
//!   so a peer that holds the secret and rekeys faster than the grace
//!   period retires SAs faster than they go;
//! - once time has passed beyond every exchange's budget and the grace
//!   period at the end of the input, the gateway holds exactly the current
//!   pair and the SAs retiring until their hard lifetime, and there are no
//!   more of those than exchanges given up.
#![no_main]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use accel::Algorithm;
use dataplane::command::SaCommand;
use dataplane::{Gateway, LinkLayer};
use ike_stub::builder::{LifetimeBuilder, RekeySection};
use ike_stub::message::{peek, ControlSpi, Kind, Message, Peek, SPI_LEN};
use ike_stub::plane::{udp_payload, MAX_HALF_OPEN};
use ike_stub::prf::{ControlKeys, Side, TunnelSecrets, NONCE_LEN};
use ike_stub::{Config, ControlPlane};
use libfuzzer_sys::fuzz_target;
use spd_sad::SaEvent;

#[path = "common.rs"]
mod common;

const PORTS: (u16, u16) = (500, 500);
/// How many INIT requests, control SAs and sent messages the model keeps.
const KEPT: usize = 8;

thread_local! {
    static CONFIG: RefCell<Option<Config>> = const { RefCell::new(None) };
}

fn config() -> Config {
    CONFIG.with(|c| {
        c.borrow_mut()
            .get_or_insert_with(|| {
                let mut config =
                    common::tunnel_builder(Algorithm::Aes128Gcm16, false, false, false).rekey(RekeySection {
                        grace_ms: Some(300),
                        retransmit_ms: Some(20),
                        // Within reach of a few time steps.
                        retry_after_s: Some(1),
                        ..RekeySection::default()
                    });
                let tunnel = config.tunnels[0].clone().secret(common::SECRET);
                config.tunnels[0] = tunnel.lifetime(LifetimeBuilder {
                    soft_packets: Some(1000),
                    hard_packets: Some(2000),
                    ..LifetimeBuilder::default()
                });
                common::parse(&config)
            })
            .clone()
    })
}

/// Whether `name` is one of tunnel `t`'s SAs.
fn of_t(name: &str) -> bool {
    let base = match name.split_once('.') {
        Some((base, generation)) => {
            if generation.is_empty() || !generation.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            base
        }
        None => name,
    };
    base == "t-out" || base == "t-in"
}

fn push_bounded<T>(list: &mut Vec<T>, item: T) {
    if list.len() == KEPT {
        list.remove(0);
    }
    list.push(item);
}

/// A control SA as site A holds it.
struct Control {
    spi_i: ControlSpi,
    spi_r: ControlSpi,
    keys: ControlKeys,
    /// Whether A started the INIT exchange that made it.
    a_initiator: bool,
    /// The ID of A's next request.
    next_id: u32,
    /// The child pair both ends switched to last, as far as A knows.
    child: u32,
    /// Whether A (its initiator) confirmed the INIT exchange.
    confirmed: bool,
    /// B's answer to A's latest rekey request, not switched to yet.
    answer: Option<Message>,
}

impl Control {
    fn is(&self, peeked: &Peek<'_>) -> bool {
        self.spi_i == peeked.spi_i && self.spi_r == peeked.spi_r
    }

    /// The key A sends with; `other`: the one B sends with.
    fn key(&self, other: bool) -> &[u8] {
        if self.a_initiator != other {
            &self.keys.sk_ai[..]
        } else {
            &self.keys.sk_ar[..]
        }
    }

    fn message(&self, kind: Kind, response: bool, message_id: u32, child: u32) -> Message {
        Message {
            kind,
            response,
            from_initiator: self.a_initiator,
            spi_i: self.spi_i,
            spi_r: self.spi_r,
            message_id,
            tunnel: "t".into(),
            child,
            spi: 0,
            nonce: [0; NONCE_LEN],
        }
    }

    fn take_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }
}

/// Site A: what it sent and what it learnt from B.
struct Peer {
    secrets: TunnelSecrets,
    /// INIT requests A sent: SPI and nonce.
    inits: Vec<(ControlSpi, [u8; NONCE_LEN])>,
    /// B's INIT requests, one per SPI.
    b_inits: Vec<Message>,
    /// Newest last.
    controls: Vec<Control>,
    /// B's latest request under a control SA.
    b_request: Option<Message>,
    /// What A sent, newest last, for an attacker to replay.
    sent: Vec<Vec<u8>>,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            secrets: TunnelSecrets::derive(common::SECRET.as_bytes(), "t"),
            inits: Vec::new(),
            b_inits: Vec::new(),
            controls: Vec::new(),
            b_request: None,
            sent: Vec::new(),
        }
    }

    fn control(&mut self, spi_i: &ControlSpi, spi_r: &ControlSpi) -> Option<&mut Control> {
        self.controls
            .iter_mut()
            .find(|c| &c.spi_i == spi_i && &c.spi_r == spi_r)
    }

    fn add_control(&mut self, control: Control) {
        self.controls
            .retain(|c| c.spi_i != control.spi_i || c.spi_r != control.spi_r);
        push_bounded(&mut self.controls, control);
    }

    /// Reads a datagram B sent, as A would.
    fn observe(&mut self, payload: &[u8]) {
        let Ok(peeked) = peek(payload) else { return };
        match (peeked.kind, peeked.response) {
            (Kind::Init, false) => {
                let Ok(m) = Message::open(payload, &self.secrets.init_key(Side::High)[..]) else {
                    return;
                };
                if self.b_inits.iter().all(|b| b.spi_i != m.spi_i) {
                    push_bounded(&mut self.b_inits, m);
                }
            }
            (Kind::Init, true) => {
                if self.control(&peeked.spi_i, &peeked.spi_r).is_some() {
                    return; // A retransmitted answer.
                }
                let secrets = &self.secrets;
                let made = self
                    .inits
                    .iter()
                    .rev()
                    .filter(|(spi_i, _)| *spi_i == peeked.spi_i)
                    .find_map(|(spi_i, ni)| {
                        let mut derived = None;
                        Message::open_keyed(payload, |m| {
                            let keys = secrets.control((ni, &m.nonce), (spi_i, &m.spi_r));
                            let key = keys.sk_ar.clone();
                            derived = Some(keys);
                            key
                        })
                        .ok()
                        .and_then(|m| derived.map(|keys| (m, keys)))
                    });
                if let Some((m, keys)) = made {
                    self.add_control(Control {
                        spi_i: m.spi_i,
                        spi_r: m.spi_r,
                        keys,
                        a_initiator: true,
                        next_id: 1,
                        child: 0,
                        confirmed: false,
                        answer: None,
                    });
                }
            }
            _ => {
                let Some(c) = self.control(&peeked.spi_i, &peeked.spi_r) else {
                    return;
                };
                let Ok(m) = Message::open(payload, c.key(true)) else {
                    return;
                };
                match (m.response, m.kind) {
                    (false, _) => self.b_request = Some(m),
                    (true, Kind::Switched) => c.child = m.child,
                    (true, Kind::Rekey) if m.message_id.wrapping_add(1) == c.next_id => c.answer = Some(m),
                    (true, _) => {}
                }
            }
        }
    }

    /// Whether `payload` verifies under a key A sends with; an INIT
    /// request is noted as A's own, so that B's answer can be read.
    fn authentic(&mut self, payload: &[u8]) -> bool {
        let Ok(peeked) = peek(payload) else { return false };
        if peeked.kind == Kind::Init && !peeked.response {
            let Ok(m) = Message::open(payload, &self.secrets.init_key(Side::Low)[..]) else {
                return false;
            };
            push_bounded(&mut self.inits, (m.spi_i, m.nonce));
            return true;
        }
        self.controls
            .iter()
            .any(|c| c.is(&peeked) && Message::open(payload, c.key(false)).is_ok())
    }

    /// Op 7.
    fn init_request(&mut self, f: &[u8]) -> Vec<u8> {
        let tweak = f[6];
        let spi_i = [f[0]; SPI_LEN];
        let message = Message {
            kind: Kind::Init,
            response: tweak & 0x20 != 0,
            from_initiator: tweak & 0x10 == 0,
            spi_i,
            spi_r: if tweak & 0x02 != 0 {
                [!f[0]; SPI_LEN]
            } else {
                [0; SPI_LEN]
            },
            message_id: u32::from(tweak & 0x04 != 0),
            tunnel: if tweak & 0x40 != 0 { "u".into() } else { "t".into() },
            child: u32::from(tweak & 0x08 != 0),
            spi: word(&f[2..6]),
            nonce: [f[1]; NONCE_LEN],
        };
        let side = if tweak & 0x01 != 0 { Side::High } else { Side::Low };
        push_bounded(&mut self.inits, (spi_i, message.nonce));
        message.seal(&self.secrets.init_key(side)[..])
    }

    /// Op 8.
    fn init_response(&mut self, f: &[u8]) -> Option<Vec<u8>> {
        let tweak = f[6];
        let which = usize::from(tweak >> 6);
        let request = self
            .b_inits
            .iter()
            .rev()
            .nth(which % self.b_inits.len().max(1))?
            .clone();
        let spi_r = [f[0]; SPI_LEN];
        let nonce = [f[1]; NONCE_LEN];
        let keys = self
            .secrets
            .control((&request.nonce, &nonce), (&request.spi_i, &spi_r));
        let message = Message {
            kind: Kind::Init,
            response: true,
            from_initiator: tweak & 0x08 != 0,
            spi_i: request.spi_i,
            spi_r,
            message_id: u32::from(tweak & 0x02 != 0),
            tunnel: "t".into(),
            child: u32::from(tweak & 0x04 != 0),
            spi: word(&f[2..6]),
            nonce,
        };
        let key = if tweak & 0x01 != 0 {
            &keys.sk_ai
        } else {
            &keys.sk_ar
        };
        let wire = message.seal(&key[..]);
        self.add_control(Control {
            spi_i: request.spi_i,
            spi_r,
            keys,
            a_initiator: false,
            next_id: 0,
            child: 0,
            confirmed: true,
            answer: None,
        });
        Some(wire)
    }

    /// Op 9.
    fn answer(&mut self, f: &[u8]) -> Option<Vec<u8>> {
        let request = self.b_request.clone()?;
        let c = self.control(&request.spi_i, &request.spi_r)?;
        let mut answer = c.message(request.kind, true, request.message_id, request.child);
        match request.kind {
            Kind::Rekey => {
                answer.spi = word(&f[..4]);
                answer.nonce = [f[4]; NONCE_LEN];
            }
            // A moves to the child B switched to.
            Kind::Switched => c.child = request.child,
            Kind::Init => {}
        }
        Some(answer.seal(c.key(false)))
    }

    /// Op 10.
    fn next_step(&mut self, f: &[u8]) -> Option<Vec<u8>> {
        let c = self.controls.last_mut()?;
        let message = if let Some(answer) = c.answer.take() {
            let id = c.take_id();
            c.message(Kind::Switched, false, id, answer.child)
        } else if c.a_initiator && !c.confirmed {
            c.confirmed = true;
            let id = c.take_id();
            c.message(Kind::Switched, false, id, 0)
        } else {
            let id = c.take_id();
            let mut rekey = c.message(Kind::Rekey, false, id, c.child.wrapping_add(1));
            rekey.spi = word(&f[..4]);
            rekey.nonce = [f[4]; NONCE_LEN];
            rekey
        };
        Some(message.seal(c.key(false)))
    }

    /// Op 2.
    fn sealed(&mut self, f: &[u8]) -> Option<Vec<u8>> {
        let which = usize::from(f[0] >> 6);
        let index = self
            .controls
            .len()
            .checked_sub(1 + which % self.controls.len().max(1))?;
        let b_request = self.b_request.clone();
        let c = &mut self.controls[index];
        let response = f[0] & 0x04 != 0;
        let kind = match f[0] & 3 {
            1 => Kind::Switched,
            2 => Kind::Init,
            _ => Kind::Rekey,
        };
        let offset = i32::from(f[1] as i8);
        let base = match &b_request {
            Some(r) if response && r.spi_i == c.spi_i && r.spi_r == c.spi_r => r.message_id,
            _ if response => c.next_id.wrapping_sub(1),
            _ => c.next_id,
        };
        let id = base.wrapping_add_signed(offset);
        if !response && offset >= 0 {
            c.next_id = id.wrapping_add(1);
        }
        let mut message = c.message(
            kind,
            response,
            id,
            c.child.wrapping_add_signed(i32::from(f[2] as i8)),
        );
        message.from_initiator ^= f[0] & 0x08 != 0;
        if f[0] & 0x20 != 0 {
            message.tunnel = "u".into();
        }
        message.spi = word(&f[3..7]);
        message.nonce = [f[7]; NONCE_LEN];
        Some(message.seal(c.key(f[0] & 0x10 != 0)))
    }
}

fn word(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Splits `n` bytes off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
    *rest = tail;
    Some(head)
}

/// The names of tunnel `t`'s SAs the gateway holds.
fn held(gateway: &Gateway) -> BTreeSet<String> {
    gateway
        .sad()
        .iter()
        .map(|(_, sa)| {
            assert!(of_t(sa.name()), "the gateway holds {}", sa.name());
            sa.name().to_owned()
        })
        .collect()
}

/// Applies what the plane issued and checks it; returns what it sent.
fn settle(
    plane: &mut ControlPlane,
    gateway: &mut Gateway,
    now: Duration,
    authentic: bool,
    init_key_b: &[u8],
) -> Vec<Vec<u8>> {
    let mut commands = Vec::new();
    let mut datagrams = Vec::new();
    plane.take_commands(&mut commands);
    plane.take_datagrams(&mut datagrams);
    if !authentic {
        assert!(commands.is_empty(), "unauthenticated input issued {commands:?}");
    }
    for command in commands {
        if let SaCommand::InstallSa(sa) | SaCommand::ReplaceSa { new: sa, .. } = &command {
            assert!(of_t(&sa.params.name), "installed {}", sa.params.name);
            assert_eq!(
                (sa.params.local, sa.params.remote),
                (IpAddr::from(common::GW_B), IpAddr::from(common::GW_A)),
                "{}",
                sa.params.name
            );
        }
        if let Err(e) = gateway.apply(&command, now) {
            panic!("{command:?} did not apply: {e}");
        }
    }
    let mut sent = Vec::new();
    for datagram in datagrams {
        assert_eq!(datagram.to, common::GW_A, "sent somewhere other than the peer");
        assert_eq!(datagram.ports, PORTS, "sent from or to another port");
        if !authentic {
            let own_init = Message::open(&datagram.payload, init_key_b).is_ok_and(|m| {
                m.kind == Kind::Init
                    && !m.response
                    && m.from_initiator
                    && m.spi_r == [0; SPI_LEN]
                    && m.message_id == 0
                    && m.child == 0
            });
            assert!(own_init, "unauthenticated input was answered");
        }
        sent.push(datagram.payload);
    }
    sent
}

fuzz_target!(|data: &[u8]| {
    let config = config();
    let mut gateway = common::build(&config, LinkLayer::RawIp);
    let mut plane = ControlPlane::new(config);
    plane.set_seed(7);
    let mut peer = Peer::new();
    let init_key_b = peer.secrets.init_key(Side::High);
    let debug = std::env::var_os("FUZZ_DEBUG").is_some();
    let mut states = BTreeSet::new();
    let mut most_held = 0;
    let mut now = Duration::ZERO;
    let mut delivered = 0u64;
    let mut authentic = false;
    let mut last_sent: Option<Vec<u8>> = None;
    let mut rest = data;
    while let Some(op) = take(&mut rest, 1) {
        // What A sends, sealed by the model: authentic, and kept for replay.
        let mut from_a: Option<Vec<u8>> = None;
        // A packet from the peer's address to B's (ops 0, 1, 5, 6).
        let mut packet: Option<Vec<u8>> = None;
        match op[0] % 12 {
            0 | 1 => {
                let Some(len) = take(&mut rest, 1) else { break };
                let len = usize::from(len[0]).min(rest.len());
                let Some(bytes) = take(&mut rest, len) else { break };
                packet = Some(if op[0] % 12 == 0 {
                    bytes.to_vec()
                } else {
                    common::udp_packet(common::GW_A, common::GW_B, PORTS, bytes)
                });
            }
            2 => {
                let Some(f) = take(&mut rest, 8) else { break };
                from_a = peer.sealed(f);
            }
            3 => {
                let Some(step) = take(&mut rest, 1) else { break };
                now += Duration::from_millis(u64::from(step[0]) * 10);
                plane.handle_timeout(now);
            }
            4 => {
                let Some(which) = take(&mut rest, 1) else { break };
                let names: Vec<String> = held(&gateway).into_iter().collect();
                if names.is_empty() {
                    continue;
                }
                let name = &names[usize::from(which[0] >> 1) % names.len()];
                if let Some(id) = gateway.sad().find(name) {
                    let event = if which[0] & 1 == 0 {
                        SaEvent::SoftExpired(id)
                    } else {
                        SaEvent::HardExpired(id)
                    };
                    plane.handle_sa_event(now, name, event);
                }
            }
            5 => {
                // Not authentic: B must refuse its own messages.
                packet = last_sent
                    .as_ref()
                    .map(|p| common::udp_packet(common::GW_A, common::GW_B, PORTS, p));
            }
            6 => {
                // IPv4 total length and UDP length whatever the size.
                let Some(f) = take(&mut rest, 5) else { break };
                let len = usize::from(f[4]).min(rest.len());
                let Some(bytes) = take(&mut rest, len) else { break };
                let mut lying = common::udp_packet(common::GW_A, common::GW_B, PORTS, bytes);
                lying[2..4].copy_from_slice(&f[0..2]);
                lying[24..26].copy_from_slice(&f[2..4]);
                packet = Some(lying);
            }
            7 => {
                let Some(f) = take(&mut rest, 7) else { break };
                from_a = Some(peer.init_request(f));
            }
            8 => {
                let Some(f) = take(&mut rest, 7) else { break };
                from_a = peer.init_response(f);
            }
            9 => {
                let Some(f) = take(&mut rest, 5) else { break };
                from_a = peer.answer(f);
            }
            10 => {
                let Some(f) = take(&mut rest, 5) else { break };
                from_a = peer.next_step(f);
            }
            _ => {
                let Some(which) = take(&mut rest, 1) else { break };
                if !peer.sent.is_empty() {
                    let at = peer.sent.len() - 1 - usize::from(which[0]) % peer.sent.len();
                    from_a = Some(peer.sent[at].clone());
                }
            }
        }
        if let Some(payload) = from_a {
            authentic = true;
            plane.handle_datagram(
                now,
                &common::udp_packet(common::GW_A, common::GW_B, PORTS, &payload),
            );
            delivered += 1;
            push_bounded(&mut peer.sent, payload);
        }
        if let Some(packet) = packet {
            // An input's bytes may carry a message sealed with A's keys
            // (only seeds do: the fuzzer cannot make one).
            if let Some((_, _, payload)) = udp_payload(&packet) {
                if peer.authentic(payload) {
                    authentic = true;
                }
            }
            plane.handle_datagram(now, &packet);
            delivered += 1;
        }
        for payload in settle(&mut plane, &mut gateway, now, authentic, &init_key_b[..]) {
            peer.observe(&payload);
            last_sent = Some(payload);
        }
        assert_eq!(plane.counters().received, delivered);
        let tunnels = plane.tunnels(now);
        let status = &tunnels[0];
        let listed: BTreeSet<&str> = [status.sa_out.as_str(), status.sa_in.as_str()]
            .into_iter()
            .chain(status.retiring.iter().map(String::as_str))
            .collect();
        let held = held(&gateway);
        for current in [&status.sa_out, &status.sa_in]
            .into_iter()
            .filter(|n| !n.is_empty())
        {
            assert!(
                held.contains(current),
                "traffic uses {current}, which the gateway does not hold"
            );
        }
        let unlisted = held.iter().filter(|n| !listed.contains(n.as_str())).count();
        assert!(
            unlisted <= 2 * MAX_HALF_OPEN + 2,
            "{unlisted} SAs neither current nor retiring: {held:?}, {status:?}"
        );
        most_held = most_held.max(held.len());
        if debug {
            states.insert(status.state.clone());
        }
    }
    // Quiet: every exchange's budget, every retransmission and the grace
    // period pass (the retry after a give-up may start a new exchange,
    // which holds no SA until answered).
    for _ in 0..12 {
        now += Duration::from_secs(1);
        plane.handle_timeout(now);
        settle(&mut plane, &mut gateway, now, authentic, &init_key_b[..]);
    }
    let tunnels = plane.tunnels(now);
    let status = &tunnels[0];
    let mut expected: BTreeSet<String> = status.retiring.iter().cloned().collect();
    if !status.sa_out.is_empty() {
        expected.extend([status.sa_out.clone(), status.sa_in.clone()]);
    }
    assert_eq!(held(&gateway), expected, "after a quiet while: {status:?}");
    assert!(
        status.retiring.len() as u64 <= plane.counters().gave_up,
        "{} SAs retiring after a quiet while, {} exchanges given up",
        status.retiring.len(),
        plane.counters().gave_up
    );
    if debug {
        eprintln!(
            "states: {states:?}; most SAs held: {most_held}\n{:?}\n{status:?}",
            plane.counters()
        );
    }
});
