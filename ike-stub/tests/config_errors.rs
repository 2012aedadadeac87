//! Every configuration mistake names file, line and column and says what to do.

use std::path::Path;

use ike_stub::{Config, ConfigErrorKind, PolicyAction};
use spd_sad::{Mode, PolicyDirection, SaDirection};

const BASE: &str = r#"[gateway]
name = "t"

[[interface]]
name = "inside"
device = "eth0"
address = "192.168.1.1/24"

[[interface]]
name = "outside"
device = "eth1"
address = "10.0.0.1/24"
"#;

const SA: &str = r#"
[[sa]]
name = "out1"
direction = "out"
spi = 0x2001
local = "10.0.0.1"
remote = "10.0.0.2"
proposal = "aes128-sha1"
enc_key = "00112233445566778899aabbccddeeff"
auth_key = "0102030405060708090a0b0c0d0e0f1011121314"
"#;

fn parse(text: &str) -> Result<Config, ike_stub::ConfigError> {
    Config::parse(Path::new("gw.toml"), text)
}

/// Parses `BASE + extra`, expects an error at `line:column` (of the whole
/// text) whose message contains `needle`.
fn expect_error(extra: &str, line: usize, column: usize, needle: &str) -> ConfigErrorKind {
    let text = format!("{BASE}{extra}");
    let err = parse(&text).expect_err("config must be rejected");
    let shown = err.to_string();
    assert!(shown.starts_with("gw.toml:"), "{shown}");
    assert_eq!((err.line, err.column), (line, column), "{shown}\n---\n{text}");
    assert!(shown.contains(needle), "`{needle}` missing from: {shown}");
    err.kind
}

/// Line of the first occurrence of `needle` in `BASE + extra` (1-based).
fn line_of(extra: &str, needle: &str) -> usize {
    let text = format!("{BASE}{extra}");
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle present")
        + 1
}

#[test]
fn a_good_config_loads() {
    let config = parse(&format!("{BASE}{SA}")).unwrap();
    assert_eq!(config.sas.len(), 1);
    assert_eq!(config.sas[0].params.direction, SaDirection::Outbound);
    assert_eq!(config.inside.network.to_string(), "192.168.1.0/24");
    assert!(
        !format!("{:?}", config).contains("00112233"),
        "keys must not appear in Debug"
    );
}

#[test]
fn unknown_proposal() {
    let extra = SA.replace("aes128-sha1", "aes128-md5");
    let line = line_of(&extra, "aes128-md5");
    let kind = expect_error(
        &extra,
        line,
        12,
        "unknown ESP proposal `aes128-md5`; expected one of",
    );
    assert!(matches!(kind, ConfigErrorKind::UnknownProposal(_)));
}

#[test]
fn wrong_key_length_says_the_right_length() {
    let extra = SA.replace("00112233445566778899aabbccddeeff", "001122");
    let line = line_of(&extra, "enc_key");
    expect_error(&extra, line, 11, "must be 16 bytes (32 hex digits), not 3 bytes");
    let gcm = SA
        .replace("aes128-sha1", "aes128gcm16")
        .replace("auth_key = \"0102030405060708090a0b0c0d0e0f1011121314\"\n", "");
    let line = line_of(&gcm, "enc_key");
    expect_error(
        &gcm,
        line,
        11,
        "must be 20 bytes (40 hex digits, the AES key followed by the 4-byte salt)",
    );
    let missing = SA.replace("auth_key = \"0102030405060708090a0b0c0d0e0f1011121314\"\n", "");
    let line = line_of(&missing, "proposal");
    expect_error(
        &missing,
        line,
        12,
        "aes128-sha1 needs `auth_key`: 20 bytes as 40 hex digits",
    );
    let not_hex = SA.replace(
        "00112233445566778899aabbccddeeff",
        "zz112233445566778899aabbccddeeff",
    );
    expect_error(&not_hex, line_of(&not_hex, "enc_key"), 11, "is not hexadecimal");
}

#[test]
fn policy_naming_a_missing_sa() {
    let extra = format!(
        "{SA}\n[[policy]]\nname = \"p\"\ndirection = \"out\"\ndestination = \"192.168.2.0/24\"\naction = \"protect\"\nsa = \"nope\"\n"
    );
    let line = line_of(&extra, "name = \"p\"");
    let kind = expect_error(
        &extra,
        line,
        8,
        "protects with SA `nope`, but no SA has that name",
    );
    assert!(matches!(kind, ConfigErrorKind::MissingSa { .. }));
}

#[test]
fn policy_direction_must_match_its_sa() {
    let extra =
        format!("{SA}\n[[policy]]\nname = \"p\"\ndirection = \"in\"\naction = \"protect\"\nsa = \"out1\"\n");
    expect_error(&extra, line_of(&extra, "name = \"p\""), 8, "is not an in SA");
}

#[test]
fn duplicate_inbound_spi() {
    let inbound = SA.replace("\"out\"", "\"in\"");
    let extra = format!("{inbound}{}", inbound.replace("out1", "in2"));
    let line = line_of(&extra, "in2");
    let kind = expect_error(
        &extra,
        line,
        8,
        "inbound SPI 0x2001 is used by both `out1` and `in2`",
    );
    assert!(matches!(kind, ConfigErrorKind::DuplicateSpi { spi: 0x2001, .. }));
}

#[test]
fn unknown_field_and_syntax_errors_point_at_the_spot() {
    let extra = SA.replace("remote =", "remtoe =");
    let line = line_of(&extra, "remtoe");
    expect_error(&extra, line, 1, "unknown field `remtoe`");
    let extra = SA.replace("spi = 0x2001", "spi = \"0x2001\"");
    expect_error(&extra, line_of(&extra, "spi ="), 7, "invalid type");
    let broken = "\n[[sa]\nname = 1\n";
    expect_error(broken, line_of(broken, "[[sa]"), 6, "unclosed array table");
}

