#!/usr/bin/env python3
"""espgw against Linux kernel IPsec (XFRM) in the linux-peer VM.

Driven by scripts/linux-interop.sh, which builds the topology first:

    netns lphost                netns lpeer                        qemu (TCG)
    192.168.1.10 eth0 ── veth ── lpin0 [espgw run] lptap0 ── tap ── eth0 10.99.0.2
                                  inside 192.168.1.1   outside 10.99.0.1   prot0 192.168.2.1
    (IPv6: 2001:db8:1::10)        2001:db8:1::1       2001:db8:99::1     2001:db8:99::2 (eth0)
                                                                         2001:db8:2::1 (prot0)

The host kernel in lpeer holds only 10.99.0.3 on the tap (the VM's control
port is reached from there); 10.99.0.1 is espgw's alone, with its own MAC, so
the host kernel neither answers its ARP nor sees its ESP (frames for another
MAC are PACKET_OTHERHOST to it). espgw reads the tap promiscuously, so it
also sees the VM's replies on the control channel (10.99.0.2 -> 10.99.0.3),
addressed to the tap's MAC: it drops them as `other_host` (a discard policy
for them, counted as `policy_discard`, stays as a second guard). These are
the only drops allowed.

For each case the VM's SAs are reconfigured with `lp-xfrm` over the control
port (no reboot), one `espgw run` is started with the matching config, ping
runs both ways (host -> VM and VM -> host, 56 and 1400 bytes, >16 packets
each way so that ESN cases cross 2^32), and then:
  - every ping is answered;
  - /proc/net/xfrm_stat in the VM has not moved (no integrity, replay,
    protocol, state or policy errors);
  - `ip -s xfrm state`: replay 0, failed 0 on both SAs, and the packets each
    kernel SA counted equal those of the matching espgw SA;
  - espgw's counters: no drops except other_host/policy_discard (control channel), no
    kernel socket drops, no engine errors;
  - ESN: both kernel SAs and both espgw SAs are past 2^32.
UDP encapsulation (RFC 3948, `encap = "udp"` in espgw, `encap espinudp 4500
4500 0.0.0.0` on the VM's SAs, which lp-xfrm pairs with a UDP_ENCAP_ESPINUDP
socket on 4500): tunnel mode with GCM, CBC-SHA1 and rfc7539esp
chacha20poly1305 (and CBC-SHA1 with ESN across 2^32), the same checks, and
also: both kernel SAs say `encap type espinudp sport 4500 dport 4500`;
XfrmInStateMismatch stays 0 (the kernel refuses raw ESP to an encapsulated
SA, so espgw's ESP arrived in UDP); espgw's NAT keepalives reached the VM
(nat_keepalives_sent >= 1; the kernel's encap socket eats them); espgw's
peer did not move (nat_peer_moved 0: the VM sends from 4500).
Negative cases: wrong keys (the kernel's XfrmInStateProtoError and the SA's
`failed` count the packets; espgw counts auth_failed), wrong SPIs
(XfrmInNoStates; espgw's unknown_spi).

IPv6 inside IPv4 ("6-in-4", tunnel mode, the cases named `6in4-*`, run
last): the outer addresses stay 10.99.0.1 <-> 10.99.0.2; the policies select

    2001:db8:1::/64 (lphost's eth0 2001:db8:1::10, espgw's inside 2001:db8:1::1)
    2001:db8:2::/64 (the VM's prot0 2001:db8:2::1)

Before the first of them the driver gives lphost's eth0 and the VM's prot0
their IPv6 addresses (lphost routes ::/0 via 2001:db8:1::1) and lets IPv6
through the VM's eth0, where XFRM hands it the decapsulated packets. Neither
eth0 gets a link-local address, DAD, router solicitations or RA: no IPv6
reaches espgw but the traffic below and neighbour discovery for
2001:db8:1::1/::10 (lpeer, espgw's namespace, keeps IPv6 off). espgw's
inside gets `address6 = "2001:db8:1::1/64"`, the tunnel IPv6 subnets. The
VM's SAs are lp-xfrm's (algorithms, keys, SPIs, ESN, replay, UDP
encapsulation; its `dry=1` output replayed) with `sel src .. dst ..` for
the IPv6 subnets added (without one, a state takes its outer family's inner
packets only: XfrmInStateMismatch / XfrmOutNoStates), lp-xfrm's IPv6
policies (IPv6 selector, IPv4 tunnel template), and a route for
2001:db8:1::/64 on eth0 in place of lp-xfrm's IPv4 one. espgw is started
with `--workers 2`: it must say that IPv6 tunnels take one worker and run one.
Traffic, after lphost's path MTU to 2001:db8:2::1 is forgotten (its default
route made again):
  - host -> VM 12 x 56 bytes with traffic class 0xb8 (DSCP EF);
  - packet too big: one 1-byte-too-large probe (`-M do`) is answered by
    ICMPv6 packet-too-big from 2001:db8:1::1 with the tunnel MTU worked
    out here from the transform (1500 - outer IPv4 - [UDP] - ESP header - IV
    - ICV, padded down to the block, - 2), and lphost's route to
    2001:db8:2::1 then carries that MTU; espgw's frag_needed equals the
    too-big errors a sniffer in lphost receives (the probe's, and one per
    other packet lphost sent over the MTU, each quoting a packet longer
    than the MTU it announces), plus at most the errors its token bucket
    held back (icmp_rate_limited);
  - host -> VM 3 x exactly the tunnel MTU (`-M do`: unfragmented) and 3 x
    1500-byte IPv6 packets, which lphost now fragments to the learnt MTU;
  - VM -> host 12 x 56 bytes, 3 x the tunnel MTU, 3 x 1500 bytes (the VM's
    kernel fragments before XFRM; lphost's replies use the learnt MTU);
  - every one answered; the checks of the IPv4 tunnel cases (VM
    xfrm_stat unmoved, SA replay/failed 0, equal packet counts, ESN past
    2^32, no espgw drops but the control channel's and that one
    frag_needed; `unsupported` 0 means no IPv6 chatter got in);
  - a sniffer on the tap (in lpeer) sees espgw's ESP to the VM: outer TOS
    0xb8 on at least the 12 marked requests and 0 otherwise (the traffic
    class copied), DF clear on all (RFC 4213 §3.2.1), none longer than
    1500 bytes and the longest exactly what the tunnel MTU's packet makes.
The ESP trailer's next header (41) is checked by the VM: its kernel takes
the inner packet as IPv6 for 41 only (anything else would not pass the
IPv6 policy and would move xfrm_stat). 6-in-4 wrong-key cases (GCM,
CBC-SHA1) check the negative side as for IPv4.

IPv6 ends (the cases named `4in6-*`, `6in6-*` and `ip6-*`, run after the
6-in-4 ones): before the first of them the VM's eth0 gets 2001:db8:99::2/64
(IPv6 is on there already, with no link-local address, DAD, RS or RA), and
espgw's outside `address6 = "2001:db8:99::1/64"`, the tunnel's `local`;
`remote` is 2001:db8:99::2. No static neighbours: espgw resolves the VM by
NS/NA and the VM resolves espgw (espgw counts the VM's NS and NA as
delivered, not dropped). Keys only (no `secret`), raw ESP (no NAT-T over
IPv6). The VM's SAs are lp-xfrm's `dry=1` commands replayed as for 6-in-4:
  - 4-in-6 (192.168.1.0/24 <-> 192.168.2.0/24) and 6-in-6 (the 6-in-4
    networks) in tunnel mode: states 2001:db8:99::2 <-> 2001:db8:99::1 with
    `sel` for the networks, policies with `tmpl src 2001:db8:99::2 dst
    2001:db8:99::1 proto esp mode tunnel` (and back); the VM's route to
    2001:db8:1::/64 goes via 2001:db8:99::1 (4-in-6 keeps the boot's
    192.168.1.0/24 via 10.99.0.1: XFRM sends by the route to the outer
    address);
  - IPv6 transport mode, host to host as the IPv4 transport cases: SAs and
    policies between 2001:db8:2::1 (the VM's prot0) and 2001:db8:1::10
    (lphost), any protocol, /128 (lp-xfrm writes /32), and a route to
    2001:db8:1::/64 via 2001:db8:99::1 from 2001:db8:2::1, so that the VM's
    kernel puts ESP into what it sends lphost and sends it to espgw; espgw's
    tunnel between the ends in transport mode selects 2001:db8:1::10/128 <->
    2001:db8:2::1/128 and routes 2001:db8:2::/64 via 2001:db8:99::2.
aes128gcm16, aes128-sha1 and chacha20poly1305 in each of 4-in-6 and 6-in-6
(ESN across 2^32 with aes128-sha1 in 4-in-6 and chacha20poly1305 in 6-in-6),
IPv6 transport with aes128gcm16 and aes128-sha1 (ESN); the ESN cases also
set `outer_ttl = 200`. Traffic and checks as for 6-in-4 (espgw again asked
for 2 workers), with the tunnel MTU of a 40-byte outer header (transport:
the packet's own 40-byte header stays outside the padding: 1466 with GCM,
1462 with CBC-SHA1), and for inner IPv4 lphost's pings with TOS 0xb8 and the
probe answered by fragmentation needed from 192.168.1.1. No pings over the
tunnel MTU in 4-in-6 and transport mode: there Linux encrypts an IPv4
packet whole and fragments the outer IPv6 packet (4-in-6: its echo requests
and its replies to lphost's reassembled fragments), or fragments the ESP
packet (transport), and espgw does not reassemble IPv6 and drops such
fragments (as `unsupported` when they are for 2001:db8:99::1; the ones of
transport mode, between the hosts, as `policy_mismatch`); nor does
transport mode carry lphost's fragments (RFC 4301 §4.1: `unsupported`).
The sniffer on the tap checks espgw's IPv6 packets to the VM
(2001:db8:99::1 -> ::2; transport: 2001:db8:1::10 -> 2001:db8:2::1),
neighbour discovery and echo replies aside: next header 50 right after the fixed header on
every one (no fragment or other extension header), hop limit 64, or 200
with outer_ttl (transport: lphost's 64 less espgw's hop, 63, whatever
outer_ttl), traffic class 0xb8 on at least the 12 marked requests and 0
otherwise, flow label 0 (tunnel mode; transport keeps lphost's), the
longest exactly what the tunnel MTU's packet makes (1500 bytes with these
proposals). Neighbour discovery, seen by the same sniffer: espgw (which
starts with no neighbours) solicits 2001:db8:99::2 for its first ESP and
the VM answers; then the VM forgets espgw's MAC (learnt from that
solicitation), pings 2001:db8:99::1 (in the clear, under bypass policies
on espgw's side; 2 answered, counted with the rest), so solicits it and
espgw answers, and the VM's entry holds espgw's MAC. Wrong keys in 4-in-6 (chacha20poly1305), 6-in-6 (GCM) and transport
(CBC-SHA1) check the negative side as for IPv4.

Prints one line per case and a table at the end; exits 1 if any case failed.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

VM = "10.99.0.2"
VM_PROT = "192.168.2.1"
HOST = "192.168.1.10"
ESPGW_MAC_OUT = "02:00:00:63:00:01"
ESPGW_MAC_IN = "02:00:00:01:01:01"
START = 0xFFFFFFF0  # ESN cases: both directions start 16 below 2^32

# 6-in-4: IPv6 networks at both ends of the IPv4 tunnel 10.99.0.1 <-> VM.
NET6_GW = "2001:db8:1::/64"  # espgw's inside, lphost's eth0
NET6_VM = "2001:db8:2::/64"  # the VM's prot0
GW6 = "2001:db8:1::1"
HOST6 = "2001:db8:1::10"
VM_PROT6 = "2001:db8:2::1"
LINK_MTU = 1500  # lptap0's, which espgw takes as its outside MTU
TCLASS = 0xB8  # DSCP EF, ECN not-ECT: the outer TOS must be this exactly

# IPv6 ends (4-in-6, 6-in-6, IPv6 transport mode): espgw's outside address6
# on the tap and the VM's eth0.
GW_OUT6 = "2001:db8:99::1"
VM6 = "2001:db8:99::2"
OUTER_TTL = 200  # `[gateway] outer_ttl` of the ESN cases over IPv6 ends

# espgw proposal -> (lp-xfrm alg, enc key bytes, auth key bytes)
ALGS = {
    "aes128gcm16": ("gcm", 20, 0),
    "aes256gcm16": ("gcm256", 36, 0),
    "chacha20poly1305": ("chacha", 36, 0),  # rfc7539esp(chacha20,poly1305)
    "aes128-sha1": ("aes-sha1", 16, 20),
    "aes256-sha256": ("aes-sha256", 32, 32),  # lp-xfrm's aes-sha256 with AES-256 keys given explicitly
    "3des-sha1": ("3des-sha1", 24, 20),
    "null-sha1": ("null-sha1", 0, 20),
}
MODES = ("tunnel", "transport")

# espgw proposal -> (IV, ICV, block the padding aligns to) on the wire, for
# the tunnel MTU (RFC 4303 §2.4: at least 4-byte alignment).
OVERHEAD = {
    "aes128gcm16": (8, 16, 4),
    "aes256gcm16": (8, 16, 4),
    "chacha20poly1305": (8, 16, 4),
    "aes128-sha1": (16, 12, 16),
    "aes256-sha256": (16, 16, 16),
    "3des-sha1": (8, 12, 8),
    "null-sha1": (0, 12, 4),
}


def tunnel_mtu(alg, encap=False, outer=4, mode="tunnel"):
    """(the largest inner packet the SA carries unfragmented over a LINK_MTU
    link, the outer length of that packet's ESP). Tunnel mode: outer IPv4 or
    IPv6 header, [UDP], ESP header, IV, ICV, the padding to the block and the
    trailer's 2 bytes. Transport mode between IPv6 ends: the packet's own
    40-byte header stays in front of ESP, outside the padding."""
    iv, icv, block = OVERHEAD[alg]
    kept = 40 if mode == "transport" else 0
    fixed = (20 if outer == 4 else 40) + (8 if encap else 0) + 8 + iv + icv
    mtu = (LINK_MTU - fixed) // block * block - 2 + kept
    return mtu, fixed + -(-(mtu - kept + 2) // block) * block


# Runs in netns lpeer: takes the first ESP frame espgw sends to the VM on the
# tap (SPI 0x1002) and sends it to the VM three more times.
REPLAYER = r"""
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("lptap0", 0))
s.settimeout(10)
print("ready", flush=True)
deadline = time.time() + 10
while time.time() < deadline:
    frame, addr = s.recvfrom(4096)
    ip = frame[14:]
    hl = (ip[0] & 15) * 4
    if ip[9] == 50 and ip[16:20] == bytes([10, 99, 0, 2]) and ip[hl:hl + 4] == (0x1002).to_bytes(4, "big"):
        seq = int.from_bytes(ip[hl + 4:hl + 8], "big")
        for _ in range(3):
            s.send(frame)
        print(f"replayed ESP seq {seq} to the VM 3 times")
        sys.exit(0)
