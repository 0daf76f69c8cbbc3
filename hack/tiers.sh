#!/usr/bin/env bash
# Runs `make TIER` for each tier named, in order, and ends with each tier's
# wall-clock time (issue 23's test-time budget: CI's limit is 90 minutes and
# the budget for `make test` 50). A failing tier stops the run; the times of
# the tiers that ran are printed all the same, with the failure named.
#
# Background builds. On a fresh machine three builds need nothing but Go
# and take long: containerd 2.x (`hack/setup-host.sh containerd2`, for the
# deb, integration and e2e tiers), golangci-lint's `go install` (lint) and
# Kubernetes (`hack/k8s/build.sh`, e2e): about 30 minutes one after
# another. The tiers before their users mostly wait on TCG guests and
# debootstrap, so the builds start at once, niced, one after another in a
# lane of their own (BG_JOBS), and a tier that needs one waits for it; a
# failed build fails that tier with the end of the build's log. Each
# build is idempotent and does nothing when its product is in place, and
# each tier still builds what it needs when run alone (`make e2e`). While
# the containerd 2.x build is pending, the other tiers run with
# SETUP_CONTAINERD2=0 so that their `make setup` does not start a second
# one. The lint tier, when its linter is still being built, is put off
# until after the next tier (it has no users). Logs: _output/tiers/.
#
#   hack/tiers.sh TIER...        run the tiers
#   hack/tiers.sh --lane DIR JOB...   (internal) the background lane
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# BG_JOBS: the background builds, in the lane's order, as name:tiers.
# Kubernetes before golangci-lint: e2e, the last tier, cannot be put off,
# while lint can, to the end of the run.
BG_JOBS=(
	"containerd2:deb-test integration e2e"
	"k8s:e2e"
	"golangci-lint:lint"
)
# DEFERRABLE: tiers no later tier needs, which may wait for their build
# behind the next tier instead of stopping the run.
DEFERRABLE=" lint "

# run_job NAME: the build itself (output to the caller's stdout/stderr).
run_job() {
	case $1 in
	containerd2) hack/setup-host.sh containerd2 ;;
	golangci-lint) make --no-print-directory lint-tool ;;
	k8s) hack/k8s/build.sh ;;
	*)
		echo "tiers: unknown background job $1" >&2
		return 2
		;;
	esac
}

# lane DIR JOB...: runs each job niced, one after another; DIR/JOB.log is
# its output, DIR/JOB.secs its time, DIR/JOB.rc (written last) its exit.
lane() {
	local dir=$1 job start rc
	shift
	for job in "$@"; do
		start=$SECONDS
		date +%s >"$dir/$job.start"
		nice -n 19 bash -c "$(declare -f run_job); run_job $job" >"$dir/$job.log" 2>&1
		rc=$?
		echo $((SECONDS - start)) >"$dir/$job.secs"
		echo "$rc" >"$dir/$job.rc"
	done
}

if [ "${1:-}" = --lane ]; then
	shift
	lane "$@"
	exit 0
fi

# needs TIER: the background jobs (started in this run) that TIER waits for.
needs() {
	local spec name tiers
	for spec in "${BG_JOBS[@]}"; do
		name=${spec%%:*}
		tiers=" ${spec#*:} "
		if [[ $tiers == *" $1 "* && " ${started[*]} " == *" $name "* ]]; then
			echo "$name"
		fi
	done
}

# pending TIER: succeeds when a job TIER needs has not finished.
pending() {
	local job
	for job in $(needs "$1"); do
		[ -e "$bgdir/$job.rc" ] || return 0
	done
	return 1
}

# wait_for TIER: waits for TIER's jobs; fails, with the log's tail, when
# one of them failed. Adds the seconds waited to waited[TIER].
wait_for() {
	local tier=$1 job rc start=$SECONDS
	for job in $(needs "$tier"); do
		if [ ! -e "$bgdir/$job.rc" ]; then
			echo "== make test: $tier waits for the background build $job ($bgdir/$job.log)"
			while [ ! -e "$bgdir/$job.rc" ]; do
				sleep 2
			done
		fi
		rc=$(cat "$bgdir/$job.rc")
		if [ "$rc" != 0 ]; then
			echo "== make test: the background build $job failed (exit $rc); the end of $bgdir/$job.log:"
			tail -n 60 "$bgdir/$job.log" | sed 's/^/    /'
			waited[$tier]=$((SECONDS - start))
			return 1
		fi
	done
	waited[$tier]=$((SECONDS - start))
}

