# shellcheck shell=bash
# Sourced by hack/guest/build.sh and hack/cloudimage/build.sh, which define
# log and die.

# install_missing NEED: NEED names an associative array that maps a probe
# (an absolute path that must exist, or a command) to the Debian package
# that provides it. The packages of the probes that fail are installed with
# apt-get, after an apt-get update if the first try fails; without root,
# missing packages are an error that says how to install them.
install_missing() {
	local -n need_=$1
	local probe
	local -a missing=()
	for probe in "${!need_[@]}"; do
		if [[ $probe == /* ]]; then
			[[ -e $probe ]] || missing+=("${need_[$probe]}")
		else
			command -v "$probe" >/dev/null || missing+=("${need_[$probe]}")
		fi
	done
	((${#missing[@]})) || return 0
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	if [[ $(id -u) != 0 ]]; then
		die "missing packages: ${missing[*]} (apt-get install -y --no-install-recommends ${missing[*]})"
	fi
	log "installing ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
	fi
}
