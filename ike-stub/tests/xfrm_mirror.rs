//! The `xfrm` keying source's translator on recorded netlink messages
//! (`testdata/xfrm/`): each fixture is a sequence of datagrams as a
//! `NETLINK_XFRM` socket hands them over, with the dumps the driver asked
//! for marked; the mirror must answer with exactly the SA and policy
//! changes listed here. The `built-*` fixtures were written by
//! `regenerate_built_fixtures` (run it with `--ignored` after changing a
//! scenario) from the kernel's documented layout with the
//! `netlink-packet-xfrm` emitters; `captured-*` ones came from a kernel
//! (see `testdata/xfrm/README.md`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dataplane::command::{PolicyAction, SaCommand};
use ike_stub::xfrm::fixtures::{
    aead, auth, cipher, decode_steps, delete_policy, delete_sa, done, encap, encode_steps, expire, frame,
    new_policy, new_sa, parse_fixture, policy, replay_esn, state, template, transport, update_policy,
    update_sa, with_esn, Step,
};
use ike_stub::xfrm::{MirrorSettings, XfrmMirror};
use netlink_packet_xfrm::{
    XfrmAttrs, XfrmMessage, XFRM_MODE_BEET, XFRM_MODE_TRANSPORT, XFRM_MODE_TUNNEL, XFRM_POLICY_FWD,
    XFRM_POLICY_IN, XFRM_POLICY_OUT,
};

const US: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2));
const US6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
const PEER6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2));
const OURS: (IpAddr, u8) = (IpAddr::V4(Ipv4Addr::new(10, 1, 0, 0)), 16);
const THEIRS: (IpAddr, u8) = (IpAddr::V4(Ipv4Addr::new(10, 2, 0, 0)), 16);

const GCM128_KEY: [u8; 20] = [0x11; 20];
/// Three different 8-byte parts: espgw refuses a 3DES key that repeats one.
const THREE_DES_KEY: [u8; 24] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/xfrm")
}

