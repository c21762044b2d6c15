"""JUnit XML for CI systems: one test case per scenario variant (and per server).

The layout most CI systems read: ``<testsuites>`` holding one ``<testsuite>`` per
server, each case named ``scenario (variant)`` with its file as ``classname``; a failed
expectation or differing output becomes a ``<failure>`` with the details as text.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from pgrace.errors import ScenarioError
from pgrace.model.cases import CaseVerdict
from pgrace.text import visible


def render_junit(results: Sequence[CaseVerdict], invalid: Sequence[ScenarioError] = ()) -> str:
    """The results, and each file that could not be read as an ``<error>`` case of its own suite."""
    root = ET.Element("testsuites", name="pgrace")
    suites: dict[str, ET.Element] = {}
    if invalid:
        unread = ET.SubElement(root, "testsuite", name="pgrace: invalid files")
        suites["invalid files"] = unread
        for error in invalid:
            case = ET.SubElement(unread, "testcase", classname=str(error.file or ""), name="invalid file", time="0.000")
            ET.SubElement(case, "error", message=str(error)[:500], type="invalid").text = str(error)
    for result in results:
        label = result.server.label
        suite = suites.get(label)
        if suite is None:
            suite = ET.SubElement(root, "testsuite", name=f"pgrace on {label}")
            suites[label] = suite
        case = ET.SubElement(
            suite,
            "testcase",
            classname=str(result.case.path),
            name=result.case.name,
            time=f"{result.seconds:.3f}",
        )
        if result.guarantee:  # a bounded search's pass is not a proof over every interleaving
            properties = ET.SubElement(case, "properties")
            ET.SubElement(properties, "property", name="guarantee", value=result.guarantee)
        if not result.ok:
            failure = ET.SubElement(case, "failure", message=(result.problems or ["failed"])[0][:500])
            failure.text = "\n".join(result.problems) + ("\n\n" + result.diff if result.diff else "")
        if result.guarantee:
            ET.SubElement(case, "system-out").text = f"bounded: {result.guarantee}"
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
        suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
        suite.set("time", f"{sum(float(c.get('time', '0')) for c in cases):.3f}")
    root.set("tests", str(len(results) + len(invalid)))
    root.set("failures", str(sum(1 for r in results if not r.ok)))
    root.set("errors", str(len(invalid)))
    ET.indent(root)
    # XML 1.0 forbids most control characters, even as references: make them visible.
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + visible(ET.tostring(root, encoding="unicode")) + "\n"
