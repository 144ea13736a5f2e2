"""A store URL made from a path: what ``open_store`` reads back as that same path."""

from __future__ import annotations

import os

__all__ = ["file_url"]


def file_url(scheme: str, path: str | os.PathLike[str]) -> str:
    """``scheme:///PATH`` naming ``path`` (``sqlite``: a file, ``json``: a directory).

    ``open_store`` ends the path at a ``?`` (the URL's options begin there) and decodes ``%``
    escapes, so a path holding either would open another file: both are escaped here, and the
    rest of the path is left as it reads (``sqlite:////tmp/what%3Fnow/demo.db``)."""
    text = os.fspath(path).replace("%", "%25").replace("?", "%3F")
    return f"{scheme}:///{text}"
