#!/usr/bin/env python3
"""Sizes the code of the given folders: files of one concept, short functions.

  code_size.py DIR...

Fails (exit 1) naming every non-test C++ file (.cc, .h, .cu) over
MAX_FILE_LINES lines and every function over MAX_FUNCTION_LINES lines (from
the line its signature starts on to its closing brace), except the ones
ALLOWED lists. A function is a brace block at namespace or class scope whose
head ends like a signature (a closing parenthesis, then qualifiers or a
constructor's initializers); lambdas and blocks count towards the function
they are in. Comments, strings and character literals are blanked first.
A heuristic, not a C++ parser: good enough for this code base's style.
"""
import pathlib
import re
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100

# (file, function name): allowed to be longer for now, and why.
ALLOWED = set()

_SIGNATURE_END = re.compile(
    r"\)\s*(const|override|final|noexcept|mutable|->[^{]*|"
    r"ABSL_[A-Z_]+\([^)]*\)|ABSL_[A-Z_]+|\s)*$")


def blank(text):
    """Comments, strings and char literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith('R"', i) and re.match(r'R"([^(]*)\(', text[i:]):
            delim = re.match(r'R"([^(]*)\(', text[i:]).group(1)
            j = text.find(")" + delim + '"', i)
            j = n if j < 0 else j + len(delim) + 2
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i]:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def functions(text):
    """(first line, last line, name) of every function defined in `text`."""
    code = blank(text)
    stack, start, found = [], 0, []
    for i, c in enumerate(code):
        if c == "{":
            head = code[start:i]
            if any(kind == "function" for kind, _, _ in stack):
                kind = "block"
            elif re.search(r"\b(namespace|extern)\b", head):
                kind = "namespace"
            elif "(" not in head and re.search(r"\b(class|struct|union|enum)\b",
                                               head):
                kind = "class"
            elif _SIGNATURE_END.search(head) or re.search(r"\)\s*:\s", head):
                kind = "function"
            else:
                kind = "block"
            first = code.count("\n", 0, start + len(head) - len(head.lstrip()))
            names = re.findall(r"([~\w]+)\s*\(", head)
            stack.append((kind, first + 1, names[0] if names else "?"))
            start = i + 1
        elif c == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "function":
                    found.append((first, code.count("\n", 0, i) + 1, name))
            start = i + 1
        elif c == ";":
            start = i + 1
    return found


def main(folders):
    problems, files = [], 0
    for folder in folders:
        for path in sorted(pathlib.Path(folder).rglob("*")):
            if path.suffix not in (".cc", ".h", ".cu"):
                continue
            if path.name.endswith("_test.cc"):
                continue
            files += 1
            name = path.as_posix()
            text = path.read_text()
            lines = text.count("\n")
            if lines > MAX_FILE_LINES:
                problems.append(f"{name}: {lines} lines (at most "
                                f"{MAX_FILE_LINES}: split it by concept)")
            for first, last, function in functions(text):
                length = last - first + 1
                if length > MAX_FUNCTION_LINES and (name, function) not in ALLOWED:
                    problems.append(
                        f"{name}:{first}: {function} has {length} lines (at "
                        f"most {MAX_FUNCTION_LINES}: split it into named steps)")
    for p in problems:
        print(p)
    print(f"code size: {files} files, {len(problems)} too long")
    if files == 0:
        print("no files found: the folders are missing")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
