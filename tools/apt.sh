# shellcheck shell=bash
# Debian package helpers shared by tools/kernel-headers.sh and
# tools/lint-kmod.sh: sourced, after the caller defined log() and die()
# and set HOST_PACKAGES (what it needs installed).

# apt as root drops to the _apt user, which cannot write into our cache.
# shellcheck disable=SC2034 # used by the scripts that source this file
APT_OPTS=()
[[ $EUID -ne 0 ]] || APT_OPTS=(-o APT::Sandbox::User=root)

# apt-get update, at most once a run and only as root; fails otherwise
# (the caller's first attempt then stands).
APT_UPDATED=0
apt_update_once() {
	((APT_UPDATED == 0)) && [[ $EUID -eq 0 ]] || return 1
	APT_UPDATED=1
	log "apt-get update"
	apt-get update -qq >&2 || die "apt-get update failed"
}

# HOST_PACKAGES installed (as root), or a clear error naming them.
ensure_host_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	[[ $EUID -eq 0 ]] ||
		die "missing host packages: ${missing[*]} (run as root, or: apt-get install ${missing[*]})"
	log "installing host packages: ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2; then
		apt_update_once || die "apt-get install ${missing[*]} failed"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
			die "apt-get install ${missing[*]} failed"
	fi
}

# A key of apt's view of the archive: answers resolved from apt-cache are
# reused while the package lists and sources are unchanged (apt-cache is
# slow where its binary cache is disabled, as in Docker-built images).
apt_state_key() {
	find /var/lib/apt/lists /etc/apt -maxdepth 2 -type f -printf '%p %s %T@\n' 2>/dev/null |
		sort | sha256sum | cut -c1-16
}