#[test]
fn insecure_null_needs_explicit_consent() {
    let null = SA
        .replace("aes128-sha1", "null")
        .replace("enc_key = \"00112233445566778899aabbccddeeff\"\n", "")
        .replace("auth_key = \"0102030405060708090a0b0c0d0e0f1011121314\"\n", "");
    expect_error(
        &null,
        line_of(&null, "proposal"),
        12,
        "allow_insecure_null = true",
    );
    let allowed = format!(
        "{}{null}",
        BASE.replace("name = \"t\"", "name = \"t\"\nallow_insecure_null = true")
    );
    assert!(parse(&allowed).is_ok());
}

#[test]
fn selectors_lifetimes_macs_and_spis_are_checked() {
    let p =
        "\n[[policy]]\nname = \"p\"\ndirection = \"out\"\nsource = \"192.168.1.5/24\"\naction = \"bypass\"\n";
    expect_error(p, line_of(p, "source"), 10, "did you mean 192.168.1.0/24");
    // IPv6 prefixes are selectors like IPv4 ones; a selector mixing the
    // two families can match no packet and is refused.
    let v6 = "\n[[policy]]\nname = \"p\"\ndirection = \"out\"\ndestination = \"2001:db8:2::/48\"\naction = \"bypass\"\n";
    let config = parse(&format!("{BASE}{v6}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.policies[0].selector.dst.to_string(), "2001:db8:2::/48");
    let mixed = "\n[[policy]]\nname = \"p\"\ndirection = \"out\"\nsource = \"192.168.1.0/24\"\ndestination = \"2001:db8:2::/48\"\naction = \"bypass\"\n";
    expect_error(mixed, line_of(mixed, "destination"), 15, "write two policies");
    let v6_host_bits =
        "\n[[policy]]\nname = \"p\"\ndirection = \"out\"\nsource = \"2001:db8::1/64\"\naction = \"bypass\"\n";
    expect_error(
        v6_host_bits,
        line_of(v6_host_bits, "source"),
        10,
        "did you mean 2001:db8::/64",
    );
    let ports =
        "\n[[policy]]\nname = \"p\"\ndirection = \"out\"\ndestination_ports = \"9-1\"\naction = \"bypass\"\n";
    expect_error(
        ports,
        line_of(ports, "destination_ports"),
        21,
        "is not a port range",
    );
    let life = format!("{SA}[sa.lifetime]\nsoft_bytes = 10\nhard_bytes = 5\n");
    expect_error(
        &life,
        line_of(&life, "[sa.lifetime]"),
        1,
        "soft_bytes (10) is above hard_bytes (5)",
    );
    let spi = SA.replace("0x2001", "17");
    expect_error(&spi, line_of(&spi, "spi ="), 7, "SPI 17 is reserved");
    let mac = "\n[[neighbor]]\naddress = \"10.0.0.2\"\nmac = \"02:00:00:00:00\"\n";
    expect_error(mac, line_of(mac, "mac ="), 7, "is not a MAC address");
    let window = SA.replace("auth_key", "replay_window = 100000\nauth_key");
    expect_error(
        &window,
        line_of(&window, "replay_window"),
        17,
        "above the maximum of 65536",
    );
}

#[test]
fn interfaces_must_be_inside_and_outside() {
    let text = BASE.replace("name = \"outside\"", "name = \"wan\"");
    let err = parse(&text).unwrap_err();
    assert!(err.to_string().contains("must be `inside` or `outside`"), "{err}");
    let only_inside = &BASE[..BASE.find("[[interface]]\nname = \"outside\"").unwrap()];
    let err = parse(only_inside).unwrap_err();
    assert!(
        err.to_string().contains("no [[interface]] named `outside`"),
        "{err}"
    );
}

#[test]
fn tunnels_expand_into_two_sas_and_two_policies() {
    let tunnel = r#"
[[tunnel]]
name = "x"
local = "10.0.0.1"
remote = "10.0.0.2"
local_subnet = "192.168.1.0/24"
remote_subnet = "192.168.2.0/24"
proposal = "aes256gcm16"
spi_out = 0x3001
spi_in = 0x3002
enc_key_out = "000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f01020304"
enc_key_in = "100102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f01020304"
esn = true
replay_window = 4096
"#;
    let config = parse(&format!("{BASE}{tunnel}")).unwrap();
    let out = config.sa("x-out").unwrap();
    let inbound = config.sa("x-in").unwrap();
    assert_eq!((out.params.spi, inbound.params.spi), (0x3001, 0x3002));
    assert_eq!(inbound.params.direction, SaDirection::Inbound);
    assert_eq!(inbound.params.mode, Mode::Tunnel);
    assert!(inbound.params.esn && inbound.params.replay_window == 4096);
    let selectors = config.inbound_selectors("x-in");
    assert_eq!(selectors.len(), 1);
    assert_eq!(selectors[0].src.to_string(), "192.168.2.0/24");
    let out_policy = config
        .policies
        .iter()
        .find(|p| p.direction == PolicyDirection::Out)
        .unwrap();
    assert_eq!(out_policy.action, PolicyAction::Protect("x-out".into()));
    assert_eq!(out_policy.selector.dst.to_string(), "192.168.2.0/24");
    // A tunnel needs its subnets unless it is transport mode.
    let no_subnet = tunnel.replace("local_subnet = \"192.168.1.0/24\"\n", "");
    expect_error(
        &no_subnet,
        line_of(&no_subnet, "name = \"x\""),
        8,
        "needs `local_subnet`",
    );
}

/// IPv6 subnets ride an IPv4 tunnel; both ends' subnets are of one
/// family, transport mode carries the ends' own IPv4, and IPv6 routes leave
/// by an interface with an `address6` on a link of at least 1280 bytes.
#[test]
fn ipv6_tunnels_and_routes_are_checked() {
    let keyed = format!(
        "{}secret = \"sixteen or more characters\"\n",
        without_spis(TUNNEL)
    );
    let six = keyed
        .replace("192.168.1.0/24", "2001:db8:1::/64")
        .replace("192.168.2.0/24", "2001:db8:2::/64");
    let base6 = BASE.replacen(
        "address = \"192.168.1.1/24\"",
        "address = \"192.168.1.1/24\"\naddress6 = \"2001:db8:1::1/64\"",
        1,
    );
    let config =
        Config::parse(Path::new("gw.toml"), &format!("{base6}{six}")).unwrap_or_else(|e| panic!("{e}"));
    let inbound = config.inbound_selectors("t-in");
    assert_eq!(inbound[0].src.to_string(), "2001:db8:2::/64");
    assert_eq!(inbound[0].dst.to_string(), "2001:db8:1::/64");

    let mixed = keyed.replace("192.168.2.0/24", "2001:db8:2::/64");
    expect_error(
        &mixed,
        line_of(&mixed, "remote_subnet"),
        17,
        "are of different families",
    );
    let transport = format!("{six}mode = \"transport\"\n");
    expect_error(
        &transport,
        line_of(&transport, "remote_subnet"),
        17,
        "other networks need `mode = \"tunnel\"`",
    );
    let policy = format!(
        "{SA}mode = \"transport\"\n\n[[policy]]\nname = \"p\"\ndirection = \"out\"\ndestination = \"2001:db8:2::/64\"\naction = \"protect\"\nsa = \"out1\"\n"
    );
    expect_error(
        &policy,
        line_of(&policy, "name = \"p\""),
        8,
        "selects IPv6 packets for SA `out1`, which is in transport mode between IPv4 ends",
    );

    let route = |r: &str| format!("{base6}\n[[route]]\n{r}\n");
    let ok = route("destination = \"2001:db8:9::/48\"\nvia = \"2001:db8:1::fe\"");
    let config = Config::parse(Path::new("gw.toml"), &ok).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.routes6.len(), 1);
    assert_eq!(config.routes6[0].port, dataplane::Port::Inside);
    for (r, says) in [
        (
            "destination = \"2001:db8:9::/48\"\nvia = \"2001:db8:5::fe\"",
            "is on neither interface's address6 network",
        ),
        (
            "destination = \"2001:db8:9::/48\"\ninterface = \"outside\"",
            "which has no `address6`",
        ),
        (
            "destination = \"2001:db8:9::/48\"\nvia = \"10.0.0.2\"",
            "must be a unicast IPv6 address",
        ),
    ] {
        let text = route(r);
        let err = Config::parse(Path::new("gw.toml"), &text).expect_err(r);
        assert!(err.to_string().contains(says), "{r}: {err}");
    }
    let small = base6.replacen("address6", "mtu = 1000\naddress6", 1);
    let err = Config::parse(Path::new("gw.toml"), &small).expect_err("mtu below 1280");
    assert!(err.to_string().contains("needs 1280 or more"), "{err}");
}

/// A tunnel with IPv6 ends (4-in-6, 6-in-6, IPv6 transport mode): raw
/// ESP, keys given (the rekey exchange runs over IPv4), both ends of one
/// family, transport mode between them for their own packets, and the
/// local end the outside interface's `address6`.
#[test]
fn ipv6_ends_are_checked() {
    let keyed = TUNNEL.replace(
        "spi_in = 0x1002\n",
        "spi_in = 0x1002\nenc_key_out = \"000102030405060708090a0b0c0d0e0f10111213\"\n\
         enc_key_in = \"202122232425262728292a2b2c2d2e2f30313233\"\n",
    );
    let six = keyed
        .replace("local = \"10.0.0.1\"", "local = \"2001:db8:ff::1\"")
        .replace("remote = \"10.0.0.2\"", "remote = \"2001:db8:ff::2\"");
    let base6 = BASE.replacen(
        "address = \"10.0.0.1/24\"",
        "address = \"10.0.0.1/24\"\naddress6 = \"2001:db8:ff::1/64\"",
        1,
    );
    let parse6 = |extra: &str| Config::parse(Path::new("gw.toml"), &format!("{base6}{extra}"));
    let config = parse6(&six).unwrap_or_else(|e| panic!("{e}"));
    let out = config.sa("t-out").unwrap();
    assert_eq!(out.params.remote.to_string(), "2001:db8:ff::2");
    // 6-in-6 as well.
    let six_six = six
        .replace("192.168.1.0/24", "2001:db8:1::/64")
        .replace("192.168.2.0/24", "2001:db8:2::/64");
    assert!(parse6(&six_six).is_ok());
    // IPv6 transport mode, its selectors the ends themselves.
    let transport6 = six
        .replace("local_subnet = \"192.168.1.0/24\"\n", "")
        .replace("remote_subnet = \"192.168.2.0/24\"\n", "");
    let config = parse6(&format!("{transport6}mode = \"transport\"\n")).unwrap_or_else(|e| panic!("{e}"));
    let selectors = config.inbound_selectors("t-in");
    assert_eq!(selectors[0].src.to_string(), "2001:db8:ff::2/128");
    for (extra, says) in [
        // IPv4 subnets between IPv6 ends cannot be transport mode.
        (
            format!("{six}mode = \"transport\"\n"),
            "transport mode carries the packets of 2001:db8:ff::1 and 2001:db8:ff::2 themselves",
        ),
        (format!("{six}encap = \"udp\"\n"), "without `encap` only so far"),
        (
            format!("{six}secret = \"sixteen or more characters\"\n"),
            "the rekey exchange a `secret` drives runs over IPv4 only so far",
        ),
        (
            keyed.replace("remote = \"10.0.0.2\"", "remote = \"2001:db8:ff::2\""),
            "are of different address families",
        ),
        (
            six.replace("local = \"2001:db8:ff::1\"", "local = \"2001:db8:ff::9\""),
            "is not the outside interface's `address6`",
        ),
        (
            keyed.replace("remote = \"10.0.0.2\"", "remote = \"10.0.0\""),
            "is not an IP address",
        ),
    ] {
        let err = parse6(&extra).expect_err(says);
        assert!(err.to_string().contains(says), "{says}: {err}");
    }
}

#[test]
fn shipped_configs_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut count = 0;
    for dir in [root.clone(), root.join("algorithms")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
                count += 1;
            }
        }
    }
    // site-a, site-b, demo-a, demo-b and a pair per algorithm.
    assert_eq!(count, 4 + 2 * accel::Algorithm::ALL.len());
}

