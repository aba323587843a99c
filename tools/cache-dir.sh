# shellcheck shell=bash
# Where vt3's build caches live: outside any clone, so every checkout on a
# machine (CI's fresh clones included) reuses them. Everything in it is
# keyed by content (package versions, input hashes), never by the path of
# the clone. Source it; it sets VT3_CACHE.
#   root:      /var/cache/vt3
#   otherwise: ${XDG_CACHE_HOME:-~/.cache}/vt3
if [ -z "${VT3_CACHE:-}" ]; then
	if [ "$(id -u)" -eq 0 ]; then
		VT3_CACHE=/var/cache/vt3
	else
		VT3_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/vt3
	fi
fi
export VT3_CACHE
