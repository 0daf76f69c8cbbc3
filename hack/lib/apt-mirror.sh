# shellcheck shell=bash
# Sourced by hack/cloudimage/build.sh; tested by hack/cloudimage/mirror_test.go.
#
# The tree names no package mirror: a Debian mirror is whatever the host's own
# apt configuration uses.

# apt_mirror SUITE [APT_DIR]: print the URI of the first enabled binary
# ("deb") source of SUITE with component main in the apt configuration under
# APT_DIR (default /etc/apt), read in apt's order: sources.list, then the
# files in sources.list.d sorted by name, one-line "*.list" and deb822
# "*.sources" alike. Only http, https and file URIs count (what debootstrap
# can fetch from). Prints nothing and returns 1 when there is none.
apt_mirror() {
	local suite=$1 dir=${2:-/etc/apt}
	local -a files=()
	local f
	[[ -f $dir/sources.list ]] && files+=("$dir/sources.list")
	# One glob, so the shell sorts .list and .sources files together.
	for f in "$dir"/sources.list.d/*; do
		case $f in
		*.list | *.sources) [[ -f $f ]] && files+=("$f") ;;
		esac
	done
	local uri
	for f in "${files[@]}"; do
		[[ -r $f ]] || continue
		if [[ $f == *.sources ]]; then
			uri=$(_apt_mirror_deb822 "$suite" <"$f")
		else
			uri=$(_apt_mirror_oneline "$suite" <"$f")
		fi
		if [[ -n $uri ]]; then
			printf '%s\n' "${uri%/}"
			return 0
		fi
	done
	return 1
}

# _apt_mirror_oneline SUITE < file: one-line entries
#   deb [ options ] URI SUITE COMPONENT...
# '#' starts a comment; the options group may contain spaces.
_apt_mirror_oneline() {
	awk -v suite="$1" '
		{
			sub(/#.*/, "")
			if ($1 != "deb") next
			line = $0
			sub(/^[ \t]*deb[ \t]+/, "", line)
			if (substr(line, 1, 1) == "[") {
				end = index(line, "]")
				if (end == 0) next
				line = substr(line, end + 1)
			}
			n = split(line, w, /[ \t]+/)
			# split keeps an empty first field when line starts with blanks.
			k = 0
			for (i = 1; i <= n; i++) if (w[i] != "") f[++k] = w[i]
			if (k < 3 || f[2] != suite || f[1] !~ /^(https?|file):/) next
			for (i = 3; i <= k; i++) if (f[i] == "main") { print f[1]; exit }
		}'
}

# _apt_mirror_deb822 SUITE < file: deb822 stanzas separated by blank lines;
# field names are case-insensitive, a line starting with a blank continues
# the previous field, '#' lines are comments, "Enabled: no" turns a stanza off.
_apt_mirror_deb822() {
	awk -v suite="$1" '
		function has(list, word,    n, i, a) {
			n = split(list, a, /[ \t]+/)
			for (i = 1; i <= n; i++) if (a[i] == word) return 1
			return 0
		}
		function trim(s) {
			sub(/^[ \t]+/, "", s)
			sub(/[ \t]+$/, "", s)
			return s
		}
		function flush(    n, i, a) {
			if (has(v["types"], "deb") && has(v["suites"], suite) && has(v["components"], "main") &&
				tolower(trim(v["enabled"])) != "no") {
				n = split(v["uris"], a, /[ \t]+/)
				for (i = 1; i <= n; i++) if (a[i] ~ /^(https?|file):/) { print a[i]; found = 1; exit }
			}
			delete v
			last = ""
		}
		/^#/ { next }
		/^[ \t]*$/ { flush(); next }
		/^[ \t]/ { if (last != "") v[last] = v[last] " " $0; next }
		{
			colon = index($0, ":")
			if (colon == 0) next
			last = tolower(substr($0, 1, colon - 1))
			v[last] = substr($0, colon + 1)
		}
		END { if (!found) flush() }'
}
