# SPDX-License-Identifier: GPL-2.0
# Full-system close/fault/flush cases for run-vm.sh (DESIGN.md section 5,
# docs/events.md): vt3-flushtest in two guests. Sourced after run-vm.sh's
# helpers and guest-driver/tests/cm-cases.sh (pair_vt3_vt3, pair_vt3_siw,
# expect, on, fail, vt3d_ctl, vt3d_pid, vt3d_main_pid, stop_guest,
# A_IP/B_IP). run-vm.sh adds FLUSH_CASES to CASES and describes them with
# describe_flush.
#
# Roles: the server (passive side, any provider) runs in guest a, the
# client (vt3, the side under test) in guest b. The client prints
# "READY <qpn> <peer qpn> SCENARIO STYLE" when its work is posted, one
# result line per scenario x style and "vt3-flushtest: N passed, N failed".
#
# Narrow a manual run with FLUSH_STYLES, e.g.
#   FLUSH_STYLES=events ./run-vm.sh test flush-local

# shellcheck disable=SC2034 # run-vm.sh adds them to CASES
FLUSH_CASES=(flush-datapath flush-local flush-local-siw flush-peer flush-peer-siw flush-bad-wqe flush-cq-overflow
	flush-peer-gone flush-rst flush-fin flush-blackhole flush-terminate flush-crc flush-stag flush-device-fatal flush-vt3d-killed)

describe_flush() {
	case $1 in
	flush-datapath) echo "vt3-datapath on vt3_0: posting rules, ring full, the flush without a connection (incl. reposts after a flush)" ;;
	flush-local) echo "vt3-flushtest local-close × 5 styles: LLP_CLOSE_COMPLETE, receives flushed, two vt3 guests" ;;
	flush-local-siw) echo "vt3-flushtest local-close × 5 styles against a siw server" ;;
	flush-peer) echo "vt3-flushtest peer-close, peer-abort (RST), bad-stag × 5 styles, two vt3 guests" ;;
	flush-peer-siw) echo "vt3-flushtest peer-close, bad-stag, peer-abort (siw closes with FIN) × 5 styles against a siw server" ;;
	flush-bad-wqe) echo "vt3-flushtest bad-wqe × 5 styles: error CQE, QP_REQ_ERR, the rest flushed" ;;
	flush-cq-overflow) echo "vt3-flushtest cq-overflow × 5 styles: CQ_ERR, then a close flushes the receives" ;;
	flush-peer-gone) echo "the server's vt3d killed: TCP timeout, QP_FATAL, flush (events style)" ;;
	flush-rst) echo "vt3d ctl fault rst on the peer's connection × 5 styles: QP_FATAL" ;;
	flush-fin) echo "vt3d ctl fault fin on the peer's connection × 5 styles: the client completes the close, LLP_CLOSE_COMPLETE" ;;
	flush-blackhole) echo "vt3d ctl fault blackhole: retransmit timeout, QP_FATAL (events, poll, idle)" ;;
	flush-terminate) echo "vt3d ctl fault terminate from the peer, each etype: QP_ACCESS_ERR / QP_REQ_ERR / QP_FATAL" ;;
	flush-crc) echo "vt3d ctl fault corrupt-crc on the peer, a SEND arrives corrupted: QP_FATAL" ;;
	flush-stag) echo "vt3d ctl fault invalidate-stag of the client's buffer, the peer WRITEs: QP_ACCESS_ERR" ;;
	flush-vt3d-killed) echo "the client's own vt3d killed: DEVICE_FATAL, everything flushed (events style)" ;;
	flush-device-fatal) echo "vt3d ctl fault device-fatal on the client's vt3d: DEVICE_FATAL, everything flushed" ;;
	esac
}

FLUSH_PORT=7471
read -ra FLUSH_STYLE_LIST <<<"${FLUSH_STYLES:-events poll post cq-event idle}"
flush_styles() { local IFS=,; echo "${FLUSH_STYLE_LIST[*]}"; }

# flush_server: vt3-flushtest server in guest a, in the background.
flush_server() {
	expect a 10 "timeout 900 vt3-flushtest server --port $FLUSH_PORT --timeout 600 > /tmp/ft.srv 2>&1 & echo \$! > /tmp/ft.pid"
	wait_rdma_listen a
}

