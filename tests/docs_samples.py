"""The code samples of the README and of docs/, read as tests/test_docs.py runs them.

A sample is a fenced block; its language says how it runs (python, toml, sh), and an
HTML comment on the line above may mark it (the reader of the Markdown source sees it;
the rendered page does not):

    <!-- test: not run: REASON -->        not run, for the reason given (required)
    <!-- test: supervisor for Q1 Q2 -->   on a page (anywhere): a real supervisor serves
                                          queues Q1 Q2 while the page's samples run

A python block whose first line is a comment naming a file (``# myapp/tasks.py``) is a
file of the sample application, written out rather than executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RUN = ("python", "toml", "sh")  # the languages whose samples are run
SHOWN = ("text", "")            # shown, never run: diagrams, output, other programs' syntax

_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*$")
_MARK = re.compile(r"^<!-- test: (.*?) -->\s*$")
_SUPERVISOR = re.compile(r"<!-- test: supervisor for ([A-Za-z0-9_.\- ]+) -->")
_FILE = re.compile(r"^# ([A-Za-z0-9_/.-]+\.py)\s*$")


@dataclass
class Sample:
    page: str
    line: int          # of the opening fence, 1-based
    lang: str
    code: str
    mark: str = ""     # the text of a `<!-- test: ... -->` just above, if any

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """The reason given, when the sample is marked not run."""
        if self.mark.startswith("not run"):
            return self.mark[len("not run"):].lstrip(": ").strip()
        return None

    @property
    def file(self) -> str | None:
        """The application file a python sample is (its first line names it), if any."""
        first = self.code.split("\n", 1)[0]
        match = _FILE.match(first) if self.lang == "python" else None
        return match.group(1) if match else None


@dataclass
class Page:
    name: str
    text: str

    def samples(self) -> list[Sample]:
        found: list[Sample] = []
        lines = self.text.splitlines()
        i = 0
        while i < len(lines):
            match = _FENCE.match(lines[i])
            if not match:
                i += 1
                continue
            start = i
            i += 1
            body = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"{self.name}:{start + 1}: a code block is never closed"
            above = start - 1
            while above >= 0 and not lines[above].strip():
                above -= 1
            mark = _MARK.match(lines[above]) if above >= 0 else None
            found.append(Sample(self.name, start + 1, match.group(1).lower(),
                                "\n".join(body) + "\n", mark.group(1) if mark else ""))
            i += 1
        return found

    def supervised_queues(self) -> list[str]:
        queues: list[str] = []
        for match in _SUPERVISOR.finditer(self.text):
            queues += match.group(1).split()
        return queues


def pages() -> list[Page]:
    """The README and every page of docs/ (configuration.md, generated, included)."""
    found = [Page("README.md", (REPO / "README.md").read_text())]
    for path in sorted(DOCS.rglob("*.md")):
        found.append(Page(str(path.relative_to(REPO)), path.read_text()))
    return found