#[test]
fn only_the_inside_can_be_a_tun() {
    let tun_inside = BASE.replace("device = \"eth0\"", "device = \"espgw0\"\nkind = \"tun\"");
    let config = parse(&tun_inside).unwrap();
    assert_eq!(config.inside.kind, dataplane::InterfaceKind::Tun);
    for (kind, message) in [
        ("tun", "only the `inside` interface can be a TUN device"),
        ("wifi", "must be `ethernet` or `tun`"),
    ] {
        let text = BASE.replace(
            "device = \"eth1\"",
            &format!("device = \"eth1\"\nkind = \"{kind}\""),
        );
        let err = parse(&text).unwrap_err();
        let line = text.lines().position(|l| l.starts_with("kind")).unwrap() + 1;
        assert_eq!((err.line, err.column), (line, 8), "{err}");
        assert!(err.to_string().contains(message), "{err}");
    }
}

const TUNNEL: &str = r#"
[[tunnel]]
name = "t"
local = "10.0.0.1"
remote = "10.0.0.2"
local_subnet = "192.168.1.0/24"
remote_subnet = "192.168.2.0/24"
proposal = "aes128gcm16"
spi_out = 0x1001
spi_in = 0x1002
"#;

/// `tunnel` without its `spi_out` and `spi_in` lines, for a tunnel with a
/// secret.
fn without_spis(tunnel: &str) -> String {
    tunnel
        .lines()
        .filter(|l| !l.starts_with("spi_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn control_plane_settings_are_checked() {
    // Neither keys nor a secret.
    let extra = TUNNEL.to_owned();
    expect_error(
        &extra,
        line_of(&extra, "proposal ="),
        12,
        "give the tunnel a `secret`",
    );
    // A secret too short to be one.
    let extra = format!("{TUNNEL}secret = \"short\"\n");
    expect_error(&extra, line_of(&extra, "secret ="), 10, "at least 16 characters");
    // A secret alone is enough: the exchange with the peer keys the tunnel,
    // so the file holds templates without keys or SPIs.
    let keyed = format!(
        "{}secret = \"sixteen or more characters\"\n",
        without_spis(TUNNEL)
    );
    let config = parse(&format!("{BASE}{keyed}")).expect("keyed by exchange");
    let template = config.sa("t-out").expect("a template");
    assert_eq!(template.keys, ike_stub::KeySource::Exchange);
    assert_eq!((template.params.spi, template.enc_key.len()), (0, 0));
    assert!(config.tunnel("t").is_some_and(|t| t.secret.is_some()));
    // ... and SPIs, keys or initial sequence numbers beside it are refused:
    // they would be used again after a restart.
    let extra = format!("{TUNNEL}secret = \"sixteen or more characters\"\n");
    expect_error(&extra, line_of(&extra, "spi_out"), 11, "remove `spi_out`");
    let extra = format!("{keyed}enc_key_out = \"{}\"\n", "ab".repeat(20));
    expect_error(&extra, line_of(&extra, "enc_key_out"), 15, "remove `enc_key_out`");
    // Rekey timing out of range.
    let extra = format!("{keyed}\n[rekey]\ngrace_ms = 5\n");
    expect_error(
        &extra,
        line_of(&extra, "grace_ms"),
        12,
        "[rekey] grace_ms must be between 300",
    );
    // Fault injection is for the sec engine model only.
    let extra = "\n[accel]\nfail_every = 100\n".to_owned();
    expect_error(&extra, line_of(&extra, "fail_every"), 14, "set engine = \"sec\"");
    let extra = "\n[accel]\nengine = \"sec\"\nlose_completion_every = 1000\n".to_owned();
    let config = parse(&format!("{BASE}{extra}")).expect("sec with faults");
    assert_eq!(config.engine.sec.faults.drop_completion_every, Some(1000));
    // A tunnel name the rekey messages cannot carry.
    let extra = TUNNEL.replace("name = \"t\"", "name = \"has space\"");
    expect_error(&extra, line_of(&extra, "has space"), 8, "without spaces");
}

/// An inbound manual SA, keys as in [`SA`].
const SA_IN: &str = r#"
[[sa]]
name = "in1"
direction = "in"
spi = 0x2002
local = "10.0.0.1"
remote = "10.0.0.2"
proposal = "aes128-sha1"
enc_key = "00112233445566778899aabbccddeeff"
auth_key = "0102030405060708090a0b0c0d0e0f1011121314"
"#;

const POLICY_IN: &str = r#"
[[policy]]
name = "from-b"
direction = "in"
source = "192.168.2.0/24"
destination = "192.168.1.0/24"
action = "protect"
sa = "in1"
"#;

#[test]
fn an_inbound_sa_no_policy_names_is_refused() {
    let kind = expect_error(
        SA_IN,
        line_of(SA_IN, "name = \"in1\""),
        8,
        "inbound SA `in1` is named by no inbound `protect` policy",
    );
    assert_eq!(kind, ConfigErrorKind::UnselectedSa { sa: "in1".into() });
    let shown = parse(&format!("{BASE}{SA_IN}")).unwrap_err().to_string();
    // The fix is in the message: a policy, or saying so explicitly.
    assert!(shown.contains("sa = \"in1\""), "{shown}");
    assert!(shown.contains("selectors = \"any\""), "{shown}");
    // An outbound policy naming it does not count (and is refused itself).
    let out_policy = format!(
        "{SA_IN}\n[[policy]]\nname = \"p\"\ndirection = \"out\"\naction = \"protect\"\nsa = \"in1\"\n"
    );
    assert!(parse(&format!("{BASE}{out_policy}")).is_err());
    // An outbound SA that no policy names carries nothing and is allowed.
    assert!(parse(&format!("{BASE}{SA}")).is_ok());
}

#[test]
fn an_inbound_sa_takes_the_selectors_of_its_policies() {
    let second = POLICY_IN
        .replace("from-b", "from-c")
        .replace("192.168.2.0/24", "192.168.3.0/24");
    let config = parse(&format!("{BASE}{SA_IN}{POLICY_IN}{second}")).unwrap();
    let sa = config.sa("in1").unwrap();
    assert!(!sa.admits_any);
    let sources: Vec<String> = sa.params.selectors.iter().map(|s| s.src.to_string()).collect();
    assert_eq!(sources, ["192.168.2.0/24", "192.168.3.0/24"]);
    assert_eq!(config.inbound_selectors("in1"), sa.params.selectors);
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
}

#[test]
fn selectors_any_must_be_explicit_and_is_warned_about() {
    let any = SA_IN.replace("auth_key", "selectors = \"any\"\nauth_key");
    let config = parse(&format!("{BASE}{any}")).unwrap();
    let sa = config.sa("in1").unwrap();
    assert!(sa.admits_any);
    assert_eq!(sa.params.selectors, vec![spd_sad::Selector::ANY]);
    let warnings = config.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("`in1` has selectors = \"any\"") && warnings[0].contains("every inner packet"),
        "{warnings:?}"
    );

    // `any` and a policy together: one of them is a mistake.
    let both = format!("{any}{POLICY_IN}");
    let kind = expect_error(
        &both,
        line_of(&both, "selectors ="),
        13,
        "SA `in1` has selectors = \"any\" but inbound policy `from-b` names it too",
    );
    assert!(matches!(kind, ConfigErrorKind::AnySaWithPolicy { .. }));
    // Anything but `any` is refused, as is `selectors` on an outbound SA.
    let narrow = SA_IN.replace("auth_key", "selectors = \"192.168.2.0/24\"\nauth_key");
    expect_error(
        &narrow,
        line_of(&narrow, "selectors ="),
        13,
        "selectors `192.168.2.0/24` must be \"any\"",
    );
    let outbound = SA.replace("auth_key", "selectors = \"any\"\nauth_key");
    expect_error(
        &outbound,
        line_of(&outbound, "selectors ="),
        13,
        "only inbound SAs have `selectors`",
    );
}

/// Every way the key bytes could be shown: hex either case, with colons,
/// and as the decimal list a derived `Debug` of `Vec<u8>` prints.
fn forms_of(key_hex: &str) -> Vec<String> {
    let bytes = hex::decode(key_hex).unwrap();
    let decimal = bytes.iter().map(u8::to_string).collect::<Vec<_>>().join(", ");
    // Half the key is enough to count as a leak.
    let half = &key_hex[..key_hex.len() / 2];
    vec![
        key_hex.to_lowercase(),
        key_hex.to_uppercase(),
        half.to_owned(),
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
        decimal[..decimal.len() / 2].to_owned(),
    ]
}

#[test]
fn no_debug_or_display_shows_a_key_or_secret() {
    let keys = [
        "8a1f3c5e7092b4d6f8ea1c3e50729b4d",
        "e1d2c3b4a5968778695a4b3c2d1e0f1a2b3c4d5e",
        "5f4e3d2c1b0a99887766554433221100",
        "a0b1c2d3e4f5061728394a5b6c7d8e9f0a1b2c3d",
    ];
    let secret = "tunnel secret MARKER-7c1e";
    let text = format!(
        r#"{BASE}
[[sa]]
name = "m-out"
direction = "out"
spi = 0x2001
local = "10.0.0.1"
remote = "10.0.0.2"
proposal = "aes128-sha1"
enc_key = "{}"
auth_key = "{}"

[[sa]]
name = "m-in"
direction = "in"
spi = 0x2002
local = "10.0.0.1"
remote = "10.0.0.2"
proposal = "aes128-sha1"
enc_key = "0x{}"
auth_key = "{}"
selectors = "any"

[[tunnel]]
name = "x"
local = "10.0.0.1"
remote = "10.0.0.2"
local_subnet = "192.168.1.0/24"
remote_subnet = "192.168.2.0/24"
proposal = "aes128gcm16"
secret = "{secret}"
"#,
        keys[0], keys[1], keys[2], keys[3]
    );
    let config = parse(&text).unwrap();
    assert_eq!(config.sa("m-in").unwrap().enc_key.len(), 16, "the keys were read");
    let mut shown = vec![
        format!("{config:?}"),
        format!("{config:#?}"),
        config.warnings().join("\n"),
    ];
    for sa in config.sas.iter().filter(|s| s.keys == ike_stub::KeySource::File) {
        shown.push(format!("{sa:?}"));
        shown.push(format!("{:#?}", sa.setup()));
        shown.push(format!("{:?}", sa.params));
        let spec = accel::SessionSpec::new(sa.algorithm, sa.params.esn, &sa.enc_key, &sa.auth_key).unwrap();
        shown.push(format!("{spec:?}"));
        let session = accel::Session::new(sa.algorithm, &sa.enc_key, &sa.auth_key).unwrap();
        shown.push(format!("{session:?}"));
    }
    for t in &config.tunnels {
        shown.push(format!("{t:#?}"));
    }
    // What the control plane hands the workers on a reload.
    let mut plane = ike_stub::ControlPlane::new(parse(&format!("{BASE}{SA}")).unwrap());
    plane.reload(config.clone()).unwrap();
    let mut commands = Vec::new();
    plane.take_commands(&mut commands);
    assert!(commands
        .iter()
        .any(|c| matches!(c, dataplane::command::SaCommand::InstallSa(_))));
    shown.push(format!("{commands:#?}"));
    // Errors about keys do not quote them.
    let short = text.replace(keys[0], &keys[0][..30]);
    shown.push(parse(&short).unwrap_err().to_string());
    let bad = text.replace(keys[1], &format!("{}zz", &keys[1][..38]));
    shown.push(parse(&bad).unwrap_err().to_string());

    let mut hidden: Vec<String> = vec![secret.to_owned()];
    hidden.extend(keys.iter().flat_map(|k| forms_of(k)));
    for output in &shown {
        for h in &hidden {
            assert!(!output.contains(h.as_str()), "`{h}` shown in:\n{output}");
        }
    }
}

#[test]
fn flood_limits_have_defaults_and_are_checked() {
    // Defaults as Linux has them.
    let config = parse(BASE).unwrap();
    assert_eq!(config.limits.neighbors.max_learnt, 1024);
    assert_eq!(config.limits.icmp.per_second, 1000);
    assert_eq!(config.limits.icmp.burst, 50);
    assert_eq!(config.limits.icmp.per_source_interval.as_millis(), 1000);
    assert_eq!(config.limits.icmp.per_source_burst, 6);
    // Every key, and into the gateway's setup.
    let extra = "\n[limits]\nneighbors_per_interface = 64\nicmp_errors_per_second = 10\nicmp_burst = 3\n\
                 icmp_per_source_ms = 0\nicmp_per_source_burst = 2\nicmp_sources = 16\n";
    let config = parse(&format!("{BASE}{extra}")).unwrap();
    let setup = config.setup(dataplane::LinkLayer::Ethernet, accel::Style::Async);
    assert_eq!(setup.neighbor_limits.max_learnt, 64);
    assert_eq!(
        (
            setup.icmp_limits.per_second,
            setup.icmp_limits.burst,
            setup.icmp_limits.sources
        ),
        (10, 3, 16)
    );
    assert!(setup.icmp_limits.per_source_interval.is_zero());
    // Out of range, and unknown keys.
    let extra = "\n[limits]\nneighbors_per_interface = 0\n";
    expect_error(
        extra,
        line_of(extra, "neighbors_per_interface"),
        27,
        "[limits] neighbors_per_interface must be between 1 and 1000000 (default 1024)",
    );
    let extra = "\n[limits]\nicmp_burst = 0\n";
    expect_error(
        extra,
        line_of(extra, "icmp_burst"),
        14,
        "[limits] icmp_burst must be between 1",
    );
    let extra = "\n[limits]\nicmp_errors_per_second = -5\n";
    expect_error(
        extra,
        line_of(extra, "icmp_errors"),
        26,
        "[limits] icmp_errors_per_second must be between 1 and 1000000 (default 1000)",
    );
    let extra = "\n[limits]\narp_entries = 5\n";
    expect_error(
        extra,
        line_of(extra, "arp_entries"),
        1,
        "unknown field `arp_entries`",
    );
}

/// `mac` and `mtu` are optional; the config records which were given, so
/// `espgw run` takes the device's own for the others.
#[test]
fn mac_and_mtu_are_optional_and_recorded() {
    let config = parse(&(BASE.to_owned() + SA)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.link_overrides, [ike_stub::LinkOverrides::default(); 2]);
    assert_eq!(config.inside.mtu, 1500, "offline stand-in");
    let text =
        BASE.replace(
            "address = \"192.168.1.1/24\"",
            "address = \"192.168.1.1/24\"\nmac = \"02:00:00:00:01:01\"",
        )
        .replace(
            "address = \"10.0.0.1/24\"",
            "address = \"10.0.0.1/24\"\nmtu = 1400",
        ) + SA;
    let config = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.link_overrides,
        [
            ike_stub::LinkOverrides {
                mac: true,
                mtu: false
            },
            ike_stub::LinkOverrides {
                mac: false,
                mtu: true
            },
        ]
    );
    assert_eq!(config.inside.mac.0, [2, 0, 0, 0, 1, 1]);
    assert_eq!(config.outside.mtu, 1400);
}

