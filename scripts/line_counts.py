"""Rewrite the line-count table of ARCHITECTURE.md (between its two ``line-counts`` markers).

    python scripts/line_counts.py          # rewrite the table
    python scripts/line_counts.py --check  # exit 1 if a file in app/ breaks the 600-line rule

The rule itself is tested in tests/test_architecture.py; this only keeps the table current.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_architecture import KNOWN_LONG_FILES, MAX_LINES, METHOD_MODULES, line_counts  # noqa: E402

BEGIN, END = "<!-- line-counts: begin -->", "<!-- line-counts: end -->"


def table() -> str:
    rows = ["| file (app/) | lines | |", "|---|---:|---|"]
    for path, n in line_counts().items():
        note = "a method's own module" if path in METHOD_MODULES else "above the rule, being split" if n > MAX_LINES else ""
        rows.append(f"| {path} | {n} | {note} |")
    return "\n".join(rows)


def main() -> int:
    if "--check" in sys.argv:
        long = [p for p, n in line_counts().items() if n > MAX_LINES and p not in METHOD_MODULES | KNOWN_LONG_FILES]
        print("\n".join(long) or f"every file in app/ is at most {MAX_LINES} lines, but the method modules")
        return 1 if long else 0
    document = ROOT / "ARCHITECTURE.md"
    text = document.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    document.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
