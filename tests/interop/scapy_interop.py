#!/usr/bin/env python3
"""Interop tests: espgw against scapy's independent ESP implementation.

Usage: scapy_interop.py --espgw PATH/TO/espgw --workdir DIR

For every algorithm (aes128gcm16, aes256gcm16, chacha20poly1305,
aes128-sha1, aes256-sha256, 3des-sha1, null-sha1, null) x mode (tunnel, transport) x ESN (off, on), the
script writes an espgw config, runs `espgw pcap` over captures built or read by
scapy's `SecurityAssociation`, and checks three things:

scapy->espgw  scapy, in the peer's role (10.0.0.2), encrypts 12 packets (UDP
    with payloads of 0..1400 bytes, so every padding length is hit; one TCP; one
    ICMP echo) with espgw's inbound SPI and keys.
    tunnel: espgw must forward exactly the inner packets, in order, to the
      inside host's MAC, byte-identical except TTL-1 and a recomputed header
      checksum. Proves decryption, ICV/AAD computation (including the ESN
      high bits in the ICV/AAD when ESN is on), padding removal and
      next-header handling agree with scapy's.
    transport: the ESP packet is addressed to the gateway (10.0.0.1), so the
      decapsulated packet is for the gateway and is consumed, not forwarded.
      Checked through --stats: decapsulated == local_delivered == 12, the
      inbound SA's packet counter == 12, no drops. Proves decryption and
      integrity agree with scapy (a bad ICV or trailer would be a drop).
      The ICMP echo among them is answered, and the reply goes back through
      the SA (RFC 4301 §5.1: the gateway's own packets take the outbound
      SPD): the one frame out must be ESP under espgw's outbound SPI that
      scapy decrypts to the echo reply, never the reply in the clear.
espgw->scapy  12 plaintext packets from 192.168.1.10 arrive on `inside`; each
    ESP frame espgw sends must decrypt with scapy's SA (espgw's outbound
    SPI/keys) to the input packet with TTL-1 and a valid checksum.
    tunnel: 192.168.1.10 -> 192.168.2.20; outer header 10.0.0.1 -> 10.0.0.2,
      proto 50, DF and DSCP/ECN copied from the inner packet, valid checksum.
    transport: the tunnel's selectors are 192.168.1.0/24 -> 10.0.0.2/32, so a
      forwarded packet 192.168.1.10 -> 10.0.0.2 gets ESP inserted after its own
      header; the ESP packet keeps its addresses.
    Both: sequence numbers 1, 2, 3, ...; CBC IVs all differ; the GCM IV is the
      64-bit sequence number (RFC 4106 section 3.1), and so is the
      ChaCha20-Poly1305 IV (RFC 7634 section 2).
negative  one capture with: a good packet (seq 1), a packet encrypted with
    the wrong keys (seq 2), a replay of the seq-1 frame, a packet with an
    unknown SPI, and the good seq-2 packet. Expect drops auth_failed == 1
    (0 for `null`, which has no integrity key to get wrong, so that packet is
    left out), replay == 1, unknown_spi == 1, and 2 packets decapsulated (so a
    failed ICV did not advance the replay window).

UDP encapsulation (RFC 3948): aes128gcm16, aes128-sha1 and chacha20poly1305
in tunnel mode (ESN off and on) again with `encap = "udp"` in espgw's tunnel
and scapy's `nat_t_header=UDP(sport=4500, dport=4500)`:
scapy->espgw, espgw->scapy  as above, ESP inside UDP 4500 -> 4500; espgw's
    outer UDP header must have ports 4500 -> 4500, checksum 0 (RFC 3948 §2.1
    allows it over IPv4) and a length that ends where the IP datagram does.
negative  as above plus a tampered packet (one ciphertext byte flipped) and a
    raw ESP packet (right SPI and keys, not in UDP), a NAT keepalive (0xFF)
    and an IKE message behind the non-ESP marker: expect auth_failed == 2,
    replay == 1, unknown_spi == 1, encap_mismatch == 1,
    nat_keepalives_received == 1, 2 packets decapsulated.
moved     scapy sends from 10.0.0.2:31000 (a NAT's mapping) instead of 4500:
    espgw accepts it, and counts nat_peer_moved == 1 (learnt from the newest
    authenticated packet); a forged packet from a third port moves nothing.

IPv6 inside IPv4 ("inner=6", RFC 4213 over an RFC 4301 tunnel): aes128gcm16,
aes128-sha1 and chacha20poly1305 in tunnel mode, ESN off and on, with and
without UDP encapsulation. The inside interface gets `address6 =
"2001:db8:1::1/64"`, the tunnel `local_subnet = "2001:db8:1::/64"` and
`remote_subnet = "2001:db8:2::/64"`; the tunnel ends stay IPv4.
scapy->espgw, espgw->scapy, negative, moved  as above with 12 IPv6 packets
    between 2001:db8:1::10 and 2001:db8:2::20 (UDP of 0..1232 bytes, so up to
    IPv6's 1280-byte minimum MTU; TCP; an ICMPv6 echo with a traffic class
    and a flow label), scapy's `tunnel_header=IP(...)`. Forwarded: the
    packet with hop limit - 1 and nothing else changed, in an IPv6 frame to
    the zero MAC (`[[neighbor]]` takes IPv4 only, and `espgw pcap` resolves
    nothing). Sent: ESP next header 41, outer TOS = inner traffic class, DF
    clear (RFC 4213 §3.2.1).
policy    correctly encrypted packets the SA's selectors do not admit (RFC
    4301 §5.2 step 4): a source outside 2001:db8:2::/64, a destination outside
    2001:db8:1::/64, an inner IPv4 packet; expect policy_mismatch == 3, also on
    the inbound SA, and the good packets around them forwarded.
too-big   an IPv6 packet exactly the tunnel MTU (worked out here from the
    transform's overheads) goes out as one ESP packet; one byte more is
    answered, after the inside host's neighbour solicitation, by an ICMPv6
    packet-too-big from 2001:db8:1::1 to its MAC with that MTU, a valid
    checksum and the packet quoted (RFC 4443 §3.2), drops frag_needed == 1.

IPv6 ends ("outer=6": 4-in-6 and 6-in-6, RFC 4301 tunnel mode over IPv6):
aes128gcm16, aes128-sha1 and chacha20poly1305, inner IPv4 and inner IPv6,
ESN off and on, tunnel mode, raw ESP only (espgw refuses UDP encapsulation
over IPv6; transport mode over IPv6 is below). The outside interface gets
`address6 = "2001:db8:ff::1/64"` and the tunnel `local = "2001:db8:ff::1"`,
`remote = "2001:db8:ff::2"`; the subnets are the inner family's, as above. The esn=on cases also set
`[gateway] outer_ttl = 200` (esn=off keeps the default, 64). UDP payloads go
up to 1232 bytes for both inner families (UDP_SIZES_OUTER6: over IPv6
nothing is fragmented, and these fit every SA's tunnel MTU).
scapy->espgw  scapy's `tunnel_header=IPv6(src=2001:db8:ff::2,
    dst=2001:db8:ff::1)`; the inner packets forwarded as above (TTL / hop
    limit - 1).
espgw->scapy  ESP in IPv6 to the zero MAC (`espgw pcap` resolves no
    neighbour): 2001:db8:ff::1 -> 2001:db8:ff::2, next header 50 right after
    the fixed header (no fragment header), hop limit = outer_ttl, traffic
    class = inner TOS / traffic class, flow label 0, payload length right,
    at most 1500 bytes; decrypted by scapy to the input with TTL - 1.
negative  as for IPv4 plus a tampered packet (one ciphertext byte flipped):
    auth_failed == 2, replay == 1, unknown_spi == 1, 2 decapsulated.
policy    as above, with 192.168.3.30 -> 192.168.1.10, 192.168.2.20 ->
    192.168.9.90 and an inner IPv6 packet for inner IPv4: policy_mismatch == 3.
too-big   the tunnel MTU over a 40-byte outer header: a packet of exactly
    that size goes out as one ESP packet over IPv6 of at most 1500 bytes;
    one byte more gets a packet-too-big (inner IPv6, as above) or, for inner
    IPv4 with DF clear, an ICMP fragmentation-needed from 192.168.1.1 to the
    host's MAC with that next-hop MTU, valid checksums, the packet's header
    and at least 8 more bytes quoted, at most 576 bytes (RFC 1812
    §4.3.2.3); drops frag_needed == 1.
ext-headers  ESP behind a hop-by-hop and a destination options header, and
    behind a destination options header, is decapsulated and forwarded; a
    fragmented outer packet (the peer fragmented its own ESP, RFC 8200
    §4.5) is reassembled, then decapsulated and forwarded, and fragments
    that overlap are refused (`reassembly_failed`, RFC 5722); ESP behind a
    destination option of an unknown type whose bits say discard (0x5E,
    RFC 8200 §4.2) is dropped unopened (`ipv6_unknown_option`).

IPv6 transport mode ("transport ... outer=6", RFC 4303 §3.1.1):
aes128gcm16, aes128-sha1 and chacha20poly1305, ESN off and on, an SA
between 2001:db8:ff::1 and 2001:db8:ff::2 in transport mode whose
selectors are the hosts' networks 2001:db8:1::/64 <-> 2001:db8:2::/64, as
the IPv4 transport cases' are (an IPv6 `[[route]]` sends 2001:db8:2::/64
via 2001:db8:ff::2); espgw applies it to the packets it forwards, which
keep the hosts' addresses. scapy's `SecurityAssociation(ESP, ...,
tunnel_header=None)`. The esn=on cases set `outer_ttl = 200`, which
transport mode must ignore. 16 packets: the 12 of inner=6 and 4 with
extension headers (a hop-by-hop header; a destination options header; both;
destination options, a routing header with no segments left, destination
options) carrying UDP, TCP and an ICMPv6 echo.
scapy->espgw  scapy encrypts them 2001:db8:2::20 -> 2001:db8:1::10 (ESP
    where scapy puts it) plus the lone destination options packet again
    with ESP in front of its options (espgw's placement, scapy's own ESP):
    each is decapsulated although its destination is not the gateway's and
    forwarded byte-identical but for hop limit - 1 to the zero MAC inside;
    nothing delivered locally, no drops.
espgw->scapy  2001:db8:1::10 -> 2001:db8:2::20 from inside: ESP to the
    zero MAC outside, after the hop-by-hop, routing (and the destination
    options before it) headers, before any other destination options; in
    front of it the packet's own headers with hop limit - 1 (not
    outer_ttl), traffic class and flow label kept, the payload length of
    the ESP packet and 50 in the byte that named what ESP protects; the
    trailer's next header is that byte's old value; the least padding;
    sequence numbers and IVs as above; scapy decrypts the rest of the
    packet. scapy's own ESP for the same packet sits at the same place and
    length except behind destination options not followed by a routing
    header, which scapy (like Linux) leaves in front of ESP: §3.1.1 allows
    both, and says "it generally will be desirable to place the destination
    options header(s) after the ESP header", espgw's choice.
negative  as for outer=6, the unknown SPI addressed to 2001:db8:ff::1:
    auth_failed == 2, replay == 1, unknown_spi == 1, 2 decapsulated.
policy    our SPI with a source outside 2001:db8:2::/64 or a destination
    outside 2001:db8:1::/64 (decrypted, then policy_mismatch on the SA, RFC
    4301 §5.2), an unknown SPI between the hosts (transit ESP the inbound
    policy wants protected: policy_mismatch, no SA), IPv4 ESP to 10.0.0.1
    with the IPv6 SA's SPI (unknown_spi): policy_mismatch == 3 (2 on the
    SA), unknown_spi == 1, the 2 good packets around them forwarded.
too-big   as for outer=6, with the packet's own 40-byte header in place
    of the outer one: the transport MTU fits, one byte more gets a
    packet-too-big with that MTU.
refused   outbound, between two good packets: a first, a later and an
    atomic fragment, next header 59 after the fixed header and after a
    hop-by-hop header: unsupported == 5 (RFC 4301 §4.1, RFC 4303 §2.6).

ESN caveat: espgw cannot be told a starting sequence number or replay top
from its config, so ESN runs use small sequence numbers (high 32 bits = 0).
That still checks that both sides include the high bits in the ICV (HMAC) or
AAD (GCM) -- 4 extra bytes -- but not carrying into the high bits.
"""

