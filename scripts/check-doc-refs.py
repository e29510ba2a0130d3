#!/usr/bin/env python3
"""Every `§` reference must resolve to a heading in docs/ (run by .ci/run).

A reference is `docs/NAME.md §N` (or `§N.M`, optionally with the path in backticks:
`docs/NAME.md` §N) in a Rust comment under crates/ or fuzz/, or in a Markdown file of the
repository (README.md, BENCHMARKS.md, PARITY.md, docs/*.md). It resolves when docs/NAME.md has a
heading whose text starts with that number (`## 5. The controller`, `### 3.7 MTP …`). A `§` in
a Rust comment that names no docs/ file is an error too: a reader could not follow it.

It also checks the relative links of those Markdown files (`[text](docs/x.md#anchor)`): the file
must exist and the anchor must be one of its headings (GitHub's slugs).

Usage: python3 scripts/check-doc-refs.py    (exit status 1 and one line per broken reference)
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
REF = re.compile(r"`?docs/([\w.-]+\.md)`?\s*§\s*(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?(?:\s|$)")


def headings(doc):
    """Section numbers of a docs/ file's headings, or None if the file is missing."""
    path = ROOT / "docs" / doc
    if not path.is_file():
        return None
    found = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else HEADING.match(line)
        if m:
            found.add(m.group(1))
    return found


def sources():
    """(path, line number, text to scan) for every comment line and Markdown line."""
    for base in ("crates", "fuzz"):
        for path in sorted((ROOT / base).rglob("*.rs")):
            if "target" in path.parts:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                i = line.find("//")
                if i >= 0 and "§" in line[i:]:
                    yield path, n, line[i:], True
    md = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "PARITY.md"]
    md += sorted((ROOT / "docs").rglob("*.md"))
    for path in md:
        if path.is_file():
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "§" in line:
                    yield path, n, line, False


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    found = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def check_links(errors):
    md = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "PARITY.md"]
    md += sorted((ROOT / "docs").rglob("*.md"))
    n = 0
    for path in md:
        if not path.is_file():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue
                n += 1
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                where = f"{path.relative_to(ROOT)}:{i}"
                if not dest.exists():
                    errors.append(f"{where}: link to a missing file: {target}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    errors.append(f"{where}: link to a missing heading: {target}")
    return n


def main():
    cache = {}
    errors = []
    refs = 0
    for path, n, text, is_code in sources():
        where = f"{path.relative_to(ROOT)}:{n}"
        found = list(REF.finditer(text))
        if is_code and text.count("§") > len(found):
            errors.append(f"{where}: a § reference that names no docs/ file: {text.strip()}")
        for m in found:
            refs += 1
            doc, sec = m.group(1), m.group(2)
            if doc not in cache:
                cache[doc] = headings(doc)
            if cache[doc] is None:
                errors.append(f"{where}: docs/{doc} does not exist ({m.group(0)})")
            elif sec not in cache[doc]:
                errors.append(f"{where}: docs/{doc} has no heading numbered {sec} ({m.group(0)})")
    links = check_links(errors)
    for e in errors:
        print(e)
    print(f"check-doc-refs: {refs} § references and {links} links, {len(errors)} broken")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
