#!/usr/bin/env bash
# Captures XFRM netlink fixtures (ike-stub/testdata/xfrm/captured-*.nl)
# from an IKE daemon in the test VM (scripts/vm/), as a NETLINK_XFRM
# listener (ike-stub/testdata/xfrm/nlraw.c) in the initiator's namespace
# printed them. See ike-stub/testdata/xfrm/README.md for what each holds.
#
#   scripts/capture-xfrm-fixtures.sh libreswan [OUT_DIR]
#
# libreswan: two libreswan 4.10 plutos in two namespaces of the VM (the
# image of scripts/vm/build.sh --libreswan), A 10.0.0.1 initiating to
# B 10.0.0.2, 192.168.1.0/24 to 192.168.2.0/24, IKEv2 with a pre-shared
# test key. Writes OUT_DIR/captured-libreswan-gcm.nl (the tunnel up
# with aes_gcm128, a CHILD_SA rekey by `whack --rekey-ipsec`, the teardown
# by `whack --terminate` and `--delete`) and captured-libreswan-cbc.nl
# (aes256-sha2_256 without ESN: the tunnel up, then the dumps). OUT_DIR
# defaults to ike-stub/testdata/xfrm. The guest half is
# scripts/capture-xfrm-fixtures/guest-libreswan.sh.
#
# Needs root (network namespaces, a TAP device). Environment: ESPGW_VM_DIR
# (default /var/cache/espgw-vm-libreswan), CAPTURE_NS (default lcap),
# CAPTURE_TAP (default lcaptap0), CAPTURE_NET (the first three octets of
# the host's and VM's addresses, default 10.98.0).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

peer=${1:-}
out=${2:-ike-stub/testdata/xfrm}
case $peer in
libreswan) ;;
*)
    echo "usage: $0 libreswan [OUT_DIR]" >&2
    exit 2
    ;;
esac
export ESPGW_VM_DIR=${ESPGW_VM_DIR:-/var/cache/espgw-vm-libreswan}
NS=${CAPTURE_NS:-lcap}
TAP=${CAPTURE_TAP:-lcaptap0}
NET=${CAPTURE_NET:-10.98.0}
VM=$NET.2
vmrun=scripts/vm/run.sh

share=$(mktemp -d /tmp/xfrm-capture.XXXXXX)
cleanup() {
    "$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
    "$vmrun" --teardown "$NS" >/dev/null 2>&1 || true
    rm -rf "$share"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== the VM's image (with libreswan, in $ESPGW_VM_DIR)"
scripts/vm/build.sh --if-needed --libreswan | tail -1
echo "== nlraw (static)"
gcc -static -O2 -Wall -o "$share/nlraw" ike-stub/testdata/xfrm/nlraw.c
cp scripts/capture-xfrm-fixtures/guest-libreswan.sh "$share/guest.sh"
chmod -R a+rX "$share"

echo "== booting the VM (netns $NS, tap $TAP)"
"$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
"$vmrun" -n "$NS" -t "$TAP" -H "$NET.1/24" -d -w 240 -m 1024 -c 2 -S "$share" \
    lp_addr="$VM/24" lp_peer="$NET.1" lp_selftest=0 lp_alg=none
vm() { EXEC_TIMEOUT=$1 "$vmrun" -n "$NS" -e "$VM" ". /mnt/host/guest.sh; $2"; }

# The control port may open a moment after the guest says it is ready.
for _ in $(seq 30); do
    "$vmrun" -n "$NS" -e "$VM" true >/dev/null 2>&1 && break
    sleep 1
done
topo=$(vm 60 topo | grep -E '^(DONE|FAIL) ' || true)
echo "${topo:-FAIL topo: no verdict from the guest}"
case $topo in DONE*) ;; *) exit 1 ;; esac
versions=${topo#DONE topo: }

# capture NAME COMMENT: runs capture_NAME in the guest and writes
# OUT_DIR/captured-libreswan-NAME.nl, COMMENT first (each line a `#`).
capture() {
    local name=$1 comment=$2 verdict
    verdict=$(vm 400 "capture_${name//-/_}" | grep -E '^(DONE|FAIL) ' || true)
    echo "${verdict:-FAIL $name: no verdict from the guest}"
    case $verdict in DONE*) ;; *) return 1 ;; esac
    {
        printf '%s\n' "$comment" | fold -s -w 100 | sed -e 's/ *$//' -e 's/^/# /'
        vm 60 "cat /tmp/cap/$name.nl"
    } >"$out/captured-libreswan-$name.nl"
    echo "   -> $out/captured-libreswan-$name.nl ($(grep -vc '^#' "$out/captured-libreswan-$name.nl") lines)"
}

lab="Captured from libreswan 4.10 (pluto) on Debian's Linux 6.1 in a qemu VM ($versions): a NETLINK_XFRM \
listener (nlraw: each datagram in hex) in the namespace of the initiator, 10.0.0.1, whose peer is \
10.0.0.2 (a pluto in each namespace); ipsec.conf: ikev2=insist, authby=secret (a test PSK), \
leftsubnet=192.168.1.0/24, rightsubnet=192.168.2.0/24, type=tunnel, ike=aes_gcm128-sha2_256-dh19, \
pfs=no, leftupdown=%disabled; A initiates with whack --initiate."
capture gcm "$lab esp=aes_gcm128 (ESN negotiated: libreswan proposes it by default). The dumps (empty) \
at start; pluto's IPv6 neighbour-discovery bypass policies (UPDPOLICY x6, ICMPv6 types 135 and 136, \
priority 1); the CHILD_SA installed (NEWSA out, UPDSA in on the SPI it allocated, UPDPOLICY in/fwd/out); \
a ping through it; whack --rekey-ipsec (NEWSA out, UPDSA in, UPDPOLICY out, DELSA of the old \
outbound and inbound SAs); a ping; whack --terminate (UPDPOLICY out to a template without reqid, \
DELPOLICY in/fwd, DELSA x2), then whack --delete (DELPOLICY out). Keys are those of a throwaway lab run."
capture cbc "$lab esp=aes256-sha2_256, esn=no. pluto's neighbour-discovery bypass policies and the \
CHILD_SA installed (as in captured-libreswan-gcm.nl), a ping through it, then a dump of the SAD and \
SPD (with pluto's per-socket policies). Keys are those of a throwaway lab run."
