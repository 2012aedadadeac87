# The guest half of scripts/strongswan-e2e.sh, sourced by busybox sh inside
# the test VM from the shared directory (/mnt/host): `. /mnt/host/guest.sh;
# topo` once, then one `case_NAME` per call. Each case prints
# "PASS NAME: what was seen" or "FAIL NAME: why" and nothing else on lines
# of that shape; details go to /tmp/e2e.
#
#  ns lan 10.1.0.10 ── in0 [ns gw: espgw] out0 ── bridge (ns sw) ── far0 10.0.0.2  ns far: charon,
#                     10.1.0.1          10.0.0.1        │                2001:db8:10::2
#                                 2001:db8:10::1        │                          LANs 10.2.0.1, 10.4.0.1
#                                                       └─ nat0 10.0.0.3 ns nat (masquerade)
#                                                           └ 172.16.0.1 ── 172.16.0.2 ns fnat: charon,
#                                                                                   LAN 10.3.0.1
#  ns key: espgw's keying namespace. espgw itself gives it a TUN with
#  10.0.0.1/32 and 2001:db8:10::1/128 (the IKE relay); charon (or pluto)
#  there keys espgw. IPv6 is on in ns far and ns key only (espgw's IPv6 is
#  its own, not ns gw's kernel's).
#
# E2E_IKE_PATH=veth (debugging the harness without the relay): far's IKE
# (UDP from ports 500 and 4500) goes by policy routing over a veth straight to ns key,
# which then holds 10.0.0.1 itself; ESP still goes to espgw. The NAT case
# cannot run that way.
# Namespace names, paths and addresses here are single words of our own;
# the small functions defined inside cases are called through `within`.
# shellcheck disable=SC2086,SC2317
ip() { /sbin/ip "$@"; }
H=/mnt/host
D=/tmp/e2e
SOCK=$D/gw.sock
PSK="e2e-psk-not-a-secret-0123456789"
# espgw's outside address6 and far's, on the bridge's segment.
GW6=2001:db8:10::1
FAR6=2001:db8:10::2
IKE_PROP=aes128gcm16-prfsha256-ecp256
: "${E2E_IKE_PATH:=relay}"
mkdir -p $D

now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
pass() { echo "PASS $CASE: $*"; }
fail() { echo "FAIL $CASE: $*"; }
log() { echo "[$(now)] $*" >>$D/harness.log; }
# within SECONDS CMD...: CMD until it succeeds or SECONDS have passed (by the
# clock: under TCG a swanctl call alone can take a second).
within() {
	_end=$(awk -v a="$(now)" -v b="$1" 'BEGIN { print a + b }')
	shift
	while :; do
		"$@" && return 0
		awk -v a="$(now)" -v b="$_end" 'BEGIN { exit !(a >= b) }' && return 1
		sleep 0.2
	done
}

espgw() { $H/run $H/espgw "$@"; }
gwq() { espgw "$@" --socket $SOCK --json 2>>$D/gwq.err; }

# ---- topology ---------------------------------------------------------------

topo() {
	for ns in lan gw sw far nat fnat key; do ip netns del $ns 2>/dev/null; done
	for ns in lan gw sw far nat fnat key; do
		ip netns add $ns
		ip -n $ns link set lo up
		case $ns in far | key) ;; *) ip netns exec $ns sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 ;; esac
	done
	ip -n sw link add br0 type bridge
	ip -n sw link set br0 up
	# veth NS1 DEV1 NS2 DEV2
	veth() {
		ip link add "$2" netns "$1" type veth peer name "$4" netns "$3"
		ip -n "$1" link set "$2" up
		ip -n "$3" link set "$4" up
	}
	veth gw out0 sw s-gw
	veth far far0 sw s-far
	veth nat nat0 sw s-nat
	for d in s-gw s-far s-nat; do ip -n sw link set $d master br0; done
	veth gw in0 lan lan0
	veth nat nat1 fnat fnat0
	# espgw owns 10.0.0.1 and 10.1.0.1 and their MACs: the kernel of ns gw
	# holds no address, so it neither answers for them nor sees the ESP.
	ip -n lan addr add 10.1.0.10/24 dev lan0
	ip -n lan route add default via 10.1.0.1
	ip -n far addr add 10.0.0.2/24 dev far0
	ip -n far addr add $FAR6/64 dev far0 nodad
	ip -n far link add farlan type dummy
	ip -n far link set farlan up
	ip -n far addr add 10.2.0.1/24 dev farlan
	ip -n far addr add 10.4.0.1/24 dev farlan
	ip -n nat addr add 10.0.0.3/24 dev nat0
	ip -n nat addr add 172.16.0.1/24 dev nat1
	ip netns exec nat sysctl -qw net.ipv4.ip_forward=1
	ip -n fnat addr add 172.16.0.2/24 dev fnat0
	ip -n fnat route add default via 172.16.0.1
	ip -n fnat link add fnatlan type dummy
	ip -n fnat link set fnatlan up
	ip -n fnat addr add 10.3.0.1/24 dev fnatlan
	if [ "$E2E_IKE_PATH" = veth ]; then
		veth far fk0 key kf0
		ip -n key addr add 10.0.0.1/24 dev kf0
		ip -n key addr add $GW6/64 dev kf0 nodad
		for f in -4 -6; do
			ip $f -n far rule add ipproto udp sport 500 lookup 100 priority 100
			ip $f -n far rule add ipproto udp sport 4500 lookup 100 priority 101
		done
		ip -n far route add 10.0.0.1/32 dev fk0 table 100
		ip -n far route add $GW6/128 dev fk0 table 100
	fi
	if nat_rules; then log "nat: masquerade from 172.16.0.0/24 out of nat0"; else log "nat: nft failed"; fi
	mkdir -p $D/far $D/key $D/fnat
	write_gw_conf
	echo "topology: lan, gw, sw, far, nat, fnat, key"
}