# flush_check: the client's output in LAST_OUT; RESULT from its last line.
flush_check() {
	local out=$1 last
	printf '%s\n' "$out" | grep -E ' (ok|FAIL):' >>"$CASE_DIR/flushtest.txt" || true
	last=$(printf '%s\n' "$out" | grep -E '^vt3-flushtest: [0-9]+ passed' | tail -n 1)
	[ -n "$last" ] || { fail "vt3-flushtest printed no summary: $(printf '%s' "$out" | tail -n 3)"; return 1; }
	RESULT="${last#vt3-flushtest: }"
	if printf '%s\n' "$out" | grep -q ' FAIL:'; then
		fail "$(printf '%s\n' "$out" | grep ' FAIL:' | head -n 3 | tr '\n' ' ')"
		return 1
	fi
}

# flush_run SCENARIOS [client args…]: scenarios needing no host action, all styles.
flush_run() {
	local scen=$1
	shift
	on b 900 "vt3-flushtest client --server $A_IP --port $FLUSH_PORT --scenario $scen --style $(flush_styles) --timeout 60 $*" || true
	flush_check "$LAST_OUT"
}

# flush_injected SCENARIO STYLE TIMEOUT EXPECT ACTION…: one client run in the
# background; once it printed READY, ACTION runs on the host with {QPN},
# {PEER} and {RKEY} replaced by the client's and the server's QP numbers
# and the client's buffer STag.
flush_injected() {
	local scen=$1 style=$2 t=$3 ev=$4 i qpn peer rkey line
	shift 4
	expect b 10 "timeout $((t + 60)) vt3-flushtest client --server $A_IP --port $FLUSH_PORT --scenario $scen --style $style --timeout $t --expect $ev > /tmp/ft.cli 2>&1 & echo \$! > /tmp/ft.cpid" || return 1
	for i in $(seq 60); do
		on b 10 "grep '^READY' /tmp/ft.cli" && break
		sleep 0.5
	done
	line=$(printf '%s\n' "$LAST_OUT" | grep '^READY' | head -n 1)
	[ -n "$line" ] || { on b 10 "cat /tmp/ft.cli" || true; fail "$scen/$style: client never READY: $(tail -n 2 <<<"$LAST_OUT")"; return 1; }
	read -r _ qpn peer rkey _ <<<"$line"
	local args=("$@")
	args=("${args[@]//\{QPN\}/$qpn}")
	args=("${args[@]//\{PEER\}/$peer}")
	args=("${args[@]//\{RKEY\}/$rkey}")
	FLUSH_T0=$(date +%s.%N)
	"${args[@]}" >>"$CASE_DIR/commands.log" 2>&1 || { fail "$scen/$style: host action failed: ${args[*]}"; return 1; }
	expect b $((t + 90)) "while kill -0 \$(cat /tmp/ft.cpid) 2>/dev/null; do sleep 0.2; done; cat /tmp/ft.cli" || return 1
	flush_check "$LAST_OUT"
}

# flush_injected_all SCENARIO STYLES TIMEOUT EXPECT ACTION…: one per style;
# the results add up in RESULT.
flush_injected_all() {
	local scen=$1 styles=$2 t=$3 ev=$4 style passed=0
	shift 4
	for style in ${styles//,/ }; do
		flush_injected "$scen" "$style" "$t" "$ev" "$@" || return 1
		passed=$((passed + 1))
	done
	RESULT="$passed passed, 0 failed ($scen)"
}

# libvt3's flush without a connection (single guest).
case_flush_datapath() {
	single_vt3 || return 1
	expect a 300 "vt3-datapath -d vt3_0"
	RESULT=$(printf '%s\n' "$LAST_OUT" | sed -n 's/^vt3-datapath: vt3_0: //p' | tail -n 1)
	expect_no_rnic_objects vt3a "after vt3-datapath"
}

case_flush_local() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_run local-close
}

case_flush_local_siw() {
	pair_vt3_siw || return 1
	# pair_vt3_siw: a is vt3, b is siw. The server (any provider) goes to b.
	expect b 10 "timeout 900 vt3-flushtest server --port $FLUSH_PORT --timeout 600 > /tmp/ft.srv 2>&1 & echo \$! > /tmp/ft.pid"
	wait_rdma_listen b || return 1
	on a 900 "vt3-flushtest client --server $B_IP --port $FLUSH_PORT --scenario local-close --style $(flush_styles) --timeout 60" || true
	flush_check "$LAST_OUT"
}

case_flush_peer() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_run peer-close,peer-abort,bad-stag
}

