#!/usr/bin/env python3
"""Every field of the public option structs appears in the docs' table of it.

Usage: option_fields.py SOURCE_ROOT. Each entry below names a struct, the
header that declares it and the page whose table lists its fields; a field
counts as listed when the first cell of a table row of that page names it
in backticks.
Fails (exit 1) naming each field the page leaves out, so a new field cannot
land undocumented.
"""
import pathlib
import re
import sys

STRUCTS = [
    ("loop_options", "runtime/include/spindle/loop.hpp", "docs/runtime.md"),
    ("loop_group_options", "runtime/include/spindle/loop_group.hpp", "docs/multicore.md"),
    ("run_options", "runtime/include/spindle/testing.hpp", "docs/testing.md"),
    ("offload_pool_options", "runtime/include/spindle/offload.hpp", "docs/offload.md"),
    ("job_options", "runtime/include/spindle/offload.hpp", "docs/offload.md"),
    ("write_options", "runtime/include/spindle/file.hpp", "docs/files.md"),
    ("listen_options", "net/include/spindle/net/listener.hpp", "docs/net.md"),
    ("resolve_hints", "net/include/spindle/net/resolve.hpp", "docs/net.md"),
    ("context_options", "net/tls/include/spindle/tls/context.hpp", "docs/tls.md"),
    ("spawn_options", "process/include/spindle/process.hpp", "docs/processes.md"),
]

# A data member: a type, a name, then a default or nothing, then ';'.
MEMBER = re.compile(r"^\s+(?!return|using|static|friend|typedef)[\w:<>,\s\*&]+?\b(\w+)\s*(?:=[^;]*|\{[^;]*\})?;")


def fields(header: str, name: str) -> list[str]:
    text = header.split(f"struct {name} {{", 1)
    if len(text) != 2:
        raise SystemExit(f"struct {name} not found")
    body, depth, out = text[1], 1, []
    for line in body.splitlines():
        stripped = line.split("//", 1)[0]
        declaration = re.split(r"[={]", stripped, maxsplit=1)[0]
        if depth == 1 and "(" not in declaration:  # a '(' there: a function
            m = MEMBER.match(stripped)
            if m:
                out.append(m.group(1))
        depth += stripped.count("{") - stripped.count("}")
        if depth <= 0:
            break
    return out


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    missing = []
    for name, header, page in STRUCTS:
        declared = fields((root / header).read_text(), name)
        if not declared:
            missing.append(f"{header}: no field of {name} found (has the parser gone stale?)")
        rows = (root / page).read_text()
        for field in declared:
            if not re.search(rf"^\|[^|\n]*`{field}`", rows, re.MULTILINE):
                missing.append(f"{page}: the table of {name} has no row for `{field}` ({header})")
    for line in missing:
        print(line)
    if not missing:
        print(f"every field of {len(STRUCTS)} option structs is in its page's table")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