fn read_fixture(name: &str) -> Vec<Step> {
    let path = dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_fixture(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn action(a: &PolicyAction) -> String {
    match a {
        PolicyAction::Protect(sa) => format!("protect {sa}"),
        PolicyAction::Bypass => "bypass".into(),
        PolicyAction::Discard => "discard".into(),
    }
}

/// A command in one line: what it does to which SA or policy.
fn render(c: &SaCommand) -> String {
    match c {
        SaCommand::InstallSa(sa) => format!(
            "install {} {} selectors={}",
            sa.params.name,
            sa.algorithm,
            sa.params.selectors.len()
        ),
        SaCommand::RemoveSa(name) => format!("remove {name}"),
        SaCommand::ReplaceSa { old, new } => format!("replace {old} by {}", new.params.name),
        SaCommand::InsertPolicy(p) => format!("policy {} {} {}", p.name, p.direction, action(&p.action)),
        SaCommand::RemovePolicy(name) => format!("unpolicy {name}"),
        SaCommand::SetPolicyAction { policy, action: a } => format!("point {policy} {}", action(a)),
        SaCommand::SetSelectors { sa, selectors } => format!("select {sa} {}", selectors.len()),
        other => format!("{other:?}"),
    }
}

fn settings(durable: bool) -> MirrorSettings {
    MirrorSettings {
        local_addresses: vec![US, US6],
        durable_sequences: durable,
    }
}

/// Runs a fixture through a new mirror; returns it and every command.
fn run(name: &str, durable: bool) -> (XfrmMirror, Vec<SaCommand>) {
    run_with(name, settings(durable))
}

/// The strongSwan and libreswan labs' initiator, whose captures these are.
const LAB_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

fn run_with(name: &str, settings: MirrorSettings) -> (XfrmMirror, Vec<SaCommand>) {
    let (mirror, noted) = run_noted(name, settings);
    (mirror, noted.into_iter().map(|(command, _)| command).collect())
}

/// [`run_with`], each SA removal with the mirror's note of why.
fn run_noted(
    name: &str,
    settings: MirrorSettings,
) -> (XfrmMirror, Vec<(SaCommand, Option<ike_stub::RemovalNote>)>) {
    let mut mirror = XfrmMirror::new(settings);
    let mut commands = Vec::new();
    for step in read_fixture(name) {
        match step {
            Step::Dump(kind) => mirror.begin_dump(kind),
            Step::Datagram(bytes) => mirror.handle_datagram(Duration::from_secs(1), &bytes),
        }
        mirror.take_noted_commands(&mut commands);
    }
    (mirror, commands)
}

/// The SAs fixture `name` removes (with `settings`), each with the reason
/// its `sa_removed` line gives.
fn removals(name: &str, settings: MirrorSettings) -> Vec<String> {
    run_noted(name, settings)
        .1
        .into_iter()
        .filter_map(|(command, note)| match command {
            SaCommand::RemoveSa(sa) => Some(format!("{sa} {}", note.map_or("(none)", |n| n.why.as_str()))),
            _ => None,
        })
        .collect()
}

fn rendered(commands: &[SaCommand]) -> Vec<String> {
    commands.iter().map(render).collect()
}

// ---------------------------------------------------------------------
// The scenarios, as strongSwan's charon writes them (tunnel mode, reqid
// per CHILD_SA, out + in + fwd policies).

fn out_sa(spi: u32, reqid: u32) -> XfrmMessage {
    new_sa(
        state(US, PEER, spi, reqid),
        vec![aead("rfc4106(gcm(aes))", &GCM128_KEY, 128), replay_esn(0)],
    )
}

fn in_sa(spi: u32, reqid: u32) -> XfrmMessage {
    // charon installs inbound SAs with UPDSA: their SPI was allocated.
    update_sa(
        state(PEER, US, spi, reqid),
        vec![aead("rfc4106(gcm(aes))", &GCM128_KEY, 128), replay_esn(32)],
    )
}

fn policies(reqid: u32) -> Vec<XfrmMessage> {
    vec![
        new_policy(
            policy(XFRM_POLICY_OUT, 1, 375_423, OURS, THEIRS),
            vec![template(US, PEER, reqid, XFRM_MODE_TUNNEL)],
        ),
        new_policy(
            policy(XFRM_POLICY_IN, 8, 375_423, THEIRS, OURS),
            vec![template(PEER, US, reqid, XFRM_MODE_TUNNEL)],
        ),
        new_policy(
            policy(XFRM_POLICY_FWD, 10, 375_423, THEIRS, OURS),
            vec![template(PEER, US, reqid, XFRM_MODE_TUNNEL)],
        ),
    ]
}

/// Both SAs in one datagram, as a dump packs its replies.
fn tunnel_dump() -> Vec<String> {
    let mut sas = frame(out_sa(0xc000_0001, 1), true);
    sas.extend(frame(in_sa(0xc000_0002, 1), true));
    let mut lines = vec!["dump sa".to_owned(), hex::encode(sas), hex::encode(done())];
    lines.push("dump policy".into());
    for p in policies(1) {
        lines.push(hex::encode(frame(p, true)));
    }
    lines.push(hex::encode(done()));
    lines
}

fn live(m: XfrmMessage) -> String {
    hex::encode(frame(m, false))
}

fn scenarios() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let mut out = Vec::new();
    out.push((
        "built-tunnel-dump.nl",
        "A tunnel's two SAs (AES-GCM-128, reqid 1) and three policies, as the dumps at start show them.",
        tunnel_dump(),
    ));
    let mut reorder = vec![];
    for p in policies(1) {
        reorder.push(live(p));
    }
    reorder.push(live(out_sa(0xc000_0001, 1)));
    reorder.push(live(in_sa(0xc000_0002, 1)));
    out.push((
        "built-policy-before-sa.nl",
        "Notifications: the policies first, then the outbound SA, then the inbound one.",
        reorder,
    ));
    let mut rekey = tunnel_dump();
    rekey.push(live(in_sa(0xc000_0004, 1)));
    rekey.push(live(out_sa(0xc000_0003, 1)));
    rekey.push(live(delete_sa(PEER, 0xc000_0001)));
    rekey.push(live(delete_sa(US, 0xc000_0002)));
    out.push((
        "built-rekey.nl",
        "A rekey: new inbound then new outbound SA of reqid 1, then the old ones deleted.",
        rekey,
    ));
    let mut delete = tunnel_dump();
    let ps = policies(1);
    let infos: Vec<_> = ps
        .iter()
        .map(|m| match m {
            XfrmMessage::AddPolicy(p) => p.user_policy_info,
            _ => unreachable!(),
        })
        .collect();
    delete.push(live(delete_policy(infos[0])));
    delete.push(live(delete_sa(PEER, 0xc000_0001)));
    delete.push(live(delete_policy(infos[1])));
    delete.push(live(delete_policy(infos[2])));
    delete.push(live(delete_sa(US, 0xc000_0002)));
    out.push((
        "built-delete.nl",
        "The tunnel torn down: outbound policy, outbound SA, inbound policies, inbound SA.",
        delete,
    ));
    let mut larval_state = state(PEER, US, 0xc000_0002, 0);
    larval_state.mode = XFRM_MODE_TRANSPORT;
    let mut larval = vec![
        "dump sa".to_owned(),
        hex::encode(frame(new_sa(larval_state, vec![]), true)),
        hex::encode(done()),
        "dump policy".to_owned(),
    ];
    for p in policies(1) {
        larval.push(hex::encode(frame(p, true)));
    }
    larval.push(hex::encode(done()));
    larval.push(live(in_sa(0xc000_0002, 1)));
    out.push((
        "built-larval.nl",
        "A larval state (an SPI allocated, no keys) in the dump, then the same SPI keyed by UPDSA.",
        larval,
    ));
    let mut refusals = Vec::new();
    let mut ah = state(US, PEER, 0x1001, 7);
    ah.id.proto = 51;
    refusals.push(live(new_sa(ah, vec![auth("hmac(sha1)", &[1; 20], 96)])));
    let mut beet = state(US, PEER, 0x1002, 7);
    beet.mode = XFRM_MODE_BEET;
    refusals.push(live(new_sa(
        beet,
        vec![aead("rfc4106(gcm(aes))", &GCM128_KEY, 128)],
    )));
    refusals.push(live(new_sa(
        state(US, PEER, 0x1003, 7),
        vec![cipher("cbc(aes)", &[2; 32]), auth("hmac(sha1)", &[3; 20], 96)],
    )));
    refusals.push(live(new_sa(
        state(US, PEER, 0x1004, 7),
        vec![
            aead("rfc4106(gcm(aes))", &GCM128_KEY, 128),
            XfrmAttrs::Mark(netlink_packet_xfrm::Mark {
                value: 42,
                mask: 0xffff_ffff,
            }),
        ],
    )));
    refusals.push(live(new_sa(
        transport(state(US, PEER, 0x1005, 7)),
        vec![aead("rfc4106(gcm(aes))", &GCM128_KEY, 128), encap(4500, 4500)],
    )));
    // A 3DES key that is single DES (the fuzzer's second find).
    refusals.push(live(new_sa(
        state(US, PEER, 0x1006, 7),
        vec![
            cipher("cbc(des3_ede)", &[7; 24]),
            auth("hmac(sha1)", &[8; 20], 96),
        ],
    )));
    // An SPI RFC 4303 reserves (the fuzzer's first find).
    refusals.push(live(new_sa(
        state(US, PEER, 0x30, 7),
        vec![aead("rfc4106(gcm(aes))", &GCM128_KEY, 128)],
    )));
    let mut comp = template(US, PEER, 7, XFRM_MODE_TUNNEL);
    comp.id.proto = 108;
    refusals.push(live(new_policy(
        policy(XFRM_POLICY_OUT, 17, 100, OURS, THEIRS),
        vec![comp, template(US, PEER, 7, XFRM_MODE_TUNNEL)],
    )));
    let mut masked = policy(XFRM_POLICY_OUT, 25, 100, OURS, THEIRS);
    masked.selector.proto = 6;
    masked.selector.dport = 0x0110;
    masked.selector.dport_mask = 0x0ff0;
    refusals.push(live(new_policy(
        masked,
        vec![template(US, PEER, 7, XFRM_MODE_TUNNEL)],
    )));
    refusals.push(live(new_policy(
        policy(XFRM_POLICY_OUT, 33, 200, OURS, THEIRS),
        vec![template(US, PEER, 7, XFRM_MODE_TUNNEL)],
    )));
    out.push((
        "built-refusals.nl",
        "What espgw cannot do: AH, BEET, cbc(aes)-256 with hmac(sha1), a mark, ESP in UDP in transport mode, a \
         degenerate 3DES key, a reserved SPI, an IPComp bundle, a port mask that is no range; and a policy whose \
         only SA (reqid 7) was refused.",
        refusals,
    ));
    let mut shapes = Vec::new();
    let mut natt = with_esn(state(US, PEER, 0x2001, 2));
    natt.lifetime_cfg.soft_byte_limit = 900_000_000;
    natt.lifetime_cfg.hard_byte_limit = 1_000_000_000;
    natt.lifetime_cfg.soft_add_expires_seconds = 3000;
    natt.lifetime_cfg.hard_add_expires_seconds = 3600;
    shapes.push(live(new_sa(
        natt,
        vec![
            cipher("cbc(aes)", &[4; 16]),
            auth("hmac(sha1)", &[5; 20], 96),
            encap(4500, 4501),
            replay_esn(128),
        ],
    )));
    shapes.push(live(new_sa(
        transport(state(PEER6, US6, 0x2002, 3)),
        vec![aead("rfc7539esp(chacha20,poly1305)", &[6; 36], 128)],
    )));
    shapes.push(live(new_sa(
        state(US, PEER, 0x2003, 4),
        vec![
            cipher("cbc(des3_ede)", &THREE_DES_KEY),
            auth("hmac(sha1)", &[8; 20], 96),
        ],
    )));
    shapes.push(live(new_sa(
        state(US, PEER, 0x2004, 5),
        vec![cipher("cbc(aes)", &[9; 32]), auth("hmac(sha256)", &[10; 32], 128)],
    )));
    let v6 = |a: IpAddr| (a, 128);
    shapes.push(live(new_policy(
        policy(XFRM_POLICY_IN, 40, 50, v6(PEER6), v6(US6)),
        vec![template(PEER6, US6, 3, XFRM_MODE_TRANSPORT)],
    )));
    out.push((
        "built-shapes.nl",
        "One SA of each other shape: AES-CBC-128/HMAC-SHA1-96 with ESN, a 128-packet window, ESP in UDP and \
         lifetimes; ChaCha20-Poly1305 over IPv6 in transport mode (with its inbound policy); 3DES; \
         AES-CBC-256/HMAC-SHA256-128.",
        shapes,
    ));
    // charon's rekey, as a listener in its namespace sees it: a soft
    // expiry, the new inbound SA (UPDSA), the new outbound one (NEWSA),
    // all three policies updated (the outbound template names the
    // outbound SA's SPI), the old outbound SA deleted (its DELSA carries
    // the state and its keys), the old inbound one expired hard.
    let mut charon = Vec::new();
    let spi_template = |src, dst, spi| {
        let mut t = template(src, dst, 1, XFRM_MODE_TUNNEL);
        t.id.spi = spi;
        t
    };
    let charon_policies = |out_spi| {
        vec![
            update_policy(
                policy(XFRM_POLICY_IN, 8, 375_423, THEIRS, OURS),
                vec![template(PEER, US, 1, XFRM_MODE_TUNNEL)],
            ),
            update_policy(
                policy(XFRM_POLICY_FWD, 10, 375_423, THEIRS, OURS),
                vec![template(PEER, US, 1, XFRM_MODE_TUNNEL)],
            ),
            update_policy(
                policy(XFRM_POLICY_OUT, 1, 375_423, OURS, THEIRS),
                vec![spi_template(US, PEER, out_spi)],
            ),
        ]
    };
    charon.push(live(in_sa(0xc000_0002, 1)));
    charon.push(live(out_sa(0xc000_0001, 1)));
    for p in charon_policies(0xc000_0001) {
        charon.push(live(p));
    }
    charon.push(live(expire(state(US, PEER, 0xc000_0001, 1), false)));
    charon.push(live(in_sa(0xc000_0004, 1)));
    charon.push(live(out_sa(0xc000_0003, 1)));
    for p in charon_policies(0xc000_0003) {
        charon.push(live(p));
    }
    let mut old_out = delete_sa(PEER, 0xc000_0001);
    if let XfrmMessage::DeleteSa(m) = &mut old_out {
        m.nlas.push(XfrmAttrs::SaInfo(state(US, PEER, 0xc000_0001, 1)));
        m.nlas.push(aead("rfc4106(gcm(aes))", &GCM128_KEY, 128));
    }
    charon.push(live(old_out));
    charon.push(live(expire(state(PEER, US, 0xc000_0002, 1), true)));
    out.push((
        "built-charon-rekey.nl",
        "A tunnel as charon installs it, then its rekey as a listener in charon's namespace sees it (see the \
         test a_charon_rekey_follows_the_outbound_template).",
        charon,
    ));
    let mut resync = tunnel_dump();
    let mut sas = frame(in_sa(0xc000_0002, 1), true);
    sas.extend(frame(out_sa(0xc000_0005, 1), true));
    resync.push("dump sa".into());
    resync.push(hex::encode(sas));
    resync.push(hex::encode(done()));
    resync.push("dump policy".into());
    for p in policies(1) {
        resync.push(hex::encode(frame(p, true)));
    }
    resync.push(hex::encode(done()));
    out.push((
        "built-resync.nl",
        "After an overrun, a fresh dump: the outbound SA was replaced meanwhile, the rest is unchanged.",
        resync,
    ));
    out
}

/// Writes the `built-*` fixtures from the scenarios above.
#[test]
#[ignore = "writes testdata/xfrm/built-*.nl; run after changing a scenario"]
fn regenerate_built_fixtures() {
    for (name, what, lines) in scenarios() {
        let mut text = format!(
            "# {what}\n# Built with netlink-packet-xfrm's emitters from the kernel's documented layout \
             (tests/xfrm_mirror.rs, regenerate_built_fixtures).\n"
        );
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
        std::fs::write(dir().join(name), text).unwrap();
    }
}

#[test]
fn built_fixtures_are_those_of_the_scenarios() {
    for (name, _, lines) in scenarios() {
        let on_disk: Vec<String> = std::fs::read_to_string(dir().join(name))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        assert_eq!(on_disk, lines, "{name} is stale: run regenerate_built_fixtures");
    }
}

fn expect(name: &str, durable: bool, expected: &[&str]) -> XfrmMirror {
    let (mirror, commands) = run(name, durable);
    assert_eq!(rendered(&commands), expected, "{name}");
    assert_eq!(mirror.counters().malformed, 0, "{name}");
    mirror
}

#[test]
fn a_dump_at_start_installs_the_tunnel() {
    let mirror = expect(
        "built-tunnel-dump.nl",
        true,
        &[
            // Outbound at once; inbound once a policy gives it selectors
            // (`in` and `fwd` select the same traffic: one selector).
            "install xfrm-r1-out-c0000001 aes128gcm16 selectors=0",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "policy xfrm-in-8 in protect xfrm-r1-in-c0000002",
            "policy xfrm-out-1 out protect xfrm-r1-out-c0000001",
            "policy xfrm-fwd-10 in protect xfrm-r1-in-c0000002",
        ],
    );
    let c = mirror.counters();
    assert_eq!((c.sas_mirrored, c.policies_mirrored, c.dumps), (2, 3, 2));
    let states: Vec<(String, u32, &str)> = mirror
        .sas()
        .into_iter()
        .map(|s| (s.name, s.reqid, s.state))
        .collect();
    assert_eq!(
        states,
        [
            // By destination, then SPI.
            ("xfrm-r1-in-c0000002".to_owned(), 1, "installed"),
            ("xfrm-r1-out-c0000001".to_owned(), 1, "installed"),
        ]
    );
}

#[test]
fn an_outbound_sa_from_before_the_start_is_refused_without_a_state_directory() {
    let mirror = expect(
        "built-tunnel-dump.nl",
        false,
        &[
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "policy xfrm-in-8 in protect xfrm-r1-in-c0000002",
            "policy xfrm-out-1 out discard",
            "policy xfrm-fwd-10 in protect xfrm-r1-in-c0000002",
        ],
    );
    let c = mirror.counters();
    assert_eq!(c.refused.get("pre_existing"), Some(&1));
    assert_eq!(c.policies_held, 1);
}

#[test]
fn policies_before_their_sas_discard_until_the_sas_arrive() {
    let mirror = expect(
        "built-policy-before-sa.nl",
        true,
        &[
            "policy xfrm-out-1 out discard",
            "policy xfrm-in-8 in discard",
            "policy xfrm-fwd-10 in discard",
            "install xfrm-r1-out-c0000001 aes128gcm16 selectors=0",
            "point xfrm-out-1 protect xfrm-r1-out-c0000001",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "point xfrm-in-8 protect xfrm-r1-in-c0000002",
            "point xfrm-fwd-10 protect xfrm-r1-in-c0000002",
        ],
    );
    let c = mirror.counters();
    assert_eq!((c.policies_held, c.policies_held_total), (0, 3));
}

#[test]
fn a_rekey_is_make_before_break() {
    expect(
        "built-rekey.nl",
        true,
        &[
            "install xfrm-r1-out-c0000001 aes128gcm16 selectors=0",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "policy xfrm-in-8 in protect xfrm-r1-in-c0000002",
            "policy xfrm-out-1 out protect xfrm-r1-out-c0000001",
            "policy xfrm-fwd-10 in protect xfrm-r1-in-c0000002",
            // The new inbound SA first (the old one still admits what is
            // on its way), then the new outbound one takes the policy.
            "install xfrm-r1-in-c0000004 aes128gcm16 selectors=1",
            "point xfrm-in-8 protect xfrm-r1-in-c0000004",
            "point xfrm-fwd-10 protect xfrm-r1-in-c0000004",
            "install xfrm-r1-out-c0000003 aes128gcm16 selectors=0",
            "point xfrm-out-1 protect xfrm-r1-out-c0000003",
            // The old ones go when the daemon deletes them.
            "remove xfrm-r1-out-c0000001",
            "remove xfrm-r1-in-c0000002",
        ],
    );
}

#[test]
fn a_charon_rekey_follows_the_outbound_template() {
    let mirror = expect(
        "built-charon-rekey.nl",
        true,
        &[
            "install xfrm-r1-out-c0000001 aes128gcm16 selectors=0",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "policy xfrm-in-8 in protect xfrm-r1-in-c0000002",
            "policy xfrm-fwd-10 in protect xfrm-r1-in-c0000002",
            "policy xfrm-out-1 out protect xfrm-r1-out-c0000001",
            // The soft expiry changes nothing. The new inbound SA is
            // installed and taken by the inbound policies (their
            // templates name no SPI)...
            "install xfrm-r1-in-c0000004 aes128gcm16 selectors=1",
            "point xfrm-in-8 protect xfrm-r1-in-c0000004",
            "point xfrm-fwd-10 protect xfrm-r1-in-c0000004",
            // ... the new outbound one waits for the outbound template to
            // name it (below: not in the same step).
            "install xfrm-r1-out-c0000003 aes128gcm16 selectors=0",
            "point xfrm-out-1 protect xfrm-r1-out-c0000003",
            "remove xfrm-r1-out-c0000001",
            // The hard expiry deleted the old inbound SA (no DELSA).
            "remove xfrm-r1-in-c0000002",
        ],
    );
    let c = mirror.counters();
    assert_eq!((c.soft_expired, c.hard_expired, c.sas_mirrored), (1, 1, 2));
    // Step by step: which datagram made which change.
    let mut mirror = XfrmMirror::new(settings(true));
    let mut at = Vec::new();
    for (n, step) in read_fixture("built-charon-rekey.nl").into_iter().enumerate() {
        if let Step::Datagram(d) = step {
            mirror.handle_datagram(Duration::from_secs(1), &d);
        }
        let mut commands = Vec::new();
        mirror.take_commands(&mut commands);
        at.extend(rendered(&commands).into_iter().map(|c| (n, c)));
    }
    let step_of = |c: &str| at.iter().find(|(_, r)| r == c).map(|(n, _)| *n).unwrap();
    assert!(
        step_of("point xfrm-out-1 protect xfrm-r1-out-c0000003")
            > step_of("install xfrm-r1-out-c0000003 aes128gcm16 selectors=0")
    );
}

/// Captured from a kernel: policies by `ip xfrm policy` and a larval
/// state from `allocspi` (see the fixture's comment).
#[test]
fn captured_policies_from_a_kernel_are_mirrored() {
    let mirror = expect(
        "captured-host-policies.nl",
        true,
        &[
            // No SA of reqid 5 (nor 6): the protect policies hold.
            "policy xfrm-out-1 out discard",
            "policy xfrm-fwd-10 in discard",
            "policy xfrm-in-16 in discard",
            "policy xfrm-out-25 out discard",
            "policy xfrm-out-33 out bypass",
            // The IPComp bundle, refused.
            "policy xfrm-out-41 out discard",
            "unpolicy xfrm-out-25",
        ],
    );
    let c = mirror.counters();
    assert_eq!((c.larval, c.policies_refused, c.policies_held), (1, 1, 3));
    assert_eq!(c.refused.get("template"), Some(&1));
    let policies = mirror.policies();
    let find = |name: &str| policies.iter().find(|p| p.name == name).unwrap();
    assert_eq!(
        find("xfrm-out-33").selector,
        "10.5.0.0/16 -> 10.6.0.0/16 proto udp ports 53 -> any"
    );
    assert_eq!(find("xfrm-out-1").priority, 100);
    assert!(find("xfrm-out-41")
        .refused
        .as_deref()
        .is_some_and(|r| r.contains("bundle of 2")));
}

fn lab(name: &str) -> (XfrmMirror, Vec<SaCommand>) {
    let (mirror, commands) = run_with(
        name,
        MirrorSettings {
            local_addresses: vec![LAB_A],
            durable_sequences: true,
        },
    );
    assert_eq!(mirror.counters().malformed, 0, "{name}");
    (mirror, commands)
}

/// strongSwan's tunnel, rekey and teardown, captured from charon in a VM
/// (see the fixture's comment): the same changes as the built scenarios.
#[test]
fn strongswan_tunnel_rekey_and_teardown_are_mirrored() {
    let (mirror, commands) = lab("captured-strongswan-gcm-rekey.nl");
    assert_eq!(
        rendered(&commands),
        [
            "install xfrm-r1-out-cce94140 aes128gcm16 selectors=0",
            "install xfrm-r1-in-cc263aba aes128gcm16 selectors=1",
            "policy xfrm-in-64 in protect xfrm-r1-in-cc263aba",
            "policy xfrm-fwd-74 in protect xfrm-r1-in-cc263aba",
            "policy xfrm-out-81 out protect xfrm-r1-out-cce94140",
            // The rekey: new inbound, new outbound (taken by the outbound
            // policy when charon's UPDPOLICY names it), old ones deleted.
            "install xfrm-r1-in-ca65079c aes128gcm16 selectors=1",
            "point xfrm-in-64 protect xfrm-r1-in-ca65079c",
            "point xfrm-fwd-74 protect xfrm-r1-in-ca65079c",
            "install xfrm-r1-out-cb91bc29 aes128gcm16 selectors=0",
            "point xfrm-out-81 protect xfrm-r1-out-cb91bc29",
            "remove xfrm-r1-out-cce94140",
            "remove xfrm-r1-in-cc263aba",
            // Teardown: the policies, then the SAs.
            "unpolicy xfrm-out-81",
            "unpolicy xfrm-in-64",
            "unpolicy xfrm-fwd-74",
            "remove xfrm-r1-in-ca65079c",
            "remove xfrm-r1-out-cb91bc29",
        ]
    );
    let c = mirror.counters();
    assert_eq!(
        (c.soft_expired, c.sas_mirrored, c.policies_mirrored, c.dumps),
        (1, 0, 0, 2)
    );
    let first = match &commands[0] {
        SaCommand::InstallSa(sa) => sa,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (first.params.local, first.params.remote),
        (LAB_A, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)))
    );
    assert_eq!(first.params.lifetime.hard.seconds, Some(3960));
    assert_eq!(first.key_source, ike_stub::KeySource::Xfrm { reqid: 1 });
}

