"""tools/mutants.py stays usable: every planted bug's text is found exactly once
in the code it plants into, and every test it names exists. (Running the
mutants takes minutes: `python tools/mutants.py --copy`.)"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import mutants  # noqa: E402  (tools/mutants.py)


def test_every_mutant_plants_into_the_current_code() -> None:
    assert mutants.check_texts(mutants.Tree(ROOT), mutants.MUTANTS) == []


def test_every_test_a_mutant_names_exists() -> None:
    for mutant in mutants.MUTANTS:
        for node in mutant.tests:
            path, _, name = node.partition("::")
            function = name.split("[")[0]
            assert f"def {function}(" in (ROOT / path).read_text(), (mutant.id, node)