import argparse
import json
import random
import shutil
import struct
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

from scapy.all import (ICMP, IP, TCP, UDP, Ether, HBHOptUnknown, ICMPv6EchoRequest, ICMPv6ND_NS,
                       ICMPv6NDOptSrcLLAddr, ICMPv6PacketTooBig, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,
                       IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, Raw, in6_chksum, rdpcap, wrpcap)
from scapy.layers import ipsec
from scapy.layers.ipsec import ESP, SecurityAssociation
from scapy.utils import checksum

Alg = namedtuple("Alg", "crypt enc_len auth auth_len iv_len icv aead")
# The cipher's block, to which ESP pads payload + trailer (4 for stream
# ciphers and AEADs: RFC 4303 §2.4 alignment).
BLOCK = {"AES-CBC": 16, "3DES": 8}
ALGORITHMS = {
    "aes128gcm16": Alg("AES-GCM", 16 + 4, "NULL", 0, 8, 16, True),
    "aes256gcm16": Alg("AES-GCM", 32 + 4, "NULL", 0, 8, 16, True),
    "chacha20poly1305": Alg("CHACHA20-POLY1305", 32 + 4, "NULL", 0, 8, 16, True),
    "aes128-sha1": Alg("AES-CBC", 16, "HMAC-SHA1-96", 20, 16, 12, False),
    "aes256-sha256": Alg("AES-CBC", 32, "SHA2-256-128", 32, 16, 16, False),
    "3des-sha1": Alg("3DES", 24, "HMAC-SHA1-96", 20, 8, 12, False),
    "null-sha1": Alg("NULL", 0, "HMAC-SHA1-96", 20, 0, 12, False),
    "null": Alg("NULL", 0, "NULL", 0, 0, 0, False),
}
MODES = ("tunnel", "transport")

GW_INSIDE, GW_OUTSIDE, PEER = "192.168.1.1", "10.0.0.1", "10.0.0.2"
HOST_A, HOST_B = "192.168.1.10", "192.168.2.20"
GW_INSIDE6, HOST_A6, HOST_B6 = "2001:db8:1::1", "2001:db8:1::10", "2001:db8:2::20"
GW_OUTSIDE6, PEER6 = "2001:db8:ff::1", "2001:db8:ff::2"
# Per outer family: the tunnel's (local, remote) ends.
ENDS = {4: (GW_OUTSIDE, PEER), 6: (GW_OUTSIDE6, PEER6)}
# Per inner family: (inside host, remote host), tunnel (local_subnet, remote_subnet).
HOSTS = {4: (HOST_A, HOST_B), 6: (HOST_A6, HOST_B6)}
SUBNETS = {4: ("192.168.1.0/24", "192.168.2.0/24"), 6: ("2001:db8:1::/64", "2001:db8:2::/64")}
# `[[neighbor]] address` takes IPv4 only, and offline (`espgw pcap`) nothing
# resolves a neighbour: an IPv6 packet to the inside host gets the zero MAC.
HOST_A6_MAC = "00:00:00:00:00:00"
# The same on the outside: ESP over IPv6 goes to the peer at the zero MAC.
PEER6_MAC = "00:00:00:00:00:00"
ETHERTYPE = {4: 0x0800, 6: 0x86DD}
# Per inner family: a source outside the remote subnet, a destination
# outside the local one (`policy`).
STRAYS = {4: ("192.168.3.30", "192.168.9.90"), 6: ("2001:db8:3::30", "2001:db8:9::90")}
MAC = {GW_INSIDE: "02:00:00:00:01:01", GW_OUTSIDE: "02:00:00:00:00:01",
       PEER: "02:00:00:00:00:02", HOST_A: "02:00:00:00:01:10"}
SPI_OUT, SPI_IN, SPI_UNKNOWN = 0x1001, 0x2002, 0xBAD0BAD
UDP_SIZES = (0, 1, 2, 3, 15, 16, 17, 100, 1000, 1400)
# IPv6 is never fragmented on the way (a tunnel packet that does not fit is
# a packet-too-big): the largest is 1280 bytes, IPv6's minimum link MTU,
# which fits every SA's tunnel here.
UDP_SIZES6 = (0, 1, 2, 3, 15, 16, 17, 100, 1000, 1232)
# Over IPv6 ends nothing is fragmented either, inner IPv4 included: the
# same sizes for both inner families, all within every SA's tunnel MTU.
UDP_SIZES_OUTER6 = UDP_SIZES6
DROP_CHECKS = ("auth_failed", "replay_duplicate", "unknown_spi")

Case = namedtuple("Case", "alg mode esn encap inner outer", defaults=(False, 4, 4))
NAT_ALGORITHMS = ("aes128gcm16", "aes128-sha1", "chacha20poly1305")
INNER6_ALGORITHMS = NAT_ALGORITHMS
OUTER6_ALGORITHMS = NAT_ALGORITHMS
TRANSPORT6_ALGORITHMS = NAT_ALGORITHMS
# `[gateway] outer_ttl` of the outer=6 esn=on cases (esn=off ones keep the
# default, 64): both the default and a configured hop limit get checked.
OUTER6_TTL = 200
NAT_PORT, NAT_MAPPED_PORT, NAT_FORGED_PORT = 4500, 31000, 31001


