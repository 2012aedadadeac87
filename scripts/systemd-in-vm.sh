#!/usr/bin/env bash
# The Debian package and its systemd units under a real systemd: boots a
# Debian 12 system with systemd as PID 1 in qemu (the test VM's kernel and
# network, scripts/vm; the image from scripts/systemd-in-vm/build-image.sh)
# and, inside it, does what an operator does on a Debian 12 host:
#
#   dpkg -i the package of scripts/package-deb.sh; espgw check-config on
#   /etc/espgw/site-a.toml; `man espgw` and the completions; the two devices
#   site-a.toml names (eth0, eth1: veth pairs, their far ends in namespaces
#   lan and wan of the VM); systemctl start espgw@site-a (Type=notify: active
#   once started), the journal's "forwarding" line, privileges dropped, the
#   control socket answering `espgw stats` and `espgw sa list`, datagrams
#   from lan encapsulated out of eth1, systemctl reload and a SIGHUP (each logs
#   "configuration reloaded"), systemctl stop (inactive, exit status 0, not
#   failed), espgw-engine.service, and dpkg --purge (prerm stops a running
#   gateway).
#
# One line per case, "PASS name: ..." or "FAIL name: why", then
# "systemd-in-vm: N passed, M failed"; exits non-zero on any failure, and
# fails (never skips) when something it needs cannot be had. Needs root
# (network namespace, TAP, mmdebstrap), a Debian 12 host, and the packages
# scripts/vm/build.sh and build-image.sh install (qemu-system-x86,
# mmdebstrap, ...). Builds espgw (cargo build --release) and the package.
# KEEP=1 keeps the VM running (ESPGW_VM_DIR=/var/cache/espgw-vm-systemd
# scripts/vm/run.sh -n lpsysd -e 10.99.0.2 '...' reaches it).
#
#   sudo scripts/systemd-in-vm.sh
# The guest scripts below are single-quoted: they expand in the VM.
# shellcheck disable=SC2016
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
vmrun=$repo/scripts/vm/run.sh
NS=lpsysd TAP=lpsysd0 VM=10.99.0.2
export ESPGW_SYSD_VM_DIR=${ESPGW_SYSD_VM_DIR:-/var/cache/espgw-vm-systemd}
t0=$(date +%s)

die() { echo "systemd-in-vm: $*" >&2; echo "systemd-in-vm: 0 passed, 1 failed"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespace, TAP, mmdebstrap)"
[ -c /dev/net/tun ] || die "no /dev/net/tun (the VM's network is a TAP device)"

work=$(mktemp -d /tmp/espgw-sysd.XXXXXX)
share=$work/share
mkdir -p "$share"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local rc=$?
    if [ "${KEEP:-0}" = 1 ]; then
        echo "kept the VM (ESPGW_VM_DIR=$ESPGW_SYSD_VM_DIR $vmrun -n $NS -e $VM '...'; ... $vmrun --stop $TAP)"
    else
        ESPGW_VM_DIR=$ESPGW_SYSD_VM_DIR "$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
        "$vmrun" --teardown "$NS" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== the systemd image (scripts/systemd-in-vm/build-image.sh --if-needed, in $ESPGW_SYSD_VM_DIR)"
scripts/systemd-in-vm/build-image.sh --if-needed >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; die "the image could not be built"; }
tail -1 "$work/build.log"

