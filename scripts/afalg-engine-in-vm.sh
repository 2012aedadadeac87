#!/usr/bin/env bash
# accel's AF_ALG engine tests (accel/tests/afalg_engine.rs) inside the
# linux-peer VM, whose stock Debian kernel has AF_ALG (this host's kernel
# has not, so there the tests show as ignored):
#   every algorithm x direction x single-pass and two-descriptor sequences x
#   buffer policy x sync/io_uring x ESN against accel::SoftEngine, forged
#   ICVs, per-session order, zero allocations per job on the registered
#   path, Drop and reclaim with requests on the ring, released handles.
#
#   scripts/afalg-engine-in-vm.sh         build, boot a VM, run, tear down
#
# Builds only the accel crate's test (release), in the workspace's target
# directory, so that it reuses what `cargo build --release` compiled (cargo
# keeps artifacts of different feature sets apart; $CARGO_TARGET_DIR
# overrides). Needs root (network namespace, TAP); the VM is
# scripts/vm's (its image is built when missing). The VM gets its own netns
# and tap (lpafeng, lpafe0), so it does not collide with
# scripts/afalg-in-vm.sh. The share carries the host's libraries and the
# binary runs through their dynamic loader, independent of the image's.
# Prints "N passed, M failed" last; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
vmrun=$repo/scripts/vm/run.sh
NS=lpafeng TAP=lpafe0 VM=10.99.0.2

case "${1:-}" in
"") ;;
*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
esac

vm() { EXEC_TIMEOUT=${EXEC_TIMEOUT:-1200} "$vmrun" -n "$NS" -e "$VM" "$1"; }

share=$(mktemp -d /tmp/espgw-afalg-engine.XXXXXX)
out=$(mktemp -d /tmp/espgw-afalg-engine-out.XXXXXX)
cleanup() {
    "$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
    "$vmrun" --teardown "$NS" >/dev/null 2>&1 || true
    rm -rf "$share" "$out"
}
trap cleanup EXIT

echo "== building accel's afalg_engine test binary (release)"
bin=$(cd accel && cargo test --release --test afalg_engine --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "afalg_engine":
        print(m["executable"])')
[ -x "$bin" ] || { echo "afalg-engine-in-vm: no afalg_engine test binary" >&2; exit 1; }
mkdir -p "$share/lib"
cp "$bin" "$share/afalg-engine"
for lib in $(ldd "$bin" | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
    cp -L "$lib" "$share/lib/"
done
cat >"$share/run" <<'EOF'
#!/bin/sh
# Runs a host binary from the share with the host's libraries.
exec /mnt/host/lib/ld-linux-x86-64.so.2 --library-path /mnt/host/lib "$@"
EOF
chmod +x "$share/run"

scripts/vm/build.sh --if-needed
echo "== booting the linux-peer VM (netns $NS, tap $TAP)"
"$vmrun" -n "$NS" -t "$TAP" -d -m 512 -S "$share" lp_selftest=0
echo "== AF_ALG in the VM: kernel $(vm 'uname -r')"

echo "== accel/tests/afalg_engine.rs inside the VM (--include-ignored)"
# Every test once, then the Drop test three more times (it races the
# kernel's cancellation of requests on the ring).
vm 'cd /tmp && T="/mnt/host/run /mnt/host/afalg-engine --include-ignored --test-threads 1"
rc=0
$T >/tmp/afalg-engine.txt 2>&1 || rc=1
for i in 1 2 3; do
    $T --exact drop_with_requests_outstanding_cancels_and_waits >>/tmp/afalg-engine.txt 2>&1 || rc=1
done
echo "afalg-engine exit $rc" >>/tmp/afalg-engine.txt; cat /tmp/afalg-engine.txt' \
    >"$out/result.txt" || true
grep -v '^$' "$out/result.txt" || true
sum() { grep -E '^test result:' "$out/result.txt" | sed -n "s/.* \([0-9]*\) $1.*/\1/p" | awk '{s += $1} END {print s + 0}'; }
passed=$(sum passed) failed=$(sum failed) ignored=$(sum ignored)
if ! grep -q '^test result:' "$out/result.txt"; then
    echo "afalg-engine-in-vm: the test binary gave no result" >&2
    failed=1
fi
echo "${passed} passed, ${failed} failed (${ignored} ignored; the Drop test ran 4 times)"
[ "$failed" = 0 ] && [ "$ignored" = 0 ] && grep -q "afalg-engine exit 0" "$out/result.txt"