nat_rules() {
	command -v nft >/dev/null || return 1
	ip netns exec nat nft -f - <<'NFT'
table ip e2e {
	chain post {
		type nat hook postrouting priority srcnat;
		ip saddr 172.16.0.0/24 oifname "nat0" masquerade
	}
}
NFT
}

# ---- espgw ------------------------------------------------------------------

write_gw_conf() {
	mkdir -p $D/state
	cat >$D/gw.toml <<EOF
[gateway]
name = "e2e"
state_dir = "$D/state"

[accel]
engine = "soft"

[keying]
source = "xfrm"
netns = "key"

[[interface]]
name = "inside"
device = "in0"
address = "10.1.0.1/24"

[[interface]]
name = "outside"
device = "out0"
address = "10.0.0.1/24"
address6 = "$GW6/64"

[[route]]
destination = "10.2.0.0/24"
via = "10.0.0.2"

[[route]]
destination = "10.3.0.0/24"
via = "10.0.0.3"
EOF
}

# bg PIDFILE LOG CMD...: CMD detached, with none of this shell's descriptors
# (the control port's connection stays open while anything holds it).
bg() {
	_p=$1 _l=$2
	shift 2
	rm -f "$_p"
	# shellcheck disable=SC2016  # expanded by that shell
	start-stop-daemon -S -b -m -p "$_p" -x /bin/sh -- -c 'exec "$@" >>"$0" 2>&1' "$_l" "$@"
}

gw_start() {
	rm -f $SOCK
	bg $D/espgw.pid $D/espgw.log /sbin/ip netns exec gw $H/run $H/espgw run --config $D/gw.toml --control $SOCK \
		--workers 1 --stats $D/final.json
	sleep 0.2
	i=0
	while [ $i -lt 150 ]; do
		[ -S $SOCK ] && gwq stats >/dev/null && break
		kill -0 "$(cat $D/espgw.pid)" 2>/dev/null || { tail -5 $D/espgw.log; return 1; }
		sleep 0.2
		i=$((i + 1))
	done
	gwq stats >/dev/null || return 1
	# The relay's TUN comes from espgw; give it a moment after the socket.
	i=0
	while [ "$E2E_IKE_PATH" = relay ] && ! ip -n key link show espgw-ike >/dev/null 2>&1 && [ $i -lt 25 ]; do
		sleep 0.2
		i=$((i + 1))
	done
	return 0
}

gw_stop() {
	[ -f $D/espgw.pid ] || return 0
	kill -TERM "$(cat $D/espgw.pid)" 2>/dev/null
	i=0
	while kill -0 "$(cat $D/espgw.pid)" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
	kill -KILL "$(cat $D/espgw.pid)" 2>/dev/null
	rm -f $D/espgw.pid
}

# Why no IKE can reach ns key, or nothing.
relay_missing() {
	[ "$E2E_IKE_PATH" = veth ] && return 1
	ip -n key link show espgw-ike >/dev/null 2>&1 && return 1
	echo "no IKE relay: espgw made no espgw-ike device in ns key (this espgw does not carry IKE to the keying namespace)"
}

