"""Run a test script under the suite's interpreter (KILN_TEST_PYTHON, the venv tests/run makes with
the PyPI packages the interoperability tests need), or skip it (exit 77) saying which is missing.
A test puts tests/lib on sys.path and calls rerun_under_test_python() before importing them."""
import os
import subprocess
import sys

_INNER = "KILN_TEST_PYTHON_INNER"


def rerun_under_test_python(modules, what):
    """Returns when this process already is the re-run; otherwise re-runs the script with the same
    arguments under KILN_TEST_PYTHON and exits with its status, or exits 77 when that interpreter
    is not set or cannot import every name in `modules` (`what` names the packages for the
    message)."""
    if os.environ.get(_INNER) == "1":
        return
    py = os.environ.get("KILN_TEST_PYTHON")
    if not py:
        print("SKIP: KILN_TEST_PYTHON is not set (tests/run sets it to the venv with %s)" % what)
        sys.exit(77)
    if subprocess.run([py, "-c", "import " + ", ".join(modules)], capture_output=True).returncode:
        print("SKIP: %s is not installed in KILN_TEST_PYTHON (%s)" % (what, py))
        sys.exit(77)
    env = dict(os.environ, **{_INNER: "1"})
    sys.exit(subprocess.run([py, os.path.abspath(sys.argv[0])] + sys.argv[1:], env=env).returncode)
