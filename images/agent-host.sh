# shellcheck shell=bash
# Host side of the vt3 guest agent (protocol: images/README.md). Source it:
#
#   . images/agent-host.sh
#   agent_mkfifo a "$dir"           # before QEMU: DIR/a.agent.in and DIR/a.agent.out
#   qemu-system-x86_64 ... -chardev pipe,id=ag,path="$dir/a.agent" -serial file:... -serial chardev:ag
#   agent_open a "$dir"
#   agent_wait_ready a 120          # the guest agent said @@READY
#   agent_run a 20 'ping -c 3 10.0.0.2'; echo "rc=$?"
#   agent_close a
#
# agent_run prints the command's output (stdout+stderr) and returns its exit
# status (124/143 when the guest-side timeout killed it). When no answer comes
# within TIMEOUT + AGENT_MARGIN seconds it says so on stderr and returns
# AGENT_RC_HOST_TIMEOUT (255, as ssh does for its own failures); usage errors
# return AGENT_RC_USAGE (2, with a message).

AGENT_MARGIN=${AGENT_MARGIN:-30} # serial transfer and TCG slowness on top of TIMEOUT
AGENT_RC_HOST_TIMEOUT=255
AGENT_RC_USAGE=2

declare -gA _AGENT_IN=() _AGENT_OUT=()
declare -g _AGENT_SEQ=0

_agent_err() { printf 'agent: %s\n' "$*" >&2; }

# agent_mkfifo NAME DIR: the FIFO pair QEMU's `-chardev pipe,path=DIR/NAME.agent` uses.
agent_mkfifo() {
	local name=${1:?agent_mkfifo NAME DIR} dir=${2:?agent_mkfifo NAME DIR} f
	for f in "$dir/$name.agent.in" "$dir/$name.agent.out"; do
		[[ -p $f ]] || mkfifo "$f" || return "$AGENT_RC_USAGE"
	done
}

# agent_open NAME DIR: open DIR/NAME.agent.{in,out}. Read-write opens of the
# FIFOs never block and never see EOF, whatever QEMU does.
agent_open() {
	local name=${1:?agent_open NAME DIR} dir=${2:?agent_open NAME DIR} in out
	if [[ ! -p $dir/$name.agent.in || ! -p $dir/$name.agent.out ]]; then
		_agent_err "$name: no FIFOs $dir/$name.agent.{in,out} (agent_mkfifo first)"
		return "$AGENT_RC_USAGE"
	fi
	agent_close "$name"
	exec {in}<>"$dir/$name.agent.in" {out}<>"$dir/$name.agent.out"
	_AGENT_IN[$name]=$in
	_AGENT_OUT[$name]=$out
}

agent_close() {
	local name=$1 fd
	fd=${_AGENT_IN[$name]:-}
	[[ -z $fd ]] || exec {fd}>&-
	fd=${_AGENT_OUT[$name]:-}
	[[ -z $fd ]] || exec {fd}<&-
	unset "_AGENT_IN[$name]" "_AGENT_OUT[$name]"
	return 0
}

_agent_check_open() {
	[[ -n ${_AGENT_OUT[$1]:-} ]] && return 0
	_agent_err "$1: not open (agent_open $1 DIR)"
	return "$AGENT_RC_USAGE"
}

# _agent_readline NAME DEADLINE: next line from the guest into _AGENT_LINE;
# fails when the deadline (epoch seconds) passes first.
_agent_readline() {
	local left=$(($2 - EPOCHSECONDS))
	((left > 0)) || return 1
	IFS= read -r -t "$left" -u "${_AGENT_OUT[$1]}" _AGENT_LINE
}

# agent_wait_ready NAME TIMEOUT: wait for the agent's @@READY line.
agent_wait_ready() {
	local name=${1:?agent_wait_ready NAME TIMEOUT} timeout=${2:?agent_wait_ready NAME TIMEOUT} deadline
	_agent_check_open "$name" || return
	deadline=$((EPOCHSECONDS + timeout))
	while _agent_readline "$name" "$deadline"; do
		[[ $_AGENT_LINE == @@READY ]] && return 0
	done
	_agent_err "$name: no @@READY within ${timeout}s (host-side timeout)"
	return "$AGENT_RC_HOST_TIMEOUT"
}

# agent_run NAME TIMEOUT COMMAND...: run COMMAND (one line; the words are
# joined with spaces) in the guest with `timeout TIMEOUT sh -c`, print its
# output, return its exit status.
agent_run() {
	if (($# < 3)); then
		_agent_err "usage: agent_run NAME TIMEOUT COMMAND..."
		return "$AGENT_RC_USAGE"
	fi
	local name=$1 timeout=$2 cmd id deadline rc=
	shift 2
	_agent_check_open "$name" || return
	cmd=$*
	if [[ ! $timeout =~ ^[0-9]+$ || -z $cmd || $cmd == *$'\n'* ]]; then
		_agent_err "$name: need a TIMEOUT in seconds and a one-line command"
		return "$AGENT_RC_USAGE"
	fi
	_AGENT_SEQ=$((_AGENT_SEQ + 1))
	id=$name.$$.$_AGENT_SEQ.$RANDOM
	printf '%s %s %s\n' "$id" "$timeout" "$cmd" >&"${_AGENT_IN[$name]}"
	deadline=$((EPOCHSECONDS + timeout + AGENT_MARGIN))
	# Lines before our @@BEGIN are leftovers of earlier, timed-out requests.
	while _agent_readline "$name" "$deadline"; do
		[[ $_AGENT_LINE == "@@BEGIN $id" ]] && break
	done
	if [[ $_AGENT_LINE == "@@BEGIN $id" ]]; then
		# Each line is printed once the next one came: an empty line just
		# before @@END is the newline the agent adds, not output.
		local held='' holding=0
		while _agent_readline "$name" "$deadline"; do
			if [[ $_AGENT_LINE =~ ^@@END\ ${id//./\\.}\ ([0-9]+)$ ]]; then
				rc=${BASH_REMATCH[1]}
				((holding)) && [[ -n $held ]] && printf '%s\n' "$held"
				break
			fi
			((holding)) && printf '%s\n' "$held"
			held=$_AGENT_LINE holding=1
		done
	fi
	if [[ -z $rc ]]; then
		_agent_err "$name: no answer to '$cmd' within $((timeout + AGENT_MARGIN))s (host-side timeout)"
		return "$AGENT_RC_HOST_TIMEOUT"
	fi
	return "$rc"
}
