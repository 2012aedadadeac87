#!/usr/bin/env bash
# Builds the test VM from Debian 12 packages: Debian's stock kernel
# (linux-image-amd64, booted directly as an uncompressed PVH vmlinux) and an
# initramfs with busybox-static, iproute2, strongSwan (charon, swanctl and
# their plugins), the kernel modules for XFRM/ESP and AF_ALG, and the guest
# scripts of scripts/vm/guest. Optionally libreswan too.
#
#   scripts/vm/build.sh               build (or rebuild) the image
#   scripts/vm/build.sh --if-needed   build only if there is no image, or it
#                                     was built from other harness files
#   scripts/vm/build.sh --libreswan   also put libreswan (pluto, whack, certutil) in
#                                     (or ESPGW_VM_LIBRESWAN=1)
#
# The packages come through this host's apt (`apt-get download`, never
# installed; the host must be Debian 12). Tools the build and the VM need on
# the host (kmod, cpio, gcc, libc6-dev, binutils, xz-utils, qemu-system-x86)
# are installed with apt-get when missing and we are root. Everything goes
# to the cache directory described in scripts/vm/common.sh
# (/var/cache/espgw-vm for root); the image is in its image/ directory.
# Prints "built ..." or "up to date ..." last.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

if_needed=0
libreswan=${ESPGW_VM_LIBRESWAN:-0}
for a in "$@"; do
	case $a in
	--if-needed) if_needed=1 ;;
	--libreswan) libreswan=1 ;;
	*) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2 ;;
	esac
done

# Packages copied into the image whole (less documentation); the libraries
# their programs load come from the dependency closure below, as needed.
WHOLE="busybox-static iproute2 libstrongswan libstrongswan-standard-plugins libcharon-extra-plugins
       strongswan-libcharon strongswan-charon strongswan-swanctl nftables"
# libatm1 is only recommended by iproute2, but tc's ATM module needs it.
# Libraries nothing names as needed but something loads: glibc loads
# libgcc_s for pthread_cancel (swanctl and charon abort without it), OpenSSL
# its provider modules.
DLOPENED="/lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/ossl-modules"
if [ "$libreswan" = 1 ]; then
	# libnss3 whole: NSS loads its softokn and freebl with dlopen.
	WHOLE="$WHOLE libreswan libnss3 libnss3-tools"
fi
# Modules the guest loads at boot (their dependencies come first, by modprobe -D).
MODULES="virtio_pci virtio_net dummy veth tun 9p 9pnet_virtio
xfrm_user esp4 esp6 af_key xfrm_interface ip_vti
authenc authencesn gcm ghash-generic ghash-clmulni-intel aesni-intel ctr seqiv echainiv
ccm cmac xcbc des_generic des3_ede-x86_64 sha1-ssse3 sha256-ssse3 sha512-ssse3
chacha20poly1305 chacha-x86_64 poly1305-x86_64 chacha_generic poly1305_generic
af_alg algif_aead algif_skcipher algif_hash algif_rng crypto_user drbg
nf_tables nft_chain_nat nft_masq bridge"

say() { echo "vm-build: $*"; }
die() { echo "vm-build: $*" >&2; exit 1; }

# ---- host tools -------------------------------------------------------------
missing=
tool() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
tool apt-get apt
tool dpkg-deb dpkg
tool depmod kmod
tool modprobe kmod
tool cpio cpio
tool gzip gzip
tool readelf binutils
tool gcc gcc
tool python3 python3
tool flock util-linux
tool qemu-system-x86_64 qemu-system-x86
tool ip iproute2
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || missing="$missing libc6-dev"
if [ -n "$missing" ]; then
	missing=$(echo "$missing" | tr ' ' '\n' | sort -u | tr '\n' ' ')
	[ "$(id -u)" = 0 ] || die "missing host packages:$missing(install them, or run as root)"
	say "installing host packages:$missing"
	export DEBIAN_FRONTEND=noninteractive
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; } ||
		die "apt-get install$missing failed"
fi
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] ||
	die "the VM is built from Debian 12 (bookworm) packages through this host's apt; this host is ${PRETTY_NAME:-unknown}"

# ---- the cache, one build at a time ------------------------------------------
vm_private_dir "$ESPGW_VM_DIR"
exec 9>"$ESPGW_VM_DIR/.lock"
flock 9

