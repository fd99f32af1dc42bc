#!/bin/sh
# tests/cuda/hip-build-check.sh SRCDIR OUTDIR LIBKILN_INTERNAL LIBKILN — the whole cuda backend built
# for AMD GPUs, from the same sources: the kernels (*.cu) compiled by hipcc through
# backends/cuda/vendor-hip.h, the host side (the C files) compiled by the C compiler ($CC,
# cc by default) with KILN_CUDA_HIP through vendor-hip-host.h and vendor-hip-libs.h (with
# the project's warnings as errors), and both linked into one shared object against the HIP
# runtime. A compile-and-link check: no AMD GPU is needed, and none is used.
#
# What the link must leave undefined: only libkiln's own engine functions (kiln__error_set,
# the fused-program emitter, ...), which the backend gets from the rest of libkiln when it
# is linked in. libkiln is built with hidden visibility, so the shared libkiln exports none
# of them and cannot stand in for them at link time; the check instead lists the shared
# object's undefined symbols, drops those the libraries it links define (the HIP runtime,
# libc, libdl, libpthread, libm, the C++ runtime hipcc adds), and requires every one left
# to be defined by a member of LIBKILN_INTERNAL (libkiln_internal.a, everything libkiln is
# made of) outside backends/cuda. hipBLASLt, MIOpen and hipRTC are loaded with dlopen at run
# time (cuda-libs.c), so none of their symbols may appear at all. Then every launcher of
# cuda-kernels.h, every entry cuda-impl.h declares and the registration function must be
# defined in the shared object.
#
# Last, two tests run, built against the same objects (and the engine from
# LIBKILN_INTERNAL, with the libraries LIBKILN itself needs): tests/cuda/test-cuda-fused.c
# generates fused programs' kernels with the HIP build's source and compiles them with
# hipRTC for gfx90a and gfx1030 (hipRTC is a compiler and needs no GPU), and
# tests/cuda/test-hip-open.c checks that the backend refuses to open cleanly without an AMD
# GPU. Nothing else of the HIP build runs here.
set -eu
export LC_ALL=C # sort and comm must agree on the order
src=$1
out=$2
internal=$3
libkiln=$4
mkdir -p "$out"
hipcc=${HIPCC:-hipcc}
cc=${CC:-cc}
archs="--offload-arch=gfx90a --offload-arch=gfx1030"
cuda="$src/backends/cuda"
objs=
nkernels=0
for f in cuda-elementwise cuda-reduce cuda-index cuda-pool cuda-resize; do
    echo "hipcc: $f.cu"
    # rocm_agent_enumerator (which hipcc runs to look for a GPU) prints a traceback on a
    # machine without one; the explicit --offload-arch makes its answer irrelevant
    "$hipcc" -x hip -std=c++17 -O2 -fPIC -DKILN_CUDA_HIP $archs -I"$src" -I"$cuda" \
        -c "$cuda/$f.cu" -o "$out/$f.o" 2>"$out/$f.log" || { cat "$out/$f.log"; exit 1; }
    objs="$objs $out/$f.o"
    nkernels=$((nkernels + 1))
done
# the host side: the CUDA build's C files, hip-miopen.c in cuda-dnn.c's place; the flags are
# meson's for libkiln (warning_level 2 and the project arguments) with -Werror as in CI
cflags="-std=c17 -O2 -fPIC -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
-Wno-unused-parameter -fno-strict-aliasing -fvisibility=hidden -D_GNU_SOURCE \
-D__HIP_PLATFORM_AMD__ -DKILN_CUDA_HIP=1 -DKILN_CUDA_CUDNN=1"
nhost=0
for f in cuda-backend cuda-alloc cuda-ops cuda-blas cuda-rtc cuda-graph cuda-libs cuda-fused cuda-conv-operands cuda-profile \
    hip-miopen; do
    echo "$cc: $f.c"
    # shellcheck disable=SC2086
    "$cc" $cflags -I"$src/engine/include" -I"$src" -I"$src/backends" -I"$src/backends/fused" -I"$src/engine" \
        -I"$src/common" -I"$cuda" -c "$cuda/$f.c" -o "$out/$f.c.o" 2>"$out/$f.c.log" ||
        { cat "$out/$f.c.log"; exit 1; }
    objs="$objs $out/$f.c.o"
    nhost=$((nhost + 1))
