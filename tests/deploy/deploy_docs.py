"""Helpers the deploy suite's container tests share: the shell blocks of docs/deployment.md that
the suite runs, podman's settings for this host, and the suite's own Python packages.

docs/deployment.md marks each block the suite runs with a comment line just above it:

    <!-- deploy suite: NAME -->
    ```sh
    ...
    ```

The tests run those blocks as written, with their own container name, volume name, host port
and environment file (so a test never touches a user's `kilnd` container, `kiln-data` volume
or port 8080); `documented()` makes exactly those substitutions and no others.
"""
import os
import re
import subprocess
import sys

MARK = re.compile(r"^<!-- deploy suite: ([\w-]+) -->\n```sh\n(.*?)^```", re.M | re.S)

def doc_blocks(root):
    """Every marked block of docs/deployment.md: {name: shell text}."""
    text = open(os.path.join(root, "docs", "deployment.md")).read()
    blocks = {}
    for name, body in MARK.findall(text):
        if name in blocks:
            raise ValueError("docs/deployment.md marks two blocks '%s'" % name)
        blocks[name] = body
    return blocks


class Names:
    """The names a test uses in place of the documented ones."""

    def __init__(self, suffix, port, env_file):
        self.container = "kilnd-test-" + suffix
        self.volume = "kiln-data-test-" + suffix
        self.port = port
        self.env_file = env_file


def documented(block, names):
    """The block with the test's names substituted for the documented ones."""
    # The container is the word kilnd standing alone (podman stop kilnd, --name kilnd,
    # podman cp FILE kilnd:/PATH), not kiln/kilnd, kilnd.env or kilnd's.
    block = re.sub(r"(?<![\w./-])kilnd(?![\w./'-])", names.container, block)
    block = re.sub(r"(?<![\w./-])kiln-data(?![\w.-])", names.volume, block)
    block = re.sub(r"(?<![\w./-])(deploy/)?kilnd\.env\b", names.env_file, block)
    block = block.replace("-p 8080:8080", "-p %d:8080" % names.port)
    block = block.replace("localhost:8080", "localhost:%d" % names.port)
    return block


def podman_env(root, base):
    """The environment podman needs here: the host's own settings when a container runs with
    them, else deploy/containers.conf (runc, explicit ulimits), as docs/deployment.md says.
    Returns (env, None) or (None, why no container can run)."""
    env = dict(os.environ)
    env.pop("CONTAINERS_CONF", None)
    tries = [("the host's podman settings", env)]
    conf = dict(env, CONTAINERS_CONF=os.path.join(root, "deploy", "containers.conf"))
    tries.append(("deploy/containers.conf", conf))
    errors = []
    for what, e in tries:
        r = subprocess.run(["podman", "run", "--rm", "--network", "none", base, "true"], env=e,
                           capture_output=True, text=True)
        if r.returncode == 0:
            print("podman runs containers with %s" % what, flush=True)
            return e, None
        errors.append("%s: %s" % (what, (r.stderr or r.stdout).strip().splitlines()[-1:]))
    return None, "; ".join(errors)
