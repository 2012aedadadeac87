#!/usr/bin/env bash
# espgw keyed by strongSwan, end to end, inside the linux-peer VM (its
# Debian kernel has the ESP that charon's SAs need; this host's has not):
# `espgw demo --keying strongswan` there, once per case. Each case builds
# the demo's four namespaces plus a keying namespace per gateway, where an
# unmodified charon (Debian's strongSwan 5.9) runs IKEv2 with a pre-shared
# key through espgw's IKE relay; espgw mirrors its SAs from XFRM and carries
# ping, UDP and TCP; charon's view of the SAs' traffic comes from espgw
# (NEWAE), and with --rekey-every charon rekeys on espgw's EXPIRE under a
# numbered UDP stream both ways, which must lose and duplicate nothing.
#
#   scripts/strongswan-demo-in-vm.sh       build, boot a VM, run, tear down
#
# Uses the workspace's release binary (built if missing). Needs root
# (network namespace, TAP); the VM is scripts/vm's (its image is built when
# missing), with its own netns and tap (lpswan, lpswan0). Prints a PASS or
# FAIL line per case and "strongswan-demo-in-vm: N passed, M failed" last;
# exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
vmrun=$repo/scripts/vm/run.sh
NS=lpswan TAP=lpswan0 VM=10.99.0.2

case "${1:-}" in
"") ;;
*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
esac

vm() { EXEC_TIMEOUT=${EXEC_TIMEOUT:-900} "$vmrun" -n "$NS" -e "$VM" "$1"; }

share=$(mktemp -d /tmp/espgw-swan.XXXXXX)
cleanup() {
    "$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
    "$vmrun" --teardown "$NS" >/dev/null 2>&1 || true
    rm -rf "$share"
}
trap cleanup EXIT

bin=${CARGO_TARGET_DIR:-$repo/target}/release/espgw
if [ ! -x "$bin" ]; then
    echo "== building espgw (release)"
    cargo build --release --quiet
fi
cp "$bin" "$share/espgw"
# The demo reads the shipped configurations from where it was built.
cp -r configs "$share/configs"

scripts/vm/build.sh --if-needed
echo "== booting the linux-peer VM (netns $NS, tap $TAP)"
"$vmrun" -n "$NS" -t "$TAP" -d -m 1024 -c 2 -S "$share" lp_selftest=0
vm "mkdir -p /usr/local/bin '$repo' && cp /mnt/host/espgw /usr/local/bin/espgw && cp -r /mnt/host/configs '$repo/'"
echo "== espgw demo --keying strongswan in the VM: kernel $(vm 'uname -r'), $(vm '/usr/sbin/swanctl --version 2>&1 | grep -o "strongSwan [0-9.]*" | head -1')"

pass=0 fail=0
# Whether charon A's counts of its outbound SA are espgw's (gwA's `sa
# list` in the same report) within one packet: what charon shows came from
# espgw, through the kernel (NEWAE).
charon_counts_are_espgws() {
    local line spi bytes packets row
    line=$(grep -Eo 'charon A \(espgw-keyA\): out [0-9a-f]{8}, +[0-9]+ bytes, +[0-9]+ packets' <<<"$1" | tail -1)
    [ -n "$line" ] || return 1
    read -r _ _ _ _ spi bytes _ packets _ <<<"$line"
    spi=${spi%,}
    row=$(grep -E "xfrm-r[0-9]+-out-$spi " <<<"$1") || return 1
    # name dir spi mode proposal xfrm reqid N state age idle packets bytes
    read -r _ _ _ _ _ _ _ _ _ _ _ espgw_packets espgw_bytes _ <<<"$row"
    echo "    charon: $packets packets, $bytes bytes; espgw: $espgw_packets packets, $espgw_bytes bytes (SPI $spi)"
    [ "$packets" -gt 0 ] && [ $((espgw_packets - packets)) -le 1 ] && [ $((packets - espgw_packets)) -le 1 ] &&
        [ $((espgw_bytes - bytes)) -le 1500 ] && [ $((bytes - espgw_bytes)) -le 1500 ]
}

# case NAME ARGS CHECK...: the demo with ARGS must pass, and its report
# must have every line CHECK (a grep -E pattern; `=charon` for
# charon_counts_are_espgws).
case_() {
    local name=$1 args=$2
    shift 2
    local out
    out=$(vm "cd /tmp && PATH=\$PATH:/usr/local/bin espgw demo --keying strongswan --tcp-bytes 200000 $args 2>&1; echo demo-exit=\$?") || true
    local why=
    grep -q '^demo-exit=0$' <<<"$out" || why="the demo failed"
    for check in "$@"; do
        [ -n "$why" ] && break
        if [ "$check" = "=charon" ]; then
            charon_counts_are_espgws "$out" || why="charon's counts are not espgw's"
        else
            grep -Eq -- "$check" <<<"$out" || why="no line matching /$check/"
        fi
    done
    if [ -z "$why" ]; then
        pass=$((pass + 1))
        echo "PASS $name"
    else
        fail=$((fail + 1))
        echo "FAIL $name: $why"
        grep -Ev '^  (link|esp) ' <<<"$out" | sed 's/^/    /' | tail -40
    fi
}

case_ "aes128gcm16: IKEv2 through the relay, SAs mirrored, ping/UDP/TCP, charon sees espgw's counts" "" \
    "INSTALLED, TUNNEL, ESP:AES_GCM_16-128" "=charon" "no plaintext leaked" "^  ok$"
case_ "aes256gcm16" "--algorithm aes256gcm16" "ESP:AES_GCM_16-256" "^  ok$"
case_ "chacha20poly1305" "--algorithm chacha20poly1305" "ESP:CHACHA20_POLY1305" "^  ok$"
case_ "aes256-sha256 (CBC and HMAC)" "--algorithm aes256-sha256" "ESP:AES_CBC-256/HMAC_SHA2_256_128" "^  ok$"
case_ "CHILD_SA rekeys by bytes (charon, on espgw's EXPIRE) under numbered UDP both ways, nothing lost" \
    "--rekey-every 200kB" \
    "rekey every 200000 bytes: ([5-9]|[1-9][0-9]+) rekeys at gwA.*2000/2000 hostA→hostB and 2000/2000 hostB→hostA received, 0 duplicates; 0 packets lost in the gateways → nothing lost" \
    "^  ok$"
echo "strongswan-demo-in-vm: $pass passed, $fail failed"
[ "$fail" = 0 ]