# What the image is built from: the harness's files and the options.
stamp=$(cd "$here" && { cat build.sh common.sh guest/*; echo "libreswan=$libreswan"; } | sha256sum | cut -d' ' -f1)
if [ "$if_needed" = 1 ] && [ -s "$VM_IMAGE/initramfs.cpio" ] && [ -s "$VM_IMAGE/vmlinuz" ] &&
	[ "$(cat "$VM_IMAGE/stamp" 2>/dev/null)" = "$stamp" ]; then
	say "up to date: $VM_IMAGE (kernel $(cat "$VM_IMAGE/KVER"))"
	exit 0
fi
t0=$(date +%s)

# ---- packages ------------------------------------------------------------------
apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -qq ||
	die "apt has no package lists (apt-get update failed)"
kpkg=$(apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
[ -n "$kpkg" ] || die "cannot tell which kernel package linux-image-amd64 names"
# The userland's dependency closure, libraries only: the packages' scripts,
# perl and debconf have no place in the image.
# shellcheck disable=SC2086
libs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
	--no-replaces --no-enhances $WHOLE libgcc-s1 libssl3 libatm1 |
	grep -E '^(lib|zlib)' | grep -vE -- '-perl$|^libperl|^libdebian-installer' | sort -u)
# shellcheck disable=SC2086
pkgs=$(printf '%s\n' $WHOLE $libs "$kpkg" | sort -u)

debs=$ESPGW_VM_DIR/debs
mkdir -p "$debs"
# package -> the file apt-get download saves its candidate version as, one
# "NAME FILE" a line (an epoch's colon is %3a there).
fetch_list() {
	# shellcheck disable=SC2086
	apt-cache show --no-all-versions $pkgs | awk -F': ' '
		$1 == "Package" {p = $2} $1 == "Version" {v = $2} $1 == "Architecture" {a = $2}
		/^$/ && p != "" {gsub(":", "%3a", v); print p, p "_" v "_" a ".deb"; p = ""}
		END {if (p != "") {gsub(":", "%3a", v); print p, p "_" v "_" a ".deb"}}'
}
list=$(fetch_list 2>/dev/null) || { apt-get update -qq; list=$(fetch_list); }
# The packages of $list not downloaded yet, in $want.
missing_debs() {
	want=
	for p in $pkgs; do
		f=$(awk -v p="$p" '$1 == p {print $2}' <<<"$list")
		[ -n "$f" ] || die "apt offers no package $p"
		[ -s "$debs/$f" ] || want="$want $p"
	done
}
download() {
	# shellcheck disable=SC2086
	(cd "$debs" && apt-get download -q -o APT::Sandbox::User=root $want >/dev/null)
}
missing_debs
if [ -n "$want" ]; then
	say "downloading$want" | fold -s -w 120
	# Package lists older than the mirror name versions it no longer has
	# (an installed library a point release replaced): fresh lists, once.
	if ! download; then
		say "apt-get download failed: updating the package lists and trying again"
		apt-get update -qq || die "apt-get update failed"
		list=$(fetch_list)
		missing_debs
		download || die "apt-get download failed"
	fi
fi
# Older versions that a newer download replaced.
for f in "$debs"/*.deb; do
	grep -qF " ${f##*/}" <<<"$list" || rm -f "$f"
done
deb_of() { echo "$debs/$(awk -v p="$1" '$1 == p {print $2}' <<<"$list")"; }

# Every package but the kernel, unpacked into one tree.
stage=$ESPGW_VM_DIR/stage
rm -rf "$stage"
mkdir -p "$stage"
for p in $pkgs; do
	[ "$p" = "$kpkg" ] || dpkg-deb -x "$(deb_of "$p")" "$stage"
done
# The kernel, unpacked once per version, with depmod's tables.
kdeb=$(deb_of "$kpkg")
kdir=$ESPGW_VM_DIR/kernel
if [ "$(cat "$kdir/.deb" 2>/dev/null)" != "${kdeb##*/}" ]; then
	rm -rf "$kdir"
	mkdir -p "$kdir"
	dpkg-deb -x "$kdeb" "$kdir"
	echo "${kdeb##*/}" >"$kdir/.deb"
fi
KVER=$(cd "$kdir/lib/modules" && ls | head -1)
[ -n "$KVER" ] && [ -s "$kdir/boot/vmlinuz-$KVER" ] || die "no kernel in $kdeb"
[ -s "$kdir/lib/modules/$KVER/modules.dep" ] || depmod -b "$kdir" "$KVER"

# ---- the root tree -----------------------------------------------------------------
out=$ESPGW_VM_DIR/image.new
rm -rf "$out"
root=$out/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,mnt/host,lib64,usr/bin,usr/sbin,var/lib/strongswan,var/log,var/tmp}
ln -s ../run "$root/var/run"

