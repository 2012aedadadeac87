#!/usr/bin/env bash
# strongSwan keys espgw through the XFRM keying source, end to end, in the
# test VM of scripts/vm (Debian's kernel, which has the ESP this host's
# lacks; the keying namespace's kernel must accept the SAs charon installs).
#
#   sudo scripts/strongswan-e2e.sh                 every case, one VM boot
#   E2E_ONLY=rekey,nat sudo scripts/strongswan-e2e.sh   the cases whose names hold these
#
# Inside one VM (scripts/strongswan-e2e/guest.sh draws it): espgw runs in
# ns gw between a LAN host (ns lan) and the outside, keyed with
# `--keying xfrm` from ns key, where a charon (or libreswan's pluto) reaches
# the peers through espgw's IKE relay. The far peer is Linux's own IPsec
# keyed by a charon of its own (ns far); for NAT traversal a second one sits
# behind a masquerading NAT (ns fnat behind ns nat).
#
# Cases (one line each, "PASS name: ..." or "FAIL name: why"): IKEv2 PSK up
# with start_action = start and ping and TCP both ways for aes128gcm16,
# aes256gcm16, aes256-sha256 and chacha20poly1305, ESN on, transport mode;
# swanctl's counters against espgw's; CHILD_SA rekeys by time and by bytes
# under a numbered UDP stream each way (nothing lost or duplicated); an IKE
# SA rekey; dead peer detection; swanctl --terminate; espgw restarted under
# a live IKE SA; a trap policy brought up by its first packet; a proposal
# espgw refuses beside one it takes; NAT traversal; IKE over IPv6 through
# the relay (IPv4 LANs in ESP over IPv6); libreswan as the keying daemon.
#
# Builds espgw (release) and the static traffic tool, builds the VM's image
# with libreswan (scripts/vm/build.sh --libreswan) in a cache directory of
# its own (ESPGW_VM_DIR, default /var/cache/espgw-vm-libreswan), so that it
# never swaps the image the other VM scripts use. Needs root. Ends with
# "strongswan-e2e: N passed, M failed"; exits non-zero on any failure.
# KEEP=1 keeps the VM running and the work directory. E2E_IKE_PATH=veth
# takes IKE past espgw's relay (a veth from far straight to ns key, by
# policy routing on far) to tell a relay fault from a data-plane one; the
# NAT case fails that way.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
vmrun=$repo/scripts/vm/run.sh
NS=lpe2e TAP=lpe2e0 VM=10.99.0.2
t0=$(date +%s)

if [ "$(id -u)" != 0 ]; then
    echo "strongswan-e2e: needs root (network namespaces, TAP)" >&2
    exit 2
fi
if [ -n "${E2E_ONLY:-}" ] && [ "${CI:-}" = true ]; then
    echo "E2E_ONLY=$E2E_ONLY is for runs by hand; under CI=true every case runs" >&2
    exit 2
fi
export ESPGW_VM_DIR=${ESPGW_VM_DIR:-/var/cache/espgw-vm-libreswan}

CASES="aes128gcm16 aes256gcm16 aes256_sha256 chacha20poly1305 esn transport counters rekey_time
rekey_bytes ike_rekey trap refused terminate restart dpd nat ipv6 libreswan"

work=$(mktemp -d /tmp/espgw-e2e.XXXXXX)
share=$work/share
mkdir -p "$share/lib"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local rc=$?
    if [ "${KEEP:-0}" = 1 ]; then
        echo "kept the VM ($vmrun -n $NS -e $VM '...'; $vmrun --stop $TAP) and $work"
    else
        "$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
        "$vmrun" --teardown "$NS" >/dev/null 2>&1 || true
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== the VM's image (with libreswan, in $ESPGW_VM_DIR)"
scripts/vm/build.sh --if-needed --libreswan >"$work/vm-build.log" 2>&1 ||
    { tail -20 "$work/vm-build.log"; exit 1; }
tail -1 "$work/vm-build.log"

echo "== espgw (release) and the traffic tool"
cargo build --release --quiet --bin espgw
espgw=$repo/target/release/espgw
gcc -static -Os -Wall -Wextra -o "$share/e2etool" scripts/strongswan-e2e/e2etool.c
# espgw is linked against the host's glibc: it runs in the guest through
# the host's loader and libraries, whatever the image holds.
cp "$espgw" "$share/espgw"
for lib in $(ldd "$espgw" | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
    cp -L "$lib" "$share/lib/"
done
cat >"$share/run" <<'EOF'
#!/bin/sh
exec /mnt/host/lib/ld-linux-x86-64.so.2 --library-path /mnt/host/lib "$@"
EOF
chmod +x "$share/run"
cp scripts/strongswan-e2e/guest.sh "$share/guest.sh"

echo "== booting the VM (netns $NS, tap $TAP)"
"$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
"$vmrun" -n "$NS" -t "$TAP" -d -w 180 -m 1024 -c 2 -S "$share" lp_selftest=0 lp_alg=none
# vm TIMEOUT SCRIPT: SCRIPT in the guest with the guest half loaded.
vm() {
    EXEC_TIMEOUT=$1 "$vmrun" -n "$NS" -e "$VM" "export E2E_IKE_PATH=${E2E_IKE_PATH:-relay}; . /mnt/host/guest.sh; $2"
}

passed=0 failed=0
results=$work/results.txt
: >"$results"
report() { echo "$1" | tee -a "$results"; }

echo "== topology and daemons"
if ! vm 120 'topo && start_all'; then
    report "FAIL setup: the topology or the daemons did not come up"
    failed=1
else
    echo "== cases"
    for c in $CASES; do
        if [ -n "${E2E_ONLY:-}" ]; then
            hit=0
            for w in ${E2E_ONLY//,/ }; do case $c in *"$w"*) hit=1 ;; esac; done
            [ $hit = 1 ] || continue
        fi
        name=${c//_/-}
        out=$(vm 240 "CASE=$name; case_$c" 2>&1) || true
        line=$(grep -E "^(PASS|FAIL) $name(:|$)" <<<"$out" | tail -1) || true
        [ -n "$line" ] || line="FAIL $name: no verdict from the guest: $(tail -3 <<<"$out" | tr '\n' ' ')"
        report "$line"
        case $line in PASS*) passed=$((passed + 1)) ;; *) failed=$((failed + 1)) ;; esac
    done
    # What the guest kept, for the failures' reasons.
    # shellcheck disable=SC2016  # the guest expands them
    vm 60 'tail -n 20 $D/espgw.log; echo; gwq stats | tr -d " \n" | grep -o "\"xfrm\":{[^}]*}[^}]*}"; echo' \
        >"$work/guest-tail.txt" 2>&1 || true
    if [ "$failed" != 0 ]; then
        echo "== espgw's log and xfrm counters in the guest (last lines)"
        cat "$work/guest-tail.txt"
    fi
fi

echo
echo "================ strongswan-e2e summary ================"
echo "espgw $(git describe --always --dirty 2>/dev/null || echo '?'), kernel $("$vmrun" --kver), IKE path ${E2E_IKE_PATH:-relay}, $(($(date +%s) - t0)) s"
grep -E '^(PASS|FAIL) ' "$results" | sed 's/:.*//' | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2} END {print ""}'
echo "strongswan-e2e: $passed passed, $failed failed"
[ "$failed" = 0 ]