echo "== espgw (release) and its Debian package"
cargo build --release --quiet --bin espgw || die "cargo build --release failed"
deb=$(DEB_COMPRESS=gzip scripts/package-deb.sh) || die "scripts/package-deb.sh failed"
cp "$deb" "$share/"
deb=${deb##*/}
echo "$deb ($(du -k "$share/$deb" | cut -f1) KiB)"

echo "== boot (systemd as PID 1, TCG)"
ESPGW_VM_DIR=$ESPGW_SYSD_VM_DIR "$vmrun" --stop "$TAP" >/dev/null 2>&1 || true
boot=$(ESPGW_VM_DIR=$ESPGW_SYSD_VM_DIR "$vmrun" -n "$NS" -t "$TAP" -d -w "${BOOT_WAIT:-300}" -m 1024 -S "$share") ||
    die "the VM did not boot to its ready line"
echo "$boot"
tboot=$(date +%s)

pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
ko() { fail=$((fail + 1)); echo "FAIL $*"; }
# vm SCRIPT: runs SCRIPT in the VM (its control port); output on stdout, its status.
vm() { EXEC_TIMEOUT=${EXEC_TIMEOUT:-240} "$vmrun" -n "$NS" -e "$VM" "$1"; }
# step NAME SCRIPT: one case that passes when SCRIPT exits 0. SCRIPT prints
# its summary as a last line "SUMMARY ..."; all its output is shown on failure.
step() {
    local name=$1 out rc summary
    out=$(vm "$2" 2>&1) && rc=0 || rc=$?
    summary=$(printf '%s\n' "$out" | sed -n 's/^SUMMARY //p' | tail -n 1)
    if [ "$rc" = 0 ]; then
        ok "$name: $summary"
    else
        ko "$name: exit $rc${summary:+, $summary}"
        printf '%s\n' "$out" | sed 's/^/    /'
    fi
}

step boot '
set -e
test "$(readlink /proc/1/exe)" = /usr/lib/systemd/systemd
state=$(systemctl is-system-running --wait || true)
systemctl --failed --no-legend
test "$state" = running
echo "SUMMARY PID 1 is $(readlink /proc/1/exe) ($(systemctl --version | head -n 1)), system $state, $(systemd-analyze | head -n 1 | sed "s/^Startup finished in //")"'

step dpkg_install '
set -e
deb=$(ls /mnt/host/espgw_*.deb)
dpkg -i "$deb"
test "$(dpkg-query -W -f "\${Status}" espgw)" = "install ok installed"
systemctl cat espgw@site-a.service >/dev/null
systemctl cat espgw-engine.service >/dev/null
test "$(stat -c %a /etc/espgw)" = 700
test "$(stat -c %a /etc/espgw/site-a.toml)" = 600
echo "SUMMARY dpkg -i ${deb##*/}: $(dpkg-query -W -f "\${Package} \${Version}" espgw) installed, espgw@.service and espgw-engine.service known to systemd, /etc/espgw 0700 with site-a.toml 0600"'

step check_config '
set -e
out=$(espgw check-config /etc/espgw/site-a.toml 2>&1)
printf "%s\n" "$out"
echo "SUMMARY espgw check-config /etc/espgw/site-a.toml: exit 0 ($(printf "%s\n" "$out" | head -n 1))"'

step man_and_completions '
set -e
MANPAGER=cat man espgw | grep -q espgw
man -w espgw-run >/dev/null
pages=$(ls /usr/share/man/man8 | grep -c "^espgw")
test -s /usr/share/bash-completion/completions/espgw
test -s /usr/share/zsh/vendor-completions/_espgw
test -s /usr/share/fish/vendor_completions.d/espgw.fish
bash -c ". /usr/share/bash-completion/bash_completion; _completion_loader espgw; complete -p espgw" | grep -q espgw
echo "SUMMARY man espgw renders, $pages espgw pages in man8 (man -w espgw-run: $(man -w espgw-run)); bash completion loads (complete -p espgw), zsh and fish files installed"'

step devices '
set -e
for n in lan wan; do ip netns add $n; ip -n $n link set lo up; done
ip link add eth0 address 02:00:00:00:01:01 type veth peer name lan0 address 02:00:00:00:01:10 netns lan
ip link add eth1 address 02:00:00:00:00:01 type veth peer name wan0 address 02:00:00:00:00:02 netns wan
ip link set eth0 up
ip link set eth1 up
ip -n lan addr add 192.168.1.10/24 dev lan0
ip -n lan link set lan0 up
ip -n lan route add 192.168.2.0/24 via 192.168.1.1
ip -n wan addr add 10.0.0.2/24 dev wan0
ip -n wan link set wan0 up
echo "SUMMARY eth0 and eth1 (the devices site-a.toml names) are veth pairs: eth0 to 192.168.1.10 in netns lan, eth1 to 10.0.0.2 in netns wan"'

step start '
set -e
systemctl start espgw@site-a
state=$(systemctl is-active espgw@site-a)
systemctl show -p Type,NotifyAccess,StatusText espgw@site-a
test "$state" = active
test "$(systemctl show -P Type espgw@site-a)" = notify
echo "SUMMARY systemctl start espgw@site-a returned (Type=notify), is-active: $state, status \"$(systemctl show -P StatusText espgw@site-a)\""'

step journal_forwarding '
set -e
line=$(journalctl -u espgw@site-a -b --no-pager -o cat | grep -m1 forwarding)
echo "$line"
echo "SUMMARY journalctl -u espgw@site-a: $line"'

step privileges '
set -e
pid=$(systemctl show -P MainPID espgw@site-a)
grep -E "^(Cap|NoNewPrivs|Seccomp)" /proc/$pid/status
eff=$(awk "/^CapEff/ {print \$2}" /proc/$pid/status)
bnd=$(awk "/^CapBnd/ {print \$2}" /proc/$pid/status)
test "$eff" = 0000000000004000
test "$(awk "/^NoNewPrivs/ {print \$2}" /proc/$pid/status)" = 1
test "$(awk "/^Seccomp:/ {print \$2}" /proc/$pid/status)" = 2
echo "SUMMARY MainPID $pid: CapEff $eff (CAP_IPC_LOCK only), CapBnd $bnd, NoNewPrivs 1, seccomp filter on"'

step control_socket '
set -e
ls -l /run/espgw/site-a.sock
test -S /run/espgw/site-a.sock
espgw stats --config /etc/espgw/site-a.toml
sa=$(espgw sa list --config /etc/espgw/site-a.toml)
printf "%s\n" "$sa"
printf "%s\n" "$sa" | grep -qi "0x0*1001\|4097"
printf "%s\n" "$sa" | grep -qi "0x0*1002\|4098"
echo "SUMMARY /run/espgw/site-a.sock answers espgw stats and espgw sa list --config /etc/espgw/site-a.toml (both SAs of a-b listed, SPIs 0x1001 and 0x1002)"'

step traffic '
set -e
rx() { ip -n wan -s link show wan0 | awk "/RX:/ {getline; print \$2; exit}"; }
encapsulated() { espgw stats --config /etc/espgw/site-a.toml | awk "\$1 == \"encapsulated\" {print \$2}"; }
before=$(rx) enc0=$(encapsulated)
ip netns exec lan bash -c "for i in 1 2 3; do echo espgw-test-\$i >/dev/udp/192.168.2.1/9; sleep 0.3; done"
sleep 1
after=$(rx) enc1=$(encapsulated)
espgw stats --config /etc/espgw/site-a.toml
echo "wan0 rx $before -> $after, encapsulated $enc0 -> $enc1"
test "$((enc1 - enc0))" -ge 3
test "$((after - before))" -ge 3
echo "SUMMARY 3 UDP datagrams 192.168.1.10 -> 192.168.2.1 from netns lan into eth0 (espgw answered ARP for 192.168.1.1): encapsulated $enc0 -> $enc1, wan0 beyond eth1 received $((after - before)) frames"'

step reload '
set -e
reloads() { journalctl -u espgw@site-a -b --no-pager -o cat | grep -c "configuration reloaded" || true; }
pid=$(systemctl show -P MainPID espgw@site-a)
n0=$(reloads)
systemctl reload espgw@site-a
n1=$(reloads)
journalctl -u espgw@site-a -b --no-pager -o cat | grep "configuration reloaded" | tail -n 1
test "$n1" -gt "$n0"
test "$(systemctl is-active espgw@site-a)" = active
test "$(systemctl show -P MainPID espgw@site-a)" = "$pid"
echo "SUMMARY systemctl reload espgw@site-a (ExecReload: espgw reload): \"configuration reloaded\" logged, still active, same MainPID $pid"'

step sighup '
set -e
reloads() { journalctl -u espgw@site-a -b --no-pager -o cat | grep -c "configuration reloaded" || true; }
pid=$(systemctl show -P MainPID espgw@site-a)
n0=$(reloads)
systemctl kill --kill-whom=main -s HUP espgw@site-a
for i in $(seq 50); do
    n1=$(reloads)
    [ "$n1" -gt "$n0" ] && break
    sleep 0.2
done
test "$n1" -gt "$n0"
test "$(systemctl is-active espgw@site-a)" = active
test "$(systemctl show -P MainPID espgw@site-a)" = "$pid"
echo "SUMMARY systemctl kill -s HUP espgw@site-a: \"configuration reloaded\" logged again, still active, same MainPID $pid"'

step stop '
set -e
systemctl stop espgw@site-a
state=$(systemctl is-active espgw@site-a || true)
systemctl show -p Result,ExecMainCode,ExecMainStatus espgw@site-a
test "$state" = inactive
test "$(systemctl show -P Result espgw@site-a)" = success
test "$(systemctl show -P ExecMainStatus espgw@site-a)" = 0
if systemctl is-failed --quiet espgw@site-a; then exit 1; fi
test ! -e /run/espgw/site-a.sock
test -d /var/lib/espgw/site-a
echo "SUMMARY systemctl stop espgw@site-a: $state, Result=success, exit status 0, not failed; control socket removed, state directory /var/lib/espgw/site-a kept"'

step engine '
set -e
systemctl start espgw-engine.service
for i in $(seq 150); do [ -S /run/espgw/engine.sock ] && break; sleep 0.2; done
state=$(systemctl is-active espgw-engine.service)
test "$state" = active
test -S /run/espgw/engine.sock
journalctl -u espgw-engine.service -b --no-pager -o cat | tail -n 3
systemctl stop espgw-engine.service
after=$(systemctl is-active espgw-engine.service || true)
test "$after" = inactive
test "$(systemctl show -P Result espgw-engine.service)" = success
echo "SUMMARY systemctl start espgw-engine: $state, /run/espgw/engine.sock there; systemctl stop: $after, Result=success"'

step dpkg_purge '
set -e
systemctl start espgw@site-a
test "$(systemctl is-active espgw@site-a)" = active
dpkg --purge espgw
state=$(systemctl is-active espgw@site-a || true)
test "$state" = inactive
if systemctl is-failed --quiet espgw@site-a; then exit 1; fi
test ! -e /usr/bin/espgw
test ! -e /var/lib/espgw
test ! -e /etc/espgw
echo "SUMMARY dpkg --purge espgw with espgw@site-a running: prerm stopped it ($state, not failed); /usr/bin/espgw, /etc/espgw and /var/lib/espgw gone"'

if [ "$fail" != 0 ]; then
    echo "== the VM's journal, espgw units"
    vm 'journalctl -b --no-pager -o short-monotonic -u "espgw*" | tail -n 60' 2>&1 | sed 's/^/    /' || true
fi
echo "systemd-in-vm: boot $(echo "$boot" | grep -o 'ready in [0-9.]* s'), cases $(($(date +%s) - tboot)) s, $(($(date +%s) - t0)) s in all"
echo "systemd-in-vm: $pass passed, $fail failed"
[ "$fail" = 0 ]
