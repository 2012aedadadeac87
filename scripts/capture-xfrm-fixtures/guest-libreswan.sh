# shellcheck shell=sh
# The guest half of scripts/capture-xfrm-fixtures.sh libreswan, sourced by
# busybox sh in the test VM from the shared directory (/mnt/host): `topo`
# once, then one `capture_NAME` per call. Each capture writes
# /tmp/cap/NAME.nl (what nlraw printed in namespace A) and prints
# "DONE NAME: what was seen" or "FAIL NAME: why".
#
#  ns A: vA 10.0.0.1, in0 192.168.1.1/24 ── veth ── ns B: vB 10.0.0.2, in0 192.168.2.1/24
#
# A pluto in each namespace (libreswan 4.10, `nsx` gives each its own /run,
# `ip netns exec` its own /etc/ipsec.conf and ipsec.secrets, and each has
# its own NSS database), IKEv2 with a pre-shared test key, A initiating.
# shellcheck disable=SC2086,SC2317
ip() { /sbin/ip "$@"; }
H=/mnt/host
D=/tmp/cap
PSK="xfrm-fixture-psk-not-a-secret"
LIBEXEC=/usr/libexec/ipsec
mkdir -p $D

now() { cut -d' ' -f1 /proc/uptime; }
# within SECONDS CMD...: CMD until it succeeds or SECONDS have passed.
within() {
	_end=$(awk -v a="$(now)" -v b="$1" 'BEGIN { print a + b }')
	shift
	while :; do
		"$@" && return 0
		awk -v a="$(now)" -v b="$_end" 'BEGIN { exit !(a >= b) }' && return 1
		sleep 0.2
	done
}

topo() {
	for ns in A B; do ip netns del $ns 2>/dev/null; done
	ip netns add A
	ip netns add B
	ip link add vA type veth peer name vB
	ip link set vA netns A
	ip link set vB netns B
	for ns in A B; do
		ip -n $ns link set lo up
		ip -n $ns link set v$ns up
		ip -n $ns link add in0 type dummy
		ip -n $ns link set in0 up
		ip netns exec $ns sysctl -qw net.ipv4.ip_forward=1
	done
	ip -n A addr add 10.0.0.1/24 dev vA
	ip -n B addr add 10.0.0.2/24 dev vB
	ip -n A addr add 192.168.1.1/24 dev in0
	ip -n B addr add 192.168.2.1/24 dev in0
	# pluto runs without updown (leftupdown=%disabled): the routes to the
	# protected networks are set here, so that a ping takes the policies.
	ip -n A route add 192.168.2.0/24 dev vA src 192.168.1.1
	ip -n B route add 192.168.1.0/24 dev vB src 192.168.2.1
	echo "DONE topo: $($LIBEXEC/pluto --version 2>&1 | grep -o 'Libreswan [0-9.]*' | head -1), $(uname -r)"
}

# conf NS ESP [EXTRA...]: ipsec.conf and ipsec.secrets of NS, one conn "cap"
# (the same text on both sides: pluto finds which end is its own).
conf() {
	ns=$1 esp=$2
	shift 2
	mkdir -p /etc/netns/$ns /var/lib/ipsec/nss-$ns /run/ns/$ns/pluto $D/$ns
	[ -e /var/lib/ipsec/nss-$ns/cert9.db ] ||
		certutil -N -d sql:/var/lib/ipsec/nss-$ns --empty-password >$D/$ns/nss.txt 2>&1
	{
		cat <<CONF
config setup
	logfile=$D/$ns/pluto.log
	logtime=yes
	plutodebug=base
	dnssec-enable=no
	nssdir=/var/lib/ipsec/nss-$ns
	protostack=xfrm
conn cap
	ikev2=insist
	authby=secret
	left=10.0.0.1
	leftid=10.0.0.1
	leftsubnet=192.168.1.0/24
	right=10.0.0.2
	rightid=10.0.0.2
	rightsubnet=192.168.2.0/24
	type=tunnel
	ike=aes_gcm128-sha2_256-dh19
	esp=$esp
	pfs=no
	leftupdown=%disabled
	rightupdown=%disabled
	auto=add
CONF
		for line in "$@"; do printf '\t%s\n' "$line"; done
	} >/etc/netns/$ns/ipsec.conf
	printf '10.0.0.1 10.0.0.2 : PSK "%s"\n' "$PSK" >/etc/netns/$ns/ipsec.secrets
}

