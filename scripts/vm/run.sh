#!/usr/bin/env bash
# Boots the test VM that scripts/vm/build.sh made, under qemu, on a TAP
# device inside a network namespace of this host, and talks to it.
#
#   run.sh [options] [lp_NAME=value ...]   boot a VM; lp_* words configure the
#                                          guest (scripts/vm/README.md)
#   run.sh [-n NS] [-P PORT] -e VM_IP 'shell script'
#                                          run a script in the VM through its control
#                                          port; prints its output, exits with its status
#   run.sh --stop NAME                     stop the VM NAME (booted with -d)
#   run.sh --teardown NS                   delete the network namespace NS
#   run.sh --log NAME                      print the path of VM NAME's console log
#   run.sh --kver                          print the image's kernel version
#
# options:
#   -n NS     network namespace (default lpeer; made if missing)
#   -t TAP    TAP device in NS (default lptap0; made if missing)
#   -b BR     put TAP into bridge BR (made in NS if missing), the host address on BR
#   -H CIDR   the host's address in NS (default 10.99.0.1/24; "none": no address)
#   -N NAME   the VM's name for its log, pid and monitor files (default: TAP)
#   -d        in the background: console to the log file; waits until the guest
#             says it is ready, then prints "run: NAME ready in S s ..."
#   -w SEC    with -d: how long to wait for ready (default 60)
#   -m MB     memory (default 256)         -c N   vCPUs (default 1)
#   -S DIR    share DIR read-only with the VM (virtio-9p, on /mnt/host; the guest
#             runs /mnt/host/peer-init.sh before it is ready, if there is one)
#   -a ACCEL  kvm, tcg or auto (default): KVM only where /dev/kvm opens and the CPU
#             has vmx or svm (a paravirtual /dev/kvm without them crawls), else TCG
#   -P PORT   the guest's control port (default 5555)
#   -v        verbose kernel console
# environment: ESPGW_VM_DIR (see common.sh), EXEC_TIMEOUT (-e's limit in seconds,
# default 120), QEMU_EXTRA (more qemu arguments, split on spaces).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

NS=lpeer TAP=lptap0 BR= HOSTADDR=10.99.0.1/24 NAME= DAEMON=0 WAIT=60 MEM=256 CPUS=1
SHARE= ACCEL=auto PORT=5555 VERBOSE=0 EXEC_IP=
die() { echo "run: $*" >&2; exit 1; }

stop_vm() {
	local pidf=$VM_RUN/$1.pid pid
	[ -f "$pidf" ] || { echo "run: $1 is not running (no pid file)"; return 0; }
	pid=$(cat "$pidf")
	if [ -r "/proc/$pid/cmdline" ] && tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qx "espgw-vm-$1"; then
		kill "$pid"
		for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
		[ -d "/proc/$pid" ] && kill -9 "$pid"
		echo "run: stopped $1 (pid $pid)"
	else
		echo "run: $1 (pid $pid) is not running"
	fi
	rm -f "$pidf" "$VM_RUN/$1.mon"
}

case "${1:-}" in
--stop) stop_vm "${2:?--stop NAME}"; exit 0 ;;
--teardown) ip netns del "${2:?--teardown NS}"; exit 0 ;;
--log) echo "$VM_RUN/${2:?--log NAME}.log"; exit 0 ;;
--kver) cat "$VM_IMAGE/KVER"; exit 0 ;;
esac

while getopts "n:t:b:H:N:dw:m:c:S:a:P:e:vh" o; do
	case $o in
	n) NS=$OPTARG ;; t) TAP=$OPTARG ;; b) BR=$OPTARG ;; H) HOSTADDR=$OPTARG ;; N) NAME=$OPTARG ;;
	d) DAEMON=1 ;; w) WAIT=$OPTARG ;; m) MEM=$OPTARG ;; c) CPUS=$OPTARG ;;
	S) SHARE=$(readlink -f "$OPTARG") ;; a) ACCEL=$OPTARG ;; P) PORT=$OPTARG ;; e) EXEC_IP=$OPTARG ;;
	v) VERBOSE=1 ;;
	*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
	esac
done
shift $((OPTIND - 1))

if [ -n "$EXEC_IP" ]; then
	# The guest's vm-ctl reads the script up to __VM_END__, runs it and ends
	# with __VM_RC__=<status>; no such line means the connection failed.
	rc=255
	while IFS= read -r line || [ -n "$line" ]; do
		case $line in
		*__VM_RC__=*)
			rc=${line##*__VM_RC__=}
			line=${line%__VM_RC__=*}
			[ -z "$line" ] || printf '%s\n' "$line"
			;;
		*) printf '%s\n' "$line" ;;
		esac
	done < <(ip netns exec "$NS" timeout "${EXEC_TIMEOUT:-120}" bash -c \
		'exec 3<>"/dev/tcp/$0/$1" && printf "%s\n__VM_END__\n" "$2" >&3 && cat <&3' \
		"$EXEC_IP" "$PORT" "${1:?-e VM_IP 'script'}")
	exit "$rc"
fi