#[test]
fn strongswan_cbc_esn_and_udp_encapsulation_are_mirrored() {
    let (mirror, commands) = lab("captured-strongswan-cbc-esn-natt.nl");
    assert_eq!(
        rendered(&commands),
        [
            "install xfrm-r1-out-c98de1cc aes256-sha256 selectors=0",
            "install xfrm-r1-in-cb78dfd3 aes256-sha256 selectors=1",
            "policy xfrm-in-64 in protect xfrm-r1-in-cb78dfd3",
            "policy xfrm-fwd-74 in protect xfrm-r1-in-cb78dfd3",
            "policy xfrm-out-81 out protect xfrm-r1-out-c98de1cc",
            // The dump afterwards shows the same: nothing changes.
        ]
    );
    // charon's per-socket bypass policies (IKE's sockets) are in the
    // policy dump; espgw has no sockets of the daemon's to exempt.
    assert_eq!(mirror.counters().ignored, 8);
    for c in &commands[..2] {
        let SaCommand::InstallSa(sa) = c else {
            unreachable!()
        };
        assert!(sa.params.esn);
        assert_eq!(sa.params.encap, Some(spd_sad::UdpEncap::NAT_T));
        assert_eq!((sa.enc_key.len(), sa.auth_key.len()), (32, 32));
    }
}

