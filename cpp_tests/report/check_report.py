#!/usr/bin/env python3
"""ctest report_chromium: the memory report, opened in a real browser.

    check_report.py --work DIR

1. Writes a sample log on the sim backend (sample_log.py: a training loop
   with two streams, a leak and an injected allocation failure).
2. Renders it with `python -m xlog_cuda.report LOG -o report.html`.
3. Opens the page in headless Chromium (--dump-dom, console logging on):
   the page must have drawn (the marker its script sets last:
   data-report="drawn", with the number of series, bars and points), with
   no error (the page counts errors in data-errors; Chromium's console log
   must hold no uncaught error). The sample tracks call sites: the page
   must draw the call-stack table (data-sites) and the per-block lifetime
   view (data-blocks).
4a. A copy of the page with a drag planted on the timeline (mouse events
   dispatched on its brush): the page must zoom (data-zoom names a range
   inside the log's) with no error.
4. The same check on a copy of the page with a script error planted: it
   must be caught (so the check can fail).
5. Takes screenshots into DIR/report.png (whole page) and
   DIR/report-zoomed.png (after the planted drag).

Exit 77 (skipped) when no Chromium is installed (CI installs Debian's
`chromium`). CHROMIUM overrides the binary.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")
SKIP = 77


def fail(message: str) -> None:
    print(f"report_chromium: FAIL: {message}", flush=True)
    sys.exit(1)


def browser() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    print("report_chromium: no Chromium installed (Debian: apt-get install chromium): skipped", flush=True)
    sys.exit(SKIP)


def chromium(exe: str, work: str, *args: str) -> subprocess.CompletedProcess:
    # --no-sandbox: CI runs as root. A profile of its own per run, so that
    # parallel or leftover browsers do not meet.
    profile = os.path.join(work, "chromium-profile")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def html_attributes(dom: str) -> dict:
    m = re.search(r"<html\b([^>]*)>", dom)
    if not m:
        fail(f"no <html> element in the dumped DOM ({len(dom)} characters)")
    return dict(re.findall(r'([a-z-]+)="([^"]*)"', m.group(1)))


def console_errors(stderr: str) -> list:
    errors = []
    for line in stderr.splitlines():
        if ":CONSOLE" not in line:
            continue
        if "Uncaught" in line or ":ERROR:CONSOLE" in line or ":WARNING:CONSOLE" in line:
            errors.append(line.strip())
    return errors


def check_page(exe: str, work: str, page: str) -> tuple:
    p = chromium(exe, work, "--virtual-time-budget=5000", "--dump-dom", "file://" + page)
    if p.returncode != 0:
        fail(f"chromium --dump-dom exited {p.returncode}: {p.stderr[-2000:]}")
    return html_attributes(p.stdout), console_errors(p.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    exe = browser()
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(PYTHON_DIR) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    log = os.path.join(work, "sample-log.csv")
    p = subprocess.run([sys.executable, os.path.join(HERE, "sample_log.py"), log], env=env, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        fail(f"sample_log.py failed: {p.stdout}{p.stderr}")
    page = os.path.join(work, "report.html")
    p = subprocess.run([sys.executable, "-m", "xlog_cuda.report", log, "-o", page], env=env, capture_output=True,
                       text=True, timeout=120, cwd=work)
    if p.returncode != 0:
        fail(f"python -m xlog_cuda.report failed: {p.stdout}{p.stderr}")
    print(p.stdout.strip(), flush=True)
    text = open(page, encoding="utf-8").read()
    for external in ("http://", "https://", "//cdn"):
        hits = [m.start() for m in re.finditer(re.escape(external), text) if "w3.org/2000/svg" not in text[m.start():m.start() + 40]]
        if hits:
            fail(f"the page refers to {external} (must work offline): ...{text[hits[0] - 40:hits[0] + 60]}...")

    attrs, errors = check_page(exe, work, page)
    print(f"report_chromium: <html> after load: {attrs}", flush=True)
    if attrs.get("data-errors") or errors:
        fail(f"errors on the page: data-errors={attrs.get('data-errors')} {attrs.get('data-last-error', '')}; console: {errors}")
    if attrs.get("data-report") != "drawn":
        fail("the page's script did not finish drawing (no data-report=drawn)")
    if int(attrs.get("data-series", 0)) < 5 or int(attrs.get("data-bars", 0)) < 2 or int(attrs.get("data-points", 0)) < 100:
        fail(f"too little drawn: {attrs} (the sample has 7 tags, several size classes)")
    if int(attrs.get("data-blocks", 0)) < 50:
        fail(f"the per-block view drew too few blocks: {attrs} (the sample allocates hundreds)")
    if int(attrs.get("data-sites", 0)) < 3:
        fail(f"the call-stack table has too few rows: {attrs} (the sample tracks call sites)")
    if attrs.get("data-zoom") is not None:
        fail(f"the page zoomed by itself: {attrs}")

    # A drag across the timeline zooms it (and the per-block view).
    zoomed = os.path.join(work, "zoomed.html")
    drag = ("<script>(function () { var h = document.querySelector('[data-role=brush]'), r = h.getBoundingClientRect();"
            " function ev(type, f) { h.dispatchEvent(new MouseEvent(type, { clientX: r.left + r.width * f,"
            " clientY: r.top + 20, bubbles: true })); }"
            " ev('mousedown', 0.1); ev('mousemove', 0.35); ev('mouseup', 0.35); })();</script></body>")
    with open(zoomed, "w", encoding="utf-8") as f:
        f.write(text.replace("</body>", drag, 1))
    zattrs, zerrors = check_page(exe, work, zoomed)
    if zattrs.get("data-errors") or zerrors:
        fail(f"errors after a drag: {zattrs.get('data-last-error', '')}; console: {zerrors}")
    try:
        lo, hi = (float(v) for v in zattrs.get("data-zoom", "").split(","))
    except ValueError:
        fail(f"a drag across the timeline did not zoom: {zattrs}")
    if not 0 < lo < hi:
        fail(f"the zoomed range {lo}..{hi} is not inside the log's")
    print(f"report_chromium: a drag zooms to {lo:.6f}..{hi:.6f}; {zattrs.get('data-blocks')} blocks in view", flush=True)

    # The check must be able to fail: plant an error and expect it caught.
    broken = os.path.join(work, "broken.html")
    with open(broken, "w", encoding="utf-8") as f:
        f.write(text.replace('var drawnSeries = drawTimeline("tag");', 'var drawnSeries = drawTimelin("tag");', 1))
    battrs, berrors = check_page(exe, work, broken)
    if battrs.get("data-errors") != "1" or battrs.get("data-report") == "drawn" or not berrors:
        fail(f"a planted script error went unnoticed: {battrs}, console {berrors}")
    print(f"report_chromium: a planted error is caught ({battrs.get('data-last-error')})", flush=True)

    for source, name in ((page, "report.png"), (zoomed, "report-zoomed.png")):
        shot = os.path.join(work, name)
        p = chromium(exe, work, "--hide-scrollbars", "--window-size=1400,2400", "--virtual-time-budget=5000",
                     f"--screenshot={shot}", "file://" + source)
        if p.returncode != 0 or not os.path.isfile(shot):
            fail(f"no screenshot: {p.stderr[-2000:]}")
        with open(shot, "rb") as f:
            head = f.read(8)
        size = os.path.getsize(shot)
        if head != b"\x89PNG\r\n\x1a\n" or size < 20000:
            fail(f"{shot} is not a plausible screenshot ({size} bytes)")
        print(f"report_chromium: screenshot {shot} ({size} bytes)", flush=True)
    print("report_chromium: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
