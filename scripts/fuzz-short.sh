#!/usr/bin/env bash
# fuzz-short.sh runs every fuzz target in the tree for a short time each
# (FUZZTIME, default 5s, or a count of inputs such as 2000x), one after
# another, each starting with its seed corpus (f.Add and testdata/fuzz). New failing inputs land in the
# package's testdata/fuzz/ as the Go fuzzer writes them: commit them as
# seeds. Packages are found from the source, so a new fuzz target is run
# without editing this script.
#
# Each package's instrumented test binary is built once (go test -c -fuzz)
# and run for each of its targets, from the package's directory as go test
# would, with go test's fuzz cache: `go test -fuzz` per target would link
# the binary again for every target, which costs more than a short run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fuzztime="${FUZZTIME:-5s}"
go="${GO:-go}"
cache="$("$go" env GOCACHE)/fuzz"
bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT
failed=()
count=0
for pkg in $(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do
	name=$(echo "${pkg#./}" | tr / -)
	bin="$bins/$name.test"
	if ! "$go" test -c -fuzz=. -o "$bin" "$pkg" >"/tmp/fuzz-$name-build.log" 2>&1; then
		echo "FAIL $pkg: build (log: /tmp/fuzz-$name-build.log)"
		tail -20 "/tmp/fuzz-$name-build.log"
		failed+=("$pkg:build")
		continue
	fi
	importpath=$(cd "$pkg" && "$go" list .)
	for target in $(cat "$pkg"/*_test.go | grep -o '^func Fuzz[A-Za-z0-9_]*' | sed 's/^func //' | sort -u); do
		count=$((count + 1))
		# Two packages may hold a target of the same name: the log is named by both.
		log="/tmp/fuzz-$name-${target}.log"
		if ! (cd "$root/$pkg" && "$bin" -test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "$fuzztime" \
			-test.fuzzcachedir "$cache/$importpath" -test.paniconexit0 >"$log" 2>&1); then
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
