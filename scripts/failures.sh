#!/usr/bin/env bash
# failures.sh LOG: after a failed `go test -v` run, print what each failing test said. The live
# output of the e2e and red-team targets keeps only the top-level progress lines, so without
# this a failure in a subtest shows as a bare "--- FAIL" of its parent.
set -uo pipefail
log=$1
[ -f "$log" ] || exit 0
echo "---- failures (full log: $log) ----"
# Names of every failing test and subtest, deepest first.
mapfile -t failed < <(grep -oE -- '--- FAIL: [^ ]+' "$log" | awk '{print $3}' | sort -u -r)
for name in "${failed[@]}"; do
	echo "== $name"
	# go test -v announces each (sub)test with === RUN/=== CONT/=== PAUSE and indents what the
	# test logged under it; print the indented lines that follow each announcement of this one.
	awk -v name="$name" '
		/^=== (RUN|CONT|PAUSE|NAME)/ { cur = $3; next }
		/^ *--- (PASS|FAIL|SKIP)/ { next }
		cur == name && /^ +[^ ].*_test\.go:[0-9]+:/ { print; more = 1; next }
		cur == name && more && /^        / { print; next }
		{ more = 0 }
	' "$log" | tail -n 40
done
