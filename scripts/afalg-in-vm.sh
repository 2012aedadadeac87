#!/usr/bin/env bash
# Runs the AF_ALG engine tests (tests/afalg.rs) inside the linux-peer VM,
# whose stock Debian kernel has AF_ALG, when the host kernel has not.
#
#   scripts/afalg-in-vm.sh            # build, boot, run, tear down
#
# Needs root (network namespace, TAP) and ../shared/tools/linux-peer. The
# test binary is linked statically against glibc so that it runs in the
# VM's busybox initramfs.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
peer=${LINUX_PEER:-$repo/../shared/tools/linux-peer}
if [ ! -x "$peer/run-peer.sh" ]; then
    echo "afalg-in-vm: linux-peer not found at $peer (set LINUX_PEER)" >&2
    exit 2
fi
target=${STATIC_TARGET_DIR:-/tmp/espgw-static-target}
share=$(mktemp -d /tmp/espgw-vmshare.XXXXXX)
cleanup() {
    "$peer/run-peer.sh" --stop lptap0 >/dev/null 2>&1 || true
    "$peer/run-peer.sh" --teardown lpeer >/dev/null 2>&1 || true
    rm -rf "$share"
}
trap cleanup EXIT

echo "== building the AF_ALG test binary (static)"
binary=$(RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target" \
    cargo test --test afalg --no-run --target x86_64-unknown-linux-gnu --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "afalg":
        print(m["executable"])')
cp "$binary" "$share/afalg-test"

echo "== booting the linux-peer VM"
if [ ! -f /tmp/linux-peer/initramfs.gz ]; then
    "$peer/build-initramfs.sh" --install-deps
fi
"$peer/run-peer.sh" -d -S "$share"

echo "== running tests/afalg.rs inside the VM"
"$peer/run-peer.sh" -e 10.99.0.2 'uname -r; /mnt/host/afalg-test --test-threads 1 --nocapture 2>&1; echo "afalg-test exit $?"' |
    tee "$share/result.txt"
grep -q "afalg-test exit 0" "$share/result.txt"
