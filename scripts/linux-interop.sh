#!/usr/bin/env bash
# espgw against Linux kernel IPsec, and the AF_ALG engine on a real kernel,
# both in the linux-peer VM (scripts/vm: Debian's stock kernel under qemu,
# with XFRM ESP and AF_ALG, which this host's kernel lacks).
#
#   sudo scripts/linux-interop.sh          # about 6-7 minutes here; CI runs it
#   INTEROP_ONLY=6in6,ip6 sudo scripts/linux-interop.sh   # the XFRM cases whose names hold these
#
# Topology (all inside network namespaces this script makes and removes):
#
#   netns lphost                 netns lpeer                         qemu, TCG
#   192.168.1.10 eth0 ── veth ── lpin0 [espgw run] lptap0 ── tap ── eth0 10.99.0.2 (XFRM)
#   2001:db8:1::10              inside 192.168.1.1  outside 10.99.0.1         2001:db8:99::2
#                                      2001:db8:1::1        2001:db8:99::1   prot0 192.168.2.1
#                                                                              2001:db8:2::1
#   (the IPv6 addresses from the cases that use them on: networks 2001:db8:1::/64
#   and 2001:db8:2::/64, IPv6 ends 2001:db8:99::1 <-> ::2)
#
# The host kernel in lpeer keeps only 10.99.0.3 on the tap, to reach the VM's
# control port; 10.99.0.1 and its MAC belong to espgw alone, so the host
# kernel neither answers for it nor sees its ESP (the host kernel has no ESP).
# IPv6 starts disabled everywhere; the driver turns it on for lphost's eth0
# and the VM's prot0 and eth0 (no link-local, DAD, RS or RA) just before the
# 6-in-4 cases, and gives the VM's eth0 2001:db8:99::2 just before the cases
# with IPv6 ends, which run last. lpeer keeps IPv6 off throughout: espgw's
# 2001:db8:99::1 is its own, and it finds the VM by neighbour discovery.
#
# 1. XFRM interop (tests/interop/linux_interop.py): every algorithm both
#    support x tunnel/transport x ESN off/on (ESN crossing 2^32 both ways),
#    replay windows on both sides; ping both ways; the VM's xfrm_stat and
#    SA counters and espgw's counters checked; wrong key, wrong SPI and a
#    replay refused and counted. 6-in-4: IPv6 subnets over the same IPv4
#    tunnel (every algorithm, ESN, ESP in UDP, wrong key), with packet too
#    big at the tunnel MTU, outer TOS from the traffic class and DF clear.
#    IPv6 ends: 4-in-6 and 6-in-6 (GCM, CBC-SHA1, chacha20poly1305, ESN,
#    wrong key) and IPv6 transport mode (GCM, CBC-SHA1 with ESN, wrong key),
#    with packet too big or fragmentation needed at the tunnel MTU and the
#    outer IPv6 header checked on the tap (hop limit, traffic class, next
#    header 50, no fragment header).
# 2. AF_ALG (scripts/afalg-in-vm.sh --run): lib-tests/tests/afalg.rs,
#    `espgw pcap --engine afalg` against soft, and the afalg/soft cost ratio.
#
# Installs its Debian packages and builds the VM's image (scripts/vm/build.sh)
# when missing, builds the release binaries,
# prints a summary, exits non-zero on any failure, and always removes the VM,
# the namespaces and any espgw it started.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
vmrun=$repo/scripts/vm/run.sh
t0=$(date +%s)

if [ "$(id -u)" != 0 ]; then
    echo "linux-interop: needs root (network namespaces, TAP, AF_PACKET)" >&2
    exit 2
fi

if [ -n "${INTEROP_ONLY:-}" ] && [ "${CI:-}" = true ]; then
    # CI runs every case: a subset there would pass what it skipped.
    echo "INTEROP_ONLY=$INTEROP_ONLY is for runs by hand; under CI=true every case runs" >&2
    exit 2
fi

work=$(mktemp -d /tmp/espgw-interop.XXXXXX)
share=$work/share
mkdir -p "$share"

