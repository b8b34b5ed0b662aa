#!/usr/bin/env python3
"""Every `florence2 ...` command line in README.md and docs/*.md names a real subcommand and real flags.

Usage: python3 scripts/ci/docs_cli_test.py [FLORENCE2_BINARY] (default target/debug/florence2).
For each ```sh block line that runs `florence2 SUB ...` (also `target/*/florence2`, `cargo run ... --`),
it asks the binary for `SUB --help` and checks that every `--flag` of the line appears there. It runs no
model (fast, < 5 s), so it covers names, not values.
Every ```js/```html block of these pages must be, verbatim, a block of src/npm/README.md (whose blocks
scripts/npm/docs_test.mjs runs as written in Chromium and Node.js), or follow a line
`<!-- not run: REASON -->`; so must every other block that runs no `florence2` command (the README's two
setup commands excepted: CI runs them).
"""
import re
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
binary = sys.argv[1] if len(sys.argv) > 1 else str(root / "target/debug/florence2")
pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
helps = {}


def help_of(sub):
    if sub not in helps:
        p = subprocess.run([binary, sub, "--help"], capture_output=True, text=True)
        helps[sub] = p.stdout if p.returncode == 0 else None
    return helps[sub]


def commands(text):
    """(line number, command line) of each florence2 invocation in a sh/bash block."""
    lang, lines, out, pending = None, text.split("\n"), [], None
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            lang = None if lang is not None else (line[3:].strip() or "text")
            continue
        if lang in ("sh", "bash", "shell"):
            line = re.sub(r"\s#\s.*$", "", line)  # a trailing comment
            if pending:
                pending[2] += " " + line
            else:
                m = re.search(r"(?:^|[\s/])florence2\s+([a-z]+)(.*)", line)
                pending = [i, m.group(1), m.group(2)] if m else None
            if pending and not line.rstrip().endswith("\\"):
                out.append(tuple(pending))
                pending = None
    return out


failures, checked = [], 0
for page in pages:
    for line_no, sub, rest in commands(page.read_text()):
        where = f"{page.relative_to(root)}:{line_no}"
        text = help_of(sub)
        if text is None:
            failures.append(f"{where}: `florence2 {sub}` is not a subcommand")
            continue
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
            if flag not in ("--help",) and not re.search(re.escape(flag) + r"(?![a-z0-9-])", text):
                failures.append(f"{where}: `florence2 {sub}` has no flag {flag}")
        checked += 1
SETUP_BLOCKS = {f"```sh\nbash scripts/setup.sh && bash scripts/{s}.sh\n```\n" for s in ("serve", "test")}
npm_readme = (root / "src/npm/README.md").read_text()
js_checked = 0
for page in pages:
    lines = page.read_text().split("\n")
    for i, line in enumerate(lines):
        lang = line.strip()[3:]
        if not line.startswith("```") or not lang:
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = "\n".join(lines[i : end + 1]) + "\n"
        marked = i > 0 and re.match(r"<!-- not run: .+ -->", lines[i - 1].strip())
        if lang not in ("js", "html"):
            # A shell block runs florence2 (checked above) or is one of the README's two commands (CI runs them).
            covered = re.search(r"(?:^|[\s/])florence2\s+[a-z]", block) or block in SETUP_BLOCKS
            if not covered and not marked:
                failures.append(f"{page.relative_to(root)}:{i + 1}: a {lang} block that nothing runs, not marked not run")
            continue
        if block not in npm_readme and not marked:
            failures.append(f"{page.relative_to(root)}:{i + 1}: a {line[3:]} block neither in the package README nor marked not run")
        js_checked += 1
for f in failures:
    print("FAIL", f)
print(f"docs: {checked} florence2 command lines and {js_checked} js/html blocks checked, {len(failures)} failures")
assert checked >= 5, "too few florence2 command lines found"
sys.exit(1 if failures else 0)