#[test]
fn idle_lifetimes_are_read_and_checked() {
    let life = format!("{SA}[sa.lifetime]\nsoft_idle_s = 30\nhard_idle_s = 120\nhard_seconds = 3600\n");
    let config = parse(&format!("{BASE}{life}")).expect("valid idle lifetimes");
    let lifetime = config.sas[0].params.lifetime;
    assert_eq!(lifetime.soft.idle_seconds, Some(30));
    assert_eq!(lifetime.hard.idle_seconds, Some(120));
    assert_eq!(lifetime.hard.seconds, Some(3600));

    let zero = format!("{SA}[sa.lifetime]\nhard_idle_s = 0\n");
    expect_error(
        &zero,
        line_of(&zero, "hard_idle_s"),
        15,
        "hard_idle_s = 0 is not a number of seconds of at least 1",
    );
    let negative = format!("{SA}[sa.lifetime]\nsoft_idle_s = -5\n");
    expect_error(
        &negative,
        line_of(&negative, "soft_idle_s"),
        15,
        "since the SA's last packet",
    );
    let order = format!("{SA}[sa.lifetime]\nsoft_idle_s = 60\nhard_idle_s = 10\n");
    expect_error(
        &order,
        line_of(&order, "soft_idle_s"),
        15,
        "soft_idle_s (60) is above hard_idle_s (10)",
    );
    let text = format!("{SA}[sa.lifetime]\nhard_idle_s = \"soon\"\n");
    let err = parse(&format!("{BASE}{text}")).expect_err("a string is not seconds");
    assert_eq!(err.line, line_of(&text, "hard_idle_s"), "{err}");
}