#[test]
fn strongswan_chacha20_poly1305_is_mirrored() {
    let (_, commands) = lab("captured-strongswan-chacha.nl");
    assert_eq!(
        rendered(&commands),
        [
            "install xfrm-r1-out-c0fb4b43 chacha20poly1305 selectors=0",
            "install xfrm-r1-in-c1ea41bd chacha20poly1305 selectors=1",
            "policy xfrm-in-64 in protect xfrm-r1-in-c1ea41bd",
            "policy xfrm-fwd-74 in protect xfrm-r1-in-c1ea41bd",
            "policy xfrm-out-81 out protect xfrm-r1-out-c0fb4b43",
        ]
    );
}

/// libreswan's tunnel, rekey and teardown, captured from pluto in a VM
/// (see the fixture's comment).
#[test]
fn libreswan_tunnel_rekey_and_teardown_are_mirrored() {
    let (mirror, commands) = lab("captured-libreswan-gcm.nl");
    assert_eq!(
        rendered(&commands),
        [
            // pluto's IPv6 neighbour-discovery bypass policies (ICMPv6
            // types 136 and 135, priority 1) come first: espgw's
            // selectors cannot name an ICMP type, so each is refused and
            // not installed (a discard in its place would drop all
            // ICMPv6 that the tunnel's policies protect).
            // NEWSA out; UPDSA in on its allocated SPI, held until the
            // inbound policy gives it selectors; UPDPOLICY in, fwd, out.
            "install xfrm-r16393-out-c03cbddd aes128gcm16 selectors=0",
            "install xfrm-r16393-in-28e2e66f aes128gcm16 selectors=1",
            "policy xfrm-in-176 in protect xfrm-r16393-in-28e2e66f",
            "policy xfrm-fwd-186 in protect xfrm-r16393-in-28e2e66f",
            "policy xfrm-out-193 out protect xfrm-r16393-out-c03cbddd",
            // The rekey: the new outbound SA first (same reqid: it takes
            // the outbound policy at once), then the new inbound one; the
            // UPDPOLICY out that follows changes nothing; the old SAs go
            // by DELSA.
            "install xfrm-r16393-out-3fa50a7d aes128gcm16 selectors=0",
            "point xfrm-out-193 protect xfrm-r16393-out-3fa50a7d",
            "install xfrm-r16393-in-3b97c59e aes128gcm16 selectors=1",
            "point xfrm-in-176 protect xfrm-r16393-in-3b97c59e",
            "point xfrm-fwd-186 protect xfrm-r16393-in-3b97c59e",
            "remove xfrm-r16393-out-c03cbddd",
            "remove xfrm-r16393-in-28e2e66f",
            // whack --terminate: the outbound policy becomes a trap (its
            // template names no reqid and no SA: held, discarding), the
            // inbound policies go and with them the inbound SA's
            // selectors, then the outbound SA (the inbound SA's DELSA
            // finds it gone).
            "point xfrm-out-193 discard",
            "unpolicy xfrm-in-176",
            "unpolicy xfrm-fwd-186",
            "remove xfrm-r16393-in-3b97c59e",
            "remove xfrm-r16393-out-3fa50a7d",
            // whack --delete: the trap goes.
            "unpolicy xfrm-out-193",
        ]
    );
    let c = mirror.counters();
    assert_eq!(
        (
            c.sas_mirrored,
            c.policies_mirrored,
            c.policies_held,
            c.policies_held_total,
            c.dumps
        ),
        (0, 0, 0, 1, 2)
    );
    assert_eq!((c.policies_refused, c.refused.get("selector")), (6, Some(&6)));
    assert_eq!((c.larval, c.soft_expired, c.hard_expired), (0, 0, 0));
    assert!(
        mirror.policies().iter().all(|p| p.name != "xfrm-out-41"),
        "the refused bypass is not installed"
    );
    let first = match &commands[0] {
        SaCommand::InstallSa(sa) => sa,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (first.params.local, first.params.remote),
        (LAB_A, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)))
    );
    assert_eq!(first.key_source, ike_stub::KeySource::Xfrm { reqid: 16393 });
    // ESN and a window of 128 (XFRMA_REPLAY_ESN_VAL); no time limits in
    // the kernel (pluto rekeys by its own timers), byte and packet limits
    // of 2^63.
    assert!(first.params.esn);
    assert_eq!(first.params.replay_window, 128);
    assert_eq!(
        (
            first.params.lifetime.soft.seconds,
            first.params.lifetime.hard.seconds
        ),
        (None, None)
    );
    assert_eq!(first.params.lifetime.hard.bytes, Some(1 << 63));
    assert_eq!(first.params.lifetime.hard.packets, Some(1 << 63));
}