print("no ESP frame to replay")
sys.exit(1)
"""


# Runs in netns lpeer: watches what espgw sends the VM on the tap (ESP, or
# ESP in UDP 4500 but not keepalives) until its stdin closes, then prints a
# summary of the outer IPv4 headers as JSON.
OUTER_SNIFFER = r"""
import json, select, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("lptap0", 0))
print("ready", flush=True)
tos, df, frames, longest = {}, 0, 0, 0
while True:
    ready, _, _ = select.select([s, sys.stdin], [], [])
    if sys.stdin in ready:
        break
    frame = s.recv(65535)
    ip = frame[14:]
    if frame[12:14] != b"\x08\x00" or ip[12:16] != bytes([10, 99, 0, 1]) or ip[16:20] != bytes([10, 99, 0, 2]):
        continue
    hl = (ip[0] & 15) * 4
    length = int.from_bytes(ip[2:4], "big")
    udp_esp = ip[9] == 17 and ip[hl + 2:hl + 4] == (4500).to_bytes(2, "big") and length - hl > 9
    if ip[9] != 50 and not udp_esp:
        continue
    frames += 1
    tos[f"{ip[1]:#04x}"] = tos.get(f"{ip[1]:#04x}", 0) + 1
    df += bool(ip[6] & 0x40)
    longest = max(longest, length)