stop_all() {
    # espgw processes the driver started (it removes a pid file on a clean stop).
    for f in "$work"/xfrm/*.pid; do
        [ -f "$f" ] || continue
        kill "$(cat "$f")" 2>/dev/null || true
    done
    "$vmrun" --stop lptap0 >/dev/null 2>&1 || true
    ip netns del lphost 2>/dev/null || true
    ip netns del lpeer 2>/dev/null || true
}
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local rc=$?
    stop_all
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== dependencies"
if ! command -v ping >/dev/null || ! command -v ip >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 iputils-ping >/dev/null
fi
# The VM's image, from Debian packages (and qemu and the build's tools).
scripts/vm/build.sh --if-needed >"$work/vm-build.log" 2>&1 ||
    { tail -20 "$work/vm-build.log"; exit 1; }
tail -1 "$work/vm-build.log"

# Builds espgw and the AF_ALG test binary (release), and writes the AF_ALG
# inputs into the VM's share.
scripts/afalg-in-vm.sh --prepare "$share"
espgw=$repo/target/release/espgw

echo "== topology"
stop_all   # leftovers of an interrupted run
ip netns add lpeer
ip netns add lphost
for ns in lpeer lphost; do
    # No IPv6: nothing but IPv4 and ARP reaches espgw (it counts the rest),
    # until the driver's 6-in-4 cases turn it on in lphost (not lpeer).
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
done
ip link add lpin0 netns lpeer type veth peer name eth0 netns lphost
ip -n lphost addr add 192.168.1.10/24 dev eth0
ip -n lphost link set eth0 up
ip -n lphost route add default via 192.168.1.1
ip -n lpeer link set lpin0 up
# The kernel's default offloads stay on (partial checksums, TSO/GSO from
# lphost): espgw's driver completes and segments what arrives.

echo "== booting the linux-peer VM"
"$vmrun" -d -m 512 -H 10.99.0.3/24 -S "$share"
vm() { "$vmrun" -e 10.99.0.2 "$1"; }
vm 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6'
# The VM keeps Linux's arp_announce=0: a packet from prot0's 192.168.2.1
# (transport mode) that finds no valid entry asks "who-has 10.99.0.1 tell
# 192.168.2.1", an off-link sender for espgw, which answers it (without
# learning the sender) as Linux does.
kernel="$(vm 'uname -r') ($(vm 'cat /proc/version' | grep -Eo 'Debian [0-9][0-9A-Za-z.+~-]*' | tail -1 || true), $(vm 'uname -m'))"
echo "peer kernel: $kernel"
selftest=$(grep -o 'AF_ALG summary: [^=]*' "$("$vmrun" --log lptap0)" || echo "AF_ALG summary: ?")
echo "VM boot: afalg-test known answers: $selftest"

status=0
echo "== espgw <-> Linux XFRM"
python3 tests/interop/linux_interop.py --espgw "$espgw" --vm-run "$vmrun" ${INTEROP_ONLY:+--only "$INTEROP_ONLY"} \
    --workdir "$work/xfrm" --summary "$work/xfrm-summary.txt" || status=1

echo "== AF_ALG engine inside the VM"
scripts/afalg-in-vm.sh --run "$share" | tee "$work/afalg.txt" || status=1

elapsed=$(($(date +%s) - t0))
echo
echo "================ linux-interop summary ================"
echo "peer: linux-peer VM (qemu TCG), Linux kernel $kernel; $selftest"
echo "espgw: $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '?'), release build, soft engine, 1 worker (IPv6 tunnels: asked for 2, runs 1)"
echo
cat "$work/xfrm-summary.txt" 2>/dev/null || echo "XFRM interop: no summary (the driver failed)"
echo
grep -E '^(PASS|FAIL) (lib-tests/)?tests/|^pcap: |^FAIL' "$work/afalg.txt" || true
sed -n '/^AF_ALG \/ soft cost/,/^AF_ALG: /p' "$work/afalg.txt" | sed '$d'
grep -E '^AF_ALG: ' "$work/afalg.txt" || echo "AF_ALG: no result"
echo
xp=$(grep -Eo '^XFRM interop: [0-9]+ passed, [0-9]+ failed' "$work/xfrm-summary.txt" 2>/dev/null | grep -Eo '[0-9]+ passed, [0-9]+ failed' || echo "0 passed, 1 failed")
ap=$(grep -Eo '^AF_ALG: [0-9]+ passed, [0-9]+ failed' "$work/afalg.txt" | grep -Eo '[0-9]+ passed, [0-9]+ failed' || echo "0 passed, 1 failed")
passed=$((${xp%% passed*} + ${ap%% passed*}))
failed=$(($(echo "$xp" | grep -Eo '[0-9]+ failed' | cut -d' ' -f1) + $(echo "$ap" | grep -Eo '[0-9]+ failed' | cut -d' ' -f1)))
[ "$failed" = 0 ] || status=1
echo "total time ${elapsed}s"
echo "linux-interop: $passed passed, $failed failed"
exit $status