#[test]
fn libreswan_cbc_without_esn_and_its_dump_are_mirrored() {
    let (mirror, commands) = lab("captured-libreswan-cbc.nl");
    assert_eq!(
        rendered(&commands),
        [
            // The neighbour-discovery bypasses: refused, not installed.
            "install xfrm-r16393-out-adfdde32 aes256-sha256 selectors=0",
            "install xfrm-r16393-in-98dd3806 aes256-sha256 selectors=1",
            "policy xfrm-in-376 in protect xfrm-r16393-in-98dd3806",
            "policy xfrm-fwd-386 in protect xfrm-r16393-in-98dd3806",
            "policy xfrm-out-393 out protect xfrm-r16393-out-adfdde32",
            // The dump afterwards shows the same: nothing changes.
        ]
    );
    let c = mirror.counters();
    // pluto's per-socket bypass policies (its IKE sockets, IPv4 and
    // IPv6) are in the policy dump; espgw has no sockets of the daemon's
    // to exempt.
    assert_eq!((c.ignored, c.policies_refused, c.dumps), (16, 6, 2));
    for c in &commands[0..2] {
        let SaCommand::InstallSa(sa) = c else {
            unreachable!()
        };
        // No ESN, but still a window of 128 (XFRMA_REPLAY_ESN_VAL).
        assert!(!sa.params.esn);
        assert_eq!(sa.params.replay_window, 128);
        assert_eq!((sa.enc_key.len(), sa.auth_key.len()), (32, 32));
    }
}

