"""Starts `kore-launch serve` for the OpenAI tests: natively and in the guest.

The binary is $KORE_LAUNCH or target/release/kore-launch (built by
`cargo test --workspace --release` in scripts/test.sh). KORE_TEST_PACK picks another pack."""

import json
import os
import pathlib
import re
import subprocess
import threading
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("KORE_LAUNCH", str(ROOT / "target" / "release" / "kore-launch"))
# KORE_TEST_PACK: another pack for the pack-agnostic files (test_tools.py's full counts on a
# synthetic 2b pack, docs/reliability.md); the others expect the tiny pack's name.
PACK = os.environ.get("KORE_TEST_PACK", str(ROOT / "model-packs" / "tiny"))
OUT = pathlib.Path(os.environ.get("KORE_TEST_OUT", ROOT / "target" / "test-output" / "openai"))


class Server:
    """A running `serve`: its base URL, placement and the flags its CLI peers need."""

    def __init__(self, placement, proc, url):
        self.placement = placement
        self.proc = proc
        self.url = url
        self.native_flag = ["--native"] if placement == "native" else []
        # The CLI peers boot their own VM (never attach to an `up` appliance elsewhere).
        self.cli_env = dict(os.environ, KORE_RUNTIME_DIR=str(OUT / f"runtime-cli-{os.getpid()}"))

    def metric(self, line_start):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(line_start + " "):
                return float(line.split()[-1])
        return 0.0


def start_server(placement, extra=(), cache_dir=None):
    cmd = [BIN, "serve", "--model", PACK, "--port", "0", *extra]
    if placement == "native":
        cmd.insert(2, "--native")
    env = dict(os.environ, KORE_RUNTIME_DIR=str(OUT / f"runtime-{placement}-{os.getpid()}"))
    # The prefix cache's files go to a directory of the test's, never the user's cache.
    env["XDG_CACHE_HOME"] = str(cache_dir or OUT / f"xdg-cache-{placement}-{os.getpid()}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    found = {}

    def read():
        for line in proc.stdout:
            m = re.search(r"(http://[0-9.:\[\]]+)/ ", line)
            if m and "url" not in found:
                found["url"] = m.group(1)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 180
    while "url" not in found:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}: {proc.stderr.read()}")
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("serve did not start in 180 s")
        time.sleep(0.1)
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return Server(placement, proc, found["url"])


def stop_server(server):
    server.proc.terminate()
    try:
        assert server.proc.wait(timeout=30) == 0, "serve did not exit cleanly"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


@pytest.fixture(scope="session", params=["native", "guest"])
def server(request):
    if not pathlib.Path(BIN).exists():
        pytest.fail(f"{BIN} is missing: build it with cargo build --release -p kore-launch")
    if request.param == "guest" and not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.fail("no /dev/kvm: the guest half of this suite cannot run here")
    OUT.mkdir(parents=True, exist_ok=True)
    s = start_server(request.param)
    health = json.loads(urllib.request.urlopen(s.url + "/health", timeout=10).read())
    assert health["placement"] == ("native" if request.param == "native" else "vm"), health
    yield s
    stop_server(s)