# Packages whole, less documentation.
for p in $WHOLE; do
	dpkg-deb --fsys-tarfile "$(deb_of "$p")" | tar -t | sed 's|^\./|/|; s|/$||' |
		grep -vE '^/?$|^/usr/share/(doc|man|lintian|bug|bash-completion|strongswan/templates)(/|$)|^/etc/(apparmor\.d|logcheck|init\.d|ufw)(/|$)|^/lib/systemd(/|$)' |
		while read -r f; do
			if [ -d "$stage$f" ] && [ ! -L "$stage$f" ]; then
				mkdir -p "$root$f"
			else
				mkdir -p "$root${f%/*}"
				cp -a "$stage$f" "$root$f"
			fi
		done
done
# busybox's applets, but `ip` (iproute2 is /sbin/ip) and anything a package put there.
[ -x "$root/bin/busybox" ] || die "no /bin/busybox from busybox-static"
for a in $("$root/bin/busybox" --list); do
	case $a in ip | busybox | linuxrc) continue ;; esac
	[ -e "$root/bin/$a" ] || [ -e "$root/sbin/$a" ] || [ -e "$root/usr/bin/$a" ] || [ -e "$root/usr/sbin/$a" ] ||
		ln -s busybox "$root/bin/$a"
done
[ -e "$root/sbin/modprobe" ] || ln -s ../bin/busybox "$root/sbin/modprobe"   # the kernel's request_module
[ -x "$root/sbin/ip" ] || { [ -x "$root/bin/ip" ] && ln -s ../bin/ip "$root/sbin/ip"; } || die "no ip from iproute2"