/// The damaged-datagram test covers the captured fixtures too.
fn every_fixture() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".nl"))
        .collect();
    names.sort();
    names
}

#[test]
fn deletes_remove_policies_and_sas() {
    let mirror = expect(
        "built-delete.nl",
        true,
        &[
            "install xfrm-r1-out-c0000001 aes128gcm16 selectors=0",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "policy xfrm-in-8 in protect xfrm-r1-in-c0000002",
            "policy xfrm-out-1 out protect xfrm-r1-out-c0000001",
            "policy xfrm-fwd-10 in protect xfrm-r1-in-c0000002",
            "unpolicy xfrm-out-1",
            "remove xfrm-r1-out-c0000001",
            "unpolicy xfrm-in-8",
            "unpolicy xfrm-fwd-10",
            // Named by no policy, the inbound SA has no selectors left.
            "remove xfrm-r1-in-c0000002",
        ],
    );
    let c = mirror.counters();
    assert_eq!((c.sas_mirrored, c.policies_mirrored), (0, 0));
    assert!(mirror.sas().is_empty());
}

/// Why each SA went, for its `sa_removed` line: charon deleting the old
/// SAs once a rekey installed new ones (with new keys), then the tunnel's
/// at its teardown (the inbound one left without a policy naming it
/// first); and the same teardown, built.
#[test]
fn removals_say_why() {
    let lab = MirrorSettings {
        local_addresses: vec![LAB_A],
        durable_sequences: true,
    };
    assert_eq!(
        removals("captured-strongswan-gcm-rekey.nl", lab),
        [
            "xfrm-r1-out-cce94140 xfrm_rekeyed",
            "xfrm-r1-in-cc263aba xfrm_rekeyed",
            // The teardown: charon deletes the policies first.
            "xfrm-r1-in-ca65079c xfrm_unselected",
            "xfrm-r1-out-cb91bc29 xfrm_deleted",
        ]
    );
    assert_eq!(
        removals("built-delete.nl", settings(true)),
        [
            "xfrm-r1-out-c0000001 xfrm_deleted",
            "xfrm-r1-in-c0000002 xfrm_unselected"
        ]
    );
}

#[test]
fn a_larval_state_is_not_installed_until_keyed() {
    let mirror = expect(
        "built-larval.nl",
        true,
        &[
            "policy xfrm-in-8 in discard",
            "policy xfrm-out-1 out discard",
            "policy xfrm-fwd-10 in discard",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "point xfrm-in-8 protect xfrm-r1-in-c0000002",
            "point xfrm-fwd-10 protect xfrm-r1-in-c0000002",
        ],
    );
    assert_eq!(mirror.counters().larval, 1);
}

#[test]
fn what_espgw_cannot_do_is_refused_and_its_traffic_discarded() {
    let mirror = expect(
        "built-refusals.nl",
        true,
        &[
            "policy xfrm-out-17 out discard",
            "policy xfrm-out-25 out discard",
            "policy xfrm-out-33 out discard",
        ],
    );
    let c = mirror.counters();
    assert_eq!((c.sas_refused, c.policies_refused, c.policies_held), (7, 2, 1));
    let reasons: Vec<(&str, u64)> = c.refused.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        reasons,
        [
            ("algorithm", 1),
            ("encapsulation", 1),
            ("mark", 1),
            ("mode", 1),
            ("protocol", 1),
            ("selector", 1),
            ("spi", 1),
            ("template", 1),
            ("weak_key", 1),
        ]
    );
}

