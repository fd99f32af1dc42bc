#!/bin/sh
# tests/check-format.sh — the C lines a change adds or edits follow .clang-format.
#
# Only the lines changed since a base commit are checked (git clang-format), so code that
# was there before is never reformatted behind anyone's back. The base is
#   $KILN_FORMAT_BASE               when set (a commit, e.g. HEAD~3), else
#   the merge base of HEAD with main (or origin/main), when such a branch exists.
# On main itself (CI's clone) the last commit's lines are checked. With no base (a tarball, a
# shallow or single-branch clone) nothing is checked, and the script says so. Uncommitted changes in the working tree count too.
# Exit 1 and the formatting diff when a changed line is off; fix with
#   git clang-format --extensions c,h BASE
set -eu
cd "$(dirname "$0")/.."

say() { echo "check-format: $*"; }

if ! command -v clang-format >/dev/null 2>&1 || ! command -v git-clang-format >/dev/null 2>&1; then
    say "clang-format is not installed (deploy/install-deps.sh installs it); nothing checked"
    exit 0
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    say "not a git checkout; nothing checked"
    exit 0
fi

base=${KILN_FORMAT_BASE:-}
if [ -z "$base" ]; then
    for ref in main origin/main; do
        if git rev-parse -q --verify "$ref^{commit}" >/dev/null; then
            base=$(git merge-base HEAD "$ref" 2>/dev/null) || base=""
            break
        fi
    done
fi
if [ -z "$base" ]; then
    say "no base to compare with (no main branch; set KILN_FORMAT_BASE=HEAD~N); nothing checked"
    exit 0
fi
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
    say "base '$base' is not a commit here (shallow clone?); nothing checked"
    exit 0
fi
if [ "$(git rev-parse "$base^{commit}")" = "$(git rev-parse HEAD)" ] && git diff --quiet HEAD -- '*.c' '*.h'; then
    # On main itself (CI's clone) the base is HEAD: check what the last commit changed instead.
    if [ -z "${KILN_FORMAT_BASE:-}" ] && git rev-parse -q --verify "HEAD~1^{commit}" >/dev/null; then
        base=$(git rev-parse "HEAD~1")
    else
        say "no change since the base ($base); nothing checked"
        exit 0
    fi
fi

out=$(git clang-format --binary clang-format --extensions c,h --diff "$base" 2>&1) || true
case "$out" in
*"diff --git"*)
    printf '%s\n' "$out"
    say "the lines above, changed since $(git rev-parse --short "$base"), do not follow .clang-format"
    say "fix: git clang-format --extensions c,h $(git rev-parse --short "$base")"
    exit 1
    ;;
esac
say "changed C lines since $(git rev-parse --short "$base") follow .clang-format"