#[test]
fn udp_encapsulation_is_read_and_its_mistakes_named() {
    let config = parse(&format!("{BASE}{SA}encap = \"udp\"\n")).unwrap();
    assert_eq!(config.sas[0].params.encap, Some(spd_sad::UdpEncap::NAT_T));
    let ports = parse(&format!(
        "{BASE}{SA}encap = \"udp\"\nudp_port = 4600\npeer_udp_port = 31000\n"
    ))
    .unwrap();
    assert_eq!(
        ports.sas[0].params.encap,
        Some(spd_sad::UdpEncap {
            local_port: 4600,
            remote_port: 31000
        })
    );
    assert_eq!(parse(&format!("{BASE}{SA}")).unwrap().sas[0].params.encap, None);

    let extra = format!("{SA}encap = \"tcp\"\n");
    let line = line_of(&extra, "encap = ");
    expect_error(&extra, line, 9, "encap `tcp` is not `udp`");
    let extra = format!("{SA}udp_port = 4500\n");
    let line = line_of(&extra, "udp_port");
    expect_error(&extra, line, 12, "UDP ports need `encap = \"udp\"`");
    let extra = format!("{SA}encap = \"udp\"\npeer_udp_port = 500\n");
    let line = line_of(&extra, "peer_udp_port");
    expect_error(&extra, line, 17, "IKE's port");
    let extra = format!("{SA}mode = \"transport\"\nencap = \"udp\"\n");
    let line = line_of(&extra, "encap = ");
    expect_error(&extra, line, 9, "needs tunnel mode");
}

