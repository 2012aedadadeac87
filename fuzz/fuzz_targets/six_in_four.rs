//! The shipped site pair (`configs/site-a.toml`, `configs/site-b.toml`)
//! with IPv6 networks behind it, carried over its IPv4 tunnel (6-in-4):
//! each inside interface gets an `address6` (unless its file has one:
//! site-b's does) and a second tunnel, `a-b-v6`, joins 2001:db8:1::/64
//! (site A) and 2001:db8:2::/64 (site B) between the same outside
//! addresses, with its own SPIs and keys. The IPv4 tunnel `a-b` and
//! everything else in the files is left as it is, so IPv4 inputs mean what
//! they meant.
//!
//! Shared by the gateway fuzz targets (through `common.rs`) and the seed
//! generator (`lib-tests/tests/fuzz_seeds.rs` includes this file by path), so that
//! the generator's site A encrypts with the keys the targets' site B
//! decrypts with. Text edits only: no dependencies.
#![allow(dead_code)]

use std::net::Ipv6Addr;

/// The gateways' inside IPv6 addresses (the `address6` this adds to
/// site A, and the one site-b.toml has).
pub const GW6_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
pub const GW6_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
/// A host behind each site.
pub const HOST6_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);
pub const HOST6_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x20);

/// The SPIs of `a-b-v6`: A to B, B to A (`a-b` has 0x1001 and 0x1002).
pub const SPI6_A_TO_B: u32 = 0x1101;
pub const SPI6_B_TO_A: u32 = 0x1102;
/// Its aes128gcm16 keys (16-byte key and 4-byte salt), A to B and B to A.
const KEY6_A_TO_B: &str = "404142434445464748494a4b4c4d4e4f50515253";
const KEY6_B_TO_A: &str = "606162636465666768696a6b6c6d6e6f70717273";

/// `text`, the contents of site-a.toml (`a`) or site-b.toml, with IPv6
/// added as the module says.
pub fn with_ipv6(text: &str, a: bool) -> String {
    let (own, far) = if a { (1, 2) } else { (2, 1) };
    let mut out = String::with_capacity(text.len() + 512);
    let mut added = false;
    for block in tables(text) {
        out.push_str(block);
        let lines = || block.lines().map(str::trim);
        let inside = block.starts_with("[[interface]]") && lines().any(|l| l == "name = \"inside\"");
        if inside && !lines().any(|l| l.starts_with("address6")) {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("address6 = \"2001:db8:{own}::1/64\"\n"));
            added = true;
        }
        added |= inside;
    }
    assert!(added, "no [[interface]] named inside");
    let (spi_out, spi_in) = if a {
        (SPI6_A_TO_B, SPI6_B_TO_A)
    } else {
        (SPI6_B_TO_A, SPI6_A_TO_B)
    };
    let (key_out, key_in) = if a {
        (KEY6_A_TO_B, KEY6_B_TO_A)
    } else {
        (KEY6_B_TO_A, KEY6_A_TO_B)
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "\n# Added for fuzzing (fuzz/fuzz_targets/six_in_four.rs): IPv6 over the IPv4 tunnel.\n\
         [[tunnel]]\n\
         name = \"a-b-v6\"\n\
         local = \"10.0.0.{own}\"\n\
         remote = \"10.0.0.{far}\"\n\
         local_subnet = \"2001:db8:{own}::/64\"\n\
         remote_subnet = \"2001:db8:{far}::/64\"\n\
         proposal = \"aes128gcm16\"\n\
         spi_out = {spi_out:#x}\n\
         spi_in = {spi_in:#x}\n\
         enc_key_out = \"{key_out}\"\n\
         enc_key_in = \"{key_in}\"\n\
         esn = false\n\
         replay_window = 128\n"
    ));
    out
}

/// `text` cut before each line that opens a table (`[x]` or `[[x]]`); the
/// first piece is what comes before the first table.
fn tables(text: &str) -> Vec<&str> {
    let mut cuts = vec![0];
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if at > 0 && line.starts_with('[') {
            cuts.push(at);
        }
        at += line.len();
    }
    cuts.push(text.len());
    cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}
