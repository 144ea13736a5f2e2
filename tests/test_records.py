"""Records' own behaviour beyond their fields (constructors: ``tests/test_constructors.py``)."""

from __future__ import annotations

from toolledger.records import Holder


def test_a_holders_text_is_its_own_whichever_was_made_last() -> None:
    """``Holder.text`` keeps the last holder's text (this process's, on every intent)."""
    v2 = Holder(host="b", pidns="4026531836", pid=7, start=99, boot="b", timens="")
    named = Holder(host="h", pidns="4026531836", pid=7, start=99, boot="b", timens="t")
    old = Holder(host="h", pidns="p", pid=8, start=1)
    unknown = Holder.unknown(9)
    expected = {
        id(v2): "v2;b;;/4026531836/7/99",
        id(named): "v2;b;t;h/4026531836/7/99",
        id(old): "h/p/8/1",
        id(unknown): "//9/0",
    }
    for holder in [v2, named, v2, old, unknown, unknown, named, old]:
        assert holder.text() == expected[id(holder)]
        assert Holder.parse(holder.text()) == holder
