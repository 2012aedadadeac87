#!/usr/bin/env bash
# The AF_ALG engine for real, inside the linux-peer VM, whose stock Debian
# kernel has AF_ALG (this host's kernel has not):
#   1. lib-tests/tests/afalg.rs (every algorithm, style, buffer policy, sync
#      and io_uring I/O, with and without ESN: the same bytes as `soft`);
#   2. `espgw pcap --engine afalg` (sync and io-uring) over UDP packets of
#      every IP size from 28 to 1500 bytes, for every algorithm, against the
#      `soft` engine's output made on the host: afalg-encapsulated ESP
#      decapsulated by soft, and soft's ESP decapsulated by afalg, give the
#      soft round trip's packets byte for byte; where the ESP has no random
#      IV (GCM, null) the ESP itself is byte-identical too;
#   3. `espgw bench --engine afalg` against `--engine soft` at 64 and 1420
#      bytes: the cost per packet as a ratio (the VM is emulated by TCG, so
#      only ratios mean anything).
#
#   scripts/afalg-in-vm.sh               build, boot a VM, run, tear down
#   scripts/afalg-in-vm.sh --prepare DIR build and write everything into DIR,
#                                        the directory the VM will share (-S DIR)
#   scripts/afalg-in-vm.sh --run DIR     run in a VM already booted with -S DIR
#                                        (scripts/linux-interop.sh does these two)
#
# Needs root (network namespace, TAP); the VM is scripts/vm's (its image is
# built when missing). The binaries are the host's release builds; DIR/lib
# carries the host's copies of their libraries, and they run through
# DIR/lib's dynamic loader, so they do not depend on the libraries in the
# VM's image. Prints "AF_ALG: N passed, M failed" last; exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
vmrun=$repo/scripts/vm/run.sh
VM=10.99.0.2
ALGORITHMS="aes128gcm16 aes256gcm16 chacha20poly1305 aes128-sha1 aes256-sha256 3des-sha1 null-sha1 null"
BENCH_ALGORITHMS="aes128gcm16,aes256gcm16,chacha20poly1305,aes128-sha1,aes256-sha256,3des-sha1,null-sha1"

# A command in the VM over its control port; under TCG on a busy host the
# longer steps can take minutes, hence the generous limit.
vm() { EXEC_TIMEOUT=${EXEC_TIMEOUT:-400} "$vmrun" -e "$VM" "$1"; }