# in_stage PATH: PATH's file in the stage, symbolic links followed inside it.
in_stage() {
	local p=$1 t n=0
	while [ -L "$stage$p" ] && [ $n -lt 20 ]; do
		t=$(readlink "$stage$p")
		case $t in /*) p=$t ;; *) p=${p%/*}/$t ;; esac
		n=$((n + 1))
	done
	[ -e "$stage$p" ] && echo "$stage$p"
}
for f in $DLOPENED; do
	s=$(in_stage "$f") || die "no $f in the packages"
	mkdir -p "$root${f%/*}"
	cp -rL "$s" "$root$f"
done

# Every shared library an ELF file in the tree needs, from the stage, until
# nothing is missing; copied to the path the loader searches, links resolved.
declare -A seen=()
is_elf() { [ -f "$1" ] && [ ! -L "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }
pending=$(find "$root" -type f | while read -r f; do is_elf "$f" && echo "$f"; done)
unresolved=
while [ -n "$pending" ]; do
	next=
	for f in $pending; do
		[ -z "${seen[$f]:-}" ] || continue
		seen[$f]=1
		dyn=$(readelf -dW "$f" 2>/dev/null) || continue
		rpath=$(sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p' <<<"$dyn" | tr ':' ' ')
		interp=$(readelf -lW "$f" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
		for need in $(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn") ${interp:+"$interp"}; do
			case $need in
			/*) cands=$need ;;
			*) cands=$(for d in $rpath /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /lib /usr/lib; do echo "$d/$need"; done) ;;
			esac
			done_=
			for c in $cands; do
				if [ -e "$root$c" ]; then done_=1; break; fi
				if s=$(in_stage "$c"); then
					mkdir -p "$root${c%/*}"
					cp -L "$s" "$root$c"
					next="$next $root$c"
					done_=1
					break
				fi
			done
			[ -n "$done_" ] || unresolved="$unresolved ${f#"$root"}:$need"
		done
	done
	pending=$next
done
[ -z "$unresolved" ] || die "libraries not found in the packages:$unresolved"

# Kernel modules, dependencies first, as modprobe would load them.
mdir=lib/modules/$KVER
mkdir -p "$root/$mdir"
: >"$root/etc/vm-modules"
for m in $MODULES; do
	lines=$(modprobe -d "$kdir" -S "$KVER" -D "$m" 2>/dev/null) || die "no module $m in $KVER"
	while read -r verb path opts; do
		[ "$verb" = insmod ] || continue
		rel=${path#"$kdir/$mdir/"}
		case $rel in
		*.ko.xz) mkdir -p "$root/$mdir/${rel%/*}"; xz -dc "$path" >"$root/$mdir/${rel%.xz}"; rel=${rel%.xz} ;;
		*) [ -e "$root/$mdir/$rel" ] || install -D -m 0644 "$path" "$root/$mdir/$rel" ;;
		esac
		grep -q "^$rel\( \|$\)" "$root/etc/vm-modules" || echo "$rel${opts:+ $opts}" >>"$root/etc/vm-modules"
	done <<<"$lines"
done
for f in modules.order modules.builtin modules.builtin.modinfo; do
	[ -e "$kdir/$mdir/$f" ] && cp "$kdir/$mdir/$f" "$root/$mdir/"
done
depmod -b "$root" "$KVER"

# The guest's own programs and settings.
gcc -static -Os -Wall -Wextra -o "$root/bin/vmtool" "$here/guest/vmtool.c"
strip "$root/bin/vmtool"
install -m 0755 "$here/guest/init" "$root/init"
for s in lp-xfrm vm-ctl nsx ss-check; do install -m 0755 "$here/guest/$s" "$root/bin/$s"; done
install -m 0644 "$here/guest/vm-shrc" "$root/etc/vm-shrc"
printf '. /etc/vm-shrc\nPS1="espgw-vm# "\n' >"$root/etc/profile"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
: >"$root/etc/resolv.conf"
for f in /etc/protocols /etc/services; do
	s=$(in_stage "$f") && cp "$s" "$root$f" || { [ -e "$f" ] && cp "$f" "$root$f"; } || true
done
if [ "$libreswan" = 1 ]; then
	mkdir -p "$root/var/lib/ipsec/nss" "$root/etc/ipsec.d"
fi

# ---- pack ---------------------------------------------------------------------------
# Uncompressed: under TCG the kernel's inflate of a gzip'ed image costs
# seconds on every boot, more than qemu's load of the larger file.
(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc --quiet -R 0:0) >"$out/initramfs.cpio"
cp "$kdir/boot/vmlinuz-$KVER" "$out/vmlinuz"
cp "$kdir/boot/config-$KVER" "$out/config"
echo "$KVER" >"$out/KVER"
# The uncompressed kernel, for a direct PVH boot: under TCG, the bzImage's
# own decompressor costs seconds on every boot. Debian compresses with xz.
if grep -q '^CONFIG_PVH=y' "$out/config" &&
	python3 - "$out/vmlinuz" "$out/vmlinux" <<'EOF'
import lzma, sys
data = open(sys.argv[1], "rb").read()
at = data.find(b"\xfd7zXZ\x00")
if at < 0:
    sys.exit(1)
d = lzma.LZMADecompressor()
elf = d.decompress(data[at:])  # stops at the stream's end; what follows is ignored
if elf[:4] != b"\x7fELF":
    sys.exit(1)
open(sys.argv[2], "wb").write(elf)
EOF
then
	readelf -n "$out/vmlinux" | grep -q 'Xen.*0x00000012' || rm -f "$out/vmlinux"
fi
[ -s "$out/vmlinux" ] || say "note: no PVH vmlinux; run.sh boots the bzImage (slower under TCG)"

{
	echo "kernel $KVER from $kpkg"
	echo "packages:"
	for p in $pkgs; do f=$(deb_of "$p"); f=${f##*/}; echo "  ${f%.deb}"; done
	echo "modules: $(wc -l <"$root/etc/vm-modules")"
} >"$out/manifest.txt"
echo "$stamp" >"$out/stamp"
rm -rf "$ESPGW_VM_DIR/image.old"
[ -d "$VM_IMAGE" ] && mv "$VM_IMAGE" "$ESPGW_VM_DIR/image.old"
mv "$out" "$VM_IMAGE"
rm -rf "$ESPGW_VM_DIR/image.old" "$stage"
say "built $VM_IMAGE in $(($(date +%s) - t0)) s: kernel $KVER, initramfs $(du -h "$VM_IMAGE/initramfs.cpio" | cut -f1)" \
	"($(wc -l <"$VM_IMAGE/root/etc/vm-modules") modules," \
	"$(echo "$pkgs" | wc -w) packages$([ "$libreswan" = 1 ] && echo ', with libreswan'))"
