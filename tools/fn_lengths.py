#!/usr/bin/env python3
"""Prints every function longer than N lines (default 150) in the given C++ files.

    python3 tools/fn_lengths.py trace/*.cpp            functions over 150 lines
    python3 tools/fn_lengths.py -n 80 trace/plan/executor.cpp
    python3 tools/fn_lengths.py --all trace/compile.cpp every function, with its length

A function is the body of a free function, a member function (defined inside its class or
outside it), an operator, or a lambda assigned at namespace scope. Its length counts the lines
from the first line of its signature to its closing brace. Namespace, class, struct, union,
enum and extern "C" bodies are not functions; what is nested inside a function (lambdas, local
classes) counts as part of it. Comments, string and character literals and preprocessor lines
are ignored when matching braces.

Exit status: 0 when no function is over the limit, 1 when one is, 2 on a usage error.
"""
import argparse
import re
import sys


def strip_code(text):
    """text with comments, literals and preprocessor lines blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            line_start = True
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        raw = re.match(r'(?:u8|[uUL])?R"([^ ()\\\t\n]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + raw.group(1) + '"'
            end = text.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if c == "'" and is_digit_separator(text, i):
            out.append(c)
            i += 1
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def is_digit_separator(text, i):
    """A ' inside a number (1'000'000), not the start of a character literal."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'"):
        j -= 1
    return j < i and text[j].isdigit()


def match_brace(code, i):
    """The index of the } closing the { at i (or len(code) - 1 when unbalanced)."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


ACCESS = re.compile(r"^\s*(?:(?:public|private|protected)\s*:(?!:)\s*)+")


def strip_template(h):
    """h without leading template <...> clauses."""
    while True:
        m = re.match(r"\s*template\s*<", h)
        if not m:
            return h
        depth, j = 0, m.end() - 1
        while j < len(h):
            if h[j] == "<":
                depth += 1
            elif h[j] == ">":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        h = h[j + 1:]


def classify(header):
    """What a { at namespace or class scope opens: 'scope', 'function' or 'other'."""
    h = strip_template(ACCESS.sub("", header)).strip()
    h = re.sub(r"^(?:\[\[.*?\]\]\s*|alignas\s*\([^)]*\)\s*)+", "", h)
    if re.search(r"\bnamespace\b", h) or re.match(r'extern\s*"', h):
        return "scope"
    if re.match(r"(?:typedef\s+)?enum\b", h):
        return "other"
    if re.match(r"(?:typedef\s+)?(?:class|struct|union)\b", h) and not re.search(r"\)\s*$", h):
        return "scope"
    if "(" in h and h[-1:] not in ("=", ",", "("):
        return "function"
    return "other"


def in_init_list(header, code, brace):
    """A { inside a constructor's member initializer list (a_{x}), not the body."""
    if not re.search(r"\)[^;{}]*?(?<!:):(?!:)", ACCESS.sub("", header)):
        return False
    j = brace - 1
    while j >= 0 and code[j].isspace():
        j -= 1
    return j >= 0 and (code[j].isalnum() or code[j] in "_>")


def function_name(header):
    h = strip_template(ACCESS.sub("", header))
    lam = re.match(r"[^(]*?(\w+)\s*=\s*\[", h)
    if lam:
        return lam.group(1) + " (lambda)"
    m = re.search(r"([\w:~]*operator\s*(?:\(\)|[^\s(]+))\s*\(", h)
    if not m:
        m = re.search(r"([\w:~]+)\s*(?:<[^()]*>)?\s*\(", h)
    return m.group(1) if m else "?"


def functions(text):
    """(name, first line, last line) of every function in C++ source text."""
    code = strip_code(text)
    found = []
    scopes = 0  # open namespace/class bodies
    start = 0  # where the current declaration's text begins
    i = 0
    while i < len(code):
        c = code[i]
        if c == "{":
            header = code[start:i]
            kind = classify(header)
            if kind == "scope":
                scopes += 1
                start = i + 1
                i += 1
                continue
            end = match_brace(code, i)
            if kind == "function" and in_init_list(header, code, i):
                i = end + 1  # a member initializer: the body is still to come
                continue
            if kind == "function":
                lead = len(header) - len(ACCESS.sub("", header).lstrip())
                first = code.count("\n", 0, start + lead) + 1
                last = code.count("\n", 0, end) + 1
                found.append((function_name(header), first, last))
            i = end + 1
            start = i
            continue
        if c == "}":
            scopes = max(scopes - 1, 0)
            start = i + 1
        elif c == ";":
            start = i + 1
        i += 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="C++ source files")
    ap.add_argument("-n", "--max-lines", type=int, default=150,
                    help="report functions longer than this (default 150)")
    ap.add_argument("--all", action="store_true", help="print every function with its length")
    args = ap.parse_args()
    over = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(f"fn_lengths: {e}", file=sys.stderr)
            return 2
        for name, first, last in functions(text):
            length = last - first + 1
            if length > args.max_lines:
                over += 1
                print(f"{path}:{first}: {name} is {length} lines (limit {args.max_lines})")
            elif args.all:
                print(f"{path}:{first}: {name} is {length} lines")
    if over:
        print(f"fn_lengths: {over} function(s) over {args.max_lines} lines", file=sys.stderr)
    else:
        print(f"fn_lengths: no function over {args.max_lines} lines in {len(args.files)} file(s)")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
