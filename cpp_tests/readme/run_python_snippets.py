"""Run the ```python blocks of Markdown files (ctest: readme_python_snippets).

    python3 run_python_snippets.py README.md [docs/usage.md ...] [--min-run N]

Every ```python block is compiled (a syntax error fails the test). A block is
then executed, each in a fresh namespace, in file order, unless the line
just before its opening fence is a marker

    <!-- readme-test: skip (the reason) -->

which Markdown renderers do not show; the reason is printed. Blocks that
need hardware or packages this machine may not have (a GPU, PyTorch, CuPy)
carry the marker. The test fails if a block raises, or fewer than N blocks
(default 1) were executed in all the files together, so removing the
snippets cannot make it pass.

The blocks run in the environment ctest gives the test: the sim backend and
XLOG_CUDA_LIBRARY pointing at the staged library (see CMakeLists.txt here).
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback

SKIP_MARKER = re.compile(r"^<!--\s*readme-test:\s*skip\b\s*(.*?)\s*-->\s*$")


def python_blocks(text: str):
    """Yield (first code line, code, skip reason or None) per block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].rstrip() == "```python":
            start = i + 1
            end = start
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            if end == len(lines):
                raise SystemExit(f"line {i + 1}: a ```python block is never closed")
            previous = lines[i - 1].strip() if i > 0 else ""
            marker = SKIP_MARKER.match(previous)
            reason = None
            if marker:
                reason = marker.group(1).strip("() ") or "marked skip"
            yield start + 1, "\n".join(lines[start:end]) + "\n", reason
            i = end + 1
        else:
            i += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("markdown", nargs="+")
    parser.add_argument("--min-run", type=int, default=1)
    args = parser.parse_args()

    ran = skipped = 0
    failed = []
    for markdown in args.markdown:
        with open(markdown, encoding="utf-8") as f:
            text = f.read()
        for line, code, skip_reason in python_blocks(text):
            where = f"{markdown}:{line}"
            # Pad with newlines so tracebacks and syntax errors give the
            # document's lines.
            try:
                compiled = compile("\n" * (line - 1) + code, markdown, "exec")
            except SyntaxError as e:
                print(f"{where}: FAILED: syntax error: {e}")
                failed.append(where)
                continue
            if skip_reason is not None:
                print(f"{where}: compiled, not run: {skip_reason}")
                skipped += 1
                continue
            print(f"{where}: running")
            sys.stdout.flush()
            try:
                exec(compiled, {"__name__": "__readme__"})
            except BaseException:  # noqa: BLE001 - report anything, SystemExit included
                traceback.print_exc(file=sys.stdout)
                print(f"{where}: FAILED")
                failed.append(where)
                continue
            ran += 1
            print(f"{where}: ok")

    print(f"{ran} ran, {skipped} not run (marked), {len(failed)} failed")
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    if ran < args.min_run:
        print(f"only {ran} ```python block(s) ran, expected at least {args.min_run}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
