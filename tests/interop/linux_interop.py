#!/usr/bin/env python3
"""espgw against Linux kernel IPsec (XFRM) in the linux-peer VM.

Driven by scripts/linux-interop.sh, which builds the topology first:

    netns lphost                netns lpeer                        qemu (TCG)
    192.168.1.10 eth0 ── veth ── lpin0 [espgw run] lptap0 ── tap ── eth0 10.99.0.2
                                  inside 192.168.1.1   outside 10.99.0.1   prot0 192.168.2.1

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
    2001:db8:2::1 then carries that MTU; espgw counts frag_needed exactly 1;
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

Prints one line per case and a table at the end; exits 1 if any case failed.
"""

import argparse
import json
import os
import re
import shlex
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


def tunnel_mtu6(alg, encap):
    """(the largest IPv6 packet the tunnel carries unfragmented, the outer
    IPv4 length of that packet's ESP) over a LINK_MTU link."""
    iv, icv, block = OVERHEAD[alg]
    fixed = 20 + (8 if encap else 0) + 8 + iv + icv  # outer IPv4, [UDP], SPI+seq, IV, ICV
    mtu = (LINK_MTU - fixed) // block * block - 2  # pad length and next header take 2
    return mtu, fixed + -(-(mtu + 2) // block) * block


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


def hexseq(start, n):
    return "".join(f"{(start + i) & 255:02x}" for i in range(n))


class Failure(Exception):
    pass


class Lab:
    def __init__(self, args):
        self.espgw = args.espgw
        self.peer = args.peer
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.verbose = args.verbose
        self.six_ready = False

    def vm(self, script, check=True, timeout=120):
        """Runs `script` in the VM's shell through the control port."""
        r = subprocess.run(
            [f"{self.peer}/run-peer.sh", "-e", VM, script],
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
               six=False):
        """espgw's side of the VM's default SAs: espgw out = VM in (SPI 0x1002,
        keys 20.., 30..), espgw in = VM out (SPI 0x1001, keys 00.., 10..).
        `six`: the tunnel carries IPv6 networks (6-in-4, tunnel mode)."""
        _, ek, ak = ALGS[alg]
        ek_out, ek_in, ak_out, ak_in = hexseq(0x20, ek), hexseq(0, ek), hexseq(0x30, ak), hexseq(0x10, ak)
        if wrong_keys:
            # Every key differs in its first byte (the GCM salt and the
            # null cipher key are left alone: only what must fail changes).
            flip = lambda k: (f"{int(k[:2], 16) ^ 0x80:02x}" + k[2:]) if k else k  # noqa: E731
            ek_out, ek_in, ak_out, ak_in = map(flip, (ek_out, ek_in, ak_out, ak_in))
        if six:
            subnets = f'local_subnet = "{NET6_GW}"\nremote_subnet = "{NET6_VM}"'
        elif mode == "tunnel":
            subnets = 'local_subnet = "192.168.1.0/24"\nremote_subnet = "192.168.2.0/24"'
        else:
            subnets = f'local_subnet = "{HOST}/32"\nremote_subnet = "{VM_PROT}/32"'
        keys = f'enc_key_out = "{ek_out}"\nenc_key_in = "{ek_in}"\n'
        if ak:
            keys += f'auth_key_out = "{ak_out}"\nauth_key_in = "{ak_in}"\n'
        seq = f"initial_seq_out = {START:#x}\ninitial_seq_in = {START:#x}\n" if esn else ""
        text = f"""# written by tests/interop/linux_interop.py: espgw opposite the linux-peer VM
[gateway]
name = "{name}"

[accel]
engine = "soft"

[[interface]]
name = "inside"
device = "lpin0"
address = "192.168.1.1/24"
{f'address6 = "{GW6}/64"' if six else ""}
mac = "{ESPGW_MAC_IN}"

[[interface]]
name = "outside"
device = "lptap0"
address = "10.99.0.1/24"
mac = "{ESPGW_MAC_OUT}"

[[route]]
destination = "192.168.2.0/24"
via = "{VM}"

[[tunnel]]
name = "vm"
local = "10.99.0.1"
remote = "{VM}"
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
"""
        path = self.work / f"{name}.toml"
        path.write_text(text)
        return path

    def start(self, name, config, workers=1):
        sock = self.work / f"{name}.sock"
        stats = self.work / f"{name}.final.json"
        log = open(self.work / f"{name}.log", "w")
        for p in (sock, stats):
            p.unlink(missing_ok=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", "lpeer", self.espgw, "run", "--config", str(config),
             "--control", str(sock), "--workers", str(workers), "--stats", str(stats)],
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

    def lp_xfrm6(self, alg, esn, encap=False, replay=64):
        """The VM's SAs for 6-in-4: lp-xfrm's own commands (`dry=1`, with the
        IPv6 networks as lnet/rnet) with an IPv6 selector added to each state
        and an IPv6 route in place of lp-xfrm's IPv4 one."""
        args = " ".join(self.lp_xfrm_args(alg, "tunnel", esn, replay, encap))
        dry = self.vm(f"lp-xfrm {args} lnet={NET6_VM} rnet={NET6_GW} dry=1")
        commands = []
        for line in dry.splitlines():
            if not line.startswith("+ "):
                continue
            # lp-xfrm prints each command's words joined by one space: an
            # empty word (the null cipher's key) is two spaces in a row.
            words = line[2:].split(" ")
            if words[:4] == ["ip", "xfrm", "state", "add"]:
                out = words[words.index("src") + 1] == VM
                sel = (NET6_VM, NET6_GW) if out else (NET6_GW, NET6_VM)
                words += ["sel", "src", sel[0], "dst", sel[1]]
            elif words[:3] == ["ip", "route", "replace"]:
                words = ["ip", "-6", "route", "replace", NET6_GW, "dev", "eth0", "src", VM_PROT6]
            commands.append(" ".join(shlex.quote(w) for w in words))
        if sum(c.startswith("ip xfrm state add") for c in commands) != 2 or not any("route" in c for c in commands):
            raise Failure(f"unexpected lp-xfrm dry=1 output:\n{dry}")
        # With encap=udp, lp-xfrm itself (not dry) also starts the VM's
        # UDP_ENCAP_ESPINUDP socket on 4500; its IPv4 SAs are replaced below.
        first = f"lp-xfrm {args} >/dev/null\n" if encap else ""
        self.vm(f"(set -e\n{first}" + "\n".join(commands) + "\n) >/dev/null")

    def traffic6(self, alg, encap, count=12):
        """6-in-4 traffic (see the module's doc); returns (answered, sent,
        text, problems)."""
        mtu, esp_len = tunnel_mtu6(alg, encap)
        problems = []
        # lphost forgets its path MTU to the VM (kept with the route).
        r = self.ns("lphost", ["sh", "-c", f"ip -6 route del default && ip -6 route add default via {GW6} dev eth0"
                                           f" && ip -6 route get {VM_PROT6}"])
        if r.returncode or " mtu " in r.stdout:
            raise Failure(f"lphost's route to {VM_PROT6} not reset: {r.stdout}{r.stderr}")
        sniffer = subprocess.Popen(
            ["ip", "netns", "exec", "lpeer", sys.executable, "-c", OUTER_SNIFFER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            if sniffer.stdout.readline().strip() != "ready":
                raise Failure("the tap sniffer did not start")
            results = {f"host->vm tclass {TCLASS:#x}": self.ping_from_host(count, dst=VM_PROT6,
                                                                          extra=["-Q", f"{TCLASS:#x}"])}
            # One byte over the tunnel MTU, not to be fragmented by lphost.
            r = self.ns("lphost", ["ping", "-n", "-M", "do", "-c", "1", "-W", "5", "-s", str(mtu + 1 - 48), VM_PROT6])
            m = re.search(r"From (\S+) icmp_seq=\d+ Packet too big: mtu=(\d+)", r.stdout)
            ptb = (m.group(1), int(m.group(2))) if m else None
            if ptb != (GW6, mtu):
                problems.append(f"a {mtu + 1}-byte packet got {ptb or 'no packet too big'}, not packet too big"
                                f" from {GW6} with mtu={mtu}: {r.stdout.strip()}")
            r = self.ns("lphost", ["ip", "-6", "route", "get", VM_PROT6])
            m = re.search(r" mtu (\d+)", r.stdout)
            learnt = int(m.group(1)) if m else None
            if learnt != mtu:
                problems.append(f"lphost's route to {VM_PROT6} has mtu {learnt}, not {mtu}: {r.stdout.strip()}")
            results.update({
                f"host->vm {mtu}B": self.ping_from_host(3, mtu - 48, dst=VM_PROT6, extra=["-M", "do"]),
                "host->vm 1500B": self.ping_from_host(3, LINK_MTU - 48, dst=VM_PROT6),
                "vm->host": self.ping_from_vm(count, src=VM_PROT6, dst=HOST6),
                f"vm->host {mtu}B": self.ping_from_vm(3, mtu - 48, src=VM_PROT6, dst=HOST6),
                "vm->host 1500B": self.ping_from_vm(3, LINK_MTU - 48, src=VM_PROT6, dst=HOST6),
            })
        finally:
            out, _ = sniffer.communicate(input="", timeout=10)
        try:
            seen = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failure(f"tap sniffer: {out}")
        got = sum(r[0] for r in results.values())
        sent = sum(r[1] for r in results.values())
        text = ", ".join(f"{k} {a}/{s}" for k, (a, s) in results.items())
        text += f"; packet too big mtu={ptb[1] if ptb else None} (expected {mtu}), lphost learnt {learnt}"
        tos = seen["tos"]
        if tos.get(f"{TCLASS:#04x}", 0) < count or set(tos) - {f"{TCLASS:#04x}", "0x00"}:
            problems.append(f"outer TOS of espgw's ESP {tos}: want {TCLASS:#04x} on >= {count} (the marked"
                            " requests) and 0x00 on the rest")
        if seen["df"]:
            problems.append(f"{seen['df']} of espgw's {seen['frames']} ESP packets have DF set")
        if seen["longest"] != esp_len:
            problems.append(f"espgw's longest ESP packet is {seen['longest']} bytes; the tunnel MTU's"
                            f" makes {esp_len}")
        text += (f"; espgw's ESP to the VM: {seen['frames']} packets, outer TOS {tos}, DF on {seen['df']},"
                 f" longest {seen['longest']}B")
        return got, sent, text, problems

    def run_case(self, name, alg, mode, esn, negative=None, encap=False, six=False):
        if six:
            self.setup6()
            self.lp_xfrm6(alg, esn, encap=encap)
        else:
            self.lp_xfrm(alg, mode, esn, encap=encap)
        kw = {"encap": encap, "six": six}
        if negative == "wrong-key":
            kw["wrong_keys"] = True
        elif negative == "wrong-spi":
            kw.update(spi_out=0x2002, spi_in=0x2001)
        config = self.config(name, alg, mode, esn, **kw)
        before = self.xfrm_stat()
        # 6-in-4: asked for two workers, espgw must say it runs one.
        proc, sock, stats_path = self.start(name, config, workers=2 if six else 1)
        problems = []
        try:
            if negative == "replay":
                got, sent, text = self.replay_traffic()
            elif negative:
                got, sent, text = self.negative_traffic(six)
            elif six:
                got, sent, text, problems = self.traffic6(alg, encap)
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
            # 6-in-4: the one probe a byte over the tunnel MTU (packet too big).
            allowed = ("policy_discard", "other_host") + (("frag_needed",) if six else ())
            unexpected = {k: v for k, v in drops.items() if k not in allowed}
            if unexpected:
                problems.append(f"espgw drops {unexpected}")
            if six and drops.get("frag_needed") != 1:
                problems.append(f"espgw counted frag_needed {drops.get('frag_needed', 0)}, not 1 (the probe)")
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
    ap.add_argument("--peer", required=True, help="the linux-peer directory (run-peer.sh)")
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
                      alg, "tunnel", esn, None, encap, True))
    cases += [
        ("6in4-neg-wrong-key-aes128gcm16", "aes128gcm16", "tunnel", False, "wrong-key", False, True),
        ("6in4-neg-wrong-key-aes128-sha1", "aes128-sha1", "tunnel", False, "wrong-key", False, True),
    ]
    if args.only:
        wanted = args.only.split(",")
        cases = [c for c in cases if any(w in c[0] for w in wanted)]

    rows = []
    for name, alg, mode, esn, negative, *more in cases:
        encap, six = (more + [False, False])[:2]
        t0 = time.time()
        try:
            problems, text = lab.run_case(name, alg, mode, esn, negative, encap, six)
        except (Failure, subprocess.TimeoutExpired, KeyError, ValueError) as e:
            problems, text = [f"{type(e).__name__}: {e}"], ""
        verdict = "FAIL" if problems else "PASS"
        print(f"{verdict} {name} ({time.time() - t0:.1f}s): {text}", flush=True)
        for p in problems:
            print(f"     problem: {p}", flush=True)
        rows.append((alg, "ipv6" if six else "ipv4", mode, "on" if esn else "off", "udp" if encap else "-",
                     negative or "-", verdict))

    lines = [f"{'algorithm':<17} {'inner':<6} {'mode':<10} {'ESN':<4} {'encap':<6} {'case':<10} result"]
    lines += [f"{a:<17} {i:<6} {m:<10} {e:<4} {u:<6} {n:<10} {v}" for a, i, m, e, u, n, v in rows]
    failed = sum(1 for r in rows if r[-1] == "FAIL")
    lines.append(f"XFRM interop: {len(rows) - failed} passed, {failed} failed")
    table = "\n".join(lines)
    print(table)
    if args.summary:
        Path(args.summary).write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
