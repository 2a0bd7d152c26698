from __future__ import annotations

import expiry


def test_all_is_sorted_and_complete() -> None:
    assert expiry.__all__ == sorted(expiry.__all__)
    for name in expiry.__all__:
        assert hasattr(expiry, name), name
    public = {n for n in dir(expiry) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(expiry.__all__)
