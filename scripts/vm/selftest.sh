#!/usr/bin/env bash
# The test VM's own check: builds the image if needed, boots one VM in a
# network namespace of its own (lpvmcheck, tap lpvmc0), and checks
#   1. the boot: the AF_ALG known answers (`vmtool afalg`) all pass;
#   2. the control port: a script runs and its exit status comes back;
#   3. lp-xfrm installed the boot's SA pair (2 states, 3 policies);
#   4. strongSwan: `ss-check` (two charons in two namespaces of the VM, an
#      IKEv2 tunnel between them, a ping through it) passes;
#   5. a ping from the host's namespace to the VM.
# Stops the VM and removes the namespace; prints "vm-selftest: N passed, M
# failed" last and exits non-zero on any failure. Needs root.
#
#   sudo scripts/vm/selftest.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
NS=lpvmcheck TAP=lpvmc0 VM=10.99.0.2
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
ko() { fail=$((fail + 1)); echo "FAIL $*"; }
vm() { EXEC_TIMEOUT=${EXEC_TIMEOUT:-180} "$here/run.sh" -n "$NS" -e "$VM" "$1"; }
cleanup() {
	"$here/run.sh" --stop "$TAP" >/dev/null 2>&1 || true
	ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || { echo "vm-selftest: needs root (network namespace, TAP)" >&2; exit 2; }
t0=$(date +%s)
"$here/build.sh" --if-needed
cleanup
boot=$("$here/run.sh" -n "$NS" -t "$TAP" -d -w 180)
echo "$boot"
log=$("$here/run.sh" --log "$TAP")

s=$(grep -o 'AF_ALG summary: [^=]*' "$log" || true)
if grep -q 'AF_ALG summary: [1-9][0-9]* passed, 0 failed' "$log"; then ok "AF_ALG known answers at boot: $s"; else ko "AF_ALG known answers at boot: ${s:-no summary} (see $log)"; fi

set +e
out=$(vm 'echo hello from $(uname -r); exit 7')
rc=$?
set -e
if [ "$rc" = 7 ] && [ "$out" = "hello from $("$here/run.sh" --kver)" ]; then
	ok "control port: output and exit status come back ($out)"
else
	ko "control port: rc $rc, output '$out'"
fi

n=$(vm 'echo "$(ip xfrm state | grep -c "^src") $(ip xfrm policy | grep -c "^src")"' || true)
if [ "$n" = "2 3" ]; then ok "lp-xfrm: the boot's SA pair (2 states, 3 policies)"; else ko "lp-xfrm: states and policies '$n'"; fi

out=$(vm 'ss-check' 2>&1) && rc=0 || rc=$?
echo "$out" | sed 's/^/    /'
if [ "$rc" = 0 ] && echo "$out" | grep -q 'ss-check: [1-9][0-9]* passed, 0 failed'; then
	ok "strongSwan in the VM: $(echo "$out" | grep 'ss-check: .* passed')"
else
	ko "strongSwan in the VM (ss-check exit $rc)"
fi

if ip netns exec "$NS" ping -c 2 -W 2 "$VM" >/dev/null; then ok "ping 10.99.0.1 -> $VM over the TAP device"; else ko "ping $VM"; fi

echo "vm-selftest: boot $(echo "$boot" | grep -o 'ready in [0-9.]* s'), $(($(date +%s) - t0)) s in all"
echo "vm-selftest: $pass passed, $fail failed"
[ "$fail" = 0 ]
