"""The package's build backend (PEP 517, with PEP 660 editable installs), in the standard library
only. The client has no dependencies, and its build has none either: `pip install ./clients/python`
works offline and with any pip, without setuptools or wheel being present (setuptools' backend
needs the wheel package to build one, which many Python installations lack).

A wheel is a zip of the package's files and a .dist-info folder (METADATA, WHEEL, RECORD with a
sha256 per file); an sdist is a .tar.gz of the source folder with a PKG-INFO. Metadata comes from
pyproject.toml's [project] table.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "kiln_client"


def _project():
    path = os.path.join(ROOT, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        # Python < 3.11: the [project] table's plain string members are all this needs.
        out, inside = {}, False
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line.startswith("["):
                inside = line == "[project]"
            m = re.match(r'^([A-Za-z_-]+)\s*=\s*"([^"]*)"$', line) if inside else None
            if m:
                out[m.group(1)] = m.group(2)
        out.setdefault("optional-dependencies", {"numpy": ["numpy"]})
        return out


def _names():
    p = _project()
    return p, re.sub(r"[-_.]+", "_", p["name"]), p["version"]


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"]]
    if p.get("description"):
        lines.append("Summary: " + p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: " + p["requires-python"])
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: " + lic["text"])
    for extra, reqs in sorted((p.get("optional-dependencies") or {}).items()):
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in reqs]
    readme = os.path.join(ROOT, p.get("readme", "README.md"))
    body = ""
    if os.path.isfile(readme):
        lines.append("Description-Content-Type: text/markdown")
        body = open(readme, encoding="utf-8").read()
    return "\n".join(lines) + "\n\n" + body


def _package_files():
    base = os.path.join(ROOT, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _write_wheel(directory, files):
    """files: (archive name, bytes) pairs; adds the .dist-info and returns the wheel's name."""
    _, dist, version = _names()
    info = "%s-%s.dist-info" % (dist, version)
    files = list(files) + [
        (info + "/METADATA", _metadata().encode("utf-8")),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: kiln_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = io.StringIO()
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write("%s,sha256=%s,%d\n" % (name, digest, len(data)))
    record.write("%s/RECORD,,\n" % info)
    files.append((info + "/RECORD", record.getvalue().encode("utf-8")))
    wheel = "%s-%s-py3-none-any.whl" % (dist, version)
    with zipfile.ZipFile(os.path.join(directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return wheel


# ---- PEP 517 ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, ((arc, open(full, "rb").read()) for full, arc in _package_files()))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: a wheel holding only a .pth that puts the source folder on sys.path."""
    _, dist, _ = _names()
    return _write_wheel(wheel_directory, [("_%s_editable.pth" % dist, (ROOT + "\n").encode("utf-8"))])


def build_sdist(sdist_directory, config_settings=None):
    _, dist, version = _names()
    base = "%s-%s" % (dist, version)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        members = [(full, base + "/" + arc) for full, arc in _package_files()]
        for f in ("pyproject.toml", "README.md", ".gitignore", "_backend/kiln_build.py"):
            if os.path.isfile(os.path.join(ROOT, f)):
                members.append((os.path.join(ROOT, f), base + "/" + f))
        for full, arc in members:
            tar.add(full, arcname=arc, recursive=False)
        data = _metadata().encode("utf-8")
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(data)
        ti.mode = 0o644
        tar.addfile(ti, io.BytesIO(data))
    return name
