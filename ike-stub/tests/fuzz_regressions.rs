//! Inputs that once crashed a fuzz target (`fuzz/`), kept as tests in the
//! crate that owns the code.

use ike_stub::plane::udp_payload;

/// A 28-byte IPv4/UDP packet whose total length (22) ends inside the UDP
/// header: `udp_payload` indexed the UDP length field past the end of the
/// packet it had cut to the total length (the `control_plane` fuzz target's
/// crash: total length 0, "index out of bounds: the len is 0 but the index
/// is 12" in `ControlPlane::handle_datagram`).
#[test]
fn udp_payload_total_length_inside_the_udp_header() {
    let mut packet = [0u8; 28];
    packet[0] = 0x45;
    packet[9] = 17;
    for total in 0..28u16 {
        packet[2..4].copy_from_slice(&total.to_be_bytes());
        assert_eq!(udp_payload(&packet), None, "total length {total}");
    }
    // Consistent lengths still give the payload.
    packet[2..4].copy_from_slice(&28u16.to_be_bytes());
    packet[24..26].copy_from_slice(&8u16.to_be_bytes());
    assert_eq!(udp_payload(&packet).map(|(_, _, p)| p.len()), Some(0));
}

/// Site B (10.0.0.2) of a tunnel `t` keyed by exchange with site A
/// (10.0.0.1): the `control_plane` fuzz target's configuration.
const SITE_B: &str = r#"
[[interface]]
name = "inside"
device = "in0"
address = "192.168.2.1/24"

[[interface]]
name = "outside"
device = "out0"
address = "10.0.0.2/24"

[[route]]
destination = "192.168.1.0/24"
via = "10.0.0.1"

[[tunnel]]
name = "t"
local = "10.0.0.2"
remote = "10.0.0.1"
local_subnet = "192.168.2.0/24"
remote_subnet = "192.168.1.0/24"
proposal = "aes128gcm16"
secret = "a fuzzing secret, longer than sixteen bytes"
"#;

/// Site B's plane beside its gateway, and the tunnel's secrets as site A
/// holds them.
fn site_b() -> (
    ike_stub::ControlPlane,
    dataplane::Gateway,
    ike_stub::prf::TunnelSecrets,
) {
    let config = ike_stub::Config::parse(std::path::Path::new("b.toml"), SITE_B).expect("site B's config");
    let engine = accel::engine::build_engine(&accel::engine::EngineSpec::default()).expect("soft engine");
    let gateway = dataplane::Gateway::with_commands(
        config.setup(dataplane::LinkLayer::RawIp, accel::job::Style::Async),
        engine,
        &config.commands(),
        std::time::Duration::ZERO,
    )
    .expect("config installs");
    let mut plane = ike_stub::ControlPlane::new(config);
    plane.set_seed(7);
    let secrets = ike_stub::prf::TunnelSecrets::derive(b"a fuzzing secret, longer than sixteen bytes", "t");
    (plane, gateway, secrets)
}

/// An IPv4/UDP packet from site A's port 500 to site B's.
fn from_a(payload: &[u8]) -> Vec<u8> {
    let total = 28 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[10, 0, 0, 1]);
    p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    p[20..24].copy_from_slice(&[0x01, 0xf4, 0x01, 0xf4]);
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    p
}

/// Applies what the plane issued to the gateway, each command checked,
/// and returns what it sent.
fn settle(
    plane: &mut ike_stub::ControlPlane,
    gateway: &mut dataplane::Gateway,
    now: std::time::Duration,
) -> Vec<Vec<u8>> {
    let mut commands = Vec::new();
    plane.take_commands(&mut commands);
    for command in commands {
        if let Err(e) = gateway.apply(&command, now) {
            panic!("the plane issued a command the gateway refuses: {command:?}: {e}");
        }
    }
    let mut datagrams = Vec::new();
    plane.take_datagrams(&mut datagrams);
    datagrams.into_iter().map(|d| d.payload).collect()
}

/// The tunnel's current SAs, if it has any, are in the gateway.
fn current_sas_held(plane: &ike_stub::ControlPlane, gateway: &dataplane::Gateway, case: &str) {
    let status = &plane.tunnels(std::time::Duration::ZERO)[0];
    for sa in [&status.sa_out, &status.sa_in]
        .into_iter()
        .filter(|n| !n.is_empty())
    {
        assert!(
            gateway.sad().find(sa).is_some(),
            "{case}: {}, traffic uses {sa}, which the gateway does not hold",
            status.state
        );
    }
}

/// The control SA's SPIs and keys, as site A holds them.
type Control = (([u8; 8], [u8; 8]), ike_stub::prf::ControlKeys);