pluto_start() {
	ns=$1
	rm -f /run/ns/$ns/pluto/pluto.ctl /run/ns/$ns/pluto/pluto.pid
	setsid nsx $ns $LIBEXEC/pluto --nofork --config /etc/ipsec.conf >>$D/$ns/pluto.out 2>&1 </dev/null &
	echo $! >$D/$ns/pluto.pid
	ctl() { [ -S /run/ns/$ns/pluto/pluto.ctl ]; }
	within 30 ctl || return 1
	nsx $ns $LIBEXEC/addconn --config /etc/ipsec.conf --autoall >$D/$ns/addconn.txt 2>&1
	nsx $ns $LIBEXEC/whack --rereadsecrets >/dev/null 2>&1
	nsx $ns $LIBEXEC/whack --listen >/dev/null 2>&1
}

pluto_stop() {
	for ns in A B; do
		nsx $ns $LIBEXEC/whack --shutdown >/dev/null 2>&1
	done
	sleep 1
	for ns in A B; do
		kill "$(cat $D/$ns/pluto.pid 2>/dev/null)" 2>/dev/null
		ip -n $ns xfrm state flush
		ip -n $ns xfrm policy flush
	done
}

# listen NAME [dump]: nlraw in A, printing to $D/NAME.nl (appending).
listen() {
	/sbin/ip netns exec A $H/nlraw ${2:-} follow >>$D/$1.nl 2>$D/$1.err &
	echo $! >$D/nlraw.pid
	sleep 1
}
unlisten() {
	sleep 1
	kill "$(cat $D/nlraw.pid)" 2>/dev/null
	wait "$(cat $D/nlraw.pid)" 2>/dev/null
}

states() { ip -n A xfrm state | grep -c '^src'; }
have_states() { [ "$(states)" = "$1" ]; }
spis() { ip -n A xfrm state | grep -o 'spi 0x[0-9a-f]*' | awk '{ print $2 }' | sort | tr '\n' ' '; }
ping_through() { ip netns exec A ping -c 2 -W 3 -I 192.168.1.1 192.168.2.1 >$D/ping.txt 2>&1; }

up() {
	nsx A $LIBEXEC/whack --initiate --name cap --asynchronous >/dev/null 2>&1
	within 60 have_states 2
}

# GCM: the tunnel up, a CHILD_SA rekey by whack, the teardown.
capture_gcm() {
	rm -f $D/gcm.nl
	for ns in A B; do conf $ns aes_gcm128; done
	listen gcm dump
	{ pluto_start B && pluto_start A; } || { echo "FAIL gcm: pluto did not start"; unlisten; return; }
	up || { echo "FAIL gcm: no CHILD_SA: $(tail -3 $D/A/pluto.log)"; pluto_stop; unlisten; return; }
	first=$(spis)
	ping_through && p=ok || p=failed
	sleep 1
	nsx A $LIBEXEC/whack --rekey-ipsec --name cap >$D/A/rekey.txt 2>&1
	changed() { have_states 2 && [ "$(spis)" != "$first" ]; }
	within 60 changed || { echo "FAIL gcm: no rekey: $(states) SAs: $(tail -3 $D/A/pluto.log)"; pluto_stop; unlisten; return; }
	second=$(spis)
	sleep 2
	ping_through && p2=ok || p2=failed
	nsx A $LIBEXEC/whack --terminate --name cap >$D/A/terminate.txt 2>&1
	within 30 have_states 0
	sleep 2
	after_terminate=$(ip -n A xfrm policy | grep -c '^src')
	nsx A $LIBEXEC/whack --delete --name cap >$D/A/delete.txt 2>&1
	sleep 2
	after_delete=$(ip -n A xfrm policy | grep -c '^src')
	unlisten
	pluto_stop
	echo "DONE gcm: SPIs $first-> $second, ping $p then $p2, policies after terminate $after_terminate, after delete $after_delete, $(wc -l <$D/gcm.nl) lines"
}

# AES-CBC with HMAC-SHA2-256 and no ESN (esn=no): the tunnel up, a ping,
# then the dumps of the SAD and SPD.
capture_cbc() {
	rm -f $D/cbc.nl
	for ns in A B; do conf $ns aes256-sha2_256 esn=no; done
	listen cbc
	{ pluto_start B && pluto_start A; } || { echo "FAIL cbc: pluto did not start"; unlisten; return; }
	up || { echo "FAIL cbc: no CHILD_SA: $(tail -3 $D/A/pluto.log)"; pluto_stop; unlisten; return; }
	ping_through && p=ok || p=failed
	sleep 1
	unlisten
	/sbin/ip netns exec A $H/nlraw dump >>$D/cbc.nl 2>$D/cbc.err
	esn=$(ip -n A xfrm state | grep -c 'flag.*esn')
	s=$(spis)
	pluto_stop
	echo "DONE cbc: SPIs $s, ping $p, $esn SAs with esn, $(wc -l <$D/cbc.nl) lines"
}
