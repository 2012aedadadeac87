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

Prints one line per case and a table at the end; exits 1 if any case failed.
"""

import argparse
import json
import os
import re
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

    def config(self, name, alg, mode, esn, spi_out=0x1002, spi_in=0x1001, wrong_keys=False, encap=False):
        """espgw's side of the VM's default SAs: espgw out = VM in (SPI 0x1002,
        keys 20.., 30..), espgw in = VM out (SPI 0x1001, keys 00.., 10..)."""
        _, ek, ak = ALGS[alg]
        ek_out, ek_in, ak_out, ak_in = hexseq(0x20, ek), hexseq(0, ek), hexseq(0x30, ak), hexseq(0x10, ak)
        if wrong_keys:
            # Every key differs in its first byte (the GCM salt and the
            # null cipher key are left alone: only what must fail changes).
            flip = lambda k: (f"{int(k[:2], 16) ^ 0x80:02x}" + k[2:]) if k else k  # noqa: E731
            ek_out, ek_in, ak_out, ak_in = map(flip, (ek_out, ek_in, ak_out, ak_in))
        if mode == "tunnel":
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

    def start(self, name, config):
        sock = self.work / f"{name}.sock"
        stats = self.work / f"{name}.final.json"
        log = open(self.work / f"{name}.log", "w")
        for p in (sock, stats):
            p.unlink(missing_ok=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", "lpeer", self.espgw, "run", "--config", str(config),
             "--control", str(sock), "--workers", "1", "--stats", str(stats)],
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

    def ping_from_host(self, count, size=56, interval=None):
        # Expected to succeed: -w waits until every probe is answered (the VM
        # is emulated and the host may be busy), up to 30 s. Expected to
        # fail (interval given): give each probe a second.
        pace = ["-i", interval, "-W", "1"] if interval else ["-A", "-w", "30"]
        r = self.ns("lphost", ["ping", "-n", "-q", *pace, "-c", str(count), "-s", str(size), VM_PROT])
        m = re.search(r"(\d+) packets transmitted, (\d+) received", r.stdout)
        # With -w, ping sends until `count` replies are in; when replies are
        # slow (the emulated VM on a busy host), more probes are out by then
        # and their replies can land before it exits: 15 received for 12 is
        # every probe answered, not a fault (duplicates are not counted here).
        return (min(int(m.group(2)), count) if m else 0), count

    def ping_from_vm(self, count, size=56, interval=None):
        pace = f"-i {interval} -W 1" if interval else "-A -W 10"
        out = self.vm(f"ping -q {pace} -c {count} -s {size} -I {VM_PROT} {HOST} 2>&1; true")
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

    def lp_xfrm(self, alg, mode, esn, replay=64, encap=False):
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
        self.vm("lp-xfrm " + " ".join(args) + " >/dev/null")

    def run_case(self, name, alg, mode, esn, negative=None, encap=False):
        self.lp_xfrm(alg, mode, esn, encap=encap)
        kw = {"encap": encap}
        if negative == "wrong-key":
            kw["wrong_keys"] = True
        elif negative == "wrong-spi":
            kw.update(spi_out=0x2002, spi_in=0x2001)
        config = self.config(name, alg, mode, esn, **kw)
        before = self.xfrm_stat()
        proc, sock, stats_path = self.start(name, config)
        problems = []
        try:
            if negative == "replay":
                got, sent, text = self.replay_traffic()
            elif negative:
                got, sent, text = self.negative_traffic()
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
            unexpected = {k: v for k, v in drops.items() if k not in ("policy_discard", "other_host")}
            if unexpected:
                problems.append(f"espgw drops {unexpected}")
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
        return problems, text

    def negative_traffic(self):
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
    if args.only:
        wanted = args.only.split(",")
        cases = [c for c in cases if any(w in c[0] for w in wanted)]

    rows = []
    for name, alg, mode, esn, negative, *encap in cases:
        encap = bool(encap and encap[0])
        t0 = time.time()
        try:
            problems, text = lab.run_case(name, alg, mode, esn, negative, encap)
        except (Failure, subprocess.TimeoutExpired, KeyError, ValueError) as e:
            problems, text = [f"{type(e).__name__}: {e}"], ""
        verdict = "FAIL" if problems else "PASS"
        print(f"{verdict} {name} ({time.time() - t0:.1f}s): {text}", flush=True)
        for p in problems:
            print(f"     problem: {p}", flush=True)
        rows.append((alg, mode, "on" if esn else "off", "udp" if encap else "-", negative or "-", verdict))

    lines = [f"{'algorithm':<17} {'mode':<10} {'ESN':<4} {'encap':<6} {'case':<10} result"]
    lines += [f"{a:<17} {m:<10} {e:<4} {u:<6} {n:<10} {v}" for a, m, e, u, n, v in rows]
    failed = sum(1 for r in rows if r[-1] == "FAIL")
    lines.append(f"XFRM interop: {len(rows) - failed} passed, {failed} failed")
    table = "\n".join(lines)
    print(table)
    if args.summary:
        Path(args.summary).write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