/// B connected as the responder to A's INIT request, whose inbound SPI is
/// `spi`, and A's confirmation; the control SA, unless B did not answer.
fn connected_as_responder(spi: u32) -> (ike_stub::ControlPlane, dataplane::Gateway, Option<Control>) {
    use ike_stub::message::{Kind, Message};
    let now = std::time::Duration::ZERO;
    let (mut plane, mut gateway, secrets) = site_b();
    let (spi_i, ni) = ([0x4a; 8], [0x4a; 32]);
    let request = Message {
        kind: Kind::Init,
        response: false,
        from_initiator: true,
        spi_i,
        spi_r: [0; 8],
        message_id: 0,
        tunnel: "t".into(),
        child: 0,
        spi,
        nonce: ni,
    };
    let init_key = secrets.init_key(ike_stub::prf::Side::Low);
    plane.handle_datagram(now, &from_a(&request.seal(&init_key[..])));
    let sent = settle(&mut plane, &mut gateway, now);
    let Some(answer) = sent.first() else {
        return (plane, gateway, None);
    };
    let mut keys = None;
    let answer = Message::open_keyed(answer, |m| {
        let derived = secrets.control((&ni, &m.nonce), (&spi_i, &m.spi_r));
        let key = derived.sk_ar.clone();
        keys = Some(derived);
        key
    })
    .expect("B's answer opens");
    let keys = keys.expect("keys");
    let confirm = Message {
        kind: Kind::Switched,
        response: false,
        from_initiator: true,
        spi_i,
        spi_r: answer.spi_r,
        message_id: 1,
        tunnel: "t".into(),
        child: 0,
        spi: 0,
        nonce: [0; 32],
    };
    plane.handle_datagram(now, &from_a(&confirm.seal(&keys.sk_ai[..])));
    settle(&mut plane, &mut gateway, now);
    (plane, gateway, Some(((spi_i, answer.spi_r), keys)))
}

/// A peer that holds the secret proposes an inbound SPI from the range
/// RFC 4303 §2.1 reserves (0 here, 1..=255 alike) wherever it gives one:
/// in an INIT request, its answer to B's INIT request, a rekey request and
/// its answer to B's rekey request. The plane takes it: it issues the
/// install of an outbound SA with that SPI, which every gateway refuses
/// ("SPIs 0-255 are reserved"), and once the exchange completes it points
/// the tunnel's outbound policy at that SA, which does not exist, and
/// reports the tunnel established with nothing able to leave. The
/// `control_plane` fuzz target's crash (its seed
/// `regression-reserved-spi`): "InstallSa ... did not apply: SPIs 0-255
/// are reserved (RFC 4303 §2.1); 0x0 cannot be used".
#[test]
fn a_peer_spi_in_the_reserved_range_installs_nothing_the_gateway_refuses() {
    use ike_stub::message::{Kind, Message};
    use ike_stub::prf::Side;
    let now = std::time::Duration::ZERO;

    // B responds to A's INIT request.
    let (plane, gateway, _) = connected_as_responder(0);
    current_sas_held(&plane, &gateway, "INIT request");

    // B initiates: A answers B's INIT request.
    let (mut plane, mut gateway, secrets) = site_b();
    plane.handle_timeout(now);
    let sent = settle(&mut plane, &mut gateway, now);
    let request = Message::open(&sent[0], &secrets.init_key(Side::High)[..]).expect("B's INIT request");
    let (spi_r, nr) = ([0x4b; 8], [0x4b; 32]);
    let keys = secrets.control((&request.nonce, &nr), (&request.spi_i, &spi_r));
    let answer = Message {
        kind: Kind::Init,
        response: true,
        from_initiator: false,
        spi_i: request.spi_i,
        spi_r,
        message_id: 0,
        tunnel: "t".into(),
        child: 0,
        spi: 0,
        nonce: nr,
    };
    plane.handle_datagram(now, &from_a(&answer.seal(&keys.sk_ar[..])));
    settle(&mut plane, &mut gateway, now);
    current_sas_held(&plane, &gateway, "INIT response");

    // Connected (A's SPI is fine), A asks a rekey and switches.
    let (mut plane, mut gateway, control) = connected_as_responder(0x1000);
    let ((spi_i, spi_r), keys) = control.expect("connected");
    let under_control = |kind, response, message_id, spi| {
        Message {
            kind,
            response,
            from_initiator: true,
            spi_i,
            spi_r,
            message_id,
            tunnel: "t".into(),
            child: 1,
            spi,
            nonce: [0x4c; 32],
        }
        .seal(&keys.sk_ai[..])
    };
    plane.handle_datagram(now, &from_a(&under_control(Kind::Rekey, false, 2, 0)));
    settle(&mut plane, &mut gateway, now);
    plane.handle_datagram(now, &from_a(&under_control(Kind::Switched, false, 3, 0)));
    settle(&mut plane, &mut gateway, now);
    current_sas_held(&plane, &gateway, "rekey request");

    // Connected, B asks a rekey (its SA's soft lifetime) and A answers.
    let (mut plane, mut gateway, control) = connected_as_responder(0x1000);
    let ((spi_i, spi_r), keys) = control.expect("connected");
    let id = gateway.sad().find("t-out").expect("the current SA");
    plane.handle_sa_event(now, "t-out", spd_sad::SaEvent::SoftExpired(id));
    let sent = settle(&mut plane, &mut gateway, now);
    let request = Message::open(&sent[0], &keys.sk_ar[..]).expect("B's rekey request");
    let answer = Message {
        kind: Kind::Rekey,
        response: true,
        from_initiator: true,
        spi_i,
        spi_r,
        message_id: request.message_id,
        tunnel: "t".into(),
        child: request.child,
        spi: 0,
        nonce: [0x4d; 32],
    };
    plane.handle_datagram(now, &from_a(&answer.seal(&keys.sk_ai[..])));
    settle(&mut plane, &mut gateway, now);
    current_sas_held(&plane, &gateway, "rekey response");
}