class CheckFailed(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def case_label(case):
    # Transport mode has no inner header: its packets are of the ends'
    # family, which `outer` names.
    return (f"{case.alg} {case.mode} esn={'on' if case.esn else 'off'}" + (" udp" if case.encap else "")
            + (f" inner={case.inner}" if case.inner != 4 and case.mode == "tunnel" else "")
            + (f" outer={case.outer}" if case.outer != 4 else ""))


def is_transport6(case):
    """Transport mode between IPv6 ends (`Case(..., "transport", ..., inner=6,
    outer=6)`): the packets of the hosts' IPv6 networks themselves."""
    return case.mode == "transport" and case.outer == 6


def outer_hop_limit(case):
    """The TTL / hop limit espgw must write in its outer headers (the
    `outer_ttl` configured; transport mode writes none, and keeps the
    packet's hop limit - 1 whatever it is)."""
    return OUTER6_TTL if case.outer == 6 and case.esn else 64


def case_keys(case):
    """Deterministic keys per case: (enc_out, auth_out, enc_in, auth_in)."""
    a = ALGORITHMS[case.alg]
    rng = random.Random(case_label(case))
    return tuple(rng.randbytes(n) for n in (a.enc_len, a.auth_len) * 2)


def toml_key(name, key):
    return f'{name} = "{key.hex()}"\n' if key else ""


def config_text(case, keys, subnets):
    enc_out, auth_out, enc_in, auth_in = keys
    inside6 = f'address6 = "{GW_INSIDE6}/64"\n' if case.inner == 6 else ""
    outside6 = f'address6 = "{GW_OUTSIDE6}/64"\n' if case.outer == 6 else ""
    ttl = f"outer_ttl = {outer_hop_limit(case)}\n" if outer_hop_limit(case) != 64 else ""
    local, remote = ENDS[case.outer]
    text = f"""[gateway]
name = "interop"
allow_insecure_null = {str(case.alg == "null").lower()}
{ttl}
[[interface]]
name = "inside"
device = "eth0"
address = "{GW_INSIDE}/24"
mac = "{MAC[GW_INSIDE]}"
{inside6}
[[interface]]
name = "outside"
device = "eth1"
address = "{GW_OUTSIDE}/24"
mac = "{MAC[GW_OUTSIDE]}"
{outside6}
[[route]]
destination = "192.168.2.0/24"
via = "{PEER}"
"""
    if is_transport6(case):
        # Transport mode keeps the hosts' addresses: the remote network is
        # reached through the peer, as 192.168.2.0/24 is over IPv4.
        text += f'\n[[route]]\ndestination = "{SUBNETS[6][1]}"\nvia = "{PEER6}"\n'
    for addr in (PEER, HOST_A):
        text += f'\n[[neighbor]]\naddress = "{addr}"\nmac = "{MAC[addr]}"\n'
    text += f"""
[[tunnel]]
name = "interop"
local = "{local}"
remote = "{remote}"
proposal = "{case.alg}"
mode = "{case.mode}"
spi_out = {SPI_OUT}
spi_in = {SPI_IN}
esn = {str(case.esn).lower()}
replay_window = 64
"""
    if case.encap:
        text += 'encap = "udp"\n'

    if subnets:
        text += f'local_subnet = "{subnets[0]}"\nremote_subnet = "{subnets[1]}"\n'
    return (text + toml_key("enc_key_out", enc_out) + toml_key("auth_key_out", auth_out)
            + toml_key("enc_key_in", enc_in) + toml_key("auth_key_in", auth_in))


def scapy_sa(case, spi, enc, auth, outer_src, outer_dst, sport=NAT_PORT):
    """`sport` is the UDP source port when the case is UDP-encapsulated."""
    a = ALGORITHMS[case.alg]
    return SecurityAssociation(
        ESP, spi=spi, crypt_algo=a.crypt, crypt_key=enc or None,
        crypt_icv_size=a.icv if a.aead else None,
        auth_algo=a.auth, auth_key=auth or None,
        tunnel_header=(IPv6 if ":" in outer_src else IP)(src=outer_src, dst=outer_dst)
        if case.mode == "tunnel" else None,
        nat_t_header=UDP(sport=sport, dport=NAT_PORT) if case.encap else None,
        esn_en=case.esn, esn=0)


def peer_encryptor(case, keys, spi=SPI_IN, sport=NAT_PORT):
    """scapy as the peer sending to espgw: espgw's inbound SA."""
    local, remote = ENDS[case.outer]
    return scapy_sa(case, spi, keys[2], keys[3], remote, local, sport)


def peer_decryptor(case, keys):
    """scapy as the peer receiving from espgw: espgw's outbound SA."""
    local, remote = ENDS[case.outer]
    return scapy_sa(case, SPI_OUT, keys[0], keys[1], local, remote)


def test_packets(src, dst, sizes=None):
    """12 IPv4 packets; the TCP one has DF, the ICMP one DF and DSCP/ECN.
    Between IPv6 addresses, 12 IPv6 packets instead (`test_packets6`).
    `sizes`: the UDP payload sizes, if not the family's own."""
    if ":" in src:
        return test_packets6(src, dst)
    pkts = [IP(src=src, dst=dst, id=100 + i) / UDP(sport=5000 + i, dport=6000)
            / Raw(bytes((7 * j + n) % 256 for j in range(n)))
            for i, n in enumerate(sizes or UDP_SIZES)]
    pkts.append(IP(src=src, dst=dst, id=200, flags="DF")
                / TCP(sport=40000, dport=80, flags="PA", seq=1000, ack=2000) / Raw(b"tcp!" * 5))
    pkts.append(IP(src=src, dst=dst, id=201, flags="DF", tos=0xB9)
                / ICMP(type="echo-request", id=7, seq=1) / Raw(b"ping" * 8))
    return [IP(bytes(p)) for p in pkts]


def case_packets(case, src, dst):
    """`test_packets` for the case: over IPv6 ends, no bigger than
    UDP_SIZES_OUTER6 (nothing is fragmented there)."""
    return test_packets(src, dst, UDP_SIZES_OUTER6 if case.outer == 6 else None)


def test_packets6(src, dst):
    """12 IPv6 packets, as `test_packets`: UDP of every padding length, one
    TCP, one ICMPv6 echo with a traffic class (DSCP/ECN) and a flow label."""
    pkts = [IPv6(src=src, dst=dst, hlim=64) / UDP(sport=5000 + i, dport=6000)
            / Raw(bytes((7 * j + n) % 256 for j in range(n)))
            for i, n in enumerate(UDP_SIZES6)]
    pkts.append(IPv6(src=src, dst=dst, hlim=64)
                / TCP(sport=40000, dport=80, flags="PA", seq=1000, ack=2000) / Raw(b"tcp!" * 5))
    pkts.append(IPv6(src=src, dst=dst, hlim=64, tc=0xB9, fl=0x12345)
                / ICMPv6EchoRequest(id=7, seq=1, data=b"ping" * 8))
    return [IPv6(bytes(p)) for p in pkts]


def forwarded(pkt):
    """What the gateway must emit for `pkt`: TTL-1 and a recomputed checksum
    (IPv6: hop limit - 1, nothing else changes, no header checksum)."""
    if bytes(pkt)[0] >> 4 == 6:
        q = IPv6(bytes(pkt))
        q.hlim -= 1
        return bytes(q)
    q = IP(bytes(pkt))
    q.ttl -= 1
    del q.chksum
    return bytes(q)


def run_espgw(args, name, config, side, frames):
    d = args.workdir / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "gw.toml").write_text(config)
    wrpcap(str(d / "in.pcap"), frames)
    # A state directory of its own per run: every run starts from sequence
    # number 1, as scapy's SAs expect.
    shutil.rmtree(d / "state", ignore_errors=True)
    cmd = [str(args.espgw), "pcap", "--config", str(d / "gw.toml"), "--from", side,
           "--state-dir", str(d / "state"),
           "--in", str(d / "in.pcap"), "--out", str(d / "out.pcap"), "--stats", str(d / "stats.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    expect(proc.returncode == 0, f"espgw exited {proc.returncode}: {proc.stderr.strip()}")
    return list(rdpcap(str(d / "out.pcap"))), json.loads((d / "stats.json").read_text())


def keepalives_out(out, case):
    """Takes espgw's NAT keepalives (RFC 3948 §2.3: one 0xFF byte in UDP from
    our encapsulation port to the peer's) out of `out`, checking each; the
    gateway sends one at start and then every nat_keepalive_s."""
    if not case.encap:
        return out, 0
    rest, n = [], 0
    for frame in out:
        if frame.type != ETHERTYPE[4]:  # an inner IPv6 packet forwarded inside
            rest.append(frame)
            continue
        ip = IP(bytes(frame[IP]))
        udp = bytes(ip)[ip.ihl * 4:]
        if ip.proto == 17 and ip.frag == 0 and not ip.flags.MF and udp[8:] == b"\xff":
            expect((ip.src, ip.dst) == (GW_OUTSIDE, PEER)
                   and struct.unpack("!HHH", udp[:6]) == (NAT_PORT, NAT_PORT, 9),
                   f"keepalive {ip.src}:{udp[:2].hex()} -> {ip.dst}:{udp[2:4].hex()} length {udp[4:6].hex()}")
            n += 1
        else:
            rest.append(frame)
    return rest, n


def reassembled(out):
    """The outer datagrams of `out`, fragments put back together: ESP in UDP
    is 8 bytes longer, so the largest packet's ESP datagram may not fit the
    link's 1500 bytes and espgw fragments it after encapsulation (RFC 4301
    §8.1, like a raw ESP datagram that does not fit). Returns (datagrams,
    how many were fragmented)."""
    datagrams, pending, fragmented = [], {}, 0
    for frame in out:
        ip = IP(bytes(frame[IP]))
        if ip.frag == 0 and not ip.flags.MF:
            datagrams.append(frame)
            continue
        parts = pending.setdefault((ip.src, ip.dst, ip.id), [])
        parts.append(ip)
        ends = [q for q in parts if not q.flags.MF]
        total = ends and ends[0].frag * 8 + len(bytes(ends[0].payload))
        if not total or sum(len(bytes(q.payload)) for q in parts) != total:
            continue
        payload = bytearray(total)
        for q in parts:
            payload[q.frag * 8: q.frag * 8 + len(bytes(q.payload))] = bytes(q.payload)
        head = min(parts, key=lambda q: q.frag).copy()
        head.remove_payload()
        head.flags, head.frag, head.len, head.chksum = 0, 0, None, None
        datagrams.append(frame.__class__(bytes(frame)[:14]) / IP(bytes(head / Raw(bytes(payload)))))
        del pending[(ip.src, ip.dst, ip.id)]
        fragmented += 1
    expect(not pending, f"fragments never completed: {list(pending)}")
    return datagrams, fragmented


def sa_stats(stats, spi):
    return next(s for s in stats["sas"] if int(s["spi"], 16) == spi)


def expect_drops(stats, **want):
    got = {k: v for k, v in stats["drops"].items() if v}
    want = {k: v for k, v in want.items() if v}
    expect(got == want, f"drops {got}, expected {want or 'none'}")


def scapy_to_espgw(args, case, keys, name):
    sa = peer_encryptor(case, keys)
    if case.mode == "tunnel":
        host_a, host_b = HOSTS[case.inner]
        inner, subnets = case_packets(case, host_b, host_a), SUBNETS[case.inner]
    else:
        inner, subnets = test_packets(PEER, GW_OUTSIDE), None
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / sa.encrypt(p) for p in inner]
    out, stats = run_espgw(args, name, config_text(case, keys, subnets), "outside", frames)
    out, _ = keepalives_out(out, case)
    n = len(inner)
    expect_drops(stats)
    expect(stats["decapsulated"] == n, f"decapsulated {stats['decapsulated']}, expected {n}")
    sa_packets = sa_stats(stats, SPI_IN)["packets"]
    expect(sa_packets == n, f"inbound SA packets {sa_packets}, expected {n}")
    if case.mode == "transport":
        expect(stats["local_delivered"] == n, f"local_delivered {stats['local_delivered']}, expected {n}")
        expect(len(out) == 1, f"{len(out)} frames out; expected only the echo reply, through the SA")
        echo_reply_through_sa(out[0], case, keys, inner[-1])
        return n
    expect(len(out) == n, f"{len(out)} frames out, expected {n}")
    host_mac = MAC[HOST_A] if case.inner == 4 else HOST_A6_MAC
    for i, (frame, pkt) in enumerate(zip(out, inner)):
        expect(frame.dst == host_mac and frame.src == MAC[GW_INSIDE] and frame.type == ETHERTYPE[case.inner],
               f"packet {i}: Ethernet {frame.src} -> {frame.dst} type {frame.type:#06x},"
               f" expected {MAC[GW_INSIDE]} -> {host_mac} type {ETHERTYPE[case.inner]:#06x}")
        got, want = bytes(frame.payload), forwarded(pkt)
        expect(got == want, f"packet {i}: forwarded {got.hex()}\n  expected {want.hex()}")
    return n


def echo_reply_through_sa(frame, case, keys, request):
    """`frame` is ESP under espgw's outbound SPI (never the clear reply)
    that scapy decrypts to the echo reply to `request`, from the address it
    was sent to."""
    ip = frame[IP]
    expect(ip.proto == 50 and ip[ESP].spi == SPI_OUT,
           f"the echo reply left as protocol {ip.proto}, not ESP under {SPI_OUT:#x}: {frame.summary()}")
    try:
        plain = peer_decryptor(case, keys).decrypt(ip.copy())
    except Exception as e:  # scapy raises IPSecIntegrityError, ValueError, ...
        raise CheckFailed(f"echo reply: scapy cannot decrypt: {type(e).__name__}: {e}")
    reply = IP(bytes(plain))
    expect((reply.src, reply.dst) == (request.dst, request.src),
           f"echo reply {reply.src} -> {reply.dst}, expected {request.dst} -> {request.src}")
    icmp = reply[ICMP]
    expect(icmp.type == 0 and (icmp.id, icmp.seq) == (request[ICMP].id, request[ICMP].seq)
           and bytes(icmp.payload) == bytes(request[ICMP].payload),
           f"not the echo reply: {reply.summary()}")
    expect(checksum(bytes(icmp)) == 0, "echo reply: bad ICMP checksum")


def check_outer(i, ip, pkt, case):
    src, dst = (GW_OUTSIDE, PEER) if case.mode == "tunnel" else (pkt.src, pkt.dst)
    proto = 17 if case.encap else 50
    expect((ip.src, ip.dst, ip.proto) == (src, dst, proto),
           f"packet {i}: outer {ip.src} -> {ip.dst} proto {ip.proto}, expected {src} -> {dst} proto {proto}")
    if case.encap:
        udp = bytes(ip)[ip.ihl * 4:]
        sport, dport, length, csum = struct.unpack("!HHHH", udp[:8])
        expect((sport, dport) == (NAT_PORT, NAT_PORT),
               f"packet {i}: outer UDP {sport} -> {dport}, expected {NAT_PORT} -> {NAT_PORT}")
        expect(csum == 0, f"packet {i}: outer UDP checksum {csum:#06x}, expected 0 (RFC 3948 §2.1)")
        expect(length == len(udp), f"packet {i}: outer UDP length {length} != {len(udp)}")
    expect(checksum(bytes(ip)[: ip.ihl * 4]) == 0, f"packet {i}: bad outer header checksum {ip.chksum:#06x}")
    expect(ip.len == len(bytes(ip)), f"packet {i}: outer total length {ip.len} != {len(bytes(ip))}")
    # IPv6 inside IPv4 goes with DF clear (RFC 4213 §3.2.1), and its traffic
    # class is the outer TOS (RFC 4301 §5.1.2.1: DSCP and ECN copied).
    inner_df, inner_tos = (bool(pkt.flags.DF), pkt.tos) if pkt.version == 4 else (False, pkt.tc)
    expect(bool(ip.flags.DF) == inner_df, f"packet {i}: outer DF {ip.flags.DF}, expected {inner_df}")
    expect(ip.tos == inner_tos, f"packet {i}: outer TOS {ip.tos:#04x}, inner {inner_tos:#04x}")
    expect(ip.frag == 0 and not ip.flags.MF, f"packet {i}: outer header is a fragment")


def check_outer6(i, ip, pkt, case):
    """The outer IPv6 header of a tunnel with IPv6 ends: the ends, next
    header ESP straight after the fixed header (no fragment header: the
    packet is never fragmented), hop limit `outer_ttl`, traffic class from
    the inner TOS / traffic class (RFC 4301 §5.1.2.1), flow label 0, a
    payload length that ends where the frame does, at most the 1500 bytes
    of the outside link."""
    want = (GW_OUTSIDE6, PEER6, 50)
    expect((ip.src, ip.dst, ip.nh) == want,
           f"packet {i}: outer {ip.src} -> {ip.dst} nh {ip.nh}, expected {want[0]} -> {want[1]} nh {want[2]}")
    expect(ip.hlim == outer_hop_limit(case), f"packet {i}: outer hop limit {ip.hlim}, expected {outer_hop_limit(case)}")
    inner_tos = pkt.tos if pkt.version == 4 else pkt.tc
    expect(ip.tc == inner_tos, f"packet {i}: outer traffic class {ip.tc:#04x}, inner {inner_tos:#04x}")
    expect(ip.fl == 0, f"packet {i}: outer flow label {ip.fl:#x}, expected 0")
    size = len(bytes(ip))
    expect(ip.plen == size - 40, f"packet {i}: outer payload length {ip.plen} != {size - 40}")
    expect(size <= 1500, f"packet {i}: outer packet {size} bytes, more than the outside MTU 1500")


def outer_of(i, frame, case):
    """The outer IP or IPv6 header of an ESP frame espgw sent the peer."""
    if case.outer == 4:
        expect(frame.dst == MAC[PEER] and frame.src == MAC[GW_OUTSIDE],
               f"packet {i}: Ethernet {frame.src} -> {frame.dst}")
        return IP(bytes(frame[IP]))
    expect(frame.dst == PEER6_MAC and frame.src == MAC[GW_OUTSIDE] and frame.type == ETHERTYPE[6],
           f"packet {i}: Ethernet {frame.src} -> {frame.dst} type {frame.type:#06x},"
           f" expected {MAC[GW_OUTSIDE]} -> {PEER6_MAC} type {ETHERTYPE[6]:#06x}")
    return IPv6(bytes(frame.payload))


def espgw_to_scapy(args, case, keys, name):
    a = ALGORITHMS[case.alg]
    host_a, host_b = HOSTS[case.inner]
    dst, subnets = (host_b, SUBNETS[case.inner]) if case.mode == "tunnel" \
        else (PEER, ("192.168.1.0/24", f"{PEER}/32"))
    inner = case_packets(case, host_a, dst)
    frames = [Ether(src=MAC[HOST_A], dst=MAC[GW_INSIDE]) / p for p in inner]
    out, stats = run_espgw(args, name, config_text(case, keys, subnets), "inside", frames)
    out, keepalives = keepalives_out(out, case)
    out, fragmented = reassembled(out) if case.encap else (out, 0)
    n = len(inner)
    expect_drops(stats)
    expect(stats["encapsulated"] == n, f"encapsulated {stats['encapsulated']}, expected {n}")
    expect(len(out) == n, f"{len(out)} frames out, expected {n}")
    sa, ivs = peer_decryptor(case, keys), []
    for i, (frame, pkt) in enumerate(zip(out, inner)):
        ip = outer_of(i, frame, case)
        (check_outer if case.outer == 4 else check_outer6)(i, ip, pkt, case)
        esp = ip[ESP]
        expect(esp.spi == SPI_OUT and esp.seq == i + 1,
               f"packet {i}: SPI {esp.spi:#x} seq {esp.seq}, expected {SPI_OUT:#x} seq {i + 1}")
        ivs.append(bytes(esp.data[: a.iv_len]))
        shell = ip.copy()
        try:
            plain = sa.decrypt(shell)
        except Exception as e:  # scapy raises IPSecIntegrityError, ValueError, ...
            raise CheckFailed(f"packet {i} (seq {esp.seq}): scapy cannot decrypt: {type(e).__name__}: {e}")
        # scapy leaves the ESP trailer's next header in the header it strips.
        nh = {4: 4, 6: 41}[pkt.version] if case.mode == "tunnel" else pkt.proto
        got_nh = shell.proto if case.outer == 4 else shell.nh
        expect(got_nh == nh, f"packet {i}: ESP next header {got_nh}, expected {nh}")
        got, want = bytes(plain), forwarded(pkt)
        expect(got == want, f"packet {i}: decrypted {got.hex()}\n  expected {want.hex()}")
    if a.aead:
        for i, iv in enumerate(ivs):
            expect(iv == struct.pack("!Q", i + 1),
                   f"packet {i}: GCM IV {iv.hex()} is not the sequence number {i + 1}")
    elif a.iv_len:
        expect(len(set(ivs)) == n, f"CBC IVs repeat: {[iv.hex() for iv in ivs]}")
    if case.encap:
        return f"{n} packets, {keepalives} keepalive, {fragmented} fragmented after encapsulation"
    return n


def negative(args, case, keys, name):
    wrong = tuple(bytes(b ^ 0x5A for b in k) for k in keys)
    good, bad = peer_encryptor(case, keys), peer_encryptor(case, wrong)
    stranger = peer_encryptor(case, keys, spi=SPI_UNKNOWN)
    if case.mode == "tunnel":
        host_a, host_b = HOSTS[case.inner]
        p1, p2 = test_packets(host_b, host_a)[:2]
        subnets = SUBNETS[case.inner]
    elif is_transport6(case):
        p1, p2 = test_packets(HOST_B6, HOST_A6)[:2]
        subnets = SUBNETS[6]
    else:
        p1, p2 = test_packets(PEER, GW_OUTSIDE)[:2]
        subnets = None
    # IPv6 transport: the unknown SPI goes to the gateway's own address
    # (ESP between the hosts that no SA claims is transit traffic for the
    # SPD: `transport6_policy`).
    unknown = test_packets(PEER6, GW_OUTSIDE6)[1] if is_transport6(case) else p2
    first = good.encrypt(p1, seq_num=1)
    has_auth = case.alg != "null"
    esps = [first] + ([bad.encrypt(p2, seq_num=2)] if has_auth else []) \
        + [first, stranger.encrypt(unknown, seq_num=1)]
    want = {"auth_failed": int(has_auth), "replay_duplicate": 1, "unknown_spi": 1}
    if case.encap:
        esps += udp_extras(case, keys, good, p2)
        want.update(auth_failed=2, encap_mismatch=1)
    if case.outer == 6:
        esps.append(tampered(good, p2, 2))
        want.update(auth_failed=2)
    esps.append(good.encrypt(p2, seq_num=2))
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / e for e in esps]
    _, stats = run_espgw(args, name, config_text(case, keys, subnets), "outside", frames)
    expect_drops(stats, **want)
    expect(stats["decapsulated"] == 2, f"decapsulated {stats['decapsulated']}, expected 2 (seq 1, seq 2)")
    sa_drops = sa_stats(stats, SPI_IN)["drops"]
    for k in ("auth_failed", "replay_duplicate"):
        expect(sa_drops[k] == want[k], f"inbound SA drops.{k} = {sa_drops[k]}, expected {want[k]}")
    if case.encap:
        got = (stats["nat_keepalives_received"], stats["local_delivered"], stats["nat_peer_moved"])
        expect(got == (1, 2, 0),
               f"(nat_keepalives_received, local_delivered, nat_peer_moved) = {got}, expected (1, 2, 0):"
               " the keepalive and the IKE message are consumed, and the peer stays where it was")
        want.update(keepalive=1, ike=1)
    return ", ".join(f"{k}={v}" for k, v in want.items())