NAME=${NAME:-$TAP}
[ -s "$VM_IMAGE/initramfs.cpio" ] && [ -s "$VM_IMAGE/vmlinuz" ] ||
	die "no image in $VM_IMAGE: run scripts/vm/build.sh"
command -v qemu-system-x86_64 >/dev/null ||
	die "no qemu-system-x86_64: apt-get install qemu-system-x86 (scripts/vm/build.sh does)"
[ -c /dev/net/tun ] || die "no /dev/net/tun: the VM's network is a TAP device"
KERNEL=$VM_IMAGE/vmlinuz
[ -s "$VM_IMAGE/vmlinux" ] && KERNEL=$VM_IMAGE/vmlinux
vm_private_dir "$VM_RUN"

# The namespace, the TAP device and the optional bridge.
ip netns list | grep -q "^$NS\( \|$\)" || ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link show "$TAP" >/dev/null 2>&1 || ip -n "$NS" tuntap add dev "$TAP" mode tap
ip -n "$NS" link set "$TAP" up
HOSTDEV=$TAP
if [ -n "$BR" ]; then
	ip -n "$NS" link show "$BR" >/dev/null 2>&1 || ip -n "$NS" link add "$BR" type bridge
	ip -n "$NS" link set "$BR" up
	ip -n "$NS" link set "$TAP" master "$BR"
	HOSTDEV=$BR
fi
[ "$HOSTADDR" = none ] || ip -n "$NS" addr replace "$HOSTADDR" dev "$HOSTDEV"

kvm_usable() { (exec 3<>/dev/kvm) 2>/dev/null && grep -qwE 'vmx|svm' /proc/cpuinfo; }
case $ACCEL in
kvm) (exec 3<>/dev/kvm) 2>/dev/null || die "/dev/kvm cannot be opened" ;;
tcg) ;;
auto) if kvm_usable; then ACCEL=kvm; else ACCEL=tcg; fi ;;
*) die "-a takes kvm, tcg or auto" ;;
esac
if [ "$ACCEL" = kvm ]; then QACCEL=kvm; else QACCEL=tcg,thread=multi,tb-size=256; fi

sum=$(printf '%s' "$NAME" | cksum | cut -d' ' -f1)
MAC=$(printf '52:54:00:%02x:%02x:%02x' $((sum >> 16 & 255)) $((sum >> 8 & 255)) $((sum & 255)))
QEMU=(qemu-system-x86_64 -name "espgw-vm-$NAME" -machine q35 -accel "$QACCEL" -cpu max
	-smp "$CPUS" -m "$MEM" -nodefaults -no-user-config -no-reboot
	-kernel "$KERNEL" -initrd "$VM_IMAGE/initramfs.cpio"
	-netdev "tap,id=net0,ifname=$TAP,script=no,downscript=no"
	-device "virtio-net-pci,netdev=net0,mac=$MAC")
KARGS="console=ttyS0 panic=-1 lp_ctl=$PORT"
if [ "$VERBOSE" = 1 ]; then KARGS="$KARGS earlyprintk=ttyS0 loglevel=7"; else KARGS="$KARGS quiet"; fi
if [ -n "$SHARE" ]; then
	QEMU+=(-fsdev "local,id=share0,path=$SHARE,security_model=none,readonly=on"
		-device "virtio-9p-pci,fsdev=share0,mount_tag=vmshare")
	KARGS="$KARGS lp_share=1"
fi
# shellcheck disable=SC2206
QEMU+=(${QEMU_EXTRA:-})
KARGS="$KARGS $*"

if [ "$DAEMON" = 0 ]; then
	echo "run: $NAME in netns $NS on $TAP (mac $MAC, $ACCEL); Ctrl-A x quits" >&2
	exec ip netns exec "$NS" "${QEMU[@]}" -nographic -serial mon:stdio -append "$KARGS"
fi

LOG=$VM_RUN/$NAME.log PIDF=$VM_RUN/$NAME.pid
if [ -f "$PIDF" ] && [ -d "/proc/$(cat "$PIDF")" ]; then die "$NAME is already running (pid $(cat "$PIDF"))"; fi
rm -f "$LOG" "$PIDF"
t0=$(date +%s.%N)
ip netns exec "$NS" "${QEMU[@]}" -display none -serial "file:$LOG" \
	-monitor "unix:$VM_RUN/$NAME.mon,server,nowait" -daemonize -pidfile "$PIDF" -append "$KARGS"
end=$(($(date +%s) + WAIT))
until grep -q 'ESPGW-VM READY' "$LOG" 2>/dev/null; do
	[ -d "/proc/$(cat "$PIDF" 2>/dev/null || echo none)" ] || { cat "$LOG" >&2; die "$NAME exited while booting"; }
	[ "$(date +%s)" -lt "$end" ] || { tail -20 "$LOG" >&2; die "$NAME not ready after ${WAIT} s (log $LOG)"; }
	sleep 0.1
done
printf 'run: %s ready in %.1f s (pid %s, %s, kernel %s %s, netns %s, tap %s, mac %s, log %s)\n' \
	"$NAME" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')" \
	"$(cat "$PIDF")" "$ACCEL" "$(cat "$VM_IMAGE/KVER")" "${KERNEL##*/}" "$NS" "$TAP" "$MAC" "$LOG"
