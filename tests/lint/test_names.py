#!/usr/bin/env python3
"""Catch2 test and section names that Catch2 can print.

Catch2 2.13's console reporter wraps a long test name and indents the lines
after the first by the position of the name's first ": " (plus two); when
that indent reaches the console width (79 columns) it aborts with an
assertion in TextFlow (`m_column.m_width > m_column.m_indent`) the moment
it prints the name, which is when the test fails: the failure is never
shown. So the first ": " of every TEST_CASE and SECTION name must come
before column MAX_COLON.

  python3 tests/lint/test_names.py DIR...   # exit 1 naming each bad name
"""

import os
import re
import sys

MAX_COLON = 72

NAME = re.compile(r'\b(TEST_CASE|SECTION)\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
PART = re.compile(r'"((?:[^"\\]|\\.)*)"')


def bad_names(path):
    with open(path, encoding="utf-8") as f:
        src = f.read()
    for m in NAME.finditer(src):
        name = "".join(PART.findall(m.group(2)))
        colon = name.find(": ")
        if colon >= MAX_COLON:
            line = src.count("\n", 0, m.start()) + 1
            yield line, m.group(1), colon, name


def main(dirs):
    bad = 0
    for top in dirs:
        for root, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(".cc"):
                    continue
                path = os.path.join(root, name)
                for line, kind, colon, text in bad_names(path):
                    bad += 1
                    print(f"{path}:{line}: {kind} name's first ': ' is at "
                          f"column {colon} (Catch2 aborts printing it from "
                          f"{MAX_COLON} on; put it earlier or drop it): "
                          f"{text[:100]}")
    if bad:
        return 1
    print("test names: every first ': ' before column", MAX_COLON)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["tests"]))
