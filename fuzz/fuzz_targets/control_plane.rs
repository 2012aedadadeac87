//! The control plane (`ike_stub::ControlPlane::handle_datagram` and the
//! exchange state machine behind it), site B of a tunnel `t` with a shared
//! secret, driven by a sequence of operations decoded from the input:
//!
//! - `op % 7 == 0`: a raw datagram (length byte, then the bytes) as the
//!   gateway would hand it over: IPv4/UDP parsing;
//! - `1`: the bytes as the UDP payload of a packet from the peer;
//! - `2`: a message *sealed with the tunnel's real key* from 15 bytes of
//!   fields (kind, flags, message ID, generation, SPI, nonce byte, name
//!   choice): reaches the request/response handling;
//! - `3`: time passes (byte × 10 ms) and timeouts run;
//! - `4`: a soft or hard expiry of one of the tunnel's SAs;
//! - `5`: the last datagram the plane sent, reflected back as if from the
//!   peer (an attacker can replay what it sees);
//! - `6`: a UDP packet from the peer with the input's IPv4 total length and
//!   UDP length (4 bytes), then a length byte and the payload.
//!
//! Commands are applied to a gateway built from the same configuration.
//! Checks: nothing panics; `received` counts every datagram; and as long
//! as only unauthenticated bytes and time came in (operations 0, 1, 3 and 6
//! without a validly sealed message, which only seeds carry), the plane
//! issues no SA command and sends nothing.
#![no_main]

use std::cell::RefCell;
use std::time::Duration;

use accel::Algorithm;
use dataplane::LinkLayer;
use ike_stub::builder::{LifetimeBuilder, RekeySection};
use ike_stub::message::{Kind, Message};
use ike_stub::prf::{TunnelSecrets, NONCE_LEN};
use ike_stub::{Config, ControlPlane, SaCommand};
use libfuzzer_sys::fuzz_target;
use spd_sad::SaEvent;

#[path = "common.rs"]
mod common;

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
                        ..RekeySection::default()
                    });
                let tunnel = &mut config.tunnels[0];
                tunnel.secret = Some(common::SECRET.to_owned());
                tunnel.lifetime = Some(LifetimeBuilder {
                    soft_packets: Some(1000),
                    hard_packets: Some(2000),
                    ..LifetimeBuilder::default()
                });
                common::parse(&config)
            })
            .clone()
    })
}

fuzz_target!(|data: &[u8]| {
    let config = config();
    let mut gateway = common::build(&config, LinkLayer::RawIp);
    let mut plane = ControlPlane::new(config);
    plane.set_seed(7);
    let secrets = TunnelSecrets::derive(common::SECRET.as_bytes(), "t");
    let mut now = Duration::ZERO;
    let mut delivered = 0u64;
    let mut authentic = false;
    let mut last_sent: Option<Vec<u8>> = None;
    let mut commands = Vec::new();
    let mut datagrams = Vec::new();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        match op % 7 {
            0 | 1 => {
                let Some((&len, tail)) = rest.split_first() else {
                    break;
                };
                let len = usize::from(len).min(tail.len());
                let (bytes, tail) = tail.split_at(len);
                rest = tail;
                let packet = if op % 7 == 0 {
                    bytes.to_vec()
                } else {
                    common::udp_packet(common::GW_A, common::GW_B, (500, 500), bytes)
                };
                plane.handle_datagram(now, &packet);
                delivered += 1;
                // A seed may carry a genuinely sealed message here (the
                // fuzzer cannot make one): that counts as authentic input.
                let payload = ike_stub::plane::udp_payload(&packet).map(|(_, _, p)| p);
                if payload.is_some_and(|p| Message::open(p, &secrets.sk_a).is_ok()) {
                    authentic = true;
                }
            }
            2 => {
                let Some(f) = rest.get(..15) else { break };
                rest = &rest[15..];
                let word = |at: usize| u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
                let message = Message {
                    kind: if f[0] & 1 == 0 {
                        Kind::Rekey
                    } else {
                        Kind::Switched
                    },
                    response: f[1] & 1 != 0,
                    from_initiator: f[1] & 2 != 0,
                    // Mostly small IDs and generations, so that they can be in step.
                    message_id: if f[0] & 2 == 0 {
                        u32::from(f[2] & 7)
                    } else {
                        word(2)
                    },
                    tunnel: if f[0] & 4 == 0 { "t".into() } else { "u".into() },
                    generation: if f[0] & 8 == 0 {
                        u32::from(f[6] & 7)
                    } else {
                        word(6)
                    },
                    spi: word(10),
                    nonce: [f[14]; NONCE_LEN],
                };
                let wire = message.seal(&secrets.sk_a);
                plane.handle_datagram(
                    now,
                    &common::udp_packet(common::GW_A, common::GW_B, (500, 500), &wire),
                );
                delivered += 1;
                authentic = true;
            }
            3 => {
                let Some((&step, tail)) = rest.split_first() else {
                    break;
                };
                rest = tail;
                now += Duration::from_millis(u64::from(step) * 10);
                plane.handle_timeout(now);
            }
            4 => {
                let Some((&which, tail)) = rest.split_first() else {
                    break;
                };
                rest = tail;
                let tunnels = plane.tunnels(now);
                let Some(status) = tunnels.first() else { continue };
                let mut names = vec![status.sa_out.clone(), status.sa_in.clone()];
                names.extend(status.retiring.iter().cloned());
                let name = &names[usize::from(which >> 1) % names.len()];
                if let Some(id) = gateway.sad().find(name) {
                    let event = if which & 1 == 0 {
                        SaEvent::SoftExpired(id)
                    } else {
                        SaEvent::HardExpired(id)
                    };
                    plane.handle_sa_event(now, name, event);
                    authentic = true;
                }
            }
            6 => {
                // A UDP packet from the peer whose IPv4 total length and UDP
                // length are the input's, whatever the packet's size.
                let Some(f) = rest.get(..5) else { break };
                let len = usize::from(f[4]).min(rest.len() - 5);
                let mut packet =
                    common::udp_packet(common::GW_A, common::GW_B, (500, 500), &rest[5..5 + len]);
                rest = &rest[5 + len..];
                packet[2..4].copy_from_slice(&f[0..2]);
                packet[24..26].copy_from_slice(&f[2..4]);
                plane.handle_datagram(now, &packet);
                delivered += 1;
            }
            _ => {
                if let Some(payload) = &last_sent {
                    plane.handle_datagram(
                        now,
                        &common::udp_packet(common::GW_A, common::GW_B, (500, 500), payload),
                    );
                    delivered += 1;
                    authentic = true;
                }
            }
        }
        plane.take_commands(&mut commands);
        plane.take_datagrams(&mut datagrams);
        if !authentic {
            assert!(commands.is_empty(), "unauthenticated input issued {commands:?}");
            assert!(datagrams.is_empty(), "unauthenticated input was answered");
        }
        for command in commands.drain(..) {
            if let SaCommand::InstallSa(sa) = &command {
                assert!(sa.params.name.starts_with("t-"), "{}", sa.params.name);
            }
            let _ = command.apply(&mut gateway, now);
        }
        for datagram in datagrams.drain(..) {
            assert_eq!(datagram.to, common::GW_A, "sent somewhere other than the peer");
            last_sent = Some(datagram.payload);
        }
        assert_eq!(plane.counters().received, delivered);
    }
    if std::env::var_os("FUZZ_DEBUG").is_some() {
        eprintln!("{:?}\n{:?}", plane.counters(), plane.tunnels(now));
    }
});
