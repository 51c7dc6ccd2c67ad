"""docs/queries.md, written from the query headers (so the page cannot drift from the queries).

    python -m slowcard list --format markdown > docs/queries.md     # what the sync test compares

Pure: returns the text.
"""

from __future__ import annotations

from .queries import SHOWS, SUBJECT_KINDS, Query


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _subject(q: Query) -> str:
    return ", ".join(f"`{col}`" if col == kind else f"`{col}` as {kind}" for col, kind in q.subject) or "-"


def query_section(q: Query) -> str:
    lines = [f"## {q.name} (v{q.version}, {q.role})", "", _cell(q.description), ""]
    facts = [("reads", ", ".join(f"`{r}`" for r in q.requires)), ("verdict", f"`{q.rule_text}`")]
    if q.is_verdict:
        facts += [
            ("finding about", _subject(q)),
            ("priority", "never names the slow card" if q.priority is None else str(q.priority)),
        ]
    elif q.subject:
        facts.append(("rows about", _subject(q)))
    facts += [
        ("runs in diagnose at", str(q.order))
        if q.scope == "run"
        else ("runs", "in `slowcard fleet`, over every run of the database (`scope: fleet`)"),
        ("shown in", ", ".join(f"`{s}`" for s in q.shows) or "the verdict lists only"),
    ]
    lines += [f"- {k}: {v}" for k, v in facts]
    if q.params:
        lines += ["", "| parameter | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{p.name}` | {p.type} | `{p.default!r}` | {_cell(p.help)} |" for p in q.params]
    if q.headline:
        lines += [
            "",
            "Headline (table columns; a slow card's evidence lines): " + "; ".join(f"`{_cell(e)}`" for e in q.headline),
        ]
    if q.summary:
        lines += ["", f"Summary per row: `{_cell(q.summary)}`"]
    if q.pass_text:
        lines += ["", f"When nothing is found: {_cell(q.pass_text)}"]
    return "\n".join(lines)


def catalog_markdown(catalog: dict[str, Query]) -> str:
    """The whole page: what the header keys mean, then one section per query in diagnosis order."""
    ordered = sorted(catalog.values(), key=lambda q: (q.order, q.name))
    head = [
        "# The queries",
        "",
        "<!-- Generated from the headers of sql/*.sql by `python -m slowcard list --format markdown`;",
        "     tests/test_query_knowledge.py fails when this page and the headers differ. -->",
        "",
        "Each query is one file `sql/<name>.sql`; its header says what the rest of slowcard needs",
        "(docs/contract.md has the rules). `role: report` queries describe (status INFO); `role: verdict`",
        "queries return their findings as rows, and their rule gives PASS / WARN / FAIL. A diagnosis runs",
        "them in `order`; the slow card is named by the verdict with the worst status, then the lowest",
        "`priority`. `subject` names the columns a finding is about:",
        "",
        "| subject kind | printed as |",
        "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in SUBJECT_KINDS.items()],
        "",
        "`shows` places a query's result:",
        "",
        "| place | what |",
        "|---|---|",
        *[f"| `{k}` | {_cell(v)} |" for k, v in SHOWS.items()],
        "",
        "| query | version | role | verdict | subject | priority | order |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| [{q.name}](#{q.name}-v{q.version}-{q.role}) | {q.version} | {q.role} | `{_cell(q.rule_text)}` | "
            f"{_subject(q)} | {'-' if q.priority is None else q.priority} | {q.order} |"
            for q in ordered
        ],
        "",
    ]
    return "\n".join(head) + "\n" + "\n\n".join(query_section(q) for q in ordered) + "\n"
