"""The mutation score (tests/mutation_score.py) in CI: its list kept in step with the code by a fast
test, so that a change that moves a mutation's text fails at once rather than in the slow run,
and the score itself run to the end in the slow tier."""

from __future__ import annotations

import dataclasses
import re

import mutation_score
import pytest
from mutation_score import MUTATIONS, Mutation


def test_every_mutation_fits_the_code():
    """Each mutation's original text occurs exactly once in its file and its replacement changes
    one line: edit the list with the code it mutates (kernels/blockwise.py, lowering/weight_cache.py
    and the others alike)."""
    assert mutation_score.problems(MUTATIONS) == []


def test_a_mutation_out_of_step_is_reported():
    """The check above can fail: text gone from its file, text found more than once, a file that
    is not there, a replacement that changes no line, a name used twice."""
    m = MUTATIONS[0]
    gone = dataclasses.replace(m, name="gone", old=m.old + "  # not in the file")
    many = Mutation("many", "lowering/ops.py", "    return ", "    return -", m.tests)
    missing = dataclasses.replace(m, name="missing", path="no_such_file.py")
    same = dataclasses.replace(m, name="same", new=m.old)
    found = mutation_score.problems((gone, many, missing, same, m, m))
    assert [p.split(":")[0] for p in found] == ["gone", "many", "missing", "same",
                                                f"duplicate mutation name {m.name}"]
    counts = [int(re.search(r"original text found (\d+) times", p).group(1)) for p in found[:2]]
    assert counts[0] == 0 and counts[1] > 1 and found[2].startswith("missing: no file ")
    assert found[3] == "same: the replacement must change exactly one line"


@pytest.mark.slow
def test_every_mutation_is_caught(capsys):
    """The whole score, as `python tests/mutation_score.py --jobs 2` runs it: every selection passes
    on the unmutated code, then each mutation fails its selection (about 10 minutes on two cores)."""
    rc = mutation_score.main(["--jobs", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out[-6000:]
    assert "survived" in out and ", 0 survived;" in out