def udp_extras(case, keys, good, pkt):
    """For a UDP-encapsulated SA, before the good seq-2 packet: seq 2 with a
    ciphertext byte flipped (the UDP checksum is 0, so only the ICV can
    catch it), seq 3 as raw ESP (right keys, no UDP), a keepalive and an IKE
    message behind the non-ESP marker (RFC 3948 §2.2, §2.3)."""
    raw = scapy_sa(case._replace(encap=False), SPI_IN, keys[2], keys[3], PEER, GW_OUTSIDE)
    udp = IP(src=PEER, dst=GW_OUTSIDE) / UDP(sport=NAT_PORT, dport=NAT_PORT)
    ike = bytes(4) + bytes(range(8)) * 2 + bytes([0x21, 0x20, 0x22, 0x08]) + bytes(8)
    return [tampered(good, pkt, 2), raw.encrypt(pkt, seq_num=3),
            IP(bytes(udp / Raw(b"\xff"))), IP(bytes(udp / Raw(ike)))]


def tampered(sa, pkt, seq):
    """`pkt` encrypted by `sa` as sequence number `seq` with one ciphertext
    byte flipped: only the ICV can catch it."""
    esp = sa.encrypt(pkt, seq_num=seq)
    flipped = bytearray(bytes(esp))
    flipped[-20] ^= 0x01
    return esp.__class__(bytes(flipped))


