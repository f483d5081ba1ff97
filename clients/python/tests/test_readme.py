"""The README's examples, run as they stand against the live service."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = re.findall(r"^## (.+?)\n.*?```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S | re.M)


def test_every_machine_has_an_example():
    titles = [t for t, _ in EXAMPLES]
    assert titles == [
        "Sessions",
        "User adoption",
        "User adoption: plans and runners",
        "Conversations",
        "Agent turns",
        "Flows (async)",
    ]


@pytest.mark.parametrize("title,code", EXAMPLES, ids=[t for t, _ in EXAMPLES])
def test_readme_example_runs(title, code, service):
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 14, f"the {title} example grew past a short example"
    exec(compile(code, f"README.md ({title})", "exec"), {"__name__": "readme_example"})
