"""The README's methods table, one line per method, from the registry (what `speclab methods` prints).

    .venv/bin/python scripts/readme_methods.py

tests/test_docs.py checks that README.md holds this table verbatim, so the table cannot drift from
the code: after a change to the registry, paste this script's output over the README's table.
"""
from speclab.decoding.registry import METHODS


def table() -> str:
    rows = ["| method | family | what drafts or commits | guarantee |", "|---|---|---|---|"]
    for m in METHODS.values():
        summary = m.summary.replace("|", "\\|")
        rows.append(f"| `{m.name}` | {m.family} | {summary} | {m.guarantee} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