def moved(args, case, keys, name):
    """The peer's NAT mapping is 10.0.0.2:31000, not :4500: espgw takes its
    packets and follows it once; a forgery and a replay from another port
    move nothing."""
    mapped = peer_encryptor(case, keys, sport=NAT_MAPPED_PORT)
    wrong = tuple(bytes(b ^ 0x5A for b in k) for k in keys)
    forger = peer_encryptor(case, wrong, sport=NAT_FORGED_PORT)
    elsewhere = peer_encryptor(case, keys, sport=NAT_FORGED_PORT)
    host_a, host_b = HOSTS[case.inner]
    inner = test_packets(host_b, host_a)[:4]
    esps = [mapped.encrypt(p, seq_num=i + 1) for i, p in enumerate(inner[:3])]
    esps += [forger.encrypt(inner[3], seq_num=4), elsewhere.encrypt(inner[0], seq_num=1)]
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / e for e in esps]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[case.inner]), "outside", frames)
    out, _ = keepalives_out(out, case)
    expect_drops(stats, auth_failed=1, replay_duplicate=1)
    expect(stats["decapsulated"] == 3 and len(out) == 3,
           f"decapsulated {stats['decapsulated']}, forwarded {len(out)}, expected 3 and 3")
    expect(stats["nat_peer_moved"] == 1, f"nat_peer_moved {stats['nat_peer_moved']}, expected 1")
    return "nat_peer_moved=1, forged and replayed from another port ignored"


def policy(args, case, keys, name):
    """Tunnel mode: packets correctly encrypted for the SA whose inner
    addresses its selectors (2001:db8:2::/64 -> 2001:db8:1::/64, or
    192.168.2.0/24 -> 192.168.1.0/24 for inner IPv4) do not admit are
    dropped after decryption (RFC 4301 §5.2 step 4), however good their ICV:
    a source outside the remote subnet, a destination outside the local one,
    and an inner packet of the other family. The good packets before and
    after them are forwarded."""
    sa = peer_encryptor(case, keys)
    host_a, host_b = HOSTS[case.inner]
    stray_src, stray_dst = STRAYS[case.inner]
    other_a, other_b = HOSTS[10 - case.inner]
    good = test_packets(host_b, host_a)
    strays = [test_packets(stray_src, host_a)[0],   # source not in remote_subnet
              test_packets(host_b, stray_dst)[1],   # destination not in local_subnet
              test_packets(other_b, other_a)[2]]    # the other family over the SA
    inner = [good[0]] + strays + [good[1]]
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / sa.encrypt(p, seq_num=i + 1)
              for i, p in enumerate(inner)]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[case.inner]), "outside", frames)
    out, _ = keepalives_out(out, case)
    n = len(strays)
    expect_drops(stats, policy_mismatch=n)
    got = sa_stats(stats, SPI_IN)["drops"]["policy_mismatch"]
    expect(got == n, f"inbound SA drops.policy_mismatch = {got}, expected {n}")
    expect(stats["decapsulated"] == 2, f"decapsulated {stats['decapsulated']}, expected 2 (the good packets)")
    want = [forwarded(good[0]), forwarded(good[1])]
    got = [bytes(f.payload) for f in out]
    expect(got == want, f"forwarded {[g.hex() for g in got]}\n  expected the 2 good packets {[w.hex() for w in want]}")
    return f"policy_mismatch={n}, 2 good packets forwarded"


def tunnel_mtu(case, link_mtu=1500):
    """The largest inner packet the SA's ESP packet carries in `link_mtu`
    bytes, worked out from the transform alone: outer IPv4 (or IPv6) header,
    UDP header if encapsulated, SPI and sequence number, IV, ICV, and
    payload + 2-byte trailer padded to the cipher's block."""
    a = ALGORITHMS[case.alg]
    block = BLOCK.get(a.crypt, 4)
    outer = 20 if case.outer == 4 else 40
    room = link_mtu - outer - (8 if case.encap else 0) - 8 - a.iv_len - a.icv
    return room // block * block - 2


def too_big_packet(host_a, host_b, size):
    """A `size`-byte UDP packet from the inside host, IPv4 with DF clear."""
    if ":" in host_a:
        return IPv6(bytes(IPv6(src=host_a, dst=host_b, hlim=64) / UDP(sport=5555, dport=6000)
                          / Raw((bytes(range(256)) * 6)[: size - 48])))
    return IP(bytes(IP(src=host_a, dst=host_b, id=300, flags=0) / UDP(sport=5555, dport=6000)
                    / Raw((bytes(range(256)) * 6)[: size - 28])))