#[test]
fn nat_keepalive_interval_is_bounded() {
    assert_eq!(
        parse(&format!("{BASE}{SA}")).unwrap().nat_keepalive,
        Some(std::time::Duration::from_secs(20))
    );
    let off = BASE.replace("name = \"t\"\n", "name = \"t\"\nnat_keepalive_s = 0\n");
    assert_eq!(parse(&format!("{off}{SA}")).unwrap().nat_keepalive, None);
    let text = BASE.replace("name = \"t\"\n", "name = \"t\"\nnat_keepalive_s = -3\n");
    let err = parse(&format!("{text}{SA}")).expect_err("refused");
    assert_eq!((err.line, err.column), (3, 19), "{err}");
    assert!(
        err.to_string().contains("nat_keepalive_s -3 is outside 0"),
        "{err}"
    );
}

/// `[gateway] on_device_loss`: `wait` by default, `exit` on request, and
/// any other word refused at the value, naming the two.
#[test]
fn on_device_loss_is_wait_or_exit() {
    assert_eq!(
        parse(&format!("{BASE}{SA}")).unwrap().on_device_loss,
        ike_stub::DeviceLoss::Wait
    );
    for (word, loss) in [
        ("wait", ike_stub::DeviceLoss::Wait),
        ("exit", ike_stub::DeviceLoss::Exit),
    ] {
        let text = BASE.replace(
            "name = \"t\"\n",
            &format!("name = \"t\"\non_device_loss = \"{word}\"\n"),
        );
        assert_eq!(parse(&format!("{text}{SA}")).unwrap().on_device_loss, loss);
    }
    let text = BASE.replace("name = \"t\"\n", "name = \"t\"\non_device_loss = \"restart\"\n");
    let err = parse(&format!("{text}{SA}")).expect_err("refused");
    assert_eq!((err.line, err.column), (3, 18), "{err}");
    assert!(
        err.to_string()
            .contains("[gateway] on_device_loss `restart` must be `wait` or `exit`"),
        "{err}"
    );
    let text = BASE.replace("name = \"t\"\n", "name = \"t\"\non_device_loss = true\n");
    let err = parse(&format!("{text}{SA}")).expect_err("refused");
    assert_eq!(err.line, 3, "{err}");
}