#[test]
fn each_shape_maps_to_its_sa() {
    let (_, commands) = run("built-shapes.nl", true);
    let installed: Vec<&dataplane::command::SaSetup> = commands
        .iter()
        .filter_map(|c| match c {
            SaCommand::InstallSa(sa) => Some(&**sa),
            _ => None,
        })
        .collect();
    assert_eq!(installed.len(), 4);
    let natt = installed[0];
    assert_eq!(natt.algorithm, accel::Algorithm::Aes128Sha1);
    assert_eq!(
        (&natt.enc_key[..], &natt.auth_key[..]),
        (&[4u8; 16][..], &[5u8; 20][..])
    );
    assert!(natt.params.esn);
    assert_eq!(natt.params.replay_window, 128);
    assert_eq!(
        natt.params.encap,
        Some(spd_sad::UdpEncap {
            local_port: 4500,
            remote_port: 4501
        })
    );
    assert_eq!(natt.params.lifetime.soft.bytes, Some(900_000_000));
    assert_eq!(natt.params.lifetime.hard.bytes, Some(1_000_000_000));
    assert_eq!(natt.params.lifetime.soft.seconds, Some(3000));
    assert_eq!(natt.params.lifetime.hard.seconds, Some(3600));
    assert_eq!(natt.params.lifetime.hard.packets, None);
    assert_eq!((natt.params.local, natt.params.remote), (US, PEER));
    assert_eq!(natt.params.direction, spd_sad::SaDirection::Outbound);
    assert_eq!(natt.key_source, ike_stub::KeySource::Xfrm { reqid: 2 });
    assert_eq!(installed[1].algorithm, accel::Algorithm::TripleDesSha1);
    assert_eq!(installed[2].algorithm, accel::Algorithm::Aes256Sha256);
    assert_eq!(&installed[2].auth_key[..], &[10u8; 32][..]);
    let six = installed[3];
    assert_eq!(six.algorithm, accel::Algorithm::ChaCha20Poly1305);
    assert_eq!(&six.enc_key[..], &[6u8; 36][..]);
    assert_eq!(six.params.mode, spd_sad::Mode::Transport);
    assert_eq!(six.params.direction, spd_sad::SaDirection::Inbound);
    assert_eq!((six.params.local, six.params.remote), (US6, PEER6));
    assert_eq!(six.params.selectors.len(), 1);
    assert!(
        format!("{six:?}").contains("<redacted>"),
        "keys stay out of Debug"
    );
    // And every one installs.
    let mut gateway = gateway_with_v6();
    for c in &commands {
        gateway
            .apply(c, Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{}: {e}", render(c)));
    }
    assert_eq!(gateway.sad().len(), 4);
}

/// A gateway of the inside 10.1.0.1/16 and the outside [`US`] (and
/// `outside6`, if given), framing `link`, at time 1 s.
fn gateway(outside6: Option<&str>, link: dataplane::LinkLayer) -> dataplane::Gateway {
    let mut text = String::from(
        r#"
[[interface]]
name = "inside"
device = "in0"
address = "10.1.0.1/16"
[[interface]]
name = "outside"
device = "out0"
address = "192.0.2.1/24"
"#,
    );
    if let Some(address6) = outside6 {
        text.push_str(&format!("address6 = \"{address6}\"\n"));
    }
    let config = ike_stub::Config::parse(Path::new("xfrm.toml"), &text).unwrap();
    let engine = accel::build_engine(&accel::EngineSpec::default()).unwrap();
    dataplane::Gateway::with_commands(
        config.setup(link, accel::Style::Async),
        engine,
        &config.commands(),
        Duration::from_secs(1),
    )
    .unwrap()
}

/// A gateway whose outside has the addresses of [`US`] and [`US6`].
fn gateway_with_v6() -> dataplane::Gateway {
    gateway(Some("2001:db8::1/64"), dataplane::LinkLayer::Ethernet)
}

#[test]
fn a_resync_dump_removes_what_is_gone_and_keeps_what_is_unchanged() {
    expect(
        "built-resync.nl",
        true,
        &[
            "install xfrm-r1-out-c0000001 aes128gcm16 selectors=0",
            "install xfrm-r1-in-c0000002 aes128gcm16 selectors=1",
            "policy xfrm-in-8 in protect xfrm-r1-in-c0000002",
            "policy xfrm-out-1 out protect xfrm-r1-out-c0000001",
            "policy xfrm-fwd-10 in protect xfrm-r1-in-c0000002",
            // The inbound SA is shown unchanged: nothing happens to it.
            "install xfrm-r1-out-c0000005 aes128gcm16 selectors=0",
            "point xfrm-out-1 protect xfrm-r1-out-c0000005",
            // Not in the dump: gone.
            "remove xfrm-r1-out-c0000001",
        ],
    );
}

/// The commands of a fixture applied to a real gateway: the SAs are in
/// its SAD, and its policies point at them.
#[test]
fn commands_apply_to_a_gateway() {
    let now = Duration::from_secs(1);
    let mut gateway = gateway(None, dataplane::LinkLayer::RawIp);
    let (_, commands) = run("built-rekey.nl", true);
    for c in &commands {
        gateway
            .apply(c, now)
            .unwrap_or_else(|e| panic!("{}: {e}", render(c)));
    }
    let sad = gateway.sad();
    assert!(sad.find("xfrm-r1-out-c0000001").is_none());
    assert!(sad.find("xfrm-r1-in-c0000002").is_none());
    let out = sad.find("xfrm-r1-out-c0000003").expect("new outbound SA");
    let into = sad.find("xfrm-r1-in-c0000004").expect("new inbound SA");
    let spd = gateway.spd();
    assert_eq!(
        spd.get("xfrm-out-1").map(|p| p.action),
        Some(spd_sad::Action::Protect(out))
    );
    assert_eq!(
        spd.get("xfrm-fwd-10").map(|p| p.action),
        Some(spd_sad::Action::Protect(into))
    );
    assert_eq!(spd.len(), 3);
}

#[test]
fn fuzz_inputs_carry_the_fixtures_steps() {
    for (name, _, _) in scenarios() {
        let steps = read_fixture(name);
        assert_eq!(decode_steps(&encode_steps(&steps)), steps, "{name}");
    }
}

/// Every built scenario's commands apply to a gateway without an error
/// (what the gateway would refuse, the mirror refuses first).
#[test]
fn every_built_scenario_applies_to_a_gateway() {
    for (name, _, _) in scenarios() {
        for durable in [true, false] {
            let (_, commands) = run(name, durable);
            let mut gateway = gateway_with_v6();
            for c in &commands {
                gateway
                    .apply(c, Duration::from_secs(1))
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", render(c)));
            }
        }
    }
}

/// What the fuzz target `xfrm_mirror` found, in its input form
/// (`testdata/xfrm/fuzz-*.bin`), checked as it checks: every command
/// applies, and the mirror and the gateway agree.
#[test]
fn fuzz_finds_stay_fixed() {
    let mut finds: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    finds.sort();
    assert!(finds.len() >= 3);
    for path in finds {
        let data = std::fs::read(&path).unwrap();
        let now = Duration::from_secs(1);
        let mut gateway = gateway_with_v6();
        let mut mirror = XfrmMirror::new(MirrorSettings {
            local_addresses: vec![US, US6],
            durable_sequences: data.first().is_some_and(|b| b & 0x80 != 0),
        });
        let mut commands = Vec::new();
        let steps = decode_steps(&data);
        let count = steps.len();
        for (n, step) in steps.into_iter().enumerate() {
            match step {
                Step::Dump(kind) => mirror.begin_dump(kind),
                Step::Datagram(d) => mirror.handle_datagram(now, &d),
            }
            if n + 1 == count {
                mirror.flush();
            }
            mirror.take_commands(&mut commands);
            for c in commands.drain(..) {
                gateway
                    .apply(&c, now)
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", path.display(), render(&c)));
            }
        }
        for p in mirror.policies() {
            let installed = gateway
                .spd()
                .get(&p.name)
                .expect("a mirrored policy is in the SPD");
            let expected = match p.action.strip_prefix("protect ") {
                Some(sa) => gateway.sad().find(sa).map(spd_sad::Action::Protect),
                None if p.action == "bypass" => Some(spd_sad::Action::Bypass),
                None => Some(spd_sad::Action::Discard),
            };
            assert_eq!(Some(installed.action), expected, "{}: {p:?}", path.display());
        }
    }
}

/// Every prefix of every fixture's datagrams, and each with one byte
/// flipped, is read without a panic; what cannot be read is counted.
#[test]
fn damaged_datagrams_are_counted_never_panic() {
    let mut mirror = XfrmMirror::new(settings(true));
    let now = Duration::from_secs(1);
    for name in every_fixture() {
        for step in read_fixture(&name) {
            let Step::Datagram(bytes) = step else { continue };
            for cut in 0..bytes.len() {
                mirror.handle_datagram(now, &bytes[..cut]);
            }
            for at in (0..bytes.len()).step_by(3) {
                let mut flipped = bytes.clone();
                flipped[at] ^= 0x5a;
                mirror.handle_datagram(now, &flipped);
            }
        }
    }
    assert!(mirror.counters().malformed > 0);
}

/// Splits a datagram of netlink messages into (type, flags) pairs.
fn message_types(datagram: &[u8]) -> Vec<(u16, u16)> {
    let mut at = 0;
    let mut found = Vec::new();
    while at < datagram.len() {
        let buffer = netlink_packet_core::NetlinkBuffer::new_checked(&datagram[at..]).expect("a message");
        found.push((buffer.message_type(), buffer.flags()));
        at += (buffer.length() as usize).div_ceil(4) * 4;
    }
    found
}

/// What the kernel is told back: a trap (a held outbound policy) asks for
/// an SA once a second at most; an SA's use goes as NEWAE only when it
/// changed; a volume expiry of a mirrored SA goes as EXPIRE, of another
/// SA not at all.
#[test]
fn the_kernel_hears_of_traps_use_and_volume_expiries() {
    use netlink_packet_xfrm::{XFRM_MSG_ACQUIRE, XFRM_MSG_EXPIRE, XFRM_MSG_NEWAE};
    let mut mirror = XfrmMirror::new(settings(true));
    let mut commands = Vec::new();
    for p in policies(1) {
        mirror.handle_datagram(Duration::from_secs(1), &frame(p, false));
    }
    mirror.take_commands(&mut commands);
    let flow = spd_sad::FlowKey {
        src: "10.1.0.5".parse().unwrap(),
        dst: "10.2.0.9".parse().unwrap(),
        protocol: 17,
        ports: Some((40000, 53)),
    };
    let mut out = Vec::new();
    assert!(mirror.trapped(Duration::from_secs(2), "xfrm-out-1", &flow, &mut out));
    assert_eq!(
        message_types(&out).iter().map(|m| m.0).collect::<Vec<_>>(),
        [XFRM_MSG_ACQUIRE]
    );
    assert!(
        !mirror.trapped(Duration::from_millis(2500), "xfrm-out-1", &flow, &mut out),
        "within a second"
    );
    assert!(
        !mirror.trapped(Duration::from_secs(4), "xfrm-in-8", &flow, &mut out),
        "not outbound"
    );
    assert!(mirror.trapped(Duration::from_secs(4), "xfrm-out-1", &flow, &mut out));
    assert_eq!(mirror.counters().acquire_sent, 2);

    // The SAs arrive: the policy protects, and is no trap any more.
    mirror.handle_datagram(Duration::from_secs(5), &frame(out_sa(0xc000_0001, 1), false));
    mirror.handle_datagram(Duration::from_secs(5), &frame(in_sa(0xc000_0002, 1), false));
    mirror.take_commands(&mut commands);
    out.clear();
    assert!(!mirror.trapped(Duration::from_secs(9), "xfrm-out-1", &flow, &mut out));

    let used = |name: &str| {
        name.starts_with("xfrm-r1-")
            .then_some((1500, 3, Duration::from_secs(2)))
    };
    mirror.report_usage(used, 1_800_000_000, &mut out);
    let sent = message_types(&out);
    assert_eq!(sent.len(), 2, "both SAs");
    assert!(sent
        .iter()
        .all(|&(kind, flags)| kind == XFRM_MSG_NEWAE && flags & 0x100 != 0));
    out.clear();
    mirror.report_usage(used, 1_800_000_001, &mut out);
    assert!(out.is_empty(), "nothing changed, nothing said");
    assert_eq!(mirror.counters().newae_sent, 2);

    assert!(mirror.volume_expired("xfrm-r1-out-c0000001", false, &mut out));
    assert!(!mirror.volume_expired("a-tunnel-of-the-file", true, &mut out));
    assert_eq!(
        message_types(&out).iter().map(|m| m.0).collect::<Vec<_>>(),
        [XFRM_MSG_EXPIRE]
    );
    assert_eq!(mirror.counters().expire_sent, 1);
    // Another worker's copy of the SA passing the same limit: handled,
    // and the kernel is not told again.
    out.clear();
    assert!(mirror.volume_expired("xfrm-r1-out-c0000001", false, &mut out));
    assert!(out.is_empty(), "one EXPIRE per SA and limit");
    assert_eq!(mirror.counters().expire_sent, 1);
}

/// Refused policies by what they were meant to do: a bypass espgw cannot
/// select exactly (an ICMP type) is not installed, so its traffic meets
/// the protect policy below it; a block of the same selector becomes a
/// discard of everything it widens to; the protect policy stays as it
/// is. Each refusal counts once, and a dump showing them again counts
/// nothing more.
#[test]
fn a_refused_bypass_is_left_out_and_a_refused_block_still_discards() {
    let v6 = |n: u16| (IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 0)), 48);
    let icmpv6_type = |mut info: netlink_packet_xfrm::UserPolicyInfo, kind: u16| {
        info.selector.proto = 58;
        info.selector.sport = kind.to_be();
        info.selector.sport_mask = u16::MAX;
        info
    };
    let nd_bypass = icmpv6_type(policy(XFRM_POLICY_OUT, 17, 1, v6(1), v6(2)), 135);
    let mut block = icmpv6_type(policy(XFRM_POLICY_OUT, 25, 2, v6(1), v6(2)), 137);
    block.action = netlink_packet_xfrm::XFRM_POLICY_BLOCK;
    let protect = new_policy(
        policy(XFRM_POLICY_OUT, 33, 100, v6(1), v6(2)),
        vec![template(US6, PEER6, 9, XFRM_MODE_TUNNEL)],
    );
    let mut mirror = XfrmMirror::new(settings(true));
    let mut commands = Vec::new();
    for _ in 0..2 {
        for message in [
            new_policy(nd_bypass, vec![]),
            new_policy(block, vec![]),
            protect.clone(),
        ] {
            mirror.handle_datagram(Duration::from_secs(1), &frame(message, false));
        }
        mirror.take_commands(&mut commands);
    }
    assert_eq!(
        rendered(&commands),
        ["policy xfrm-out-25 out discard", "policy xfrm-out-33 out discard"],
        "the bypass left out; the block a discard; the protect policy held for its SA"
    );
    let c = mirror.counters();
    assert_eq!((c.policies_refused, c.refused.get("selector")), (2, Some(&2)));
    assert!(mirror.policies().iter().all(|p| p.name != "xfrm-out-17"));
}
