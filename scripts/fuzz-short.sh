#!/usr/bin/env bash
# fuzz-short.sh runs every fuzz target in the tree for a short time each
# (FUZZTIME, default 5s), one after another. New failing inputs land in the
# package's testdata/fuzz/ as the Go fuzzer writes them: commit them as seeds.
# Packages are found from the source, so a new fuzz target is run without
# editing this script.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-5s}"
go="${GO:-go}"
failed=()
count=0
for pkg in $(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do
	for target in $(cat "$pkg"/*_test.go | grep -o '^func Fuzz[A-Za-z0-9_]*' | sed 's/^func //' | sort -u); do
		count=$((count + 1))
		# Two packages may hold a target of the same name: the log is named by both.
		log="/tmp/fuzz-$(echo "${pkg#./}" | tr / -)-${target}.log"
		if ! "$go" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >"$log" 2>&1; then
			echo "FAIL $pkg $target (log: $log)"
			tail -20 "$log"
			failed+=("$pkg:$target")
		else
			echo "ok   $pkg $target"
		fi
	done
done
echo "fuzz: $((count - ${#failed[@]})) passed, ${#failed[@]} failed"
[ "${#failed[@]}" -eq 0 ]
