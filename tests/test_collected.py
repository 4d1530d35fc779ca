"""No test drops out of ``make test`` unnoticed: each Python's tiers collect every test id listed for it in
tests/collected (``python -m devtools.collected`` writes the lists). A test added since is fine; one deleted,
renamed or deselected by a tier's marks fails here until the list is regenerated on purpose, the reason in the
commit."""

from __future__ import annotations

import sys

import pytest

from devtools.collected import collect, listed

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.mark.slow  # a collection of the whole suite in a subprocess: seconds, and nothing for make unit to check
def test_every_listed_test_is_still_collected() -> None:
    assert listed(VERSION).exists(), f"no list of python {VERSION}'s tests: python -m devtools.collected {VERSION}"
    expected = set(listed(VERSION).read_text().split("\n")) - {""}
    missing = sorted(expected - set(collect(sys.executable, VERSION)))
    assert not missing, (
        f"{len(missing)} test(s) of {listed(VERSION).name} no longer collected by python {VERSION}'s tiers "
        f"(devtools/tiers.py):\n  " + "\n  ".join(missing[:50])
        + "\nIf that is meant, regenerate the lists with `python -m devtools.collected` and say why in the commit.")
