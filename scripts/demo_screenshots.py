#!/usr/bin/env python3
"""The demo page's screenshots in docs/, made in headless Chromium (SwiftShader WebGPU) through
chromedriver, as README shows them:

  docs/browser-saturation.png  a linear-attention student beside a gated DeltaNet student after
                               TOKENS generated tokens: heatmaps of ||S|| per block and head, the
                               per-block mean ||S|| against position, the memory chart;
  docs/browser-eval.png        the same students and the teacher scored in the page: zero-shot
                               ARC-Easy on DOCS documents and the perplexity of the page's text;
  docs/browser-live-distil.png stage 1 of block 1 fitted live (gated DeltaNet, STEPS steps).

The students are untrained (`linearize student`: the teacher's first LAYERS blocks with attention
replaced, weights copied from it), so the pictures show the mechanics — a state that only adds
grows, a gated one levels off — not a distilled student's quality.

Needs: the release binary (cargo build --release), www/pkg (scripts/build-web.sh), the fetched
teacher and evaluation sets, chromium and chromedriver (scripts/setup.sh).
Run: python3 scripts/demo_screenshots.py [--tokens 200] [--layers 2] [--docs 5] [--steps 40] [--views saturation,eval,live]
"""
import argparse
import base64
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "linearize"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Driver:
    """A WebDriver session on chromedriver, with the page's status line as its clock."""

    def __init__(self, profile):
        port = free_port()
        self.proc = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.root = f"http://127.0.0.1:{port}"
        chromium = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"binary": chromium, "args": [
            "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--window-size=1400,2400", "--no-first-run",
            f"--user-data-dir={profile}"]}}}}
        for _ in range(150):
            try:
                self.base = f"{self.root}/session/{self.call('POST', '/session', caps, root=True)['sessionId']}"
                return
            except OSError:
                time.sleep(0.2)
        sys.exit("no WebDriver session")

    def call(self, method, path, body=None, root=False):
        url = (self.root if root else self.base) + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())["value"]

    def script(self, source):
        return self.call("POST", "/execute/sync", {"script": source, "args": []})

    def wait(self, states, secs):
        started = time.time()
        while True:
            state, text = self.script("const s = document.getElementById('status'); return [s.dataset.state || '', s.textContent];")
            if state in states:
                return text
            if state == "error":
                sys.exit(f"the page reports an error: {text}")
            if time.time() - started > secs:
                sys.exit(f"status still '{state}: {text}' after {secs} s")
            time.sleep(1)

    def shot(self, selector, path):
        # At the top of the window (1400 × 2400), so all of it is on screen.
        self.script(f"document.querySelector({json.dumps(selector)}).scrollIntoView();")
        el = self.call("POST", "/element", {"using": "css selector", "value": selector})
        png = self.call("GET", f"/element/{next(iter(el.values()))}/screenshot")
        path.write_bytes(base64.b64decode(png))
        print(f"wrote {path}")

    def close(self):
        try:
            self.call("DELETE", "")
        finally:
            self.proc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--docs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--views", default="saturation,eval,live", help="which screenshots, comma-separated")
    args = ap.parse_args()
    views = set(args.views.split(","))
    if not BIN.exists() or not (ROOT / "www" / "pkg").exists():
        sys.exit("build first: cargo build --release && scripts/build-web.sh")
    work = pathlib.Path(tempfile.mkdtemp(prefix="demo-shots-"))
    home = work / "home"
    cache = pathlib.Path(os.environ.get("LINEARIZE_HOME", pathlib.Path.home() / ".cache" / "linearize"))
    (home / "teacher").mkdir(parents=True)
    for f in (cache / "teacher").glob("*.gguf"):
        (home / "teacher" / f.name).symlink_to(f.resolve())
    (home / "eval").symlink_to((cache / "eval").resolve())
    for mixer in ["linear_attn", "gated_deltanet"]:
        subprocess.run([BIN, "student", "--mixer", mixer, "--layers", str(args.layers), "--out", home / "students" / mixer], check=True, stdout=subprocess.DEVNULL)
    serve = subprocess.Popen([BIN, "serve", "--port", "0"], env={**os.environ, "LINEARIZE_HOME": str(home)}, stdout=subprocess.PIPE, text=True)
    url = next(w for w in serve.stdout.readline().split() if w.startswith("http://"))
    d = Driver(work / "profile")
    try:
        d.call("POST", "/url", {"url": url})
        d.wait(["ready"], 120)
        if views & {"saturation", "eval"}:
            tick = "for (const c of document.querySelectorAll('#models input')) c.checked = ['linear_attn', 'gated_deltanet'].includes(JSON.parse(c.value).name);"
            d.script(f"{tick} document.getElementById('shared').checked = true; document.getElementById('tokens').value = '{args.tokens}';"
                     "document.getElementById('prompt').value = 'Once upon a time, in a small village by the sea, there lived an old fisherman who'; document.getElementById('run').click();")
            print(d.wait(["ready"], 7200))
            if "saturation" in views:
                d.shot("#panels", ROOT / "docs" / "browser-saturation.png")
        if "eval" in views:
            d.script("for (const c of document.querySelectorAll('#models input')) c.checked = true;"
                     f"document.getElementById('task').value = 'arc_easy'; document.getElementById('docs').value = '{args.docs}'; document.getElementById('evaluate').click();")
            print(d.wait(["ready"], 7200))
            d.script("document.getElementById('score').click();")
            print(d.wait(["ready"], 7200))
            d.shot("#panels", ROOT / "docs" / "browser-eval.png")
        if "live" in views:
            d.script("document.getElementById('fitmixer').value = 'gated_deltanet'; document.getElementById('fitlayer').value = '1';"
                     f"document.getElementById('fitsteps').value = '{args.steps}'; document.getElementById('fitlr').value = '1e-3'; document.getElementById('fit').click();")
            print(d.wait(["ready"], 7200))
            d.shot("#fitchart", ROOT / "docs" / "browser-live-distil.png")
    finally:
        d.close()
        serve.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
