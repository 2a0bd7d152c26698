"""Checks every dashboard page's HTML: valid by the WHATWG parser (html5lib,
strict: the first parse error fails), balanced tags, unique ids, and a label
for every form control a person fills in."""

from __future__ import annotations

from html.parser import HTMLParser

import html5lib

VOID = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
    "source", "track", "wbr",
}  # fmt: skip
SVG_SELF_CLOSING = {"rect", "polyline", "path", "circle", "line"}


class _Structure(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, tuple[int, int]]] = []
        self.problems: list[str] = []
        self.ids: dict[str, int] = {}
        self.labels: set[str] = set()
        self.controls: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids[str(found["id"])] = self.ids.get(str(found["id"]), 0) + 1
        if tag == "label" and found.get("for"):
            self.labels.add(str(found["for"]))
        if tag in ("input", "select", "textarea") and found.get("type") != "hidden":
            self.controls.append((tag, found))
        if tag == "button" and found.get("type") not in ("submit", "button", "reset"):
            self.problems.append(f"<button> without an explicit type at {self.getpos()}")
        if tag not in VOID:
            self.stack.append((tag, self.getpos()))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID and tag not in SVG_SELF_CLOSING:
            self.problems.append(f"<{tag}/> self-closed at {self.getpos()}")
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1][0] != tag:
            opened = self.stack[-1] if self.stack else ("nothing", (0, 0))
            self.problems.append(f"</{tag}> at {self.getpos()} closes <{opened[0]}> of {opened[1]}")
            return
        self.stack.pop()


def check_html(text: str, where: str) -> None:
    """Raise AssertionError naming the first problem on the page at ``where``."""
    try:
        html5lib.HTMLParser(strict=True).parse(text)
    except html5lib.html5parser.ParseError as exc:
        raise AssertionError(f"{where}: invalid HTML: {exc}") from None
    structure = _Structure()
    structure.feed(text)
    structure.close()
    problems = list(structure.problems)
    problems += [f"<{tag}> never closed (opened at {pos})" for tag, pos in structure.stack]
    problems += [f'id "{i}" used {n} times' for i, n in structure.ids.items() if n > 1]
    for tag, attrs in structure.controls:
        named = attrs.get("id") in structure.labels or attrs.get("aria-label")
        if not named:
            problems.append(f"<{tag} name={attrs.get('name')!r}> has no label")
    assert not problems, f"{where}: " + "; ".join(problems)
    assert text.lstrip().lower().startswith("<!doctype html>"), f"{where}: no doctype"