done
lib="$out/libkiln-hip-backend.so"
# shellcheck disable=SC2086
"$hipcc" -shared $archs -o "$lib" $objs -lamdhip64 -ldl -lpthread -lm 2>"$out/link.log" ||
    { cat "$out/link.log"; exit 1; }

# the undefined symbols, without their version tags (weak ones, the C runtime's optional
# hooks, may stay unresolved)
nm -D --undefined-only "$lib" | awk '$1 == "U" {print $2}' | sed 's/@.*//' | sort -u >"$out/undefined.txt"
# what the linked libraries define (ldd resolves them as the loader would)
: >"$out/provided.txt"
for dso in $(ldd "$lib" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
    nm -D --defined-only "$dso" | awk '{print $3}' | sed 's/@.*//' >>"$out/provided.txt"
done
sort -u -o "$out/provided.txt" "$out/provided.txt"
# libkiln's own definitions outside the cuda backend
nm -A --defined-only -g "$internal" 2>/dev/null | grep -v ':backends/cuda/' | awk '{print $3}' | sort -u \
    >"$out/engine.txt"
comm -23 "$out/undefined.txt" "$out/provided.txt" >"$out/from-libkiln.txt"
bad=$(comm -23 "$out/from-libkiln.txt" "$out/engine.txt")
if [ -n "$bad" ]; then
    echo "hip-build-check: undefined in the HIP build and not defined by libkiln's engine:"
    echo "$bad"
    exit 1
fi
vendor=$(grep -E '^(hipblas|miopen|hiprtc|cublas|cudnn|nvrtc|cuda)' "$out/undefined.txt" || true)
if [ -n "$vendor" ]; then
    echo "hip-build-check: linked against symbols the backend must load at run time (cuda-libs.c):"
    echo "$vendor"
    exit 1
fi

# every launcher, entry and the registration function is defined (hidden ones included)
nm --defined-only "$lib" | awk '{print $3}' | sort -u >"$out/defined.txt"
wanted=$( (
    sed -n 's/^int \(kcu_[a-z_]*\)(.*/\1/p' "$cuda/cuda-kernels.h"
    sed -n '/^static/!s/^[a-z_ ]*[ *]\(kiln_*[a-z_]*\)(.*/\1/p' "$cuda/cuda-impl.h"
) | sort -u)
missing=0
nwanted=0
for sym in $wanted; do
    nwanted=$((nwanted + 1))
    if ! grep -qx "$sym" "$out/defined.txt"; then
        echo "hip-build-check: $sym is not defined in the HIP build"
        missing=1
    fi
done
[ $missing -eq 0 ] || exit 1
# the two tests that run: the generated kernels through hipRTC, and the open refused
# without an AMD GPU. The backend's objects come first, so that the archive gives only the
# engine (its own cuda objects, in a build that has them, are then never pulled in).
needed=$(readelf -d "$libkiln" | sed -n 's/.*Shared library: \[\(.*\)\]/-l:\1/p')
# a sanitized build (ASan+UBSan): the archive's objects need the ASan runtime loaded
# first, which a program the test compiler links without -fsanitize only gets preloaded
asan=$(ldd "$libkiln" | awk '$1 ~ /^libasan/ && $3 ~ /^\// {print $3}')
for t in test-cuda-fused test-hip-open; do
    echo "$cc: $t.c (KILN_CUDA_HIP)"
    # shellcheck disable=SC2086
    "$cc" $cflags -I"$src/engine/include" -I"$src" -I"$src/backends" -I"$src/backends/fused" -I"$src/engine" \
        -I"$src/common" -I"$cuda" -c "$src/tests/cuda/$t.c" -o "$out/$t.test.o" 2>"$out/$t.log" ||
        { cat "$out/$t.log"; exit 1; }
    # shellcheck disable=SC2086
    "$hipcc" $archs -o "$out/$t-hip" "$out/$t.test.o" $objs "$internal" $needed -lamdhip64 \
        2>"$out/$t-link.log" || { cat "$out/$t-link.log"; exit 1; }
    if [ -n "$asan" ]; then
        LD_PRELOAD="$asan" "$out/$t-hip"
    else
        "$out/$t-hip"
    fi
done

echo "hip-build-check: $nkernels kernel and $nhost host objects compile and link for gfx90a and gfx1030;" \
    "$nwanted launchers and entries defined; $(wc -l <"$out/from-libkiln.txt") symbols left to libkiln's" \
    "engine: $(tr '\n' ' ' <"$out/from-libkiln.txt")"