print(json.dumps({"frames": frames, "tos": tos, "df": df, "longest": longest}))
"""


# Runs in netns lpeer: watches the IPv6 packets from argv[1] to argv[2] that
# espgw sends the VM on the tap (neighbour discovery and its echo replies
# aside) until its stdin closes, then prints a summary of their fixed
# headers as JSON: what came after the fixed header when it was not ESP (a
# fragment header would be 44), traffic classes, hop limits, how many had a
# flow label, the longest; and the neighbour solicitations and
# advertisements seen, either way, by sender and target ("ns SRC for
# TARGET": count).
# Runs in netns lphost: the too-big errors espgw sends lphost (ICMPv6 packet
# too big, ICMP fragmentation needed) until stdin closes, then prints them as
# JSON: for each the MTU it announces and what it quotes (the refused
# packet's length, next protocol, and ICMP type and sequence when it is one),
# so an error beyond the probe is explained, and one for a packet that fit
# is caught.
TOO_BIG_SNIFFER = r"""
import json, select, socket, sys
gw4, gw6 = socket.inet_pton(socket.AF_INET, sys.argv[1]), socket.inet_pton(socket.AF_INET6, sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("eth0", 0))
print("ready", flush=True)
seen = []
while True:
    ready, _, _ = select.select([s, sys.stdin], [], [])
    if sys.stdin in ready:
        break
    frame, addr = s.recvfrom(65535)
    if addr[2] == socket.PACKET_OUTGOING:
        continue
    kind, ip = frame[12:14], frame[14:]
    if kind == b"\x86\xdd" and len(ip) >= 48 + 40 and ip[6] == 58 and ip[8:24] == gw6 and ip[40] == 2:
        mtu, q = int.from_bytes(ip[44:48], "big"), ip[48:]
        entry = {"mtu": mtu, "length": 40 + int.from_bytes(q[4:6], "big"), "next": q[6]}
        if q[6] == 58 and len(q) >= 48:
            entry.update(icmp=q[40], seq=int.from_bytes(q[46:48], "big"))
        seen.append(entry)
    elif kind == b"\x08\x00" and len(ip) >= 28 + 20 and ip[9] == 1 and ip[12:16] == gw4:
        hl = (ip[0] & 15) * 4
        icmp = ip[hl:]
        if len(icmp) < 28 or icmp[0] != 3 or icmp[1] != 4:
            continue
        q = icmp[8:]
        entry = {"mtu": int.from_bytes(icmp[6:8], "big"), "length": int.from_bytes(q[2:4], "big"), "next": q[9]}
        qhl = (q[0] & 15) * 4
        if q[9] == 1 and len(q) >= qhl + 8:
            entry.update(icmp=q[qhl], seq=int.from_bytes(q[qhl + 6:qhl + 8], "big"))
        seen.append(entry)
