#!/bin/sh
# tests/install/check_install.sh BUILD_DIR SOURCE_DIR — `meson install` as a user runs it, into a
# staging root (DESTDIR), then checks what a fresh Debian 12 needs of the result:
#   - libkiln, kiln.pc, the headers, kilnd and kiln land under the configured prefix in folders
#     the dynamic linker (ld.so.conf) and pkg-config (its default search path) look in, when the
#     prefix is the default /usr/local;
#   - the staged kilnd starts with no LD_LIBRARY_PATH (it links libkiln's internals statically)
#     and answers /v2/health/live;
#   - the README's C example, cut out of README.md, compiles with the staged kiln.pc and headers
#     alone and prints a softmax row that sums to 1.
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
stage=$(mktemp -d "${TMPDIR:-/tmp}/kiln-install.XXXXXX")
kilnd_pid=""
cleanup() {
    [ -n "$kilnd_pid" ] && kill "$kilnd_pid" 2>/dev/null && wait "$kilnd_pid" 2>/dev/null
    rm -rf "$stage"
}
trap cleanup EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

# The build's own view of where things go.
opt() { meson introspect --buildoptions "$build" | python3 -c \
    'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]))' "$1"; }
prefix=$(opt prefix)
libdir=$(opt libdir)
bindir=$(opt bindir)
includedir=$(opt includedir)
case "$libdir" in /*) ;; *) libdir="$prefix/$libdir" ;; esac
case "$bindir" in /*) ;; *) bindir="$prefix/$bindir" ;; esac
case "$includedir" in /*) ;; *) includedir="$prefix/$includedir" ;; esac
echo "prefix $prefix, libdir $libdir, bindir $bindir"

DESTDIR="$stage" meson install -C "$build" --no-rebuild --quiet >"$stage.log" 2>&1 ||
    { cat "$stage.log"; rm -f "$stage.log"; fail "meson install into a staging root failed"; }
rm -f "$stage.log"

for f in "$libdir/libkiln.so" "$libdir/pkgconfig/kiln.pc" "$includedir/kiln/kiln.h" \
         "$includedir/kiln/tensor.h" "$bindir/kilnd" "$bindir/kiln"; do
    [ -e "$stage$f" ] || fail "$f was not installed"
done
ls "$stage$libdir"/libkiln.so.* >/dev/null 2>&1 || fail "no versioned libkiln.so.* in $libdir"
echo "ok: library, kiln.pc, headers, kilnd and kiln installed"

# With the default prefix the folders must be ones the system searches without help.
if [ "$prefix" = /usr/local ]; then
    searched=$(cat /etc/ld.so.conf /etc/ld.so.conf.d/*.conf 2>/dev/null | sed 's/#.*//' | grep '^/' || true)
    echo "$searched" | grep -qx "$libdir" ||
        fail "$libdir is not in ld.so's search path (/etc/ld.so.conf*): an installed program cannot load libkiln"
    pc_path=$(pkg-config --variable pc_path pkg-config)
    echo ":$pc_path:" | grep -q ":$libdir/pkgconfig:" ||
        fail "$libdir/pkgconfig is not in pkg-config's default path ($pc_path)"
    echo "ok: $libdir is searched by ld.so and $libdir/pkgconfig by pkg-config"
fi

# The staged kilnd starts on its own, with no LD_LIBRARY_PATH. It links libkiln's internals
# statically (libkiln_internal.a: it uses more than the shared library exports), so it must not
# load a libkiln.so at all; should it ever, ldd must name the staged one, not a system-wide copy.
loaded=$(env -u LD_LIBRARY_PATH ldd "$stage$bindir/kilnd" | awk '$1 ~ /^libkiln\.so/ {print $3}')
[ -n "$loaded" ] && loaded=$(realpath "$loaded")
case "$loaded" in
    "") echo "ok: the staged kilnd carries libkiln statically and loads no libkiln.so" ;;
    "$stage$libdir"/*) echo "ok: the staged kilnd loads $loaded" ;;
    *) fail "the staged kilnd would load libkiln from '$loaded', not from $stage$libdir" ;;
esac
data="$stage/var"
env -u LD_LIBRARY_PATH "$stage$bindir/kilnd" --port 0 --data-dir "$data" >"$stage/kilnd.log" 2>&1 &
kilnd_pid=$!
i=0
while [ ! -s "$data/kilnd.port" ]; do
    i=$((i + 1))
    kill -0 "$kilnd_pid" 2>/dev/null || { cat "$stage/kilnd.log"; fail "the installed kilnd exited at start"; }
    [ "$i" -lt 200 ] || { cat "$stage/kilnd.log"; fail "the installed kilnd wrote no port file in 20 s"; }
    sleep 0.1
done
port=$(cat "$data/kilnd.port")
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v2/health/live")
[ "$code" = 200 ] || fail "the installed kilnd answered $code on /v2/health/live"
kill -TERM "$kilnd_pid"
wait "$kilnd_pid" || fail "the installed kilnd did not exit 0 on SIGTERM"
kilnd_pid=""
echo "ok: the installed kilnd started, answered /v2/health/live and stopped cleanly"

# The README's C example, exactly as printed there, against the staged tree only.
python3 - "$src/README.md" "$stage/prog.c" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"<!-- example: prog\.c[^>]*-->\s*```c\n(.*?)```", text, re.S)
if not m:
    sys.exit("FAIL: README.md has no block marked '<!-- example: prog.c ... -->'")
open(sys.argv[2], "w").write(m.group(1))
PY
# kiln.pc names $prefix; pointing its prefix variable into the staging root reads it as the
# installed file would be read after a real install.
flags=$(PKG_CONFIG_PATH="$stage$libdir/pkgconfig" \
        pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs kiln) || fail "pkg-config cannot read the installed kiln.pc"
echo "pkg-config --cflags --libs kiln: $flags"
# A sanitizer build's libkiln needs its runtime in the program too, as any user of that build would.
sanitize=$(opt b_sanitize)
[ "$sanitize" != none ] && flags="$flags -fsanitize=$sanitize"
# shellcheck disable=SC2086 # the flags are several words
cc -std=c17 -Wall -Wextra -Werror "$stage/prog.c" $flags -o "$stage/prog" ||
    fail "the README's C example does not compile against the installed headers and kiln.pc"
out=$(LD_LIBRARY_PATH="$stage$libdir" "$stage/prog") || fail "the README's C example failed: $out"
echo "$out"
echo "$out" | grep -q "softmax row sums to 1.0000" || fail "the README's C example printed '$out'"
echo "ok: the README's C example builds and runs against the installed tree"