case_flush_peer_siw() {
	pair_vt3_siw || return 1
	expect b 10 "timeout 900 vt3-flushtest server --port $FLUSH_PORT --timeout 600 > /tmp/ft.srv 2>&1 & echo \$! > /tmp/ft.pid"
	wait_rdma_listen b || return 1
	on a 900 "vt3-flushtest client --server $B_IP --port $FLUSH_PORT --scenario peer-close,bad-stag --style $(flush_styles) --timeout 60" || true
	flush_check "$LAST_OUT" || return 1
	local first=$RESULT
	# siw closes its socket gracefully when its QP is destroyed with the
	# connection up (FIN, not RST): vt3 sees a peer close, not a reset.
	on a 900 "vt3-flushtest client --server $B_IP --port $FLUSH_PORT --scenario peer-abort --style $(flush_styles) --timeout 60 --expect LLP_CLOSE_COMPLETE" || true
	flush_check "$LAST_OUT" || return 1
	RESULT="$first; peer-abort (siw: FIN) $RESULT"
}

case_flush_bad_wqe() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_run bad-wqe
}

case_flush_cq_overflow() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_run cq-overflow
}

# The server's vt3d dies (no RST, no FIN): the client's TCP times out.
case_flush_peer_gone() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected timeout events 90 QP_FATAL kill -9 "$(vt3d_main_pid vt3a)"
}

# Faults through `vt3d ctl fault` on the server's vt3d (vt3a) against its
# connection ({PEER}), so that the client (b) receives them.
case_flush_rst() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected_all rst "$(flush_styles)" 60 QP_FATAL vt3d_ctl vt3a fault rst --qp "{PEER}"
}

case_flush_fin() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected_all fin "$(flush_styles)" 60 LLP_CLOSE_COMPLETE vt3d_ctl vt3a fault fin --qp "{PEER}"
}

case_flush_blackhole() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected_all timeout events,poll,idle 90 QP_FATAL vt3d_ctl vt3a fault blackhole --qp "{PEER}"
}

case_flush_terminate() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	# RDMAP (layer 0): etype 1 remote protection, 2 remote operation, 0 catastrophic.
	flush_injected terminate events 60 QP_ACCESS_ERR vt3d_ctl vt3a fault terminate --layer 0 --etype 1 --ecode 0 --qp "{PEER}" || return 1
	flush_injected terminate poll 60 QP_REQ_ERR vt3d_ctl vt3a fault terminate --layer 0 --etype 2 --ecode 6 --qp "{PEER}" || return 1
	flush_injected terminate events 60 QP_FATAL vt3d_ctl vt3a fault terminate --layer 0 --etype 0 --ecode 0 --qp "{PEER}" || return 1
	# DDP (layer 1): etype 1 tagged buffer, 2 untagged buffer errors; LLP (2): MPA.
	flush_injected terminate cq-event 60 QP_ACCESS_ERR vt3d_ctl vt3a fault terminate --layer 1 --etype 1 --ecode 0 --qp "{PEER}" || return 1
	flush_injected terminate post 60 QP_REQ_ERR vt3d_ctl vt3a fault terminate --layer 1 --etype 2 --ecode 1 --qp "{PEER}" || return 1
	flush_injected terminate idle 60 none vt3d_ctl vt3a fault terminate --layer 2 --etype 0 --ecode 2 --qp "{PEER}" || return 1
	flush_injected terminate events 60 QP_FATAL vt3d_ctl vt3a fault terminate --layer 2 --etype 0 --ecode 2 --qp "{PEER}" || return 1
	RESULT="7 passed, 0 failed (terminate: RDMAP etype 0/1/2, DDP etype 1/2, LLP CRC)"
}

case_flush_crc() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected_all crc events,poll 60 QP_FATAL vt3d_ctl vt3a fault corrupt-crc --qp "{PEER}"
}

case_flush_stag() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected_all stag events,poll 60 QP_ACCESS_ERR vt3d_ctl vt3b fault invalidate-stag --stag "{RKEY}"
}

case_flush_device_fatal() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected device-fatal events 60 DEVICE_FATAL vt3d_ctl vt3b fault device-fatal
}

# The client's own vt3d killed: vt3.ko loses the device (DEVICE_FATAL), and
# libvt3 still gives every WR back.
case_flush_vt3d_killed() {
	pair_vt3_vt3 || return 1
	flush_server || return 1
	flush_injected device-fatal events 60 DEVICE_FATAL kill "$(vt3d_main_pid vt3b)"
}
