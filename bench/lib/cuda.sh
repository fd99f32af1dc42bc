# bench/lib/cuda.sh — sourced by the bench/gpu/cuda_*.bench entries (not run by itself).
#
#   need_cuda_device NAME LIBKILN [SPEC]
#
# opens SPEC (default cuda:0) through LIBKILN's public C API, as the entry's kiln side would,
# and closes it again. When it does not open because the machine has no such device (or no
# driver for it), the entry ends there with exit 77 and one line on stderr saying why: bench/run
# skips it rather than reporting an error, so plain `bench/run` passes on a machine without a
# CUDA device. Whether the toolkit is installed says nothing about a device, so it is not what
# decides: a libkiln built without the cuda backend is skipped only when the machine shows no
# GPU either (no /proc/driver/nvidia/gpus entry, no /dev/nvidia0, no /dev/kfd); beside a GPU it
# is an error (exit 1), as is a LIBKILN that cannot be loaded.
need_cuda_device() {
    _why=$(python3 - "$2" "${3:-cuda:0}" <<'PY'
import ctypes, glob, os, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as e:
    print("cannot load %s: %s" % (sys.argv[1], e))
    sys.exit(1)
lib.kiln_device_open.restype = ctypes.c_void_p
lib.kiln_device_open.argtypes = [ctypes.c_char_p]
lib.kiln_device_close.argtypes = [ctypes.c_void_p]
lib.kiln_error.restype = ctypes.c_char_p
dev = lib.kiln_device_open(sys.argv[2].encode())
if dev:
    lib.kiln_device_close(dev)
    sys.exit(0)
why = (lib.kiln_error() or b"").decode(errors="replace").strip()
why = why.splitlines()[0] if why else "no reason given"
if "not compiled into this build" in why:
    gpus = glob.glob("/proc/driver/nvidia/gpus/*") + glob.glob("/dev/nvidia[0-9]*") + glob.glob("/dev/kfd")
    if gpus:
        print("%s, yet this machine has a GPU (%s): build kiln with the CUDA toolkit (or HIP) "
              "to measure it" % (why, gpus[0]))
        sys.exit(1)
print(why)
sys.exit(77)
PY
    ) && return 0
    case $? in
    77)
        echo "$1: skipped: $_why" >&2
        exit 77
        ;;
    *)
        echo "$1: $_why" >&2
        exit 1
        ;;
    esac
}