/// Keyword fields are parsed by derived `FromStr`s; an unknown word is
/// named, with every accepted one, at the value.
#[test]
fn unknown_keywords_name_the_accepted_ones() {
    let policy = |direction: &str, action: &str| {
        format!("\n[[policy]]\nname = \"p\"\ndirection = \"{direction}\"\naction = \"{action}\"\n")
    };
    let cases = [
        (
            SA.replace("auth_key", "mode = \"bridge\"\nauth_key"),
            "mode =",
            8,
            "mode `bridge` is not `tunnel` or `transport`",
        ),
        (
            SA.replace("direction = \"out\"", "direction = \"both\""),
            "direction =",
            13,
            "SA direction `both` must be `out` or `in`",
        ),
        (
            policy("fwd", "bypass"),
            "direction =",
            13,
            "policy direction `fwd` must be `out` or `in`",
        ),
        (
            policy("out", "drop"),
            "action =",
            10,
            "action `drop` must be `protect`, `bypass` or `discard`",
        ),
        (
            "\n[accel]\nengine = \"sec\"\ncompletion = \"msi\"\n".to_owned(),
            "completion =",
            14,
            "[accel] completion `msi` must be `interrupt`, `polling` or `coalesced`",
        ),
    ];
    for (extra, field, column, message) in cases {
        expect_error(&extra, line_of(&extra, field), column, message);
    }
}

/// Interface addresses are address/prefix-length in the canonical form;
/// MACs are six octets joined by `:` (or `-`, as smoltcp parses them).
#[test]
fn interface_addresses_and_macs_parse_as_written() {
    for bad in [
        "192.168.1.1",
        "192.168.1.1/33",
        "192.168.1/24",
        "010.0.0.1/24",
        "192.168.1.1/",
    ] {
        let text = BASE.replace("192.168.1.1/24", bad);
        let err = parse(&text).unwrap_err();
        assert_eq!(
            err.line,
            text.lines().position(|l| l.contains(bad)).unwrap() + 1,
            "{err}"
        );
        assert!(
            err.to_string().contains(&format!(
                "interface address `{bad}` must be address/prefix-length, e.g. 192.168.1.1/24"
            )),
            "{err}"
        );
    }
    let config = parse(&BASE.replace("192.168.1.1/24", "192.168.1.77/26")).unwrap();
    assert_eq!(config.inside.address, std::net::Ipv4Addr::new(192, 168, 1, 77));
    assert_eq!(config.inside.network.to_string(), "192.168.1.64/26");

    for (text, mac) in [
        ("02:00:5e:10:0a:FF", [2, 0, 0x5e, 0x10, 0x0a, 0xff]),
        ("02-00-5e-10-0a-ff", [2, 0, 0x5e, 0x10, 0x0a, 0xff]),
    ] {
        let extra = format!("\n[[neighbor]]\naddress = \"10.0.0.2\"\nmac = \"{text}\"\n");
        let config = parse(&format!("{BASE}{extra}")).unwrap();
        assert_eq!(config.neighbors[0].1 .0, mac, "{text}");
    }
    for bad in [
        "02:00:00:00:00:100",
        "02:00:00:00:00:0g",
        "02:00-00:00:00:00",
        "020000000001",
    ] {
        let extra = format!("\n[[neighbor]]\naddress = \"10.0.0.2\"\nmac = \"{bad}\"\n");
        expect_error(&extra, line_of(&extra, "mac ="), 7, "is not a MAC address");
    }
    // Neighbours of either family; anything else is named.
    let v6 = "\n[[neighbor]]\naddress = \"2001:db8::2\"\nmac = \"02:00:00:00:00:02\"\n";
    assert!(parse(&format!("{BASE}{v6}")).is_ok());
    let bad = "\n[[neighbor]]\naddress = \"10.0.0\"\nmac = \"02:00:00:00:00:02\"\n";
    expect_error(
        bad,
        line_of(bad, "address = \"10.0.0\""),
        11,
        "is not an IP address",
    );
}

