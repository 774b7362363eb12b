#!/usr/bin/env bash
# Mutation testing with cargo-mutants (issue 54, item 9): each mutant is one
# small wrong edit to the source (a `<` made `<=`, a body made `Default`); a
# mutant no test fails on is a line the tests do not pin down. Slow (a build
# and a test run per mutant) and not part of CI: rerun it by hand after
# changing a crate's logic, and give each new missed mutant an assertion or a
# line on why it is equivalent.
#
# Some 760 mutants in the algorithm crate, 890 in the policy's and 183 in
# the memory store's, a few seconds each on an idle machine (the algorithm
# crate's files but calendar, concurrency and credit, 633 mutants, took an
# hour on two busy cores): scope a run with `-f <file>` when short.
# Each mutant runs only its own crate's unit tests (`--lib`), one at a time,
# built at opt-level 1: the property tests run twenty times faster than in a
# debug build, and the crate itself still builds in seconds.
#
#   scripts/mutants.sh                      algorithm and policy
#   scripts/mutants.sh policy memory        the policy, the limiter's memory store
#   scripts/mutants.sh algorithm -- -f crates/algorithm/src/credit.rs
#   scripts/mutants.sh --missed policy      only last run's missed mutants,
#                                           against the tests as they are now
#
# Arguments after `--` go to cargo-mutants. Results land in
# $CARGO_TARGET_DIR/mutants/<crate>/mutants.out (missed.txt, caught.txt, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || {
    echo "needs cargo-mutants: cargo install --locked cargo-mutants" >&2
    exit 1
}

crates=()
missed=false
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; break ;;
        --missed) missed=true; shift ;;
        algorithm | policy | memory) crates+=("$1"); shift ;;
        *) echo "unknown crate '$1' (algorithm, policy, memory)" >&2; exit 1 ;;
    esac
done
[ ${#crates[@]} -gt 0 ] || crates=(algorithm policy)

target="${CARGO_TARGET_DIR:-$PWD/target}"
for crate in "${crates[@]}"; do
    files=()
    case "$crate" in
        algorithm) package=floodgate-algorithm ;;
        policy) package=floodgate-policy ;;
        # The memory store is a folder: its files but tests.rs.
        memory)
            package=floodgate-limiter
            files=(crates/limiter/src/memory/{mod,decide,room,slots}.rs)
            ;;
    esac
    scope=(-p "$package")
    out="$target/mutants/$crate"
    if $missed; then
        # Each missed mutant by its exact name (file:line:col: what): its
        # file is unchanged since, only the tests are new.
        [ -s "$out/mutants.out/missed.txt" ] || { echo "$crate: no missed.txt in $out" >&2; continue; }
        while IFS= read -r name; do
            scope+=(--re "^$(printf '%s' "$name" | sed 's/[][\\.*^$()+?{}|]/\\&/g')\$")
        done <"$out/mutants.out/missed.txt"
        # cargo-mutants 27 lets its "delete field" mutants past --re: the
        # files too (in place of the crate's), so that only those of these
        # files come along.
        mapfile -t files < <(cut -d: -f1 "$out/mutants.out/missed.txt" | sort -u)
        out="$out-missed"
    fi
    for file in "${files[@]}"; do
        scope+=(-f "$file")
    done
    mkdir -p "$out"
    # Exit status 2 is "some mutants missed", 3 "some timed out": the
    # counts below say so; anything else is a failure of the run itself.
    status=0
    cargo mutants "${scope[@]}" \
        --output "$out" \
        --jobs 1 \
        --cargo-test-arg=--lib \
        --cargo-arg=--config=profile.dev.opt-level=1 \
        --minimum-test-timeout 30 \
        --build-timeout 300 \
        --colors never \
        "$@" || status=$?
    case "$status" in
        0 | 2 | 3) ;;
        *) echo "cargo mutants failed on $crate (status $status)" >&2; exit "$status" ;;
    esac
done

count() { [ -s "$1" ] && grep -c . "$1" || echo 0; }
echo
printf '%-10s %7s %7s %9s %8s\n' crate caught missed unviable timeout
for crate in "${crates[@]}"; do
    out="$target/mutants/$crate/mutants.out"
    $missed && out="$target/mutants/$crate-missed/mutants.out"
    printf '%-10s %7s %7s %9s %8s\n' "$crate" \
        "$(count "$out/caught.txt")" "$(count "$out/missed.txt")" \
        "$(count "$out/unviable.txt")" "$(count "$out/timeout.txt")"
done