# Start the lane with every job a named tier needs.
begin_epoch=$(date +%s)
bgdir=$PWD/_output/tiers
mkdir -p "$bgdir"
started=()
for spec in "${BG_JOBS[@]}"; do
	name=${spec%%:*}
	rm -f "$bgdir/$name".{log,secs,rc,start}
	for t in ${spec#*:}; do
		if [[ " $* " == *" $t "* ]]; then
			started+=("$name")
			break
		fi
	done
done
lane_pid=
if [ "${#started[@]}" -gt 0 ]; then
	echo "== make test: background builds (niced, logs in $bgdir): ${started[*]}"
	# A session of its own, so that its builds can be stopped as a group.
	setsid "${BASH_SOURCE[0]}" --lane "$bgdir" "${started[@]}" &
	lane_pid=$!
	trap 'if [ -n "$lane_pid" ]; then kill -- -"$lane_pid" 2>/dev/null; fi' EXIT
fi

declare -A waited=()
names=()
secs=()
status=0
failed=
begin=$SECONDS
queue=("$@")
while [ "${#queue[@]}" -gt 0 ]; do
	tier=${queue[0]}
	queue=("${queue[@]:1}")
	if [[ $DEFERRABLE == *" $tier "* ]] && [ "${#queue[@]}" -gt 0 ] && pending "$tier"; then
		echo "== make test: $tier waits for its background build; ${queue[0]} runs first"
		queue=("${queue[0]}" "$tier" "${queue[@]:1}")
		continue
	fi
	start=$SECONDS
	env=()
	if [[ " ${started[*]} " == *" containerd2 "* ]] && [[ " $(needs "$tier" | tr '\n' ' ') " != *" containerd2 "* ]] &&
		[ ! -e "$bgdir/containerd2.rc" ]; then
		env=(SETUP_CONTAINERD2=0)
	fi
	if wait_for "$tier"; then
		env "${env[@]}" make --no-print-directory "$tier"
		rc=$?
	else
		rc=1
	fi
	names+=("$tier")
	secs+=($((SECONDS - start)))
	if [ "$rc" -ne 0 ]; then
		status=$rc
		failed=$tier
		break
	fi
done

echo
echo "== make test: time per tier"
for i in "${!names[@]}"; do
	t=${names[$i]}
	note=
	if [ "${waited[$t]:-0}" -gt 0 ]; then
		note="  (of which ${waited[$t]} s waiting for its background build)"
	fi
	printf '  %-12s %5d s  (%d min %02d s)%s\n' "$t" "${secs[$i]}" $((secs[i] / 60)) $((secs[i] % 60)) "$note"
done
total=$((SECONDS - begin))
printf '  %-12s %5d s  (%d min %02d s)\n' total "$total" $((total / 60)) $((total % 60))
if [ "${#started[@]}" -gt 0 ]; then
	echo "== make test: background builds (niced, one after another from the start)"
	for job in "${started[@]}"; do
		if [ -e "$bgdir/$job.rc" ]; then
			s=$(cat "$bgdir/$job.secs")
			printf '  %-14s %5d s  (%d min %02d s)  exit %s, started at +%d s\n' "$job" "$s" $((s / 60)) $((s % 60)) \
				"$(cat "$bgdir/$job.rc")" $(($(cat "$bgdir/$job.start") - begin_epoch))
		elif [ -e "$bgdir/$job.start" ]; then
			printf '  %-14s still running, stopped with the run\n' "$job"
		else
			printf '  %-14s not started\n' "$job"
		fi
	done
fi
if [ -n "$failed" ]; then
	echo "== make test: tier '$failed' failed (exit $status)"
fi
exit "$status"