print(json.dumps(seen))
"""


OUTER6_SNIFFER = r"""
import json, select, socket, sys
src, dst = (socket.inet_pton(socket.AF_INET6, a) for a in sys.argv[1:3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(("lptap0", 0))
print("ready", flush=True)
tclass, hlim, other, ndp, frames, flow, longest = {}, {}, {}, {}, 0, 0, 0
while True:
    ready, _, _ = select.select([s, sys.stdin], [], [])
    if sys.stdin in ready:
        break
    frame = s.recv(65535)
    ip = frame[14:]
    if frame[12:14] != b"\x86\xdd" or len(ip) < 48:
        continue
    if ip[6] == 58 and ip[40] in (135, 136) and len(ip) >= 64:
        key = (f"{'ns' if ip[40] == 135 else 'na'} {socket.inet_ntop(socket.AF_INET6, ip[8:24])}"
               f" for {socket.inet_ntop(socket.AF_INET6, ip[48:64])}")
        ndp[key] = ndp.get(key, 0) + 1
    if ip[8:24] != src or ip[24:40] != dst:
        continue
    if ip[6] == 58 and ip[40] in (129, 133, 134, 135, 136, 137):
        continue
    if ip[6] != 50:
        other[str(ip[6])] = other.get(str(ip[6]), 0) + 1
        continue
    frames += 1
    word = int.from_bytes(ip[0:4], "big")
    tc = f"{word >> 20 & 0xFF:#04x}"
    tclass[tc] = tclass.get(tc, 0) + 1
    hlim[str(ip[7])] = hlim.get(str(ip[7]), 0) + 1
    flow += bool(word & 0xFFFFF)
    longest = max(longest, 40 + int.from_bytes(ip[4:6], "big"))
print(json.dumps({"frames": frames, "tos": tclass, "hlim": hlim, "other": other, "flow": flow,
                  "longest": longest, "ndp": ndp}))
"""


def hexseq(start, n):
    return "".join(f"{(start + i) & 255:02x}" for i in range(n))


class Failure(Exception):
    pass


class Lab:
    def __init__(self, args):
        self.espgw = args.espgw
        self.vm_run = args.vm_run
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.verbose = args.verbose
        self.six_ready = False
        self.ends6_ready = False
        self.too_big = []

    def vm(self, script, check=True, timeout=120):
        """Runs `script` in the VM's shell through the control port."""
        r = subprocess.run(
            [self.vm_run, "-e", VM, script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "EXEC_TIMEOUT": str(timeout)},
        )
        if check and r.returncode != 0:
            raise Failure(f"VM command failed ({r.returncode}): {script}\n{r.stdout}{r.stderr}")
        return r.stdout

    def ns(self, netns, argv, timeout=60):
        return subprocess.run(
            ["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=timeout
        )

    # ---- the VM's counters

    def xfrm_stat(self):
        out = self.vm("cat /proc/net/xfrm_stat")
        return {k: int(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}

    def xfrm_states(self):
        """SPI -> {packets, replay, failed, seq, oseq} from `ip -s xfrm state`."""
        out = self.vm("ip -s xfrm state")
        states = {}
        for block in re.split(r"(?m)^src ", out)[1:]:
            spi = int(re.search(r"spi 0x([0-9a-f]+)", block).group(1), 16)
            s = {"mode": re.search(r"mode (\w+)", block).group(1), "esn": "flag esn" in block}
            m = re.search(r"encap type (\S+) sport (\d+) dport (\d+)", block)
            s["encap"] = (m.group(1), int(m.group(2)), int(m.group(3))) if m else None
            m = re.search(r"seq-hi 0x([0-9a-f]+), seq 0x([0-9a-f]+), oseq-hi 0x([0-9a-f]+), oseq 0x([0-9a-f]+)", block)
            if m:
                s["seq"] = int(m.group(1), 16) << 32 | int(m.group(2), 16)
                s["oseq"] = int(m.group(3), 16) << 32 | int(m.group(4), 16)
            m = re.search(r"lifetime current:\s*\n\s*(\d+)\(bytes\), (\d+)\(packets\)", block)
            s["packets"] = int(m.group(2)) if m else -1
            m = re.search(r"stats:\s*\n\s*replay-window \d+ replay (\d+) failed (\d+)", block)
            s["replay"], s["failed"] = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
            states[spi] = s
        return states

    # ---- espgw

    def config(self, name, alg, mode, esn, spi_out=0x1002, spi_in=0x1001, wrong_keys=False, encap=False,
               inner=4, outer=4):
        """espgw's side of the VM's default SAs: espgw out = VM in (SPI 0x1002,
        keys 20.., 30..), espgw in = VM out (SPI 0x1001, keys 00.., 10..).
        `inner`: the family of the networks (6: IPv6, the inside gets its
        address6); `outer`: the family of the ends (6: the outside gets
        address6 and the tunnel's ends are IPv6; with ESN, outer_ttl is set)."""
        _, ek, ak = ALGS[alg]
        ek_out, ek_in, ak_out, ak_in = hexseq(0x20, ek), hexseq(0, ek), hexseq(0x30, ak), hexseq(0x10, ak)
        if wrong_keys:
            # Every key differs in its first byte (the GCM salt and the
            # null cipher key are left alone: only what must fail changes).
            flip = lambda k: (f"{int(k[:2], 16) ^ 0x80:02x}" + k[2:]) if k else k  # noqa: E731
            ek_out, ek_in, ak_out, ak_in = map(flip, (ek_out, ek_in, ak_out, ak_in))
        if inner == 6 and mode == "tunnel":
            subnets = f'local_subnet = "{NET6_GW}"\nremote_subnet = "{NET6_VM}"'
        elif inner == 6:
            # IPv6 transport, host to host as over IPv4 below.
            subnets = f'local_subnet = "{HOST6}/128"\nremote_subnet = "{VM_PROT6}/128"'
        elif mode == "tunnel":
            subnets = 'local_subnet = "192.168.1.0/24"\nremote_subnet = "192.168.2.0/24"'
        else:
            subnets = f'local_subnet = "{HOST}/32"\nremote_subnet = "{VM_PROT}/32"'
        keys = f'enc_key_out = "{ek_out}"\nenc_key_in = "{ek_in}"\n'
        if ak:
            keys += f'auth_key_out = "{ak_out}"\nauth_key_in = "{ak_in}"\n'
        seq = f"initial_seq_out = {START:#x}\ninitial_seq_in = {START:#x}\n" if esn else ""
        local, remote = (GW_OUT6, VM6) if outer == 6 else ("10.99.0.1", VM)
        # Transport mode keeps the hosts' addresses: the VM's IPv6 network
        # is reached through the VM's eth0 address, as 192.168.2.0/24 is
        # through 10.99.0.2.
        route6 = (f'\n[[route]]\ndestination = "{NET6_VM}"\nvia = "{VM6}"\n'
                  if inner == 6 and mode == "transport" else "")
        # The cases with IPv6 ends ping espgw's outside address from the
        # VM's in the clear. espgw's own packets and clear IPv6 to its
        # outside address obey the SPD (RFC 4301 §5.1), so a bypass policy
        # each way between the two ends lets them through; the ESP between
        # the same ends is the SAs' (by SPI), as in configs/site-a.toml.
        ends6_bypass = f"""
[[policy]]
name = "vm-ends6-out"
direction = "out"
priority = 10
source = "{GW_OUT6}/128"
destination = "{VM6}/128"
action = "bypass"

[[policy]]
name = "vm-ends6-in"
direction = "in"
priority = 10
source = "{VM6}/128"
destination = "{GW_OUT6}/128"
action = "bypass"
"""
        text = f"""# written by tests/interop/linux_interop.py: espgw opposite the linux-peer VM
[gateway]
name = "{name}"
{f"outer_ttl = {OUTER_TTL}" if outer == 6 and esn else ""}

[accel]
engine = "soft"

[[interface]]
name = "inside"
device = "lpin0"
address = "192.168.1.1/24"
{f'address6 = "{GW6}/64"' if inner == 6 else ""}
mac = "{ESPGW_MAC_IN}"

[[interface]]
name = "outside"
device = "lptap0"
address = "10.99.0.1/24"
{f'address6 = "{GW_OUT6}/64"' if outer == 6 else ""}
mac = "{ESPGW_MAC_OUT}"

[[route]]
destination = "192.168.2.0/24"
via = "{VM}"
{route6}
[[tunnel]]
name = "vm"
local = "{local}"
remote = "{remote}"
{subnets}
mode = "{mode}"
proposal = "{alg}"
spi_out = {spi_out:#x}
spi_in = {spi_in:#x}
{keys}esn = {"true" if esn else "false"}
replay_window = {128 if esn else 64}
{seq}{'encap = "udp"' if encap else ""}

# The VM's control port answers the host kernel at 10.99.0.3 on the same
# tap; espgw reads the tap promiscuously and must not forward that traffic.
[[policy]]
name = "vm-control-channel"
direction = "in"
priority = 10
source = "{VM}/32"
destination = "10.99.0.3/32"
action = "discard"
{ends6_bypass if outer == 6 else ""}"""
        path = self.work / f"{name}.toml"
        path.write_text(text)
        return path

    def start(self, name, config, workers=1):
        sock = self.work / f"{name}.sock"
        stats = self.work / f"{name}.final.json"
        # A state directory of its own per start: the VM's SAs are new too.
        state = self.work / f"{name}.state"
        shutil.rmtree(state, ignore_errors=True)
        log = open(self.work / f"{name}.log", "w")
        for p in (sock, stats):
            p.unlink(missing_ok=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", "lpeer", self.espgw, "run", "--config", str(config),
             "--control", str(sock), "--workers", str(workers), "--stats", str(stats),
             "--state-dir", str(state)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        # For scripts/linux-interop.sh's cleanup, should this driver die.
        (self.work / f"{name}.pid").write_text(f"{proc.pid}\n")
        self.pidfile = self.work / f"{name}.pid"
        deadline = time.time() + 10
        while time.time() < deadline:
            if proc.poll() is not None:
                raise Failure(f"espgw exited at start ({proc.returncode}); see {log.name}")
            if sock.exists() and self.query(sock, "stats", check=False) is not None:
                return proc, sock, stats
            time.sleep(0.05)
        proc.terminate()
        proc.wait()
        self.pidfile.unlink(missing_ok=True)
        raise Failure("espgw did not answer on its control socket within 10 s")

    def query(self, sock, what, check=True):
        argv = [self.espgw, *what.split(), "--socket", str(sock), "--json"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            if check:
                raise Failure(f"{' '.join(argv)}: {r.stderr}")
            return None
        return json.loads(r.stdout)

    def stop(self, proc, stats):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.pidfile.unlink(missing_ok=True)
            raise Failure("espgw did not stop within 10 s of SIGTERM")
        self.pidfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise Failure(f"espgw exited with {proc.returncode}")
        return json.loads(stats.read_text())

    # ---- traffic

    def ping_from_host(self, count, size=56, interval=None, dst=VM_PROT, extra=()):
        # Expected to succeed: -w waits until every probe is answered (the VM
        # is emulated and the host may be busy), up to 30 s. Expected to
        # fail (interval given): give each probe a second.
        pace = ["-i", interval, "-W", "1"] if interval else ["-A", "-w", "30"]
        r = self.ns("lphost", ["ping", "-n", "-q", *pace, *extra, "-c", str(count), "-s", str(size), dst])
        m = re.search(r"(\d+) packets transmitted, (\d+) received", r.stdout)
        # With -w, ping sends until `count` replies are in; when replies are
        # slow (the emulated VM on a busy host), more probes are out by then
        # and their replies can land before it exits: 15 received for 12 is
        # every probe answered, not a fault (duplicates are not counted here).
        return (min(int(m.group(2)), count) if m else 0), count

    def ping_from_vm(self, count, size=56, interval=None, src=VM_PROT, dst=HOST):
        pace = f"-i {interval} -W 1" if interval else "-A -W 10"
        out = self.vm(f"ping -q {pace} -c {count} -s {size} -I {src} {dst} 2>&1; true")
        m = re.search(r"(\d+) packets transmitted, (\d+) packets received", out)
        return (int(m.group(2)) if m else 0), count

    def traffic(self, count=12, big=3, big_size=1400):
        """Pings both ways; returns (answered, sent) summed and a text."""
        results = {
            "host->vm": self.ping_from_host(count),
            f"host->vm {big_size}B": self.ping_from_host(big, big_size),
            "vm->host": self.ping_from_vm(count),
            f"vm->host {big_size}B": self.ping_from_vm(big, big_size),
        }
        got = sum(r[0] for r in results.values())
        sent = sum(r[1] for r in results.values())
        text = ", ".join(f"{k} {a}/{s}" for k, (a, s) in results.items())
        return got, sent, text

    # ---- one case

    def lp_xfrm_args(self, alg, mode, esn, replay=64, encap=False):
        lalg, ek, ak = ALGS[alg]
        args = [f"alg={lalg}", "peer=10.99.0.1", f"replay={replay}", f"encap={'udp' if encap else 'none'}"]
        if alg == "aes256-sha256":
            args += [f"ekey_out=0x{hexseq(0, ek)}", f"ekey_in=0x{hexseq(0x20, ek)}"]
        if mode == "transport":
            # Host to host: the VM (192.168.2.1) is one end, espgw protects
            # 192.168.1.10's packets in transport mode on its way through.
            args += ["mode=transport", f"local={VM_PROT}", f"peer={HOST}", "tsel="]
        if esn:
            args += ["esn=1", f"iseq={START:#x}", f"oseq={START:#x}"]
        return args

    def lp_xfrm(self, alg, mode, esn, replay=64, encap=False):
        self.vm("lp-xfrm " + " ".join(self.lp_xfrm_args(alg, mode, esn, replay, encap)) + " >/dev/null")

    # ---- 6-in-4

    def setup6(self):
        """IPv6 on lphost's eth0 and the VM's prot0 (and through the VM's
        eth0), once, before the first 6-in-4 case. No link-local address,
        DAD, router solicitation or RA on either eth0: nothing but the
        tests' traffic and neighbour discovery for it goes to espgw."""
        if self.six_ready:
            return
        quiet = "addr_gen_mode=1 accept_dad=0 accept_ra=0 router_solicitations=0 disable_ipv6=0"
        script = (
            "set -e; for k in " + quiet + "; do sysctl -qw net.ipv6.conf.eth0.$k; done\n"
            f"ip -6 addr add {HOST6}/64 dev eth0 nodad\n"
            f"ip -6 route add default via {GW6} dev eth0\n"
        )
        r = self.ns("lphost", ["sh", "-c", script])
        if r.returncode:
            raise Failure(f"lphost IPv6 setup: {r.stdout}{r.stderr}")
        # XFRM hands decapsulated IPv6 to ipv6_rcv on eth0, which drops it
        # where IPv6 is disabled: eth0 takes IPv6, with no address of its own.
        self.vm("(set -e\n"
                "c=/proc/sys/net/ipv6/conf\n"
                "for k in addr_gen_mode=1 accept_ra=0 router_solicitations=0 accept_dad=0 disable_ipv6=0; do\n"
                "  echo ${k#*=} > $c/eth0/${k%=*}; done\n"
                "echo 0 > $c/prot0/accept_dad; echo 0 > $c/prot0/disable_ipv6\n"
                f"ip -6 addr add {VM_PROT6}/64 dev prot0 nodad\n)")
        # lphost's MLD reports for its new address's solicited-node group
        # (sent twice within a second) are over before espgw starts.
        time.sleep(2)
        self.six_ready = True

    def setup_ends6(self):
        """The VM's eth0 gets 2001:db8:99::2/64 (IPv6 is on there since
        setup6, with the same quiet settings), once, before the first case
        with IPv6 ends. Neighbour discovery between it and espgw's
        2001:db8:99::1 needs nothing more: adding the address joins its
        solicited-node group, so the VM answers espgw's NS (and learns its
        MAC from the NS's source link-layer option), and solicits espgw
        from 2001:db8:99::2, the only address eth0 has."""
        if self.ends6_ready:
            return
        self.setup6()
        self.vm(f"ip -6 addr add {VM6}/64 dev eth0 nodad")
        # Its MLD reports (from ::, no link-local address) are over before
        # espgw starts: espgw would count them as unsupported.
        time.sleep(2)
        out = self.vm("ip -6 -o addr show dev eth0")
        if f"{VM6}/64" not in out or "tentative" in out or "fe80:" in out:
            raise Failure(f"the VM's eth0 IPv6 addresses: {out}")
        self.ends6_ready = True

    def lp_xfrm_replayed(self, alg, mode, esn, encap=False, inner=6, outer=4, replay=64):
        """The VM's SAs where the networks or the ends are IPv6: lp-xfrm's own
        commands (`dry=1`: algorithms, keys, SPIs, ESN, replay, UDP
        encapsulation) replayed with these changes.
        Tunnel mode (6-in-4, 4-in-6, 6-in-6), lp-xfrm given the networks as
        lnet/rnet and the ends as local/peer: each state gets a selector for
        the networks (`sel src .. dst ..`; without one a state takes its
        outer family's inner packets only: XfrmInStateMismatch /
        XfrmOutNoStates), and lp-xfrm's route to rnet (via the peer's outer
        address) becomes one of the inner family: 6-in-4 2001:db8:1::/64
        on eth0 (no IPv6 next hop on an IPv4 link), 6-in-6 the same via
        2001:db8:99::1, 4-in-6 the boot's 192.168.1.0/24 via 10.99.0.1 kept
        (iproute2 takes no IPv6 next hop for an IPv4 prefix in that form;
        XFRM sends the packets by the route to the outer address anyway).
        IPv6 transport mode, lp-xfrm given the hosts as local/peer as the
        IPv4 transport cases are (2001:db8:2::1 <-> 2001:db8:1::10, SAs
        and policies between them, any protocol): lp-xfrm's /32 policy
        prefixes become /128 (2001:db8::/32 would put the neighbour
        discovery between the eth0 addresses under the policies too), and a
        route to 2001:db8:1::/64 via 2001:db8:99::1 from 2001:db8:2::1 is
        added, the IPv6 twin of the boot's 192.168.1.0/24 via 10.99.0.1
        that the IPv4 transport cases use: the VM's kernel then applies the
        transport SA to what it sends lphost, and sends it to espgw."""
        transport = mode == "transport"
        if transport:
            assert inner == 6 and outer == 6 and not encap
            vm_end, ends = VM_PROT6, f"local={VM_PROT6} peer={HOST6}"
        else:
            vm_end = VM6 if outer == 6 else VM
            ends = f"local={VM6} peer={GW_OUT6}" if outer == 6 else ""
        nets = (NET6_VM, NET6_GW) if inner == 6 else ("192.168.2.0/24", "192.168.1.0/24")
        args = " ".join(self.lp_xfrm_args(alg, mode, esn, replay, encap))
        extra = f" {ends}" if transport else f" lnet={nets[0]} rnet={nets[1]} {ends}"
        dry = self.vm(f"lp-xfrm {args}{extra} dry=1")
        if outer == 6 and not transport:
            route = ["ip", "-6", "route", "replace", NET6_GW, "via", GW_OUT6, "dev", "eth0", "src", VM_PROT6]
            if inner == 4:
                route = ["ip", "route", "replace", "192.168.1.0/24", "via", "10.99.0.1", "dev", "eth0", "src", VM_PROT]
        else:
            route = ["ip", "-6", "route", "replace", NET6_GW, "dev", "eth0", "src", VM_PROT6]
        commands = []
        for line in dry.splitlines():
            if not line.startswith("+ "):
                continue
            # lp-xfrm prints each command's words joined by one space: an
            # empty word (the null cipher's key) is two spaces in a row.
            words = line[2:].split(" ")
            if words[:4] == ["ip", "xfrm", "state", "add"] and not transport:
                out = words[words.index("src") + 1] == vm_end
                sel = nets if out else nets[::-1]
                words += ["sel", "src", sel[0], "dst", sel[1]]
            elif words[:4] == ["ip", "xfrm", "policy", "add"] and transport:
                words = [w[:-3] + "/128" if w.endswith("/32") and ":" in w else w for w in words]
            elif words[:3] == ["ip", "route", "replace"]:
                words = route
            commands.append(" ".join(shlex.quote(w) for w in words))
        if transport:
            commands.append(" ".join(["ip", "-6", "route", "replace", NET6_GW, "via", GW_OUT6, "dev", "eth0",
                                      "src", VM_PROT6]))
        states = [c for c in commands if c.startswith("ip xfrm state add")]
        if (len(states) != 2 or not any(f"src {vm_end} " in c for c in states)
                or not any("route" in c for c in commands) or (transport and "/32 " in " ".join(commands))):
            raise Failure(f"unexpected lp-xfrm dry=1 output:\n{dry}")
        # With encap=udp, lp-xfrm itself (not dry) also starts the VM's
        # UDP_ENCAP_ESPINUDP socket on 4500; its IPv4 SAs are replaced below.
        first = f"lp-xfrm {args} >/dev/null\n" if encap else ""
        self.vm(f"(set -e\n{first}" + "\n".join(commands) + "\n) >/dev/null")

    def traffic_mtu(self, alg, mode, esn, encap, inner, outer, count=12):
        """The traffic of the cases with IPv6 networks or ends (see the
        module's doc): pings both ways around the tunnel MTU, lphost
        taught it by espgw's packet too big (inner IPv6) or fragmentation
        needed (inner IPv4), and a sniffer on the tap checking the outer
        headers of espgw's ESP; returns (answered, sent, text, problems)."""
        mtu, esp_len = tunnel_mtu(alg, encap, outer, mode)
        transport = mode == "transport"
        problems = []
        if inner == 6:
            ip, gw, src, dst, hdr = ["ip", "-6"], GW6, HOST6, VM_PROT6, 48
        else:
            ip, gw, src, dst, hdr = ["ip"], "192.168.1.1", HOST, VM_PROT, 28
        # lphost forgets its path MTU to the VM (kept with the route).
        r = self.ns("lphost", ["sh", "-c", f"{' '.join(ip)} route del default && {' '.join(ip)} route add default"
                                           f" via {gw} dev eth0 && {' '.join(ip)} route get {dst}"])
        if r.returncode or " mtu " in r.stdout:
            raise Failure(f"lphost's route to {dst} not reset: {r.stdout}{r.stderr}")
        if outer == 4:
            sniff = [OUTER_SNIFFER]
        else:
            # Transport mode: the hosts' own header, in front of ESP.
            sniff = [OUTER6_SNIFFER, *((HOST6, VM_PROT6) if transport else (GW_OUT6, VM6))]
        sniffer = subprocess.Popen(
            ["ip", "netns", "exec", "lpeer", sys.executable, "-c", *sniff],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        too_big = subprocess.Popen(
            ["ip", "netns", "exec", "lphost", sys.executable, "-c", TOO_BIG_SNIFFER, "192.168.1.1", GW6],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            if sniffer.stdout.readline().strip() != "ready":
                raise Failure("the tap sniffer did not start")
            if too_big.stdout.readline().strip() != "ready":
                raise Failure("lphost's too-big sniffer did not start")
            mark = "tclass" if inner == 6 else "tos"
            results = {f"host->vm {mark} {TCLASS:#x}": self.ping_from_host(count, dst=dst,
                                                                          extra=["-Q", f"{TCLASS:#x}"])}
            # One byte over the tunnel MTU, not to be fragmented by lphost.
            r = self.ns("lphost", ["ping", "-n", "-M", "do", "-c", "1", "-W", "5", "-s", str(mtu + 1 - hdr), dst])
            if inner == 6:
                what = "packet too big"
                m = re.search(r"From (\S+) icmp_seq=\d+ Packet too big: mtu=(\d+)", r.stdout)
            else:
                what = "fragmentation needed"
                m = re.search(r"From (\S+) icmp_seq=\d+ Frag needed and DF set \(mtu = (\d+)\)", r.stdout)
            ptb = (m.group(1), int(m.group(2))) if m else None
            if ptb != (gw, mtu):
                problems.append(f"a {mtu + 1}-byte packet got {ptb or 'no ' + what}, not {what}"
                                f" from {gw} with mtu={mtu}: {r.stdout.strip()}")
            r = self.ns("lphost", [*ip, "route", "get", dst])
            m = re.search(r" mtu (\d+)", r.stdout)
            learnt = int(m.group(1)) if m else None
            if learnt != mtu:
                problems.append(f"lphost's route to {dst} has mtu {learnt}, not {mtu}: {r.stdout.strip()}")
            results[f"host->vm {mtu}B"] = self.ping_from_host(3, mtu - hdr, dst=dst, extra=["-M", "do"])
            # Packets over the tunnel MTU only where the VM's kernel cuts the
            # inner packet before XFRM (IPv6 inside a tunnel). An IPv4
            # packet (4-in-6: its echo requests, and its replies to
            # lphost's fragments, which it reassembles) it encrypts whole
            # and then fragments the outer IPv6 packet, and in transport
            # mode it fragments the ESP packet: espgw does not reassemble
            # IPv6 and drops such fragments, nor does transport mode carry
            # lphost's fragments (RFC 4301 §4.1).
            whole = inner == 4 and outer == 6 or transport
            if not whole:
                results["host->vm 1500B"] = self.ping_from_host(3, LINK_MTU - hdr, dst=dst)
            results["vm->host"] = self.ping_from_vm(count, src=dst, dst=src)
            results[f"vm->host {mtu}B"] = self.ping_from_vm(3, mtu - hdr, src=dst, dst=src)
            if not whole:
                results["vm->host 1500B"] = self.ping_from_vm(3, LINK_MTU - hdr, src=dst, dst=src)
            if outer == 6:
                # espgw, which starts with no neighbours, solicited the VM
                # for the first ESP; now the VM solicits espgw: it forgets
                # espgw's MAC (learnt from that solicitation) and pings
                # espgw's outside address in the clear (espgw's bypass policies
                # between the ends; no policy on the VM's side).
                self.vm("ip -6 neigh flush dev eth0")
                results[f"vm->espgw {GW_OUT6}"] = self.ping_from_vm(2, src=VM6, dst=GW_OUT6)
        finally:
            out, _ = sniffer.communicate(input="", timeout=10)
            errors, _ = too_big.communicate(input="", timeout=10)
        try:
            seen = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failure(f"tap sniffer: {out}")
        try:
            self.too_big = json.loads(errors.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failure(f"lphost's too-big sniffer: {errors}")
        # Each error espgw sent lphost refused a packet longer than the MTU
        # it announces; the probe is one of them.
        wrong = [e for e in self.too_big if e["length"] <= e["mtu"] or e["mtu"] != mtu]
        if wrong:
            problems.append(f"espgw's too-big errors to lphost for packets that fit or with another MTU"
                            f" than {mtu}: {wrong}")
        got = sum(r[0] for r in results.values())
        sent = sum(r[1] for r in results.values())
        text = ", ".join(f"{k} {a}/{s}" for k, (a, s) in results.items())
        text += f"; {what} mtu={ptb[1] if ptb else None} (expected {mtu}), lphost learnt {learnt}"
        tos = seen["tos"]
        field = "outer TOS" if outer == 4 else "traffic class" if transport else "outer traffic class"
        if tos.get(f"{TCLASS:#04x}", 0) < count or set(tos) - {f"{TCLASS:#04x}", "0x00"}:
            problems.append(f"{field} of espgw's ESP {tos}: want {TCLASS:#04x} on >= {count} (the marked"
                            " requests) and 0x00 on the rest")
        if seen["longest"] != esp_len:
            problems.append(f"espgw's longest ESP packet is {seen['longest']} bytes; the tunnel MTU's"
                            f" makes {esp_len}")
        if outer == 4:
            if seen["df"]:
                problems.append(f"{seen['df']} of espgw's {seen['frames']} ESP packets have DF set")
            text += (f"; espgw's ESP to the VM: {seen['frames']} packets, outer TOS {tos}, DF on {seen['df']},"
                     f" longest {seen['longest']}B")
            return got, sent, text, problems
        # IPv6: the outer hop limit is outer_ttl (64 by default); transport
        # mode writes no outer header and keeps lphost's 64, less espgw's hop.
        hlim = 63 if transport else OUTER_TTL if esn else 64
        if seen["hlim"] != {str(hlim): seen["frames"]}:
            problems.append(f"hop limits of espgw's ESP {seen['hlim']}, not {hlim} on all {seen['frames']}")
        if seen["other"]:
            problems.append(f"espgw's IPv6 packets to the VM with another next header than ESP (50) after"
                            f" the fixed header (next header: count): {seen['other']}")
        if seen["flow"] and not transport:
            problems.append(f"{seen['flow']} of espgw's {seen['frames']} ESP packets have a flow label")
        if seen["frames"] < 2 * count:
            problems.append(f"the sniffer saw {seen['frames']} ESP packets from espgw, fewer than {2 * count}")
        # Neighbour discovery (no static neighbours on either side): espgw
        # solicited the VM, which answered; the VM solicited espgw, which
        # answered, and the VM holds espgw's MAC.
        ndp = seen["ndp"]
        if not ndp.get(f"ns {GW_OUT6} for {VM6}") or not ndp.get(f"na {VM6} for {VM6}"):
            problems.append(f"espgw did not resolve the VM by NS/NA on the tap: {ndp}")
        if not ndp.get(f"ns {VM6} for {GW_OUT6}") or not ndp.get(f"na {GW_OUT6} for {GW_OUT6}"):
            problems.append(f"the VM did not resolve espgw by NS/NA on the tap: {ndp}")
        neigh = self.vm(f"ip -6 neigh show {GW_OUT6} dev eth0").strip()
        if not re.fullmatch(rf"{GW_OUT6} lladdr {ESPGW_MAC_OUT} (REACHABLE|STALE|DELAY|PROBE)", neigh):
            problems.append(f"the VM's neighbour entry for {GW_OUT6}: {neigh!r}, not {ESPGW_MAC_OUT}")
        text += (f"; espgw's ESP to the VM: {seen['frames']} packets, next header 50 on all,"
                 f" {'' if transport else 'outer '}traffic class {tos}, hop limit {seen['hlim']},"
                 f" other next headers {seen['other'] or 'none'}, flow label on {seen['flow']},"
                 f" longest {seen['longest']}B; neighbour discovery {ndp}, the VM's entry: {neigh}")
        return got, sent, text, problems

    def run_case(self, name, alg, mode, esn, negative=None, encap=False, inner=4, outer=4):
        # `six`: IPv6 networks or ends (6-in-4, 4-in-6, 6-in-6, IPv6 transport).
        six = inner == 6 or outer == 6
        if six:
            self.setup6()
            if outer == 6:
                self.setup_ends6()
            self.lp_xfrm_replayed(alg, mode, esn, encap, inner, outer)
        else:
            self.lp_xfrm(alg, mode, esn, encap=encap)
        kw = {"encap": encap, "inner": inner, "outer": outer}
        if negative == "wrong-key":
            kw["wrong_keys"] = True
        elif negative == "wrong-spi":
            kw.update(spi_out=0x2002, spi_in=0x2001)
        config = self.config(name, alg, mode, esn, **kw)
        before = self.xfrm_stat()
        # IPv6 tunnels: asked for two workers, espgw must say it runs one.
        proc, sock, stats_path = self.start(name, config, workers=2 if six else 1)
        problems = []
        try:
            if negative == "replay":
                got, sent, text = self.replay_traffic()
            elif negative:
                got, sent, text = self.negative_traffic(inner == 6)
            elif six:
                got, sent, text, problems = self.traffic_mtu(alg, mode, esn, encap, inner, outer)
            elif encap:
                # The UDP header takes 8 bytes of the tunnel's MTU: with
                # CBC-SHA1 over a 1500-byte link, 1422-byte inner packets
                # are the most it carries, so a 1400-byte ping (1428 bytes,
                # DF) would rightly be refused with fragmentation-needed.
                got, sent, text = self.traffic(big_size=1372)
            else:
                got, sent, text = self.traffic()
            live = self.query(sock, "stats")
        finally:
            final = self.stop(proc, stats_path)
        after = self.xfrm_stat()
        states = self.xfrm_states()
        moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        drops = {k: v for k, v in final["drops"].items() if v}
        sas = {sa["direction"]: sa for sa in final["sas"]}
        vm_in, vm_out = states.get(0x1002, {}), states.get(0x1001, {})
        if self.verbose:
            print(f"   {name}: {text}; xfrm_stat moved {moved}; states {states}; espgw drops {drops}")
        if final["kernel_drops"]:
            problems.append(f"kernel dropped {final['kernel_drops']} frames before espgw read them")
        if final["engine"]["counters"]["errors"]:
            problems.append(f"engine errors {final['engine']['counters']['errors']}")
        if live["decapsulated"] > final["decapsulated"] or live["encapsulated"] > final["encapsulated"]:
            problems.append("the control socket's live counters exceed the final ones")
        if six:
            log = re.sub(r"\x1b\[[0-9;]*m", "", (self.work / f"{name}.log").read_text())
            if final.get("workers") != 1 or "IPv6 tunnels are served by one worker" not in log:
                problems.append(f"asked for 2 workers, espgw ran {final.get('workers')} and its log"
                                f" {'says' if 'served by one worker' in log else 'does not say'} why")

        if negative == "replay":
            # The replayed frames are refused by the kernel's window; the
            # traffic itself is untouched.
            if got != sent:
                problems.append(f"pings answered {got}/{sent} ({text})")
            if moved.get("XfrmInStateSeqError", 0) != 3 or vm_in.get("replay") != 3:
                problems.append(f"VM did not refuse 3 replays: xfrm_stat moved {moved}, SA replay {vm_in.get('replay')}")
            extra = {k: v for k, v in moved.items() if k != "XfrmInStateSeqError"}
            if extra:
                problems.append(f"VM counters other than XfrmInStateSeqError moved: {extra}")
            text += f"; VM XfrmInStateSeqError +{moved.get('XfrmInStateSeqError', 0)}, SA replay {vm_in.get('replay')}"
        elif negative is None:
            if got != sent:
                problems.append(f"pings answered {got}/{sent} ({text})")
            if moved:
                problems.append(f"VM /proc/net/xfrm_stat moved: {moved}")
            for label, s in (("VM in SA 0x1002", vm_in), ("VM out SA 0x1001", vm_out)):
                if s.get("mode") != mode or s.get("esn") != esn:
                    problems.append(f"{label} is mode {s.get('mode')} esn {s.get('esn')}, not {mode} esn {esn}")
                if s.get("replay") != 0 or s.get("failed") != 0:
                    problems.append(f"{label}: replay {s.get('replay')} failed {s.get('failed')}")
            # IPv6 networks or ends: the one probe a byte over the tunnel MTU
            # (packet too big or fragmentation needed).
            allowed = ("policy_discard", "other_host") + (("frag_needed",) if six else ())
            unexpected = {k: v for k, v in drops.items() if k not in allowed}
            if unexpected:
                problems.append(f"espgw drops {unexpected}")
            # frag_needed counts the too-big packets espgw refused: the probe,
            # and any other lphost sent over the tunnel MTU (each answered
            # with an error lphost received, which says what it refused,
            # unless the error's token bucket was empty: icmp_rate_limited).
            if six:
                errors = len(self.too_big)
                refused, limited = drops.get("frag_needed", 0), final.get("icmp_rate_limited", 0)
                if errors < 1 or not errors <= refused <= errors + limited:
                    problems.append(f"espgw counted frag_needed {refused} (icmp_rate_limited {limited});"
                                    f" lphost received {errors} too-big errors (the probe's among them):"
                                    f" {self.too_big}")
                elif errors > 1:
                    text += f"; too-big errors beyond the probe's, for what lphost sent: {self.too_big}"
            if encap:
                want = ("espinudp", 4500, 4500)
                for label, s in (("VM in SA 0x1002", vm_in), ("VM out SA 0x1001", vm_out)):
                    if s.get("encap") != want:
                        problems.append(f"{label} has encap {s.get('encap')}, not {want}")
                if final["nat_keepalives_sent"] < 1:
                    problems.append("espgw sent no NAT keepalive")
                if final["nat_peer_moved"]:
                    problems.append(f"espgw's peer moved {final['nat_peer_moved']} times; the VM sends from 4500")
                text += (f"; ESP in UDP 4500<->4500 both ways, espgw keepalives sent {final['nat_keepalives_sent']},"
                         f" peer moved {final['nat_peer_moved']}")
            # Every packet one side sent, the other side accepted.
            if vm_in.get("packets") != sas["out"]["packets"]:
                problems.append(f"espgw sent {sas['out']['packets']} ESP, the VM's SA took {vm_in.get('packets')}")
            if vm_out.get("packets") != sas["in"]["packets"]:
                problems.append(f"the VM sent {vm_out.get('packets')} ESP, espgw's SA took {sas['in']['packets']}")
            if esn:
                crossed = {
                    "espgw out": sas["out"]["last_sequence"],
                    "espgw in": sas["in"]["replay_top"],
                    "VM out": vm_out.get("oseq", 0),
                    "VM in": vm_in.get("seq", 0),
                }
                low = {k: hex(v) for k, v in crossed.items() if v < 1 << 32}
                if low:
                    problems.append(f"did not cross 2^32: {low}")
                text += f"; seq now espgw out {sas['out']['last_sequence']:#x}, VM out {vm_out.get('oseq', 0):#x}"
        elif negative == "wrong-key":
            # espgw's ESP fails the VM's ICV check; the VM's fails espgw's.
            if got:
                problems.append(f"{got} pings got through with wrong keys")
            if moved.get("XfrmInStateProtoError", 0) < 1 or vm_in.get("failed", 0) < 1:
                problems.append(f"VM did not count an integrity failure: xfrm_stat moved {moved}, SA failed {vm_in.get('failed')}")
            if final["drops"]["auth_failed"] < 1:
                problems.append(f"espgw counted no auth_failed: drops {drops}")
            extra = {k: v for k, v in moved.items() if k != "XfrmInStateProtoError"}
            if extra:
                problems.append(f"VM counters other than XfrmInStateProtoError moved: {extra}")
            text += f"; VM XfrmInStateProtoError +{moved.get('XfrmInStateProtoError', 0)}, SA failed {vm_in.get('failed')}; espgw auth_failed {final['drops']['auth_failed']}"
        elif negative == "wrong-spi":
            if got:
                problems.append(f"{got} pings got through with wrong SPIs")
            if moved.get("XfrmInNoStates", 0) < 1:
                problems.append(f"VM did not count XfrmInNoStates: moved {moved}")
            if final["drops"]["unknown_spi"] < 1:
                problems.append(f"espgw counted no unknown_spi: drops {drops}")
            extra = {k: v for k, v in moved.items() if k != "XfrmInNoStates"}
            if extra:
                problems.append(f"VM counters other than XfrmInNoStates moved: {extra}")
            text += f"; VM XfrmInNoStates +{moved.get('XfrmInNoStates', 0)}; espgw unknown_spi {final['drops']['unknown_spi']}"
        if negative:
            expected = {"wrong-key": "auth_failed", "wrong-spi": "unknown_spi"}.get(negative)
            unexpected = {k: v for k, v in drops.items() if k not in ("policy_discard", "other_host", expected)}
            if unexpected:
                problems.append(f"espgw drops besides the expected: {unexpected}")
        text += f"; espgw drops {drops or 'none'} (policy_discard, other_host = VM control channel)"
        if six:
            text += f"; espgw workers {final.get('workers')} (asked for 2)"
        return problems, text

    def negative_traffic(self, six=False):
        if six:
            a = self.ping_from_host(3, interval="0.2", dst=VM_PROT6)
            b = self.ping_from_vm(3, interval="0.2", src=VM_PROT6, dst=HOST6)
        else:
            a = self.ping_from_host(3, interval="0.2")
            b = self.ping_from_vm(3, interval="0.2")
        return a[0] + b[0], a[1] + b[1], f"host->vm {a[0]}/{a[1]}, vm->host {b[0]}/{b[1]} answered"

    def replay_traffic(self):
        """Pings both ways while a sniffer on the tap (in lpeer) takes the
        first ESP frame espgw sends the VM and sends it 3 more times."""
        sniffer = subprocess.Popen(
            ["ip", "netns", "exec", "lpeer", sys.executable, "-c", REPLAYER],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        assert sniffer.stdout.readline().strip() == "ready"
        got, sent, text = self.traffic(count=6, big=1)
        out, _ = sniffer.communicate(timeout=10)
        if sniffer.returncode != 0:
            raise Failure(f"replayer: {out}")
        return got, sent, text + f"; {out.strip()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--espgw", required=True)
    ap.add_argument("--vm-run", required=True, help="the test VM's run script (scripts/vm/run.sh)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--summary", help="also write the table here")
    ap.add_argument("--only", help="comma-separated substrings; run matching cases only")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    lab = Lab(args)

    cases = []
    for alg in ALGS:
        for mode in MODES:
            for esn in (False, True):
                cases.append((f"{alg}-{mode}-{'esn' if esn else 'noesn'}", alg, mode, esn, None))
    # RFC 3948: ESP in UDP 4500 is tunnel mode only in espgw.
    for alg, esn in (("aes128gcm16", False), ("aes128-sha1", False), ("chacha20poly1305", False),
                     ("aes128-sha1", True)):
        cases.append((f"udp-{alg}-tunnel-{'esn' if esn else 'noesn'}", alg, "tunnel", esn, None, True))
    cases += [
        ("neg-wrong-key-aes128gcm16", "aes128gcm16", "tunnel", False, "wrong-key"),
        ("neg-wrong-key-aes128-sha1", "aes128-sha1", "tunnel", False, "wrong-key"),
        ("neg-wrong-key-chacha20poly1305", "chacha20poly1305", "tunnel", False, "wrong-key"),
        ("neg-wrong-spi-aes128-sha1", "aes128-sha1", "tunnel", False, "wrong-spi"),
        ("neg-replay-to-vm-aes128gcm16", "aes128gcm16", "tunnel", False, "replay"),
        ("neg-udp-wrong-key-aes128gcm16", "aes128gcm16", "tunnel", False, "wrong-key", True),
        ("neg-udp-wrong-key-chacha20poly1305", "chacha20poly1305", "tunnel", False, "wrong-key", True),
    ]
    # 6-in-4 last (the first one turns IPv6 on in lphost and the VM): every
    # algorithm; ESN across 2^32 with GCM, CBC-SHA1 and chacha20poly1305;
    # ESP in UDP; wrong keys.
    six = [(alg, False, False) for alg in ALGS]
    six += [(alg, True, False) for alg in ("aes128gcm16", "aes128-sha1", "chacha20poly1305")]
    six += [("aes128gcm16", False, True), ("aes128-sha1", True, True)]
    for alg, esn, encap in six:
        cases.append((f"6in4-{'udp-' if encap else ''}{alg}-tunnel-{'esn' if esn else 'noesn'}",
                      alg, "tunnel", esn, None, encap, 6, 4))
    cases += [
        ("6in4-neg-wrong-key-aes128gcm16", "aes128gcm16", "tunnel", False, "wrong-key", False, 6, 4),
        ("6in4-neg-wrong-key-aes128-sha1", "aes128-sha1", "tunnel", False, "wrong-key", False, 6, 4),
    ]
    # IPv6 ends after them (the first one gives the VM's eth0 its IPv6
    # address): 4-in-6 and 6-in-6 with GCM, CBC-SHA1 and chacha20poly1305,
    # ESN across 2^32 (with outer_ttl) with CBC-SHA1 in 4-in-6 and
    # chacha20poly1305 in 6-in-6; IPv6 transport mode with GCM and CBC-SHA1
    # (ESN); wrong keys.
    ends6 = [(inner, alg, "tunnel", esn) for inner, alg, esn in (
        (4, "aes128gcm16", False), (4, "aes128-sha1", True), (4, "chacha20poly1305", False),
        (6, "aes128gcm16", False), (6, "aes128-sha1", False), (6, "chacha20poly1305", True))]
    ends6 += [(6, "aes128gcm16", "transport", False), (6, "aes128-sha1", "transport", True)]
    for inner, alg, mode, esn in ends6:
        kind = f"{inner}in6" if mode == "tunnel" else "ip6"
        cases.append((f"{kind}-{alg}-{mode}-{'esn' if esn else 'noesn'}", alg, mode, esn, None, False, inner, 6))
    cases += [
        ("4in6-neg-wrong-key-chacha20poly1305", "chacha20poly1305", "tunnel", False, "wrong-key", False, 4, 6),
        ("6in6-neg-wrong-key-aes128gcm16", "aes128gcm16", "tunnel", False, "wrong-key", False, 6, 6),
        ("ip6-neg-wrong-key-aes128-sha1", "aes128-sha1", "transport", False, "wrong-key", False, 6, 6),
    ]
    if args.only:
        wanted = args.only.split(",")
        cases = [c for c in cases if any(w in c[0] for w in wanted)]
        if not cases:
            sys.exit(f"--only {args.only}: no case's name holds any of these; nothing would run")

    rows = []
    for name, alg, mode, esn, negative, *more in cases:
        encap, inner, outer = (*more, *(False, 4, 4)[len(more):])
        t0 = time.time()
        try:
            problems, text = lab.run_case(name, alg, mode, esn, negative, encap, inner, outer)
        except (Failure, subprocess.TimeoutExpired, KeyError, ValueError) as e:
            problems, text = [f"{type(e).__name__}: {e}"], ""
        verdict = "FAIL" if problems else "PASS"
        print(f"{verdict} {name} ({time.time() - t0:.1f}s): {text}", flush=True)
        for p in problems:
            print(f"     problem: {p}", flush=True)
        rows.append((alg, f"ipv{inner}", f"ipv{outer}", mode, "on" if esn else "off", "udp" if encap else "-",
                     negative or "-", verdict))

    lines = [f"{'algorithm':<17} {'inner':<6} {'outer':<6} {'mode':<10} {'ESN':<4} {'encap':<6} {'case':<10} result"]
    lines += [f"{a:<17} {i:<6} {o:<6} {m:<10} {e:<4} {u:<6} {n:<10} {v}" for a, i, o, m, e, u, n, v in rows]
    failed = sum(1 for r in rows if r[-1] == "FAIL")
    lines.append(f"XFRM interop: {len(rows) - failed} passed, {failed} failed")
    table = "\n".join(lines)
    print(table)
    if args.summary:
        Path(args.summary).write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
