#!/usr/bin/env bash
# Builds the systemd image of scripts/systemd-in-vm.sh: a Debian 12 root file
# system made by mmdebstrap (minbase, with systemd as /sbin/init, udev, dbus,
# iproute2, kmod, man-db and bash-completion), packed as an initramfs whose
# /init is systemd, so that systemd runs as PID 1. The kernel and its modules
# are the test VM's (scripts/vm/build.sh --if-needed builds them), so
# scripts/vm/run.sh boots this image as it boots the busybox one: on a TAP
# device in a network namespace, with the same control port (served here by
# a systemd socket unit) and the same -S share.
#
#   scripts/systemd-in-vm/build-image.sh              build (or rebuild) it
#   scripts/systemd-in-vm/build-image.sh --if-needed  only when it is missing or
#                                                     was built from other inputs
#
# Needs root (mmdebstrap installs the packages in a chroot) and a Debian 12
# host; installs mmdebstrap with apt-get when it is missing. The packages
# come from deb.debian.org's bookworm, bookworm-updates and bookworm-security
# (ESPGW_SYSD_MIRRORS: other sources.list lines, separated by "|"). The
# image goes to ESPGW_SYSD_VM_DIR (default /var/cache/espgw-vm-systemd),
# laid out like the test VM's cache directory (scripts/vm/common.sh), with
# the downloaded packages kept in its debs/ for rebuilds. Prints "built ..."
# or "up to date ..." last.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
vmdir=$(cd "$here/../vm" && pwd)

if_needed=0
for a in "$@"; do
	case $a in
	--if-needed) if_needed=1 ;;
	*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
	esac