# The release build of the library test NAME (lib-tests/tests/NAME.rs); its
# path.
test_binary() {
    local path
    path=$(cargo test --release -p espgw-lib-tests --test "$1" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1")
    [ -x "$path" ] || { echo "afalg-in-vm: no $1 test binary" >&2; return 1; }
    echo "$path"
}

# passed TEST FILE: the test binary's output in FILE says TEST ran and passed
# (testkit pads names to a column; a test that could not run says "ignored").
passed() { grep -Eq "^test $1 +\.\.\. ok" "$2"; }

prepare() {
    local dir=$1 espgw afalg_test alg
    mkdir -p "$dir/lib" "$dir/pcap"
    echo "== building espgw and the AF_ALG test binary (release)"
    cargo build --release --quiet --bin espgw
    espgw=$repo/target/release/espgw
    local verdicts_test
    afalg_test=$(test_binary afalg) || return 1
    # lib-tests/tests/verdicts.rs takes the afalg engine into its engine x
    # style x buffers comparison where the kernel has AF_ALG, as the VM's has.
    verdicts_test=$(test_binary verdicts) || return 1
    cp "$espgw" "$dir/espgw"
    cp "$afalg_test" "$dir/afalg-test"
    cp "$verdicts_test" "$dir/verdicts-test"
    # Their shared libraries and loader, from this host.
    for lib in $(ldd "$espgw" "$afalg_test" "$verdicts_test" | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
        cp -L "$lib" "$dir/lib/"
    done
    cat >"$dir/run" <<'EOF'
#!/bin/sh
# Runs a host binary from the share with the host's libraries.
exec /mnt/host/lib/ld-linux-x86-64.so.2 --library-path /mnt/host/lib "$@"
EOF
    chmod +x "$dir/run"

    echo "== soft-engine reference captures (host)"
    python3 scripts/make-pcap.py "$dir/pcap/plain.pcap" 0 1472 1
    local log
    for alg in $ALGORITHMS; do
        cp "configs/algorithms/$alg-a.toml" "configs/algorithms/$alg-b.toml" "$dir/pcap/"
        # Fresh state directories: the references count from 1.
        rm -rf "$dir/state-a" "$dir/state-b"
        log=$("$espgw" pcap --config "configs/algorithms/$alg-a.toml" --from inside --engine soft \
            --state-dir "$dir/state-a" --in "$dir/pcap/plain.pcap" --out "$dir/pcap/$alg-esp-soft.pcap" 2>&1)
        log="$log $("$espgw" pcap --config "configs/algorithms/$alg-b.toml" --from outside --engine soft \
            --state-dir "$dir/state-b" --in "$dir/pcap/$alg-esp-soft.pcap" --out "$dir/pcap/$alg-out-soft.pcap" 2>&1)"
        # Both runs: every frame through, nothing dropped.
        case $log in
        *"1473 encapsulated"*"no drops"*"1473 decapsulated"*"no drops"*) ;;
        *) echo "afalg-in-vm: soft reference for $alg: $log" >&2; return 1 ;;
        esac
    done
    echo "$ALGORITHMS" >"$dir/pcap/algorithms"
    cat >"$dir/pcap/check.sh" <<'EOF'
#!/bin/sh
# Inside the VM: espgw pcap --engine afalg against the host's soft captures.
# check.sh [ALGORITHM...]   (default: every algorithm in $P/algorithms)
H=/mnt/host P=/mnt/host/pcap T=/tmp/afalg-pcap
mkdir -p $T
fail=0
gw() { # gw ALG SIDE FROM ENGINE IO IN OUT
    # A state directory of its own per run: every run counts from 1, as
    # the reference captures did.
    rm -rf $T/state
    out=$($H/run $H/espgw pcap --config $P/$1-$2.toml --from $3 --engine $4 ${5:+--afalg-io $5} \
        --state-dir $T/state --in $6 --out $7 2>&1)
    case $out in *"no drops"*) return 0 ;; esac
    echo "     $1 $4 $5: $out"
    return 1
}
for alg in ${*:-$(cat $P/algorithms)}; do
    for io in sync io-uring; do
        ok=1 what=
        gw $alg a inside afalg $io $P/plain.pcap $T/esp.pcap || ok=0
        gw $alg b outside soft "" $T/esp.pcap $T/out-afalg-soft.pcap || ok=0
        gw $alg b outside afalg $io $P/$alg-esp-soft.pcap $T/out-soft-afalg.pcap || ok=0
        cmp -s $T/out-afalg-soft.pcap $P/$alg-out-soft.pcap || { ok=0; what="$what afalg->soft"; }
        cmp -s $T/out-soft-afalg.pcap $P/$alg-out-soft.pcap || { ok=0; what="$what soft->afalg"; }
        case $alg in
        *gcm*|chacha20poly1305|null|null-sha1) # no random IV: the ESP itself is the same
            cmp -s $T/esp.pcap $P/$alg-esp-soft.pcap || { ok=0; what="$what esp-bytes"; }
            note="ESP bytes identical to soft, round trips identical" ;;
        *) note="round trips identical (CBC IVs are random)" ;;
        esac
        if [ $ok = 1 ]; then
            echo "PASS pcap --engine afalg --afalg-io $io $alg: $note"
        else
            fail=$((fail + 1)); echo "FAIL pcap --engine afalg --afalg-io $io $alg:$what differ"
        fi
        rm -f $T/*.pcap
    done
done
[ $fail = 0 ]
EOF
}

run() {
    local dir=$1 out pass=0 fail=0
    out=$(mktemp -d /tmp/espgw-afalg.XXXXXX)
    echo "== AF_ALG in the VM: kernel $(vm 'uname -r')"

    echo "== lib-tests/tests/afalg.rs inside the VM (release build)"
    vm '/mnt/host/run /mnt/host/afalg-test --test-threads 1 >/tmp/afalg-test.txt 2>&1; echo "afalg-test exit $?" >>/tmp/afalg-test.txt; cat /tmp/afalg-test.txt' |
        tee "$out/afalg-test.txt" | grep -E '^test |test result|exit'
    if grep -q "afalg-test exit 0" "$out/afalg-test.txt" && passed afalg_gives_the_same_bytes_as_soft "$out/afalg-test.txt"; then
        pass=$((pass + 1)); echo "PASS lib-tests/tests/afalg.rs (every algorithm x style x buffers x sync/io_uring x ESN)"
    else
        fail=$((fail + 1)); echo "FAIL lib-tests/tests/afalg.rs"
    fi

    echo "== lib-tests/tests/verdicts.rs inside the VM: the same inbound verdicts on soft, sec and afalg"
    vm '/mnt/host/run /mnt/host/verdicts-test --test-threads 1 >/tmp/verdicts-test.txt 2>&1; echo "verdicts-test exit $?" >>/tmp/verdicts-test.txt; cat /tmp/verdicts-test.txt' |
        tee "$out/verdicts-test.txt" | grep -E '^test |test result|exit'
    if grep -q "verdicts-test exit 0" "$out/verdicts-test.txt" &&
        passed every_engine_style_and_buffer_policy_gives_the_same_verdicts "$out/verdicts-test.txt" &&
        passed afalg_gives_the_same_verdicts_in_every_style_and_buffer_policy "$out/verdicts-test.txt"; then
        pass=$((pass + 1)); echo "PASS lib-tests/tests/verdicts.rs with afalg (every engine x style x buffers, ESN wrap, duplicates, forgeries)"
    else
        fail=$((fail + 1)); echo "FAIL lib-tests/tests/verdicts.rs with afalg"
    fi

    echo "== espgw pcap --engine afalg inside the VM, against soft"
    local alg n=0
    for alg in $ALGORITHMS; do   # one control-port call each: bounded by EXEC_TIMEOUT
        vm "sh /mnt/host/pcap/check.sh $alg" | tee -a "$out/pcap.txt" || true
        n=$((n + 2))
    done
    local ok
    ok=$(grep -c '^PASS pcap' "$out/pcap.txt" || true)
    echo "pcap: $ok passed, $((n - ok)) failed"
    if [ "$ok" = "$n" ]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1)); echo "FAIL espgw pcap --engine afalg"
    fi

    echo "== espgw bench: afalg vs soft cost per packet inside the VM (TCG emulation: ratios only)"
    local args="--sizes 64,1420 --algorithms $BENCH_ALGORITHMS --scenarios esp --slice-ms 30 --repetitions 7"
    if vm "cd /tmp && /mnt/host/run /mnt/host/espgw bench --engine soft $args --json /tmp/bench-soft.json >/dev/null 2>&1 &&
           /mnt/host/run /mnt/host/espgw bench --engine afalg $args --json /tmp/bench-afalg.json >/dev/null 2>&1" &&
        vm 'cat /tmp/bench-soft.json' >"$out/bench-soft.json" &&
        vm 'cat /tmp/bench-afalg.json' >"$out/bench-afalg.json" &&
        python3 - "$out/bench-soft.json" "$out/bench-afalg.json" <<'EOF' | tee "$out/bench.txt"
import json, sys
# The fastest repetition: on a shared host the emulated vCPU is preempted at
# random, and the minimum is the estimate least disturbed by that.
cost = lambda c: min(c["repetitions_ns"])  # noqa: E731
soft = {(c["scenario"].split("/")[0], c["path"], c["frame_size"]): cost(c)
        for c in json.load(open(sys.argv[1]))["cells"] if "/soft" in c["scenario"]}
afalg = [c for c in json.load(open(sys.argv[2]))["cells"] if "/afalg/" in c["scenario"]]
styles = []
for c in afalg:
    s = c["scenario"].split("/")[2]
    if s not in styles:
        styles.append(s)
algs = []
for c in afalg:
    a = c["scenario"].split("/")[0]
    if a not in algs:
        algs.append(a)
ns = {(c["scenario"].split("/")[0], c["scenario"].split("/")[2], c["path"], c["frame_size"]): cost(c) for c in afalg}
print("AF_ALG / soft cost per packet (encapsulation + decapsulation ns per packet, fastest of the repetitions),")
print("inside the TCG-emulated VM: absolute times are emulation times, only the ratios compare; afalg I/O is io_uring")
head = f"{'algorithm':<15} {'bytes':>5} {'soft ns':>9} " + " ".join(f"{'afalg/' + s + ' ns':>18} {'ratio':>6}" for s in styles)
print(head)
for a in algs:
    for size in (64, 1420):
        base = soft[(a, "encap", size)] + soft[(a, "decap", size)]
        row = f"{a:<15} {size:>5} {base:>9.0f} "
        for s in styles:
            v = ns[(a, s, "encap", size)] + ns[(a, s, "decap", size)]
            row += f"{v:>18.0f} {v / base:>5.1f}x "
        print(row.rstrip())
EOF
    then
        pass=$((pass + 1))
    else
        fail=$((fail + 1)); echo "FAIL espgw bench --engine afalg"
    fi
    echo "AF_ALG: $pass passed, $fail failed"
    rm -rf "$out"
    [ "$fail" = 0 ]
}

case "${1:-}" in
--prepare) prepare "${2:?--prepare DIR}" ;;
--run) run "${2:?--run DIR}" ;;
"")
    share=$(mktemp -d /tmp/espgw-vmshare.XXXXXX)
    cleanup() {
        "$vmrun" --stop lptap0 >/dev/null 2>&1 || true
        "$vmrun" --teardown lpeer >/dev/null 2>&1 || true
        rm -rf "$share"
    }
    trap cleanup EXIT
    prepare "$share"
    scripts/vm/build.sh --if-needed
    echo "== booting the linux-peer VM"
    "$vmrun" -d -m 512 -S "$share" lp_selftest=0
    run "$share"
    ;;
*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
esac
