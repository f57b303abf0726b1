#!/usr/bin/env python3
"""docs/architecture.md stays a contract a newcomer reads in one sitting.

Usage: contract_length.py SOURCE_ROOT. Fails (exit 1) when the page is over
400 lines: measurements and history belong in docs/benchmarks.md, a
backend's details in docs/backends.md.
"""
import pathlib
import sys

LIMIT = 400

page = pathlib.Path(sys.argv[1]) / "docs" / "architecture.md"
lines = page.read_text(encoding="utf-8").count("\n")
if lines > LIMIT:
    print(f"{page.name}: {lines} lines, over {LIMIT}: move measurements to benchmarks.md")
    sys.exit(1)
print(f"{page.name}: {lines} lines (limit {LIMIT})")
