#!/usr/bin/env bash
# Soak: the demo topology (four network namespaces, two gateways) under
# mixed traffic -- numbered UDP both ways at several sizes, TCP, ping --
# with a rekey every megabyte and injected engine faults (every 5000th
# descriptor fails, every 20000th completion is lost), for a bounded time.
# Fails on a crash, memory or pool-buffer growth, counters that do not add
# up, or datagrams lost beyond the drops the gateways and kernel counted.
#
# Usage: sudo scripts/soak.sh [SECONDS]    (default 600; .ci/run uses 60)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
cargo build --release --quiet
exec target/release/espgw demo --soak "$seconds" \
    --rekey-every 1MB --fail-every 5000 --lose-completion-every 20000
