#!/usr/bin/env bash
# Re-plants each bug of tests/hosts/planted/*.patch (or of the patches
# named as arguments) in a scratch copy of the repository, runs the hosts
# harness's short run on it RUNS times (3 unless set), and prints a table:
# the bug, the runs that caught it, and what caught it (the checker's
# violation kinds, with how many of each over the runs). A patch whose
# description has a line "Unit: <package> <test>" is also checked against
# that unit test, which must fail on it.
#
# As root on Linux, with LOCKS_TEST_POSTGRES_DSN set and PostgreSQL's
# server binaries installed (the harness skips otherwise, and a skipped
# run counts as not caught). A short run takes about 90 s on a loaded
# 2-core machine. JOBS=n runs n patches at once (1 unless set; each run
# has namespaces and a server of its own). KEEP=1 keeps the scratch
# copies and the runs' logs.
#
#   tests/hosts/planted/run.sh
#   RUNS=1 tests/hosts/planted/run.sh tests/hosts/planted/fence-owner.patch
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
runs=${RUNS:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/locks-planted.XXXXXX")
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT INT TERM

if [ $# -eq 0 ]; then
	set -- "$here"/*.patch
fi

# kinds prints the violation kinds a run's log reports, one a line: the
# harness reports each as "<file>.go:<line>: <kind>: <detail>".
kinds() {
	sed -n 's/^ *[a-z_]*\.go:[0-9]*: \([a-z][a-z-]*\): .*/\1/p' "$1" | grep -v '^cleanup$'
}

# one runs the patch $1 and writes its row of the table to $work/<name>/row.
one() {
	local patch name src unit caught i log k what
	name=$(basename "$1" .patch)
	patch=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
	src="$work/$name/src"
	mkdir -p "$src"
	# The repository as checked out, uncommitted edits included.
	tar -C "$root" --exclude=./.git -cf - . | tar -C "$src" -xf -
	if ! (cd "$src" && git apply "$patch") 2>"$work/$name/apply.log"; then
		echo "$name: the patch does not apply: $(head -1 "$work/$name/apply.log")" >&2
		echo "| $name | does not apply | |" >"$work/$name/row"
		return
	fi
	unit=""
	set -- $(sed -n 's/^Unit: //p' "$patch" | head -1)
	if [ $# -eq 2 ]; then
		(cd "$src" && go test -count=1 -v "$1" -run "^$2\$" >"$work/$name/unit.log" 2>&1)
		if grep -q -- "^--- FAIL: $2 " "$work/$name/unit.log"; then
			unit="unit test \`$2\` fails on it"
		elif grep -q -- "^--- SKIP: $2 " "$work/$name/unit.log"; then
			unit="unit test \`$2\` skipped: $(grep -m1 -A1 -- "^--- SKIP" "$work/$name/unit.log" | tail -1 | sed 's/^ *//')"
		else
			unit="unit test \`$2\` passes on it"
		fi
	fi
	if ! (cd "$src/tests/hosts" && go test -c -o hosts.test . >"$work/$name/build.log" 2>&1); then
		echo "$name: the harness does not build: $(head -3 "$work/$name/build.log")" >&2
		echo "| $name | does not build | |" >"$work/$name/row"
		return
	fi
	caught=0
	: >"$work/$name/kinds"
	for i in $(seq 1 "$runs"); do
		log="$work/$name/run$i.log"
		(cd "$src/tests/hosts" && ./hosts.test -test.run '^TestHosts$' -test.count=1 -test.v -test.timeout 10m >"$log" 2>&1)
		if grep -q -- '^--- FAIL' "$log"; then
			caught=$((caught + 1))
			k=$(kinds "$log" | sort | uniq -c | awk '{printf "%s%s %d", sep, $2, $1; sep=", "}')
			[ -n "$k" ] || k="failed: $(grep -m1 -E '(Error|error)' "$log" | sed 's/^ *//' | cut -c1-80)"
			echo "$name: run $i caught it: $k" >&2
			kinds "$log" >>"$work/$name/kinds"
		elif grep -q -- '^--- SKIP' "$log"; then
			echo "$name: run $i skipped: $(grep -m1 -A1 -- '^--- SKIP' "$log" | tail -1 | sed 's/^ *//')" >&2
		else
			echo "$name: run $i passed ($(grep -m1 -o 'seed [0-9]*' "$log"))" >&2
		fi
	done
	what=$(sort "$work/$name/kinds" | uniq -c | sort -rn | awk '{printf "%s`%s` %d", sep, $2, $1; sep=", "}')
	[ -n "$what" ] && [ -n "$unit" ] && what="$what; "
	echo "| $name | $caught / $runs | $what$unit |" >"$work/$name/row"
}

jobs=${JOBS:-1}
for patch in "$@"; do
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		wait -n
	done
	one "$patch" &
	sleep 5 # the copies and builds one after another
done
wait

echo "| planted bug | runs caught | what caught it (violations over the runs) |"
echo "|---|---|---|"
for patch in "$@"; do
	cat "$work/$(basename "$patch" .patch)/row" 2>/dev/null || echo "| $(basename "$patch" .patch) | no result | |"
done
[ -n "${KEEP:-}" ] && echo "logs in $work" >&2
exit 0