/// `address6` takes a unicast address with its prefix length; anything
/// else is refused at its line with what to write.
#[test]
fn interface_address6_is_checked() {
    let with = |value: &str| {
        BASE.replacen(
            "address = \"192.168.1.1/24\"",
            &format!("address = \"192.168.1.1/24\"\naddress6 = \"{value}\""),
            1,
        )
    };
    let config = parse(&with("2001:db8:1::1/64")).unwrap_or_else(|e| panic!("{e}"));
    let (addr, network) = config.inside.address6.expect("address6 read");
    assert_eq!(addr, "2001:db8:1::1".parse::<std::net::Ipv6Addr>().unwrap());
    assert_eq!(network.to_string(), "2001:db8:1::/64");
    assert_eq!(config.outside.address6, None);
    for (bad, says) in [
        (
            "2001:db8:1::1",
            "must be address/prefix-length, e.g. 2001:db8:1::1/64",
        ),
        ("2001:db8:1::1/129", "must be address/prefix-length"),
        ("2001:db8:1::1/0", "must be address/prefix-length"),
        ("192.168.1.1/24", "must be address/prefix-length"),
        ("ff02::1/64", "must be a unicast address of this link"),
        ("::1/128", "must be a unicast address of this link"),
        ("::ffff:10.0.0.1/96", "must be a unicast address of this link"),
    ] {
        let text = with(bad);
        let err = parse(&text).expect_err(bad);
        assert_eq!(
            err.line,
            text.lines().position(|l| l.contains("address6")).unwrap() + 1,
            "{err}"
        );
        assert!(err.to_string().contains(says), "{bad}: {err}");
    }
}

/// One encryption key on two SAs of a file is refused where the second
/// names it: for an AEAD out and in (both ends' outbound SAs would count
/// 1, 2, 3, ... under it), and on two SAs of one direction.
#[test]
fn one_encryption_key_on_two_sas_is_refused() {
    let tunnel = r#"
[[tunnel]]
name = "t"
local = "10.0.0.1"
remote = "10.0.0.2"
local_subnet = "192.168.1.0/24"
remote_subnet = "192.168.2.0/24"
proposal = "aes128gcm16"
spi_out = 0x1001
spi_in = 0x1002
enc_key_out = "000102030405060708090a0b0c0d0e0f10111213"
enc_key_in = "000102030405060708090a0b0c0d0e0f20212223"
"#;
    // The same AES key with another salt is still the same GHASH key.
    let line = line_of(tunnel, "enc_key_in");
    let kind = expect_error(
        tunnel,
        line,
        14,
        "`t-in` has the same encryption key as `t-out`: aes128gcm16 takes its nonce from the sequence number",
    );
    let shown = kind.to_string();
    assert!(shown.contains("RFC 4106 §8"), "{shown}");
    assert!(shown.contains("give each direction its own key"), "{shown}");
    assert!(shown.contains("`secret`"), "{shown}");
    // Two [[sa]] of one direction, CBC: refused too.
    let second = SA.replace("out1", "out2").replace("0x2001", "0x2002");
    let extra = format!("{SA}{second}");
    let text = format!("{BASE}{extra}");
    let line = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("enc_key"))
        .nth(1)
        .unwrap()
        .0
        + 1;
    expect_error(&extra, line, 11, "`out2` has the same encryption key as `out1`: one key must not do the work of two SAs; give each SA its own key");
    // Different keys load; a tunnel whose keys come from its secret has none to compare.
    let fixed = tunnel.replace(
        "000102030405060708090a0b0c0d0e0f20212223",
        "202122232425262728292a2b2c2d2e2f30313233",
    );
    parse(&format!("{BASE}{fixed}")).unwrap();
}

/// `[gateway] state_dir` is taken relative to the file's directory.
#[test]
fn the_state_directory_is_relative_to_the_file() {
    let text = BASE.replace("name = \"t\"", "name = \"t\"\nstate_dir = \"state/t\"");
    let config = Config::parse(Path::new("/etc/espgw/gw.toml"), &text).unwrap();
    assert_eq!(config.state_dir.as_deref(), Some(Path::new("/etc/espgw/state/t")));
    let text = BASE.replace("name = \"t\"", "name = \"t\"\nstate_dir = \"/var/lib/espgw\"");
    let config = Config::parse(Path::new("/etc/espgw/gw.toml"), &text).unwrap();
    assert_eq!(config.state_dir.as_deref(), Some(Path::new("/var/lib/espgw")));
    assert_eq!(parse(BASE).unwrap().state_dir, None);
}

#[test]
fn keying_sources_parse_and_their_mistakes_are_named() {
    use ike_stub::Keying;
    assert_eq!(parse(BASE).unwrap().keying, Keying::Config);
    let xfrm = parse(&format!(
        "{BASE}\n[keying]\nsource = \"xfrm\"\nnetns = \"keying\"\n"
    ))
    .unwrap();
    assert_eq!(
        xfrm.keying,
        Keying::Xfrm {
            netns: Some("keying".into())
        }
    );
    let own = parse(&format!("{BASE}\n[keying]\nsource = \"xfrm\"\n")).unwrap();
    assert_eq!(own.keying, Keying::Xfrm { netns: None });
    let extra = "\n[keying]\nsource = \"ike\"\n";
    expect_error(
        extra,
        line_of(extra, "source"),
        10,
        "expected one of: config, xfrm",
    );
    let extra = "\n[keying]\nsource = \"xfrm\"\nnetns = \"../etc\"\n";
    expect_error(extra, line_of(extra, "netns"), 9, "is not a namespace name");
    let extra = "\n[keying]\nnetns = \"keying\"\n";
    expect_error(extra, line_of(extra, "netns"), 9, "needs source = \"xfrm\"");
}
