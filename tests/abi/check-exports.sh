#!/bin/sh
# tests/abi/check-exports.sh NM LIBKILN INCLUDE_DIR CC... — libkiln exports its public API
# and nothing else.
#
# The public API is what engine/include/kiln/kiln.h declares once the preprocessor has run
# (nn.h declares its layers through a macro, so a plain grep of the headers would miss
# them). The test fails on any dynamic symbol the library defines that is not a kiln_
# name from those headers, and on any kiln__ (internal) name, printing each one.
set -eu
nm=$1
lib=$2
inc=$3
shift 3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '#include "kiln/kiln.h"\n' >"$work/all.c"
"$@" -E -P -I"$inc" "$work/all.c" >"$work/expanded.c"
grep -o '\bkiln_[A-Za-z0-9_]*' "$work/expanded.c" | grep -v '^kiln__' | sort -u >"$work/declared"
"$nm" -D --defined-only "$lib" | awk 'NF >= 3 { print $NF }' | sed 's/@.*//' | sort -u >"$work/exported"

bad=0
if grep '^kiln__' "$work/exported" >"$work/internal"; then
    echo "libkiln exports internal (kiln__) symbols:"
    sed 's/^/  /' "$work/internal"
    bad=1
fi
comm -23 "$work/exported" "$work/declared" | grep -v '^kiln__' >"$work/undeclared" || true
if [ -s "$work/undeclared" ]; then
    echo "libkiln exports symbols its public headers do not declare:"
    sed 's/^/  /' "$work/undeclared"
    bad=1
fi
exported=$(wc -l <"$work/exported")
declared=$(comm -12 "$work/exported" "$work/declared" | wc -l)
echo "libkiln: $exported exported symbols, $declared of them declared in kiln/kiln.h"
if [ "$declared" -eq 0 ]; then
    echo "no public symbol found: is $lib the shared library?"
    bad=1
fi
exit $bad
