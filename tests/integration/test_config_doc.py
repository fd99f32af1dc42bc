"""docs/configuration.md is what `kilnd --print-config-doc` prints: the reference a user reads
and the one the binary carries (config/config-table.c, config/config.c) cannot drift apart.

Usage: test_config_doc.py KILND DOC
After changing either, regenerate the file: kilnd --print-config-doc > docs/configuration.md
"""
import difflib
import subprocess
import sys


def main():
    kilnd, doc = sys.argv[1], sys.argv[2]
    printed = subprocess.run([kilnd, "--print-config-doc"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    with open(doc, encoding="utf-8") as f:
        written = f.read()
    if printed == written:
        print("docs/configuration.md matches kilnd --print-config-doc")
        return 0
    sys.stdout.writelines(difflib.unified_diff(written.splitlines(True), printed.splitlines(True),
                                               "docs/configuration.md", "kilnd --print-config-doc"))
    print("docs/configuration.md differs from kilnd --print-config-doc: change the text in "
          "config/config-table.c or config/config.c, then regenerate the file with it")
    return 1


if __name__ == "__main__":
    sys.exit(main())