# espgw's SAs of the xfrm source, one a line of their top-level fields
# ("direction=out spi=0x... packets=N bytes=N mode=tunnel proposal=..."),
# from `sa list --json` as espgw pretty-prints it.
gw_sas() {
	gwq sa list | awk '
		/^    \{/ { sa = ""; on = 1; next }
		/^    \}/ { if (sa ~ / source=xfrm/) print sa; on = 0; next }
		on && /^      "[a-z_]+": [^{[]/ {
			line = $0; sub(/^ +"/, "", line); sub(/,$/, "", line)
			k = line; sub(/".*/, "", k)
			v = line; sub(/^[^:]*: /, "", v); gsub(/"/, "", v); gsub(/ /, "_", v)
			sa = sa " " k "=" v
		}'
}
# field NAME: the value of NAME= in the lines on stdin.
field() { grep -o " $1=[^ ]*" | cut -d= -f2; }

# ---- IKE daemons --------------------------------------------------------------

# strongswan.conf for NS; ROUTES=no for espgw's side (routes there lead nowhere).
ss_files() {
	ns=$1 routes=$2
	mkdir -p /etc/netns/$ns/swanctl $D/$ns
	for d in conf.d x509 x509ca x509aa x509ocsp x509crl x509ac pubkey private rsa ecdsa bliss pkcs8 pkcs12; do
		mkdir -p /etc/netns/$ns/swanctl/$d
	done
	cat >/etc/netns/$ns/strongswan.conf <<EOF
charon {
	load_modular = yes
	install_routes = $routes
	# Dead peers are found in seconds, not minutes.
	retransmit_timeout = 1.0
	retransmit_base = 1.4
	retransmit_tries = 3
	plugins {
		include /etc/strongswan.d/charon/*.conf
	}
	filelog {
		e2e {
			path = $D/$ns/charon.log
			time_format = %H:%M:%S
			flush_line = yes
			default = 1
			ike = 2
			knl = 2
			chd = 2
		}
	}
}
include /etc/strongswan.d/*.conf
swanctl {
	load = pem pkcs1 pkcs8 x509 revocation constraints pubkey openssl random
}
EOF
}

charon_start() {
	ns=$1
	rm -f /run/ns/$ns/charon.pid /run/ns/$ns/charon.vici
	setsid nsx $ns /usr/lib/ipsec/charon >>$D/$ns/charon.out 2>&1 </dev/null &
	i=0
	while [ ! -S /run/ns/$ns/charon.vici ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
	[ -S /run/ns/$ns/charon.vici ]
}

charon_stop() {
	ns=$1
	[ -f /run/ns/$ns/charon.pid ] || return 0
	p=$(cat /run/ns/$ns/charon.pid)
	kill "$p" 2>/dev/null
	i=0
	while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	kill -9 "$p" 2>/dev/null
	rm -f /run/ns/$ns/charon.pid /run/ns/$ns/charon.vici
}

# The connection "e2e" of one side, from these settings (the case sets them
# before, `conf_defaults` resets them):
#   ESP MODE LTS RTS START   esp_proposals, mode, traffic selectors, start_action
#   REKEY LIFE RAND          CHILD_SA rekey_time, life_time, rand_time
#   RBYTES LBYTES            rekey_bytes, life_bytes (rand_bytes 0)
#   IKE_REKEY DPD            the IKE SA's rekey_time, dpd_delay
#   EXTRA                    more children (text)
#   GW_IKE FAR_IKE           the IKE SA's ends: espgw's outside address, far's
conf_defaults() {
	ESP=aes128gcm16 MODE=tunnel START=none REKEY=0 LIFE=0 RAND=0 RBYTES=0 LBYTES=0
	IKE_REKEY=0 DPD=0 EXTRA='' REMOTE='' LOCAL_ID='' REMOTE_ID='' GW_IKE=10.0.0.1 FAR_IKE=10.0.0.2
}
# conn_conf NS LOCAL REMOTE LTS RTS
conn_conf() {
	ns=$1 local=$2 remote=$3
	cat >/etc/netns/$ns/swanctl/swanctl.conf <<EOF
connections {
	e2e {
		version = 2
		local_addrs = $local
		remote_addrs = ${REMOTE:-$remote}
		proposals = $IKE_PROP
		rekey_time = $IKE_REKEY
		# Beyond any case: the IKE SA's end must never race its rekey.
		over_time = 10m
		rand_time = 0
		reauth_time = 0
		dpd_delay = $DPD
		local {
			auth = psk
			id = ${LOCAL_ID:-$local}
		}
		remote {
			auth = psk
			id = ${REMOTE_ID:-$remote}
		}
		children {
			net {
				local_ts = $4
				remote_ts = $5
				mode = $MODE
				esp_proposals = $ESP
				start_action = $START
				dpd_action = clear
				rekey_time = $REKEY
				life_time = $LIFE
				rand_time = $RAND
				rekey_bytes = $RBYTES
				life_bytes = $LBYTES
				rand_bytes = 0
			}
$EXTRA
		}
	}
}
secrets {
	ike-e2e {
		secret = "$PSK"
	}
}
EOF
}

# Both sides of the usual tunnel: key (espgw's, the initiator unless START
# says otherwise) and far (the responder, which never rekeys or checks for
# dead peers on its own, so that every rekey and DPD is espgw's side's, and
# times nothing out).
tunnel_conf() {
	if [ "$MODE" = transport ]; then lts="dynamic[icmp]" rts="dynamic[icmp]"; else lts=10.1.0.0/24 rts=10.2.0.0/24; fi
	conn_conf key $GW_IKE $FAR_IKE "$lts" "$rts"
	start=$START rekey=$REKEY life=$LIFE rand=$RAND rbytes=$RBYTES lbytes=$LBYTES ike_rekey=$IKE_REKEY dpd=$DPD
	START=none REKEY=0 LIFE=0 RAND=0 RBYTES=0 LBYTES=0 IKE_REKEY=0 DPD=0
	conn_conf far $FAR_IKE $GW_IKE "$rts" "$lts"
	START=$start REKEY=$rekey LIFE=$life RAND=$rand RBYTES=$rbytes LBYTES=$lbytes IKE_REKEY=$ike_rekey DPD=$dpd
}

# Whatever the last case left: IKE SAs closed on both sides (espgw then
# removes the SAs), the new configuration loaded, far first.
# Loading a connection charon already has unchanged does not start it again:
# each is unloaded (an empty file loaded) first.
reload() {
	printf 'connections {\n}\n' >$D/empty.conf
	for ns in "$@"; do
		nsx $ns swanctl --terminate --ike e2e --timeout 3 >/dev/null 2>&1
		nsx $ns swanctl --load-all --noprompt --file $D/empty.conf >/dev/null 2>&1
	done
	for ns in "$@"; do
		nsx $ns swanctl --load-all --noprompt >$D/$ns/load.txt 2>&1 || return 1
	done
}

installed() { nsx $1 swanctl --list-sas --raw 2>/dev/null | grep -q "name=${2:-net} [^}]*state=INSTALLED"; }
# wait_installed NS SECONDS [CHILD]: the CHILD_SA (default net) is INSTALLED.
wait_installed() { within "$2" installed "$1" "$3"; }

gw_has() { [ "$(gw_sas | grep -c direction=)" -ge "$1" ]; }
# wait_gw_sas N SECONDS: espgw holds at least N SAs of the xfrm source.
wait_gw_sas() { within "$2" gw_has "$1"; }

last_log() { tail -n 4 $D/$1/charon.log 2>/dev/null | tr '\n' ' ' | cut -c1-300; }

# up CASE_TIMEOUT: load both sides and wait for the tunnel; prints why not.
up() {
	reload far key || { echo "swanctl --load-all failed: $(cat $D/key/load.txt $D/far/load.txt | tail -3 | tr '\n' ' ')"; return 1; }
	t=$(now)
	if [ "$START" = none ]; then nsx key swanctl --initiate --child net --timeout 30 >$D/key/initiate.txt 2>&1 & fi
	if ! wait_installed key "${1:-30}"; then
		why=$(relay_missing) || why="no CHILD_SA installed in ns key after $(since "$t") s: $(last_log key)"
		echo "$why"
		return 1
	fi
	wait_installed far 10 || { echo "far's CHILD_SA not installed: $(last_log far)"; return 1; }
	if ! wait_gw_sas 2 10; then
		echo "the CHILD_SA is installed in ns key but espgw holds $(gw_sas | grep -c direction=) of its SAs"
		return 1
	fi
	log "up in $(since "$t") s"
	return 0
}

# ---- traffic ----------------------------------------------------------------

# ping_ok NS SRC DST COUNT: every probe answered (prints the summary line).
ping_ok() {
	out=$(nsx $1 ping -c "$4" -W 3 -I "$2" "$3" 2>&1 | grep 'packet loss')
	echo "${out:-no answer from ping}"
	case $out in *" 0% packet loss"*) return 0 ;; *) return 1 ;; esac
}

# tcp_ok SERVER_NS SERVER_IP CLIENT_NS BYTES CLIENT_IP
tcp_ok() {
	nsx $1 $H/e2etool tcp-serve 7000 >$D/tcp-serve.txt 2>&1 &
	sp=$!
	listening() { nsx $1 ss -ltn 2>/dev/null | grep -q ':7000 '; }
	within 10 listening $1
	out=$(nsx $3 $H/e2etool tcp-send "$2" 7000 "$4" "$5" 2>&1)
	rc=$?
	[ $rc = 0 ] || kill $sp 2>/dev/null
	wait $sp 2>/dev/null
	echo "$out" | tail -1
	return $rc
}

# traffic [FAR_NS FAR_IP]: ping and TCP both ways between lan's host and a
# host of the far side (far's LAN by default).
traffic() {
	fns=${1:-far} fip=${2:-10.2.0.1}
	r=$(ping_ok lan 10.1.0.10 $fip 3) || { echo "ping lan->$fns: $r"; return 1; }
	r=$(ping_ok $fns $fip 10.1.0.10 3) || { echo "ping $fns->lan: $r"; return 1; }
	r=$(tcp_ok $fns $fip lan 100000 10.1.0.10) || { echo "tcp lan->$fns: $r"; return 1; }
	r=$(tcp_ok lan 10.1.0.10 $fns 100000 $fip) || { echo "tcp $fns->lan: $r"; return 1; }
	echo "ping both ways, tcp 100000 B both ways"
}

# stream SECONDS PPS SIZE: a numbered UDP stream each way between lan and
# far's LAN at once; prints both receivers' lines, fails on any loss or
# duplicate.
stream() {
	n=$(($1 * $2))
	nsx far $H/e2etool udp-recv 7001 $n 3000 >$D/recv-far.txt 2>&1 &
	r1=$!
	nsx lan $H/e2etool udp-recv 7002 $n 3000 >$D/recv-lan.txt 2>&1 &
	r2=$!
	sleep 0.3
	nsx lan $H/e2etool udp-send 10.2.0.1 7001 $n "$2" "$3" 10.1.0.10 >$D/send-lan.txt 2>&1 &
	s1=$!
	nsx far $H/e2etool udp-send 10.1.0.10 7002 $n "$2" "$3" 10.2.0.1 >$D/send-far.txt 2>&1
	wait $s1
	wait $r1
	a=$?
	wait $r2
	b=$?
	echo "lan->far $(head -1 $D/recv-far.txt | sed 's/^udp: //'); far->lan $(head -1 $D/recv-lan.txt | sed 's/^udp: //')"
	[ $a = 0 ] && [ $b = 0 ]
}

# The CHILD_SA's unique id in NS: each rekey makes a new one.
child_id() {
	nsx $1 swanctl --list-sas --raw 2>/dev/null | grep -o "name=${2:-net} uniqueid=[0-9]*" | tail -1 | grep -o '[0-9]*$'
}
ike_id() {
	nsx $1 swanctl --list-sas --raw 2>/dev/null | grep -o "e2e {uniqueid=[0-9]*" | head -1 | grep -o '[0-9]*$'
}
# A counter of espgw's xfrm section (the first of that name).
xfrm_stat() { gwq stats | tr -d ' \n' | grep -o '"xfrm":{.*' | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }
# A counter of espgw's IKE relay (to_daemon, from_daemon, ...).
relay_stat() { gwq stats | tr -d ' \n' | grep -o '"ike_relay":{.*' | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }

# ---- cases --------------------------------------------------------------------

start_all() {
	ss_files far yes
	ss_files key no
	ss_files fnat yes
	charon_start far || { echo "charon in far did not start: $(tail -3 $D/far/charon.out)"; return 1; }
	gw_start || { echo "espgw did not start: $(tail -3 $D/espgw.log)"; return 1; }
	charon_start key || { echo "charon in key did not start: $(tail -3 $D/key/charon.out)"; return 1; }
	echo "espgw up, IKE path: $E2E_IKE_PATH ($(ip -n key -br addr show espgw-ike 2>/dev/null || echo 'no espgw-ike in ns key')); charons in far and key"
}

# proposal_case ESP [MODE]: up with these child proposals, traffic, and
# espgw's SAs have the mode and ESN the daemons agreed.
proposal_case() {
	conf_defaults
	ESP=$1 MODE=${2:-tunnel} START=start
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	if [ "$MODE" = transport ]; then
		# strongSwan keeps transport mode to the IKE ends (host to host), so
		# the traffic is far's to espgw's outside address, which espgw
		# answers itself; ICMP only, so that IKE stays outside the SA.
		r=$(ping_ok far 10.0.0.2 10.0.0.1 3) || { fail "ping far->espgw's outside address in transport mode: $r"; return; }
		res="ping far->10.0.0.1 (espgw) through ESP in transport mode"
	else
		res=$(traffic) || { fail "$res"; return; }
	fi
	sas=$(gw_sas)
	echo "$sas" >$D/sas-$CASE.txt
	echo "$sas" | grep -q " mode=$MODE" || { fail "espgw's SAs are not in $MODE mode: $(echo "$sas" | head -c 300)"; return; }
	case $ESP in *-esn*) esn=true ;; *) esn=false ;; esac
	[ "$(echo "$sas" | field esn | sort -u)" = $esn ] || { fail "espgw's SAs: esn $(echo "$sas" | field esn | tr '\n' ' '), not $esn"; return; }
	pkts=$(echo "$sas" | field packets | awk '{s += $1} END {print s + 0}')
	[ "$pkts" -gt 0 ] || { fail "espgw's SAs counted no packets: the traffic did not go through espgw"; return; }
	pass "$ESP $MODE: $res; espgw's SAs ($(echo "$sas" | field proposal | head -1), esn $esn) carried $pkts packets"
}

case_aes128gcm16() { proposal_case aes128gcm16; }
case_aes256gcm16() { proposal_case aes256gcm16; }
case_aes256_sha256() { proposal_case aes256-sha256; }
case_chacha20poly1305() { proposal_case chacha20poly1305; }
case_esn() { proposal_case aes128gcm16-esn; }
case_transport() { proposal_case aes128gcm16-esn transport; }

# swanctl's counters in ns key (from espgw's NEWAE) against espgw's own.
case_counters() {
	conf_defaults
	START=start
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	nsx lan ping -c 20 -i 0.2 -s 300 -W 3 10.2.0.1 >/dev/null 2>&1
	nsx far ping -c 7 -i 0.2 -s 100 -W 3 -I 10.2.0.1 10.1.0.10 >/dev/null 2>&1
	# NEWAE goes out once a second.
	sleep 2.5
	sas=$(gw_sas)
	gin_p=$(echo "$sas" | grep ' direction=in ' | field packets) gin_b=$(echo "$sas" | grep ' direction=in ' | field bytes)
	gout_p=$(echo "$sas" | grep ' direction=out ' | field packets) gout_b=$(echo "$sas" | grep ' direction=out ' | field bytes)
	raw=$(nsx key swanctl --list-sas --raw 2>/dev/null | grep -o "name=net [^}]*state=INSTALLED[^}]*")
	kin_p=$(echo "$raw" | grep -o ' packets-in=[0-9]*' | cut -d= -f2) kin_b=$(echo "$raw" | grep -o ' bytes-in=[0-9]*' | cut -d= -f2)
	kout_p=$(echo "$raw" | grep -o ' packets-out=[0-9]*' | cut -d= -f2) kout_b=$(echo "$raw" | grep -o ' bytes-out=[0-9]*' | cut -d= -f2)
	seen="swanctl in ${kin_p:-?} packets/${kin_b:-?} B, out ${kout_p:-?}/${kout_b:-?}; espgw in ${gin_p:-?}/${gin_b:-?}, out ${gout_p:-?}/${gout_b:-?}"
	# Within one packet: packets differ by at most one, bytes by at most
	# the largest packet sent (328 bytes of IP, 400 with ESP's own).
	ok=$(awk -v a="$kin_p" -v b="$gin_p" -v c="$kout_p" -v d="$gout_p" -v e="$kin_b" -v f="$gin_b" -v g="$kout_b" -v h="$gout_b" '
		function abs(x) { return x < 0 ? -x : x }
		BEGIN { print (a != "" && b != "" && c != "" && d != "" && abs(a - b) <= 1 && abs(c - d) <= 1 &&
			abs(e - f) <= 400 && abs(g - h) <= 400 && c >= 20) ? "yes" : "no" }')
	[ "$ok" = yes ] || { fail "counters differ by more than a packet: $seen"; return; }
	pass "$seen"
}

# rekey_case KIND SECONDS AT_LEAST: a numbered UDP stream each way across
# CHILD_SA rekeys, all started by espgw's side.
# The sequence ledger's entries (one per key it keeps a mark for).
ledger_entries() { grep -c -E '^(in|out) ' $D/state/ledger; }
# espgw's event lines so far: SAs the xfrm source installed (they carry
# the kernel's reqid), and SAs it removed once the kernel had dropped them
# after a rekey (reason="xfrm_rekeyed") or otherwise (reason="xfrm_deleted").
xfrm_installs() { grep 'event="sa_installed"' $D/espgw.log | grep -c 'reqid='; }
xfrm_removals() { grep 'event="sa_removed"' $D/espgw.log | grep -c -E 'reason="xfrm_(rekeyed|deleted)"'; }

rekey_case() {
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	id0=$(child_id key)
	l0=$(ledger_entries)
	i0=$(xfrm_installs) d0=$(xfrm_removals)
	r=$(stream "$2" 100 400)
	ok=$?
	id1=$(child_id key)
	n=$((${id1:-0} - ${id0:-0}))
	echo "$n" >$D/rekeys-$1
	[ $ok = 0 ] || { fail "$r (with $n rekeys by $1)"; return; }
	[ "$n" -ge "$3" ] || { fail "$n CHILD_SA rekeys by $1 in $2 s, not $3: $r"; return; }
	# Each rekey adds two keys and deletes two that a rekey replaced,
	# whose entries go; the last rekey's old inbound SA may still live.
	l1=$(ledger_entries)
	[ $((l1 - l0)) -le 2 ] || { fail "the sequence ledger grew from $l0 to $l1 entries over $n rekeys: the keys they replaced were not forgotten"; return; }
	# The operator's log tells the same story: each rekey one line per new
	# SA, and a line with its reason per SA the kernel dropped after it
	# (the last rekey's old inbound SA may still live).
	i1=$(xfrm_installs) d1=$(xfrm_removals)
	[ $((i1 - i0)) -ge $((2 * n)) ] || { fail "$((i1 - i0)) sa_installed lines with a reqid over $n rekeys, not $((2 * n))"; return; }
	[ $((d1 - d0)) -ge $((2 * (n - 1))) ] || { fail "$((d1 - d0)) sa_removed lines with an xfrm reason over $n rekeys, not $((2 * (n - 1)))"; return; }
	pass "$n CHILD_SA rekeys by $1 in $2 s (CHILD_SA #$id0 -> #$id1); $r; sequence ledger $l0 -> $l1 entries ($(xfrm_stat sas_superseded) superseded SAs forgotten); log: $((i1 - i0)) sa_installed, $((d1 - d0)) sa_removed (xfrm_rekeyed/xfrm_deleted)"
}
case_rekey_time() {
	conf_defaults
	START=start REKEY=7s LIFE=40s RAND=1s
	rekey_case time 18 3
}
case_rekey_bytes() {
	# About 44 kB/s of IP each way at 100 packets/s of 400 bytes: a soft
	# byte limit every 3.5 s or so, which only espgw's EXPIRE can tell.
	conf_defaults
	START=start RBYTES=150000 LBYTES=3000000
	rekey_case bytes 12 2
}

case_ike_rekey() {
	conf_defaults
	START=start IKE_REKEY=8s
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	id0=$(ike_id key) c0=$(child_id key)
	changed() { [ -n "$(ike_id key)" ] && [ "$(ike_id key)" != "$id0" ]; }
	within 30 changed || { fail "IKE SA #$id0 not rekeyed within 30 s: $(last_log key)"; return; }
	r=$(traffic) || { fail "after the IKE rekey: $r"; return; }
	pass "IKE SA #$id0 -> #$(ike_id key), CHILD_SA #$c0 kept (#$(child_id key)); $r"
}

case_dpd() {
	conf_defaults
	START=start DPD=2s
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	id0=$(ike_id key)
	# A live peer answers: idle for a few DPD intervals, the IKE SA stays.
	n0=$(grep -c 'generating INFORMATIONAL request' $D/key/charon.log)
	sleep 5
	if [ "$(ike_id key)" != "$id0" ] || ! installed key; then
		fail "the IKE SA did not survive DPD with a live peer: $(last_log key)"
		return
	fi
	dpds=$(($(grep -c 'generating INFORMATIONAL request' $D/key/charon.log) - n0))
	# The peer dies without a word: its charon killed, its SAs gone.
	kill -9 "$(cat /run/ns/far/charon.pid)"
	ip -n far xfrm state flush
	ip -n far xfrm policy flush
	t=$(now)
	gone() { ! nsx key swanctl --list-sas --raw 2>/dev/null | grep -q "e2e {" && ! gw_has 1; }
	within 40 gone
	res=$?
	charon_start far
	[ $res = 0 ] || { fail "the dead peer's IKE SA or espgw's SAs still there after $(since "$t") s: $(last_log key)"; return; }
	pass "live peer: IKE SA kept over 5 s idle ($dpds DPD requests answered); dead peer: IKE SA and espgw's SAs gone $(since "$t") s after it died"
}

case_terminate() {
	conf_defaults
	START=start
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	removed0=$(xfrm_stat sas_removed)
	nsx key swanctl --terminate --ike e2e --timeout 10 >/dev/null 2>&1
	t=$(now)
	none() { ! gw_has 1; }
	within 10 none || { fail "espgw still holds $(gw_sas | grep -c direction=) SAs $(since "$t") s after swanctl --terminate"; return; }
	r=$(ping_ok lan 10.1.0.10 10.2.0.1 2) && { fail "traffic still flows after the terminate: $r"; return; }
	pass "espgw's SAs gone $(since "$t") s after swanctl --terminate (sas_removed $removed0 -> $(xfrm_stat sas_removed)); lan->far no longer passes"
}

case_restart() {
	conf_defaults
	START=start
	tunnel_conf
	why=$(up 40) || { fail "$why"; return; }
	r=$(traffic) || { fail "before the restart: $r"; return; }
	id0=$(ike_id key) c0=$(child_id key)
	mark=$(gw_sas | grep ' direction=in ' | field sequence_ceiling)
	lines=$(wc -l <$D/espgw.log)
	gw_stop
	# Stopped cleanly, espgw writes each SA's exact mark: the inbound SA
	# resumes where it stopped, not at its reservation's end, so the
	# peer, which goes on counting, is not refused.
	tail -n +$((lines + 1)) $D/espgw.log | grep -q 'sequence ledger settled' || { fail "espgw did not settle its ledger at the stop: $(tail -3 $D/espgw.log)"; return; }
	t=$(now)
	gw_start || { fail "espgw did not start again: $(tail -3 $D/espgw.log)"; return; }
	wait_gw_sas 2 15 || { fail "restarted espgw holds $(gw_sas | grep -c direction=) SAs: $(tail -3 $D/espgw.log)"; return; }
	back=$(since "$t")
	r=$(traffic) || { fail "after the restart: $r"; return; }
	drops=$(gwq stats | tr -d ' \n' | grep -o '"drops":{[^}]*}' | head -1)
	old=$(echo "$drops" | grep -o '"replay_too_old":[0-9]*' | cut -d: -f2)
	dup=$(echo "$drops" | grep -o '"replay_duplicate":[0-9]*' | cut -d: -f2)
	[ "${old:-x}${dup:-x}" = 00 ] || { fail "after the restart the peer's packets were refused as replays (${old:-?} too old, ${dup:-?} duplicates; the inbound mark before was ${mark:-?})"; return; }
	[ "$(ike_id key)" = "$id0" ] || { fail "the IKE SA changed (#$id0 -> #$(ike_id key)): it did not live through the restart"; return; }
	pass "espgw restarted under IKE SA #$id0, CHILD_SA #$c0 (now #$(child_id key)): $(gw_sas | grep -c direction=) SAs back $back s after it was stopped, resumed at the exact marks its clean stop wrote: 0 packets refused as replays, then $r"
}

case_trap() {
	conf_defaults
	START='trap'
	tunnel_conf
	reload far key || { fail "swanctl --load-all failed"; return; }
	acq0=$(xfrm_stat acquire_sent)
	sleep 1
	installed key && { fail "a CHILD_SA before any traffic: not a trap"; return; }
	t=$(now)
	nsx lan ping -c 1 -W 1 10.2.0.1 >/dev/null 2>&1
	wait_installed key 20 || { fail "no CHILD_SA $(since "$t") s after the first packet (acquire_sent ${acq0:-?} -> $(xfrm_stat acquire_sent)): $(relay_missing || last_log key)"; return; }
	wait_gw_sas 2 10 || { fail "the trap's CHILD_SA is installed but espgw holds $(gw_sas | grep -c direction=) SAs"; return; }
	r=$(traffic) || { fail "$r"; return; }
	pass "CHILD_SA up $(since "$t") s after the first packet (acquire_sent ${acq0:-?} -> $(xfrm_stat acquire_sent)); $r"
}

case_refused() {
	conf_defaults
	START=start
	# A second CHILD_SA of the same IKE SA with a proposal espgw has not:
	# AES-CBC-128 with HMAC-SHA-256 (cbc(aes) 128 with hmac(sha256)).
	EXTRA="			bad {
				local_ts = 10.1.0.0/24
				remote_ts = 10.4.0.0/24
				esp_proposals = aes128-sha256
				start_action = start
			}"
	tunnel_conf
	# far's side of it is the mirror image, and waits.
	awk '/^\t\t\tbad \{/ { bad = 1 }
		bad && /local_ts/ { sub(/10\.1\.0\.0\/24/, "10.4.0.0/24") }
		bad && /remote_ts/ { sub(/10\.4\.0\.0\/24/, "10.1.0.0/24") }
		bad && /start_action/ { sub(/start$/, "none") }
		{ print }' /etc/netns/far/swanctl/swanctl.conf >$D/far.conf && cp $D/far.conf /etc/netns/far/swanctl/swanctl.conf
	r0=$(xfrm_stat algorithm) s0=$(xfrm_stat sas_refused)
	why=$(up 40) || { fail "$why"; return; }
	wait_installed key 20 bad || { fail "the aes128-sha256 CHILD_SA was not installed in ns key: $(last_log key)"; return; }
	sleep 1
	r1=$(xfrm_stat algorithm) s1=$(xfrm_stat sas_refused)
	if [ "${s1:-0}" -lt $((${s0:-0} + 2)) ] || [ "${r1:-0}" -lt $((${r0:-0} + 2)) ]; then
		fail "espgw did not refuse the aes128-sha256 SAs: sas_refused ${s0:-0} -> ${s1:-0}, refused.algorithm ${r0:-0} -> ${r1:-0}"
		return
	fi
	r=$(traffic) || { fail "the aes128gcm16 CHILD_SA beside the refused one: $r"; return; }
	p=$(ping_ok lan 10.1.0.10 10.4.0.1 2) && { fail "traffic passed under the refused SA: $p"; return; }
	pass "aes128-sha256 refused (sas_refused ${s0:-0} -> $s1, refused.algorithm ${r0:-0} -> $r1; its traffic dropped) while aes128gcm16 beside it carried $r"
}

case_nat() {
	command -v nft >/dev/null || { fail "no nft in the VM's image: no NAT to cross"; return; }
	[ "$E2E_IKE_PATH" = relay ] || { fail "E2E_IKE_PATH=$E2E_IKE_PATH: the NAT case needs the relay"; return; }
	charon_start fnat || { fail "charon in fnat did not start"; return; }
	# The peer behind the NAT initiates (nothing reaches it before it has
	# opened the NAT's mapping); espgw's side knows it by its identity.
	conf_defaults
	REMOTE=10.0.0.3 REMOTE_ID=172.16.0.2
	conn_conf key 10.0.0.1 10.0.0.3 10.1.0.0/24 10.3.0.0/24
	START=start REMOTE='' REMOTE_ID=10.0.0.1
	conn_conf fnat 172.16.0.2 10.0.0.1 10.3.0.0/24 10.1.0.0/24
	nsx far swanctl --terminate --ike e2e --timeout 3 >/dev/null 2>&1
	reload key fnat || { fail "swanctl --load-all failed"; charon_stop fnat; return; }
	t=$(now)
	if ! wait_installed key 40 || ! wait_installed fnat 10 || ! wait_gw_sas 2 10; then
		fail "no tunnel through the NAT after $(since "$t") s: $(relay_missing || last_log fnat)"
		charon_stop fnat
		return
	fi
	encap=$(ip -n key xfrm state | grep -c 'encap type espinudp')
	natr=$(nsx key swanctl --list-sas --raw 2>/dev/null | grep -o 'nat-remote=yes' | head -1)
	r=$(traffic fnat 10.3.0.1)
	ok=$?
	nsx fnat swanctl --terminate --ike e2e --timeout 3 >/dev/null 2>&1
	charon_stop fnat
	[ $ok = 0 ] || { fail "through the NAT: $r"; return; }
	if [ "$encap" -lt 2 ] || [ -z "$natr" ]; then
		fail "no NAT seen (nat-remote: ${natr:-no}, $encap SAs in UDP): the NAT did not translate"
		return
	fi
	pass "far peer behind a masquerading NAT: $natr, $encap SAs in UDP 4500; $r"
}

# IKE over IPv6 through the relay: the IKE SA between espgw's outside
# address6 and far's, its CHILD_SA the usual IPv4 networks in IPv6 (ESP
# over IPv6, tunnel mode), which far's kernel and espgw each carry.
case_ipv6() {
	conf_defaults
	START=start GW_IKE=$GW6 FAR_IKE=$FAR6
	tunnel_conf
	to0=$(relay_stat to_daemon) from0=$(relay_stat from_daemon)
	why=$(up 40) || { fail "$why"; return; }
	to1=$(relay_stat to_daemon) from1=$(relay_stat from_daemon)
	ends=$(nsx key swanctl --list-sas --raw 2>/dev/null | grep -o 'e2e {[^}]*' | grep -o -E ' (local|remote)-(host|port)=[^ ]*' | tr -d '\n')
	case "$ends " in *" local-host=$GW6 "*" remote-host=$FAR6 "*) ;; *)
		fail "the IKE SA in ns key is not between $GW6 and $FAR6:${ends:- none}"
		return
		;;
	esac
	if [ "$E2E_IKE_PATH" = relay ] && { [ "${to1:-0}" -le "${to0:-0}" ] || [ "${from1:-0}" -le "${from0:-0}" ]; }; then
		fail "IKE over IPv6 did not go through the relay: ike_relay to_daemon ${to0:-?} -> ${to1:-?}, from_daemon ${from0:-?} -> ${from1:-?}"
		return
	fi
	r=$(traffic) || { fail "$r"; return; }
	sas=$(gw_sas)
	echo "$sas" >$D/sas-$CASE.txt
	n=$(echo "$sas" | grep -c direction=)
	n6=$(echo "$sas" | grep -c " local=$GW6 .* remote=$FAR6 ")
	[ "$n6" = "$n" ] || { fail "of espgw's $n SAs, $n6 are between $GW6 and $FAR6: $(echo "$sas" | grep -o -E ' (direction|local|remote)=[^ ]*' | tr -d '\n')"; return; }
	pkts=$(echo "$sas" | field packets | awk '{s += $1} END {print s + 0}')
	[ "$pkts" -gt 0 ] || { fail "espgw's SAs counted no packets: the traffic did not go through espgw"; return; }
	lp=$(echo "$ends" | grep -o 'local-port=[0-9]*' | cut -d= -f2) rp=$(echo "$ends" | grep -o 'remote-port=[0-9]*' | cut -d= -f2)
	pass "IKE SA ${GW6}[$lp] <-> ${FAR6}[$rp] in ns key (ike_relay to_daemon ${to0:-?} -> $to1, from_daemon ${from0:-?} -> $from1); $r; espgw's $n SAs $(echo "$sas" | field mode | sort -u) mode, outer $GW6 <-> $FAR6, carried $pkts packets"
}

case_libreswan() {
	[ -x /usr/libexec/ipsec/pluto ] || { fail "no libreswan in the VM's image (scripts/vm/build.sh --libreswan)"; return; }
	conf_defaults
	tunnel_conf
	reload far || { fail "swanctl --load-all failed in far"; return; }
	nsx key swanctl --terminate --ike e2e --timeout 3 >/dev/null 2>&1
	charon_stop key
	mkdir -p /etc/netns/key/ipsec.d /var/lib/ipsec/nss /run/ns/key/pluto
	[ -e /var/lib/ipsec/nss/cert9.db ] || certutil -N -d sql:/var/lib/ipsec/nss --empty-password >$D/key/nss.txt 2>&1
	# No updown (the image has no `ipsec` wrapper, and espgw's side wants no
	# routes); IKE and ESP as far's charon proposes them.
	cat >/etc/netns/key/ipsec.conf <<EOF
config setup
	logfile=$D/key/pluto.log
	logtime=yes
	plutodebug=base
	dnssec-enable=no
	nssdir=/var/lib/ipsec/nss
	protostack=xfrm
conn e2e
	ikev2=insist
	authby=secret
	left=10.0.0.1
	leftid=10.0.0.1
	leftsubnet=10.1.0.0/24
	right=10.0.0.2
	rightid=10.0.0.2
	rightsubnet=10.2.0.0/24
	type=tunnel
	ike=aes_gcm128-sha2_256-dh19
	esp=aes_gcm128
	pfs=no
	leftupdown=%disabled
	auto=start
EOF
	printf '10.0.0.1 10.0.0.2 : PSK "%s"\n' "$PSK" >/etc/netns/key/ipsec.secrets
	bg $D/key/pluto.pid $D/key/pluto.out nsx key /usr/libexec/ipsec/pluto --nofork --config /etc/ipsec.conf
	t=$(now)
	up=1 ok=1
	ctl() { [ -S /run/ns/key/pluto/pluto.ctl ]; }
	if within 20 ctl; then
		nsx key /usr/libexec/ipsec/addconn --config /etc/ipsec.conf --autoall >$D/key/addconn.txt 2>&1
		nsx key /usr/libexec/ipsec/whack --rereadsecrets >/dev/null 2>&1
		nsx key /usr/libexec/ipsec/whack --listen >/dev/null 2>&1
		nsx key /usr/libexec/ipsec/whack --initiate --name e2e --asynchronous >/dev/null 2>&1
		wait_installed far 40 && wait_gw_sas 2 10
		up=$?
	fi
	if [ $up = 0 ]; then
		r=$(traffic)
		ok=$?
		sas=$(gw_sas)
	fi
	why=$(relay_missing || tail -3 $D/key/pluto.log | tr '\n' ' ')
	nsx key /usr/libexec/ipsec/whack --shutdown >/dev/null 2>&1
	sleep 1
	kill "$(cat $D/key/pluto.pid 2>/dev/null)" 2>/dev/null
	ip -n key xfrm state flush
	ip -n key xfrm policy flush
	charon_start key
	[ $up = 0 ] || { fail "no tunnel keyed by pluto after $(since "$t") s: $why"; return; }
	[ $ok = 0 ] || { fail "keyed by pluto: $r"; return; }
	pass "$(/usr/libexec/ipsec/pluto --version 2>&1 | grep -o 'Libreswan [0-9.]*' | head -1) in ns key keyed espgw ($(echo "$sas" | field name | tr '\n' ' ')): $r"
}