def too_big(args, case, keys, name):
    """Tunnel mode, inner IPv6 (RFC 4213 §3.2, RFC 8200 §5), or any inner
    packet over IPv6 ends, or IPv6 transport mode: a packet that fits the
    tunnel goes out as one ESP packet of at most 1500 bytes; one byte more
    is not fragmented but
    answered with an ICMPv6 packet-too-big (RFC 4443 §3.2), or for inner
    IPv4 an ICMP fragmentation-needed (RFC 1191) even though its DF is
    clear, from the gateway's inside address, whose MTU is that tunnel MTU.
    An IPv6 inside host solicits the gateway first, so its MAC is known for
    the error."""
    host_a, host_b = HOSTS[case.inner]
    # IPv6 transport keeps the packet's own 40-byte header in front of ESP
    # in place of an outer one: 40 bytes more of the packet fit.
    fits = tunnel_mtu(case) + (40 if is_transport6(case) else 0)
    solicit = [IPv6(src=host_a, dst="ff02::1:ff00:1", hlim=255) / ICMPv6ND_NS(tgt=GW_INSIDE6)
               / ICMPv6NDOptSrcLLAddr(lladdr=MAC[HOST_A])] if case.inner == 6 else []
    inner = [too_big_packet(host_a, host_b, size) for size in (fits, fits + 1)]
    frames = [Ether(src=MAC[HOST_A], dst=MAC[GW_INSIDE]) / p for p in solicit + inner]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[case.inner]), "inside", frames)
    out, _ = keepalives_out(out, case)
    expect_drops(stats, frag_needed=1)
    expect(stats["encapsulated"] == 1, f"encapsulated {stats['encapsulated']}, expected 1")
    if case.inner == 6:
        expect(len(out) == 3, f"{len(out)} frames out, expected 3 (advertisement, ESP, packet-too-big):"
               f" {[f.summary() for f in out]}")
        _advert, esp, error = out
    else:
        expect(len(out) == 2, f"{len(out)} frames out, expected 2 (ESP, fragmentation-needed):"
               f" {[f.summary() for f in out]}")
        esp, error = out
    if case.outer == 4:
        ip = IP(bytes(esp[IP]))
        expect(esp.dst == MAC[PEER] and ip.len <= 1500 and ip.frag == 0 and not ip.flags.MF,
               f"{fits}-byte packet: {esp.dst} outer length {ip.len} fragment {ip.frag}/{ip.flags},"
               " expected one ESP packet")
    else:
        ip = IPv6(bytes(esp.payload))
        size = len(bytes(ip))
        expect(esp.dst == PEER6_MAC and esp.type == ETHERTYPE[6] and ip.nh == 50 and size <= 1500
               and ip.plen == size - 40,
               f"{fits}-byte packet: {esp.dst} type {esp.type:#06x} nh {ip.nh} length {size}"
               f" (payload length {ip.plen}), expected one ESP packet over IPv6 of at most 1500 bytes")
    try:
        plain = peer_decryptor(case, keys).decrypt(ip)
    except Exception as e:
        raise CheckFailed(f"{fits}-byte packet: scapy cannot decrypt: {type(e).__name__}: {e}")
    expect(bytes(plain) == forwarded(inner[0]), f"{fits}-byte packet: decrypted {bytes(plain).hex()}")
    if case.inner == 4:
        return frag_needed(error, inner[1], host_a, fits)
    expect(error.dst == MAC[HOST_A] and error.src == MAC[GW_INSIDE] and error.type == ETHERTYPE[6],
           f"packet-too-big: Ethernet {error.src} -> {error.dst} type {error.type:#06x}")
    err = IPv6(bytes(error.payload))
    ptb = err[ICMPv6PacketTooBig]
    expect((err.src, err.dst, err.nh, ptb.code) == (GW_INSIDE6, host_a, 58, 0),
           f"packet-too-big {err.src} -> {err.dst} nh {err.nh} code {ptb.code}")
    expect(ptb.mtu == fits, f"packet-too-big MTU {ptb.mtu}, expected {fits} (the tunnel's)")
    expect(len(bytes(err)) <= 1280, f"packet-too-big is {len(bytes(err))} bytes, more than 1280")
    icmp = bytes(err)[40:]
    expect(in6_chksum(58, err, icmp) == 0, "packet-too-big: bad ICMPv6 checksum")
    # The quote is the invoking packet, as much as fits (its hop limit may
    # already be the decremented one).
    quote, sent = bytearray(icmp[8:]), bytearray(bytes(inner[1]))
    quote[7] = sent[7] = 0
    expect(len(quote) >= 1280 - 48 and sent.startswith(quote),
           f"packet-too-big quotes {len(quote)} bytes {bytes(quote[:48]).hex()}, not the packet")
    return f"{fits} bytes fit, {fits + 1} answered with packet-too-big mtu={fits}"


def frag_needed(error, sent, host_a, fits):
    """`error` must be the ICMP fragmentation-needed (type 3 code 4, RFC 792
    and RFC 1191 §4) for the IPv4 packet `sent`: from the gateway's inside
    address to the host's MAC, next-hop MTU `fits`, valid checksums, and
    the packet's header and at least 8 bytes beyond it quoted (RFC 1812
    §4.3.2.3: no more than 576 bytes in all)."""
    expect(error.dst == MAC[HOST_A] and error.src == MAC[GW_INSIDE] and error.type == ETHERTYPE[4],
           f"fragmentation-needed: Ethernet {error.src} -> {error.dst} type {error.type:#06x}")
    err = IP(bytes(error.payload))
    raw = bytes(err)
    expect((err.src, err.dst, err.proto) == (GW_INSIDE, host_a, 1),
           f"fragmentation-needed {err.src} -> {err.dst} proto {err.proto}")
    expect(checksum(raw[: err.ihl * 4]) == 0, "fragmentation-needed: bad IPv4 header checksum")
    expect(err.len == len(raw) <= 576, f"fragmentation-needed: total length {err.len}, {len(raw)} bytes,"
           " expected them equal and at most 576")
    icmp = raw[err.ihl * 4:]
    kind, code, _csum, _unused, mtu = struct.unpack("!BBHHH", icmp[:8])
    expect((kind, code) == (3, 4), f"ICMP type {kind} code {code}, expected 3/4 (fragmentation needed)")
    expect(mtu == fits, f"fragmentation-needed next-hop MTU {mtu}, expected {fits} (the tunnel's)")
    expect(checksum(icmp) == 0, "fragmentation-needed: bad ICMP checksum")
    # The quote starts with the packet's header; its TTL (and so its
    # checksum) may already be the decremented one.
    quote, packet = bytearray(icmp[8:]), bytearray(bytes(sent))
    for q in (quote, packet):
        q[8] = q[10] = q[11] = 0
    expect(len(quote) >= 28 and packet.startswith(quote),
           f"fragmentation-needed quotes {len(quote)} bytes {bytes(quote[:28]).hex()}, not the packet")
    return f"{fits} bytes fit, {fits + 1} with DF clear answered with fragmentation-needed mtu={fits}"


def outer6_headers(args, case, keys, name):
    """IPv6 ends (RFC 8200 §4): ESP behind a hop-by-hop and a destination
    options header, or a destination options header alone, is decapsulated
    and forwarded; ESP in a fragmented outer IPv6 packet (a peer may
    fragment its own ESP: Linux does for DF-clear IPv4 in 4-in-6) is
    reassembled, in either order, then decapsulated; overlapping fragments
    of another packet are refused (RFC 5722) and never reach the SA; ESP
    behind a destination option of an unknown type whose bits say discard
    (0x5E, RFC 8200 §4.2) is dropped unopened."""
    sa = peer_encryptor(case, keys)
    host_a, host_b = HOSTS[case.inner]
    inner = test_packets(host_b, host_a)[:5]
    esps = [bytes(sa.encrypt(p, seq_num=i + 1)[ESP]) for i, p in enumerate(inner)]
    outer = IPv6(src=PEER6, dst=GW_OUTSIDE6)
    with_options = outer.copy() / IPv6ExtHdrHopByHop(nh=60) / IPv6ExtHdrDestOpt(nh=50) / Raw(esps[0])
    # The last fragment first.
    fragments = [outer.copy() / IPv6ExtHdrFragment(nh=50, offset=6, m=0, id=0x5EED) / Raw(esps[1][48:]),
                 outer.copy() / IPv6ExtHdrFragment(nh=50, offset=0, m=1, id=0x5EED) / Raw(esps[1][:48])]
    dest_options = outer.copy() / IPv6ExtHdrDestOpt(nh=50) / Raw(esps[2])
    overlapping = [outer.copy() / IPv6ExtHdrFragment(nh=50, offset=0, m=1, id=0xBAD) / Raw(esps[3][:48]),
                   outer.copy() / IPv6ExtHdrFragment(nh=50, offset=5, m=0, id=0xBAD) / Raw(esps[3][40:])]
    discard = outer.copy() / IPv6ExtHdrDestOpt(nh=50, options=[HBHOptUnknown(otype=0x5E, optdata=b"no")]) \
        / Raw(esps[4])
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / IPv6(bytes(p))
              for p in [with_options] + fragments + [dest_options] + overlapping + [discard]]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[case.inner]), "outside", frames)
    # The overlapping fragment and the datagram it joined; the option.
    expect_drops(stats, reassembly_failed=2, ipv6_unknown_option=1)
    expect(stats["decapsulated"] == 3, f"decapsulated {stats['decapsulated']}, expected 3")
    sa_packets = sa_stats(stats, SPI_IN)["packets"]
    expect(sa_packets == 3, f"inbound SA packets {sa_packets}, expected 3")
    want = [forwarded(inner[0]), forwarded(inner[1]), forwarded(inner[2])]
    got = [bytes(f.payload) for f in out]
    expect(got == want, f"forwarded {[g.hex() for g in got]}\n  expected packets 1 to 3 {[w.hex() for w in want]}")
    return ("behind hop-by-hop + destination options and destination options: forwarded; "
            "fragmented (last first): reassembled and forwarded; overlapping: reassembly_failed=2; "
            "behind option 0x5E: ipv6_unknown_option=1")


# IPv6 next-header values of the extension headers (RFC 8200 §4).
HOP_BY_HOP, ROUTING, FRAGMENT, DEST_OPTIONS = 0, 43, 44, 60


def ext_headers6(raw):
    """Walks the extension headers of the IPv6 packet `raw`: yields (the
    header's next-header value, where it starts, its length, where the
    byte naming it is), up to the first header that is not one."""
    nh, at, offset = raw[6], 6, 40
    while nh in (HOP_BY_HOP, ROUTING, FRAGMENT, DEST_OPTIONS):
        length = 8 if nh == FRAGMENT else (raw[offset + 1] + 1) * 8
        yield nh, offset, length, at
        nh, at, offset = raw[offset], offset, offset + length


def esp_place6(raw):
    """Where transport-mode ESP goes in the IPv6 packet `raw` (RFC 4303
    §3.1.1: "after hop-by-hop, routing, and fragmentation extension
    headers"; destination options "could appear before, after, or both"):
    after the last hop-by-hop, routing or fragment header, so destination
    options in front of a routing header (for the destinations it lists,
    RFC 8200 §4.1 note 1) stay in front of ESP and those after it, or with
    no routing header, go inside. Returns (ESP's offset, the offset of the
    byte that names it, 6 when ESP follows the fixed header)."""
    place = (40, 6)
    for nh, offset, length, _at in ext_headers6(raw):
        if nh != DEST_OPTIONS:
            place = (offset + length, offset)
    return place


