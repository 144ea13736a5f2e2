"""A MkDocs hook: a nav entry ending in "/" stands for every page of that folder not listed
already, in name order (a README.md or index.md first), each titled by its first heading; the
entry "*" stands for every page listed nowhere else. Pages added to docs/integrations/,
docs/stores/, docs/how-to/ … appear in their section without editing mkdocs.yml, a page added
anywhere else appears where "*" is, and the listed ones keep their place."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _listed(nav: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, list):
        for item in nav:
            found |= _listed(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= _listed(value)
    return found


def _expand(nav: Any, docs: Path, listed: set[str]) -> Any:
    if isinstance(nav, list):
        out: list[Any] = []
        for item in nav:
            if isinstance(item, str) and item.endswith("/"):
                folder = docs / item
                pages = sorted(
                    (
                        p
                        for p in folder.glob("*.md")
                        if p.relative_to(docs).as_posix() not in listed
                    ),
                    key=lambda p: (p.stem.lower() not in ("readme", "index"), p.name),
                )
                out.extend(p.relative_to(docs).as_posix() for p in pages)
            else:
                out.append(_expand(item, docs, listed))
        return out
    if isinstance(nav, dict):
        return {key: _expand(value, docs, listed) for key, value in nav.items()}
    return nav


def _rest(nav: Any, rest: list[str]) -> Any:
    if isinstance(nav, list):
        out: list[Any] = []
        for item in nav:
            if item == "*":
                out.extend(rest)
            else:
                out.append(_rest(item, rest))
        return out
    if isinstance(nav, dict):
        return {key: _rest(value, rest) for key, value in nav.items()}
    return nav


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    nav = _expand(config["nav"], docs, _listed(config["nav"]))
    listed = _listed(nav)
    rest = sorted(
        page
        for page in (p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
        if page not in listed
    )
    config["nav"] = _rest(nav, rest)
    return config