done
say() { echo "sysd-build: $*"; }
die() { echo "sysd-build: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap installs packages into a chroot)"

# The packages beyond minbase: what a Debian 12 host running espgw has.
INCLUDE="systemd systemd-sysv udev dbus iproute2 kmod man-db bash-completion"
# Modules the image carries (udev and modprobe load them on demand):
# the NIC, the 9p share, the test's veth and dummy devices, TUN.
MODULES="virtio_pci virtio_net 9p 9pnet_virtio veth dummy tun autofs4"
MIRRORS=${ESPGW_SYSD_MIRRORS:-deb http://deb.debian.org/debian bookworm main|deb http://deb.debian.org/debian bookworm-updates main|deb http://deb.debian.org/debian-security bookworm-security main}

# ---- the kernel: the test VM's --------------------------------------------------
"$vmdir/build.sh" --if-needed >/dev/null || die "scripts/vm/build.sh failed (the kernel comes from its image)"
# shellcheck source=../vm/common.sh
. "$vmdir/common.sh"
kdir=$ESPGW_VM_DIR/kernel
KVER=$(cat "$VM_IMAGE/KVER")
[ -s "$kdir/lib/modules/$KVER/modules.dep" ] || die "no modules for $KVER in $kdir"

if ! command -v mmdebstrap >/dev/null; then
	say "installing mmdebstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null; } ||
		die "apt-get install mmdebstrap failed"
fi

# ---- the cache, one build at a time --------------------------------------------
dir=${ESPGW_SYSD_VM_DIR:-/var/cache/espgw-vm-systemd}
vm_private_dir "$dir"
exec 9>"$dir/.lock"
flock 9
image=$dir/image
stamp=$({
	cat "$0" "$here"/guest/* "$vmdir/guest/vm-ctl" "$vmdir/guest/vm-shrc"
	echo "kernel $KVER $(cat "$kdir/.deb") $(sha256sum <"$VM_IMAGE/vmlinuz")"
	echo "mirrors $MIRRORS"
} | sha256sum | cut -d' ' -f1)
if [ "$if_needed" = 1 ] && [ -s "$image/initramfs.cpio" ] && [ "$(cat "$image/stamp" 2>/dev/null)" = "$stamp" ]; then
	say "up to date: $image (kernel $KVER, $(du -h "$image/initramfs.cpio" | cut -f1) initramfs)"
	exit 0
fi
t0=$(date +%s)

# ---- the root file system ----------------------------------------------------------
out=$dir/image.new
rm -rf "$out"
mkdir -p "$out" "$dir/debs"
root=$out/root
say "mmdebstrap bookworm (minbase + ${INCLUDE// /, })"
# Documentation, manual pages and translations are left out while the
# packages install (dpkg path-exclude); the exclusions are removed from the
# image afterwards, so that the espgw package installs its manual pages.
# The downloaded packages are kept in debs/ (sync-in, sync-out). The
# merged-usr hook makes the /usr merge with symbolic links and installs
# usr-is-merged, which keeps the usrmerge package (and perl) out.
mirror_args=()
IFS='|' read -r -a mirror_args <<<"$MIRRORS"
mmdebstrap --variant=minbase --mode=root --format=directory --quiet \
	--include="${INCLUDE// /,}" \
	--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
	--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
	--skip=essential/unlink \
	--setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
	--setup-hook="sync-in $dir/debs /var/cache/apt/archives/" \
	--customize-hook="sync-out /var/cache/apt/archives $dir/debs" \
	--customize-hook='rm -f "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap' \
	bookworm "$root" "${mirror_args[@]}" >"$dir/mmdebstrap.log" 2>&1 ||
	{ tail -30 "$dir/mmdebstrap.log" >&2; die "mmdebstrap failed (log $dir/mmdebstrap.log)"; }
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$out/packages.txt"
# Only the packages this image holds stay in debs/.
for f in "$dir"/debs/*.deb; do
	b=${f##*/}
	p=${b%%_*} v=${b#*_}
	v=${v%_*}
	grep -qxF "$p ${v//%3a/:}" "$out/packages.txt" || rm -f "$f"
done
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin

# PID 1: the kernel runs the initramfs's /init, here systemd.
ln -sf sbin/init "$root/init"
[ "$(chroot "$root" readlink -f /sbin/init)" = "$(chroot "$root" readlink -f /lib/systemd/systemd)" ] ||
	die "/sbin/init is not systemd in the image"
echo espgw-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 espgw-vm\n::1 localhost\n' >"$root/etc/hosts"
# A fixed machine id: no first-boot logic on every boot.
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$root/etc/machine-id"
echo >>"$root/etc/machine-id"
: >"$root/etc/fstab"
# root logs in on the serial console without a password (run.sh in the
# foreground, for a look by hand); the VM has no other way in but the
# control port, which only its network namespace reaches.
chroot "$root" passwd -dq root

# Kernel modules, with their dependencies, and depmod's tables.
mdir=lib/modules/$KVER
mkdir -p "$root/$mdir"
for m in $MODULES; do
	lines=$(modprobe -d "$kdir" -S "$KVER" -D "$m" 2>/dev/null) || die "no module $m in $KVER"
	while read -r verb path _; do
		[ "$verb" = insmod ] || continue
		rel=${path#"$kdir/$mdir/"}
		case $rel in
		*.ko.xz) mkdir -p "$root/$mdir/${rel%/*}"; xz -dc "$path" >"$root/$mdir/${rel%.xz}" ;;
		*) [ -e "$root/$mdir/$rel" ] || install -D -m 0644 "$path" "$root/$mdir/$rel" ;;
		esac
	done <<<"$lines"
done
for f in modules.order modules.builtin modules.builtin.modinfo; do
	[ -e "$kdir/$mdir/$f" ] && cp "$kdir/$mdir/$f" "$root/$mdir/"
done
depmod -b "$root" "$KVER"

# The test VM's plumbing: ctl0, the control port, the ready line.
install -m 0644 "$here/guest/10-espgw-vm-ctl.link" "$root/etc/systemd/network/"
install -m 0755 "$here/guest/espgw-vm-setup" "$root/usr/local/sbin/espgw-vm-setup"
install -m 0755 "$vmdir/guest/vm-ctl" "$root/usr/local/bin/vm-ctl"
install -m 0644 "$vmdir/guest/vm-shrc" "$root/etc/vm-shrc"
for u in espgw-vm-setup.service espgw-vm-ctl.socket espgw-vm-ctl@.service espgw-vm-ready.service; do
	install -m 0644 "$here/guest/$u" "$root/etc/systemd/system/$u"
done
chroot "$root" systemctl enable --quiet espgw-vm-setup.service espgw-vm-ctl.socket espgw-vm-ready.service
# e2scrub_reap checks LVM snapshots of ext4 file systems the VM has none of
# (15 s of its boot under TCG).
chroot "$root" systemctl mask --quiet e2scrub_reap.service

# ---- pack ---------------------------------------------------------------------------
(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) >"$out/initramfs.cpio"
for f in vmlinux vmlinuz config KVER; do
	[ -e "$VM_IMAGE/$f" ] && cp "$VM_IMAGE/$f" "$out/"
done
{
	echo "kernel $KVER ($(cat "$kdir/.deb")), modules: $MODULES"
	echo "packages ($(wc -l <"$out/packages.txt")):"
	sed 's/^/  /' "$out/packages.txt"
} >"$out/manifest.txt"
echo "$stamp" >"$out/stamp"
rm -rf "$dir/image.old"
[ -d "$image" ] && mv "$image" "$dir/image.old"
mv "$out" "$image"
rm -rf "$dir/image.old"
say "built $image in $(($(date +%s) - t0)) s: kernel $KVER, initramfs $(du -h "$image/initramfs.cpio" | cut -f1)," \
	"$(wc -l <"$image/packages.txt") packages, systemd $(awk '$1 == "systemd" {print $2}' "$image/packages.txt")"