def esp_at6(raw):
    """Where the ESP header of the IPv6 packet `raw` is, after its
    extension headers: (offset, the offset of the byte naming it), or None
    if the chain does not end in ESP."""
    nh, at, offset = raw[6], 6, 40
    for _nh, start, length, _at in ext_headers6(raw):
        nh, at, offset = raw[start], start, start + length
    return (offset, at) if nh == 50 else None


def transport_len(case, header_len, protected_len):
    """The length of a transport-mode ESP packet that keeps `header_len`
    bytes of headers in front of ESP and protects `protected_len`: SPI and
    sequence number, IV, the protected bytes and the 2-byte trailer padded
    to the cipher's block (the least padding, as both scapy and espgw
    pad), ICV."""
    a = ALGORITHMS[case.alg]
    block = BLOCK.get(a.crypt, 4)
    return header_len + 8 + a.iv_len + -(-(protected_len + 2) // block) * block + a.icv


def ext_header_packets6(src, dst):
    """(what, packet): IPv6 packets with extension headers in front of
    their upper layer, to see where transport-mode ESP goes: after a
    hop-by-hop header (an option of an unknown type that routers skip,
    RFC 8200 §4.2), a lone destination options header, both, and
    destination options around a routing header (type 0 with no segments
    left, which a router forwards as it is, RFC 5095 §3)."""
    hbh = IPv6ExtHdrHopByHop(options=[HBHOptUnknown(otype=0x1E, optdata=b"espgw!")])
    ip = IPv6(src=src, dst=dst, hlim=64)
    pkts = [("hop-by-hop", ip.copy() / hbh.copy() / UDP(sport=5100, dport=6000) / Raw(b"behind hop-by-hop")),
            ("destination options", ip.copy() / IPv6ExtHdrDestOpt() / UDP(sport=5101, dport=6000)
             / Raw(b"behind destination options")),
            ("hop-by-hop + destination options", ip.copy() / hbh.copy() / IPv6ExtHdrDestOpt()
             / TCP(sport=40001, dport=80, flags="PA", seq=1000, ack=2000) / Raw(b"tcp!" * 3)),
            ("destination options + routing + destination options", ip.copy() / IPv6ExtHdrDestOpt()
             / IPv6ExtHdrRouting(type=0, segleft=0, addresses=[]) / IPv6ExtHdrDestOpt()
             / ICMPv6EchoRequest(id=8, seq=2, data=b"ping" * 4))]
    return [(what, IPv6(bytes(p))) for what, p in pkts]


def transport6_packets(src, dst):
    """The 12 `test_packets6` (UDP of every padding length, TCP, ICMPv6
    echo with a traffic class and a flow label) and the 4
    `ext_header_packets6`, as (what, packet)."""
    plain = [(f"packet {i}", p) for i, p in enumerate(test_packets6(src, dst))]
    return plain + ext_header_packets6(src, dst)


def encrypt_after_fixed_header(sa, pkt, seq):
    """`pkt` encrypted by scapy's transport-mode `sa` with ESP straight
    after the fixed IPv6 header, whatever extension headers follow it:
    scapy itself puts ESP after every destination options header not
    behind a routing header (Linux's choice, `split_for_transport`), so its
    split is replaced for this one call; the ESP is scapy's own."""
    def split(orig, proto):
        header = IPv6(bytes(orig))
        payload, nh = header.payload, header.nh
        header.nh = proto
        header.remove_payload()
        del header.plen
        return header, nh, payload
    saved, ipsec.split_for_transport = ipsec.split_for_transport, split
    try:
        return sa.encrypt(pkt, seq_num=seq)
    finally:
        ipsec.split_for_transport = saved


def transport6_scapy_to_espgw(args, case, keys, name):
    """IPv6 transport, scapy as the peer: the hosts' packets 2001:db8:2::20
    -> 2001:db8:1::10 with ESP inserted by scapy (after any hop-by-hop and
    routing header and, scapy's choice, destination options not behind a
    routing header), and once more the lone destination options packet
    with ESP in front of its destination options (espgw's own choice; RFC
    4303 §3.1.1 allows both). espgw must take the ESP of our inbound SPI though
    the destination is not its address, remove it, and forward exactly the
    packet scapy encrypted with hop limit - 1 to the inside host."""
    sa = peer_encryptor(case, keys)
    named = transport6_packets(HOST_B6, HOST_A6)
    esps = [sa.encrypt(p, seq_num=i + 1) for i, (_, p) in enumerate(named)]
    lone = next(p for what, p in named if what == "destination options")
    esps.append(encrypt_after_fixed_header(sa, lone, len(esps) + 1))
    inner = [p for _, p in named] + [lone]
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / e for e in esps]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[6]), "outside", frames)
    n = len(inner)
    expect_drops(stats)
    expect(stats["decapsulated"] == n, f"decapsulated {stats['decapsulated']}, expected {n}")
    sa_packets = sa_stats(stats, SPI_IN)["packets"]
    expect(sa_packets == n, f"inbound SA packets {sa_packets}, expected {n}")
    expect(stats["local_delivered"] == 0, f"local_delivered {stats['local_delivered']}, expected 0")
    expect(len(out) == n, f"{len(out)} frames out, expected {n}")
    for i, (frame, pkt) in enumerate(zip(out, inner)):
        expect(frame.dst == HOST_A6_MAC and frame.src == MAC[GW_INSIDE] and frame.type == ETHERTYPE[6],
               f"packet {i}: Ethernet {frame.src} -> {frame.dst} type {frame.type:#06x},"
               f" expected {MAC[GW_INSIDE]} -> {HOST_A6_MAC} type {ETHERTYPE[6]:#06x}")
        got, want = bytes(frame.payload), forwarded(pkt)
        expect(got == want, f"packet {i}: forwarded {got.hex()}\n  expected {want.hex()}")
    places = [esp_at6(bytes(e))[0] for e in esps[-5:]]
    return (f"{n} packets, 5 with extension headers, ESP at offsets {places}"
            " (scapy's placements, then espgw's for lone destination options)")


def transport6_espgw_to_scapy(args, case, keys, name):
    """IPv6 transport, espgw as the sender: the hosts' packets
    2001:db8:1::10 -> 2001:db8:2::20 from inside go out to the peer's MAC
    with ESP where `esp_place6` puts it; in front of it exactly the
    packet's own headers with hop limit - 1 (not `outer_ttl`), traffic
    class and flow label kept, the payload length of the ESP packet and 50
    in the byte that named what ESP now protects; the ESP trailer's next
    header is what that byte said. scapy decrypts every ESP (the SPI,
    sequence numbers 1, 2, ..., the IVs) to the rest of the packet; and
    scapy's own encryption of the same packet puts ESP at the same place,
    at the same length, except for destination options not behind a
    routing header, which scapy leaves in front of ESP and espgw puts
    inside it: RFC 4303 §3.1.1 allows both, and finds espgw's "generally
    desirable" (ESP protects only what follows it); the PASS line names
    those packets."""
    a = ALGORITHMS[case.alg]
    named = transport6_packets(HOST_A6, HOST_B6)
    inner = [p for _, p in named]
    frames = [Ether(src=MAC[HOST_A], dst=MAC[GW_INSIDE]) / p for p in inner]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[6]), "inside", frames)
    n = len(inner)
    expect_drops(stats)
    expect(stats["encapsulated"] == n, f"encapsulated {stats['encapsulated']}, expected {n}")
    expect(len(out) == n, f"{len(out)} frames out, expected {n}")
    sa, ivs, differ = peer_decryptor(case, keys), [], []
    for i, (frame, (what, pkt)) in enumerate(zip(out, named)):
        expect(frame.dst == PEER6_MAC and frame.src == MAC[GW_OUTSIDE] and frame.type == ETHERTYPE[6],
               f"{what}: Ethernet {frame.src} -> {frame.dst} type {frame.type:#06x},"
               f" expected {MAC[GW_OUTSIDE]} -> {PEER6_MAC} type {ETHERTYPE[6]:#06x}")
        raw, want = bytes(frame.payload), forwarded(pkt)
        expect(len(raw) <= 1500, f"{what}: {len(raw)} bytes, more than the outside MTU 1500")
        expect(len(raw) - 40 == struct.unpack("!H", raw[4:6])[0],
               f"{what}: payload length {struct.unpack('!H', raw[4:6])[0]}, the packet has {len(raw) - 40}")
        found, (off, at) = esp_at6(raw), esp_place6(want)
        expect(found == (off, at), f"{what}: ESP at {found} (offset, byte naming it), expected {(off, at)}:"
               f" {raw[:off + 8].hex()}")
        head = bytearray(want[:off])
        head[4:6] = struct.pack("!H", len(raw) - 40)
        head[at] = 50
        expect(raw[:off] == bytes(head), f"{what}: headers in front of ESP {raw[:off].hex()}\n"
               f"  expected {bytes(head).hex()} (the packet's own, hop limit - 1, next header 50)")
        esp = ESP(raw[off:])
        expect(esp.spi == SPI_OUT and esp.seq == i + 1,
               f"{what}: SPI {esp.spi:#x} seq {esp.seq}, expected {SPI_OUT:#x} seq {i + 1}")
        ivs.append(bytes(esp.data[: a.iv_len]))
        # ESP's ICV covers none of the IP header (RFC 4303 §2): scapy
        # decrypts it behind the bare fixed header. (Behind extension
        # headers scapy 2.x would parse the plaintext as the class the fixed
        # header's next header names, a hop-by-hop header for UDP, say.)
        shell = IPv6(raw[:40])
        shell.nh, shell.plen = 50, None
        shell = IPv6(bytes(shell / Raw(raw[off:])))
        try:
            plain = sa.decrypt(shell)
        except Exception as e:
            raise CheckFailed(f"{what} (seq {esp.seq}): scapy cannot decrypt: {type(e).__name__}: {e}")
        expect(plain.nh == want[at], f"{what}: ESP next header {plain.nh}, expected {want[at]}")
        got = bytes(plain)[40:]
        expect(got == want[off:], f"{what}: decrypted {got.hex()}\n  expected {want[off:].hex()}")
        size = transport_len(case, off, len(want) - off)
        expect(len(raw) == size, f"{what}: {len(raw)} bytes, expected {size} (the least padding)")
        # scapy's own ESP for the same packet: at the same place, or (its
        # choice) behind destination options that espgw protects.
        theirs = bytes(sa.encrypt(IPv6(want), seq_num=i + 1))
        place = esp_at6(theirs)
        if place != (off, at):
            behind = (off + (want[off + 1] + 1) * 8, off)
            expect(want[at] == DEST_OPTIONS and place == behind,
                   f"{what}: scapy puts ESP at {place}, espgw at {(off, at)}")
            differ.append(what)
        size = transport_len(case, place[0], len(want) - place[0])
        expect(len(theirs) == size, f"{what}: scapy's ESP packet {len(theirs)} bytes, expected {size}")
    if a.aead:
        for i, iv in enumerate(ivs):
            expect(iv == struct.pack("!Q", i + 1), f"packet {i}: IV {iv.hex()} is not the sequence number {i + 1}")
    elif a.iv_len:
        expect(len(set(ivs)) == n, f"CBC IVs repeat: {[iv.hex() for iv in ivs]}")
    return (f"{n} packets; ESP where scapy puts it but for {' and '.join(differ)}:"
            " their destination options inside ESP here, in front of it in scapy (both RFC 4303 §3.1.1)")


