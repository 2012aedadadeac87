# Sourced by scripts/vm/build.sh and scripts/vm/run.sh: where the test VM's
# files live.
#
# ESPGW_VM_DIR, if set, is the directory; otherwise root uses
# /var/cache/espgw-vm and anyone else $XDG_CACHE_HOME/espgw-vm (default
# ~/.cache/espgw-vm). Below it:
#   debs/     the downloaded Debian packages (kept: a rebuild reuses them)
#   stage/    those packages unpacked (dpkg-deb -x), the union of their trees
#   kernel/   the kernel package unpacked, with a depmod'ed modules tree
#   image/    what boots: vmlinux, vmlinuz, initramfs.gz, KVER, manifest.txt, stamp
#   run/      per-VM console logs, pid files and monitor sockets (NAME.log ...)
if [ -z "${ESPGW_VM_DIR:-}" ]; then
	if [ "$(id -u)" = 0 ]; then
		ESPGW_VM_DIR=/var/cache/espgw-vm
	else
		ESPGW_VM_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/espgw-vm
	fi
fi
VM_IMAGE=$ESPGW_VM_DIR/image
VM_RUN=$ESPGW_VM_DIR/run

# vm_private_dir DIR: create DIR (and parents) readable and writable by the
# owner only, and refuse one that another user owns or can write: the VM's
# kernel and initramfs must not be replaceable by someone else.
vm_private_dir() {
	mkdir -p -m 0700 "$1"
	if [ ! -O "$1" ] || [ -n "$(find "$1" -maxdepth 0 -perm /022 2>/dev/null)" ]; then
		echo "scripts/vm: $1 is not owned by $(id -un) alone (owner or mode); refusing it" >&2
		return 1
	fi
}
