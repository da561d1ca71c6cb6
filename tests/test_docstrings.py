"""Every registered calibration method documents itself in numpydoc form, and its example runs.

For each class in the registry the class docstring must have the sections Parameters,
Attributes, References and Examples; every constructor argument must be named under
Parameters and every learned attribute (``fitted_attributes``) under Attributes, so that a
new option or a new piece of learned state without documentation fails here. The Examples
run as doctests, each in a namespace of its own (they import what they use).
"""

from __future__ import annotations

import doctest
import inspect
import re
import sys

import pytest

import calibd.calibration
from calibd.calibration.linear import LinearCalibrator
from calibd.calibration.registry import METHODS

SECTIONS = ("Parameters", "Attributes", "References", "Examples")

#: Methods whose docstrings are not yet in this form, each with the reason; remove an entry
#: once the method's docstring is.
NOT_YET: dict[str, str] = {}

#: Every registered method but those, and the public base class of vector, matrix and dirichlet.
DOCUMENTED = {name: cls for name, cls in sorted(METHODS.items()) if name not in NOT_YET} | {"linear": LinearCalibrator}


def sections(doc: str) -> dict[str, list[str]]:
    """numpydoc sections of a cleaned docstring: a title line underlined with dashes."""
    lines = doc.splitlines()
    found: dict[str, list[str]] = {}
    title = None
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and lines[i].strip() and re.fullmatch(r"-{3,}", lines[i + 1].strip()):
            title = lines[i].strip()
            found[title] = []
            i += 2
            continue
        if title is not None:
            found[title].append(lines[i])
        i += 1
    return found


def documented_names(body: list[str]) -> list[str]:
    """Names of a Parameters or Attributes section, in order: unindented ``name : type``
    lines, where ``a, b : float`` names both."""
    names: list[str] = []
    for line in body:
        if line and not line[0].isspace():
            head = line.split(" : ", 1)[0] if " : " in line else line
            names.extend(part.strip() for part in head.split(","))
    return names


def class_doc(name: str) -> str:
    cls = DOCUMENTED[name]
    assert "__doc__" in cls.__dict__ and cls.__doc__, f"{cls.__name__} has no docstring of its own"
    return inspect.cleandoc(cls.__doc__)


def test_the_allowed_list_names_registered_methods_only_and_shrinks_when_one_is_documented():
    assert set(NOT_YET) <= set(METHODS)
    for name in NOT_YET:
        found = sections(inspect.cleandoc(METHODS[name].__doc__ or ""))
        assert not all(title in found for title in SECTIONS), f"{name} has the sections now: remove it from NOT_YET"


@pytest.mark.parametrize("name", DOCUMENTED)
def test_the_docstring_has_the_numpydoc_sections_and_names_every_option_and_attribute(name):
    cls = DOCUMENTED[name]
    doc = class_doc(name)
    summary = doc.splitlines()[0]
    assert summary.strip() and summary.rstrip().endswith("."), f"{cls.__name__}: a one-line summary first"
    found = sections(doc)
    missing = [title for title in SECTIONS if title not in found]
    assert not missing, f"{cls.__name__} lacks the section(s) {missing}"
    assert [title for title in found if title in SECTIONS] == list(SECTIONS), f"{cls.__name__}: sections in numpydoc order"
    parameters = documented_names(found["Parameters"])
    undocumented = [p for p in cls._get_param_names() if p not in parameters]
    assert not undocumented, f"{cls.__name__}: __init__ argument(s) {undocumented} not under Parameters"
    assert parameters == cls._get_param_names(), f"{cls.__name__}: Parameters in __init__'s order, and no others"
    attributes = documented_names(found["Attributes"])
    undocumented = [a for a in cls.fitted_attributes if a not in attributes]
    assert not undocumented, f"{cls.__name__}: fitted attribute(s) {undocumented} not under Attributes"
    assert "".join(found["References"]).strip(), f"{cls.__name__}: References is empty"


def run_examples(obj: object, name: str, module: object) -> tuple[int, int, str]:
    """(examples run, failures, the runner's report) of ``obj``'s own docstring, in a fresh namespace."""
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for test in finder.find(obj, name, module=module, globs={}):
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    return results.attempted, results.failed, "".join(report)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_the_examples_run(name):
    cls = DOCUMENTED[name]
    examples = sections(class_doc(name)).get("Examples", [])
    code = "\n".join(line for line in examples if line.lstrip().startswith((">>>", "...")))
    assert ".fit(" in code and "predict" in code, f"{cls.__name__}: the example fits and predicts"
    assert "from calibd.calibration" in code, f"{cls.__name__}: the example imports from calibd.calibration"
    attempted, failed, report = run_examples(cls, cls.__name__, sys.modules[cls.__module__])
    assert attempted > 0, f"{cls.__name__}: no example found"
    assert failed == 0, report


def test_the_package_example_runs():
    attempted, failed, report = run_examples(calibd.calibration, "calibd.calibration", calibd.calibration)
    assert attempted > 0 and failed == 0, report


def test_a_broken_example_and_an_undocumented_option_are_caught():
    """The checks above can fail: an example whose printed value is wrong, and a docstring
    that leaves out an option."""

    class Broken:
        """Summary.

        >>> 1 + 1
        3
        """

    attempted, failed, report = run_examples(Broken, "Broken", sys.modules[__name__])
    assert (attempted, failed) == (1, 1) and "Expected" in report
    doc = class_doc("platt").replace("smooth_targets : bool", "smoothing : bool")
    assert "smooth_targets" not in documented_names(sections(doc)["Parameters"])
