#!/usr/bin/env bash
# Runs `make TIER` for each tier named, in order, and ends with each tier's
# wall-clock time (issue 23's test-time budget: CI's limit is 90 minutes and
# the budget for `make test` 50). A failing tier stops the run; the times of
# the tiers that ran are printed all the same, with the failure named.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
names=()
secs=()
status=0
failed=
begin=$SECONDS
for tier in "$@"; do
	start=$SECONDS
	make --no-print-directory "$tier"
	rc=$?
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
	printf '  %-12s %5d s  (%d min %02d s)\n' "${names[$i]}" "${secs[$i]}" $((secs[i] / 60)) $((secs[i] % 60))
done
total=$((SECONDS - begin))
printf '  %-12s %5d s  (%d min %02d s)\n' total "$total" $((total / 60)) $((total % 60))
if [ -n "$failed" ]; then
	echo "== make test: tier '$failed' failed (exit $status)"
fi
exit "$status"