def transport6_policy(args, case, keys, name):
    """IPv6 transport: correctly encrypted packets of our inbound SPI
    whose addresses the SA's selectors (2001:db8:2::/64 -> 2001:db8:1::/64)
    do not admit are taken (transport ESP is found by SPI alone, whatever
    the destination), decrypted and dropped (RFC 4301 §5.2 step 4): a
    source outside 2001:db8:2::/64, a destination outside 2001:db8:1::/64;
    the SA counts both. ESP with an SPI no SA has between the hosts is not
    the gateway's to decrypt: the inbound policy says that traffic must
    come protected, so it is dropped as plaintext that should not be
    (RFC 4301 §5.2, `policy_mismatch` on no SA). IPv4 ESP to the gateway
    with the IPv6 SA's SPI finds no SA (transport ESP is found within the
    SA's family): `unknown_spi`. The good packets around them are
    forwarded."""
    sa = peer_encryptor(case, keys)
    stranger = peer_encryptor(case, keys, spi=SPI_UNKNOWN)
    v4 = scapy_sa(case, SPI_IN, keys[2], keys[3], PEER, GW_OUTSIDE)
    stray_src, stray_dst = STRAYS[6]
    good = test_packets(HOST_B6, HOST_A6)
    strays = [sa.encrypt(test_packets(stray_src, HOST_A6)[0], seq_num=2),   # source not in remote_subnet
              sa.encrypt(test_packets(HOST_B6, stray_dst)[1], seq_num=3),   # destination not in local_subnet
              stranger.encrypt(good[2], seq_num=1),                          # no SA's SPI, between the hosts
              v4.encrypt(test_packets(PEER, GW_OUTSIDE)[3], seq_num=4)]     # IPv4 with the IPv6 SA's SPI
    esps = [sa.encrypt(good[0], seq_num=1)] + strays + [sa.encrypt(good[1], seq_num=5)]
    frames = [Ether(src=MAC[PEER], dst=MAC[GW_OUTSIDE]) / e for e in esps]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[6]), "outside", frames)
    expect_drops(stats, policy_mismatch=3, unknown_spi=1)
    got = sa_stats(stats, SPI_IN)["drops"]["policy_mismatch"]
    expect(got == 2, f"inbound SA drops.policy_mismatch = {got}, expected 2 (the strays it decrypted)")
    expect(stats["decapsulated"] == 2, f"decapsulated {stats['decapsulated']}, expected 2 (the good packets)")
    want = [forwarded(good[0]), forwarded(good[1])]
    got = [bytes(f.payload) for f in out]
    expect(got == want, f"forwarded {[g.hex() for g in got]}\n  expected the 2 good packets {[w.hex() for w in want]}")
    return "policy_mismatch=3 (2 on the SA), unknown_spi=1, 2 good packets forwarded"


def transport6_refused(args, case, keys, name):
    """IPv6 transport, outbound: what transport mode cannot carry is
    dropped `unsupported` between two good packets that go out: a first
    and a later fragment (RFC 4301 §4.1: transport mode carries whole
    packets; IPv6 is not reassembled on the way), and packets whose ESP
    would protect next header 59 (RFC 4303 §2.6: the peer would discard it
    as a dummy), straight after the fixed header or after a hop-by-hop
    header."""
    good = test_packets6(HOST_A6, HOST_B6)
    ip = IPv6(src=HOST_A6, dst=HOST_B6, hlim=64)
    udp = bytes(UDP(sport=5555, dport=6000) / Raw(bytes(range(64))))
    refused = [ip.copy() / IPv6ExtHdrFragment(nh=17, offset=0, m=1, id=0xF00D) / Raw(udp[:32]),
               ip.copy() / IPv6ExtHdrFragment(nh=17, offset=4, m=0, id=0xF00D) / Raw(udp[32:]),
               ip.copy() / IPv6ExtHdrFragment(nh=17, offset=0, m=0, id=0xF00E) / Raw(udp),
               IPv6(src=HOST_A6, dst=HOST_B6, hlim=64, nh=59) / Raw(b"dummy"),
               ip.copy() / IPv6ExtHdrHopByHop(nh=59) / Raw(b"dummy")]
    inner = [good[0]] + [IPv6(bytes(p)) for p in refused] + [good[10]]
    frames = [Ether(src=MAC[HOST_A], dst=MAC[GW_INSIDE]) / p for p in inner]
    out, stats = run_espgw(args, name, config_text(case, keys, SUBNETS[6]), "inside", frames)
    expect_drops(stats, unsupported=len(refused))
    expect(stats["encapsulated"] == 2, f"encapsulated {stats['encapsulated']}, expected 2")
    expect(len(out) == 2, f"{len(out)} frames out, expected 2: {[f.summary() for f in out]}")
    sa = peer_decryptor(case, keys)
    for i, (frame, pkt) in enumerate(zip(out, (good[0], good[10]))):
        try:
            plain = sa.decrypt(IPv6(bytes(frame.payload)))
        except Exception as e:
            raise CheckFailed(f"good packet {i}: scapy cannot decrypt: {type(e).__name__}: {e}")
        expect(bytes(plain) == forwarded(pkt), f"good packet {i}: decrypted {bytes(plain).hex()}")
    return (f"unsupported={len(refused)} (first, later and atomic fragment, next header 59 twice),"
            " 2 good packets sent")


def run_case(args, case, direction, check):
    label = f"{case_label(case)} {direction}"
    name = label.replace(" ", "_").replace(">", "").replace("=", "")
    try:
        result = check(args, case, case_keys(case), name)
    except CheckFailed as e:
        print(f"FAIL {label}: {e}", flush=True)
        return False
    except Exception as e:  # a crash in a check is that case's failure, not the run's
        print(f"FAIL {label}: {type(e).__name__}: {e}", flush=True)
        return False
    detail = f"{result} packets" if isinstance(result, int) else result
    print(f"PASS {label} ({detail})", flush=True)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--espgw", type=Path, required=True, help="the espgw binary")
    parser.add_argument("--workdir", type=Path, required=True, help="where configs and captures go")
    parser.add_argument("-k", "--filter", default="", help="only cases whose label contains this")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    checks = (("scapy->espgw", scapy_to_espgw), ("espgw->scapy", espgw_to_scapy), ("negative", negative))
    cases = [Case(alg, mode, esn) for alg in ALGORITHMS for mode in MODES for esn in (False, True)]
    cases += [Case(alg, "tunnel", esn, encap=True) for alg in NAT_ALGORITHMS for esn in (False, True)]
    cases += [Case(alg, "tunnel", esn, encap, inner=6)
              for alg in INNER6_ALGORITHMS for encap in (False, True) for esn in (False, True)]
    runs = [(case, direction, check) for case in cases for direction, check in checks]
    runs += [(case, "moved", moved) for case in cases if case.encap and not case.esn]
    runs += [(case, direction, check) for case in cases if case.inner == 6 and not case.esn
             for direction, check in (("policy", policy), ("too-big", too_big))]
    # IPv6 ends: tunnel mode, raw ESP only (no UDP encapsulation over IPv6).
    cases6 = [Case(alg, "tunnel", esn, inner=inner, outer=6)
              for alg in OUTER6_ALGORITHMS for inner in (4, 6) for esn in (False, True)]
    runs += [(case, direction, check) for case in cases6 for direction, check in checks]
    runs += [(case, direction, check) for case in cases6 if not case.esn
             for direction, check in (("policy", policy), ("too-big", too_big), ("ext-headers", outer6_headers))]
    # IPv6 transport mode (RFC 4303 §3.1.1) between the hosts' networks.
    cases6t = [Case(alg, "transport", esn, inner=6, outer=6) for alg in TRANSPORT6_ALGORITHMS for esn in (False, True)]
    checks6t = (("scapy->espgw", transport6_scapy_to_espgw), ("espgw->scapy", transport6_espgw_to_scapy),
                ("negative", negative))
    runs += [(case, direction, check) for case in cases6t for direction, check in checks6t]
    runs += [(case, direction, check) for case in cases6t if not case.esn
             for direction, check in (("policy", transport6_policy), ("too-big", too_big),
                                      ("refused", transport6_refused))]
    results = [run_case(args, case, direction, check) for case, direction, check in runs
               if args.filter in f"{case_label(case)} {direction}"]
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if results and passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
