"""The error vocabulary: the README's error table is exactly the codes, statuses and types served."""

from __future__ import annotations

import re
from pathlib import Path

from shared.errors import ErrorCode, ServingError

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `(?P<code>[a-z_]+)` \| (?P<status>\d{3}) \| `(?P<type>[a-z_]+)` \|$")


def readme_table() -> dict[str, tuple[int, str]]:
    section = README.read_text().split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = [m for line in section.splitlines() if (m := ROW.match(line))]
    return {m["code"]: (int(m["status"]), m["type"]) for m in rows}


def test_the_readme_error_table_is_the_vocabulary() -> None:
    served = {
        code.value: (ServingError(code, "").http_status, ServingError(code, "").error_type)
        for code in ErrorCode
    }
    assert readme_table() == served
