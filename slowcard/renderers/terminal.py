"""The terminal: the first screen of `slowcard diagnose` (the answer in the first lines, the
evidence one step away), its ``-v`` form, and `slowcard compare` (the watch lines, by the same
rules, are ``cli_watch.status_line``).

The first screen fits ``max_lines`` lines of ``width`` columns (default 30 x 100): a header (run,
ranks / domains, what was read), the headline, then per slow card, costliest first, its cause,
cost, evidence lines in words, why lines and one next line; the picture; one line per finding;
PASS and INFO folded into a count, SKIPs into the inputs that would enable them; the totals.
What does not fit ends in "(N more: -v)". ``verbose_text`` shows everything, unfolded.
"""

from __future__ import annotations

import re

from ..view import SHORT_OF_DATA
from . import clip, wrap
from .picture import BLOCKS, PLAIN, Style, bar_lines

LABEL_W = 10  # "  evidence" column of a card block
STATUS_COLOURS = {"FAIL": "1;31", "ERROR": "1;31", "WARN": "1;33", "PASS": "32", "INFO": "36", "SKIP": "90"}
PART_COLOURS = ("34", "33", "31", "90")  # the picture: GroupedMatmul, dispatch+combine, waiting, other
_STATUS_WORD = re.compile(
    r"(?<![\w@=-])(FAIL|ERROR|WARN|PASS|INFO|SKIP)(?![\w=-])|\b(FAIL|ERROR|WARN|PASS|INFO|SKIP)=([1-9]\d*)"
)
_BAR_RUN = re.compile("|".join(f"{re.escape(c)}+" for c in BLOCKS))
_MARK = re.compile(r"< slow card[^\n]*")


def colour(text: str) -> str:
    """ANSI colours on text that is already safe to print (``render.terminal_safe``): status
    words, the picture's bar segments and the slow-card marks. Adds only SGR sequences."""

    def status(m: re.Match) -> str:
        word = m.group(1) or m.group(2)
        return f"\x1b[{STATUS_COLOURS[word]}m{m.group(0)}\x1b[0m"

    def bar(m: re.Match) -> str:
        return f"\x1b[{PART_COLOURS[BLOCKS.index(m.group(0)[0])]}m{m.group(0)}\x1b[0m"

    text = _STATUS_WORD.sub(status, text)
    text = _BAR_RUN.sub(bar, text)
    return _MARK.sub(lambda m: f"\x1b[1;31m{m.group(0)}\x1b[0m", text)


def header_line(sc, width: int) -> str:
    """``slowcard diagnose · run 'x' · 4 ranks · 4 kineto files, 7,132 rows``."""
    inp = sc.inputs or {}
    parts = [f"slowcard diagnose · run {sc.run!r}"]
    if inp.get("ranks"):
        parts.append(f"{inp['ranks']} rank{'s' if inp['ranks'] != 1 else ''}")
    if inp.get("dp_ranks"):
        parts.append(f"{inp['dp_ranks']} DP domain{'s' if inp['dp_ranks'] != 1 else ''}")
    fmts = inp.get("formats") or {}
    if fmts:
        n = sum(fmts.values())
        if len(fmts) == 1:
            (fmt,) = fmts
            read = f"{n} {fmt} file{'s' if n != 1 else ''}"
        else:
            read = f"{n} files (" + ", ".join(f"{c} {f}" for f, c in fmts.items()) + ")"
        if inp.get("rows"):
            read += f", {inp['rows']:,} rows"
        parts.append(read)
    return clip(" · ".join(parts), width)


def _fold(prefix: str, items: list[str], width: int, sep: str = ", ", more: str = "-v") -> str:
    """``prefix item, item, … (+N more: -v)`` within ``width``."""
    out = prefix
    for i, item in enumerate(items):
        rest = len(items) - i - 1
        tail = f" (+{rest} more: {more})" if rest else ""
        candidate = out + (sep if out != prefix else "") + item
        if len(candidate + tail) > width:
            left = len(items) - i
            return clip(out, width - len(f" (+{left} more: {more})")) + f" (+{left} more: {more})"
        out = candidate
    return out


def _card_block(
    card, width: int | None, lines_next: int | None = 2, why_max: int | None = 3, same_next=False, note=True
) -> list[str]:
    """A slow card: title (card, cause, level, cost, query), evidence, why and next lines, each
    within ``width`` (None: nothing cut, the why lines left to the full why-section)."""
    head = f"{card.card} — {card.causes}  {card.level}" + (f"  costs {card.cost()}" if card.cost() else "")
    if width is None:
        title = f"{head}  ({card.query})"
    elif len(head) + 2 + len(card.query) <= width:
        title = head + " " * (width - len(head) - len(card.query)) + card.query
    else:
        title = clip(head, width)
    out = [title]
    pad = " " * (LABEL_W + 2)
    cut = width or 10**6

    def labelled(label: str, text: str) -> str:
        return clip(f"  {label:<{LABEL_W}}{text}" if label else pad + text, cut)

    for i, line in enumerate(card.evidence):
        out.append(labelled("evidence" if i == 0 else "", line))
    if width is not None:
        why = list(card.why[:why_max])
        if card.why_quiet:
            why.append("also checked: " + ", ".join(f"{q.split('@')[0]} {s}" for q, s in card.why_quiet) + " (-v)")
        if why_max is not None and len(card.why) > why_max:
            why.append(f"({len(card.why) - why_max} more: -v)")
        for i, line in enumerate(why):
            out.append(labelled("why" if i == 0 else "", line))
        if card.why_note and note:
            out += wrap(card.why_note, width, indent=pad, first=f"  {'why':<{LABEL_W}}", lines=2)
    if card.next_step:
        if same_next:
            out.append(labelled("next", "as above"))
        else:
            out += wrap(card.next_step, cut, indent=pad, first=f"  {'next':<{LABEL_W}}", lines=lines_next)
    return out


def _findings_block(sc, width: int, most: int | None) -> list[str]:
    if not sc.findings and not sc.errors:
        return []
    counts: dict[str, int] = {}
    for f in sc.findings:
        counts[f.level] = counts.get(f.level, 0) + 1
    if sc.errors:
        counts["ERROR"] = len(sc.errors)
    out = ["Findings (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + "):"]
    rows = [(f.level, f.query, f.label, f.cost, f.causes) for f in sc.findings]
    w = [max((len(r[k]) for r in rows), default=0) for k in range(4)]
    lines = []
    for lv, q, label, cost, causes in rows:
        text = f"{q:<{w[1]}}  {label:<{w[2]}}  {cost:>{w[3]}}  {causes}".rstrip()
        lines.append(clip(f"  {lv:<5} {text}", width))
    lines += [clip(f"  ERROR {e}", width) for e in sc.errors]
    if most is not None and len(lines) > most:
        hidden = len(lines) - (most - 1)
        lines = lines[: most - 1] + [f"  ({hidden} more: -v)"]
    return out + lines


def _tail(sc, width: int, folded: bool = True) -> list[str]:
    out = []
    if folded:
        quiet = []
        if sc.passed:
            quiet.append(_fold(f"PASS {len(sc.passed)}: ", sc.passed, width - 30))
        if sc.info:
            quiet.append(f"INFO {len(sc.info)} report{'s' if len(sc.info) != 1 else ''}")
        if quiet:
            out.append(clip(" · ".join(quiet) + " (-v)", width))
        if sc.skips:
            n = sum(len(g.queries) for g in sc.skips)
            wanted = [g for g in sc.skips if g.need != SHORT_OF_DATA]
            short = [g for g in sc.skips if g.need == SHORT_OF_DATA]
            items = [f"{g.need} {len(g.queries)}" for g in wanted] + [f"{g.need} {len(g.queries)}" for g in short]
            out.append(_fold(f"SKIP {n}, missing input: ", items, width))
    totals = " ".join(f"{k}={v}" for k, v in sc.totals.items()) + f" TOTAL={sc.total}"
    if len(sc.cards) == 1:
        more = f" · slow card: {sc.cards[0].card} ({sc.cards[0].causes})"
    elif sc.cards:
        more = f" · {len(sc.cards)} slow cards: " + "; ".join(c.card for c in sc.cards)
    else:
        more = ""
    totals += clip(more, max(width - len(totals), 0))
    out.append(totals)
    return out


def _head(sc, width: int) -> list[str]:
    top = header_line(sc, width - len(sc.status) - 2)
    gap = max(width - len(top) - len(sc.status), 2)
    out = [top + " " * gap + sc.status]
    fitting = sc.headline_fitting(width)
    if sc.cards and len(fitting) <= width:
        out.append(fitting)
    elif sc.cards:
        out += wrap(fitting, width, indent="  ", lines=2)
    else:
        out += wrap(sc.headline, width, indent="  ", lines=2)
    return out


def _plain_body(sc, width: int, verbose: bool) -> list[str]:
    """Below the headline of a conclusion without cards (PASS, SKIP): what it rests on, next."""
    out = []
    limit = None if verbose else 2
    for line in sc.resting if verbose else sc.resting[:3]:
        out += wrap(line, width, indent="    ", first="  ", lines=limit)
    if sc.conclusion.get("status") == "SKIP" and sc.conclusion.get("evidence") and verbose:
        out += wrap(sc.conclusion["evidence"], width, indent="    ", first="  ")
    nxt = sc.conclusion.get("next_step")
    if nxt:
        out += wrap(nxt, width, indent=" " * (LABEL_W + 2), first=f"  {'next':<{LABEL_W}}", lines=limit)
    return out


def first_screen(sc, width: int = 100, style: Style = PLAIN, max_lines: int = 30) -> str:
    """The first screen of a diagnosis (``view.Screen``) within ``max_lines`` x ``width``."""
    width = max(width, 60)
    head = _head(sc, width)
    tail = _tail(sc, width)
    budget = max_lines - len(head) - len(tail)
    body: list[str] = []
    cards: list[list[str]] = []
    if sc.cards:
        first = _card_block(sc.cards[0], width, lines_next=3)
        cards.append(first)
        budget -= len(first) + 1
    else:
        plain = _plain_body(sc, width, verbose=False)
        body += plain
        budget -= len(plain) + (1 if plain else 0)
    # the findings list keeps at least its title, 2 lines and the fold; the picture gets up to
    # 8 bars; then more cards while they fit; then the rest of the findings
    n_find = len(sc.findings) + len(sc.errors)
    find_min = 0 if not n_find else 1 + min(n_find, 3)
    picture: list[str] = []
    if sc.bars is not None and sc.bars.rows:
        room = budget - find_min - (1 if find_min else 0) - 1
        rows = min(len(sc.bars.rows), 8, room - 1)
        if rows >= 2:
            picture = bar_lines(sc.bars, width, style, most=rows - (1 if rows < len(sc.bars.rows) else 0))
            budget -= len(picture) + 1
    left_out = []
    for i, card in enumerate(sc.cards[1:], start=1):
        same = card.next_step == sc.cards[i - 1].next_step
        block = _card_block(card, width, lines_next=1, why_max=1, same_next=same, note=False)
        fold_line = 1 if i < len(sc.cards) - 1 else 0
        if len(block) + 1 + fold_line <= budget - find_min - (1 if find_min else 0):
            cards.append(block)
            budget -= len(block) + 1
        else:
            left_out = sc.cards[i:]
            budget -= 1
            break
    findings = _findings_block(sc, width, most=max(budget - 2, 2) if n_find else None)
    lines = head + [""]
    for block in cards:
        lines += block + [""]
    if left_out:
        labels = [c.card for c in left_out]
        lines[-1:] = [_fold(f"+{len(left_out)} more slow cards: ", labels, width, sep="; "), ""]
    if body:
        lines += body + [""]
    if picture:
        lines += picture + [""]
    if findings:
        lines += findings
    return "\n".join(lines + tail)


def verbose_text(sc, width: int = 100, style: Style = PLAIN) -> str:
    """Everything: every card with all its evidence, why lines and next step, every bar, every
    finding, every query's one line (as before issue 32), the totals. Lines are not cut."""
    big = 10**6
    lines = [header_line(sc, big), sc.headline, ""]
    for card in sc.cards:
        lines += _card_block(card, None, lines_next=None, why_max=None)
        lines.append("")
    if not sc.cards:
        lines += _plain_body(sc, width, verbose=True) + [""]
    if sc.why_lines:
        lines += sc.why_lines + [""]
    if sc.bars is not None and sc.bars.rows:
        lines += bar_lines(sc.bars, width, style) + [""]
    find = _findings_block(sc, big, most=None)
    if find:
        lines += find + [""]
    lines += sc.lines
    lines += _tail(sc, big, folded=False)
    return "\n".join(lines)


def _ab(a, b, ratio) -> str:
    """``5,839 -> 70,964 (12.2x)``: one compared cell."""
    from ..verdict import fmt_value

    def f(v):
        return "-" if v is None else fmt_value(v)

    cell = f"{f(a)} -> {f(b)}"
    return cell + (f" ({ratio:.3g}x)" if isinstance(ratio, float) and ratio != 1 else "")


def compare_text(cmp, catalog: dict | None = None, limit: int = 20, width: int | None = 100) -> str:
    """`slowcard compare`: the slow cards of both runs, each verdict that changed on its own line
    (the unchanged ones counted), then per compared report query its key and headline columns
    side by side (``A -> B (B/A)``), fitted to ``width`` (None: every column, nothing cut)."""
    from .tables import table

    cut = width or 10**6
    lines = [
        clip(f"slowcard compare · {cmp.run_a!r} (A) -> {cmp.run_b!r} (B)", cut),
        clip(
            f"slow card(s) in A: {'; '.join(cmp.slow_cards_a) or 'none'} · in B: {'; '.join(cmp.slow_cards_b) or 'none'}",
            cut,
        ),
        "",
    ]
    changed = [v for v in cmp.verdicts if v["changed"]]
    same = [v for v in cmp.verdicts if not v["changed"]]
    qw = max((len(v["query"]) for v in changed), default=0)
    for v in changed:
        lines.append(clip(f"{v['query']:<{qw}}  {v['status_a']} -> {v['status_b']}  {v['note']}", cut))
    if same:
        lines.append(
            _fold(
                f"{len(same)} verdict{'s' if len(same) != 1 else ''} unchanged: ",
                [f"{v['query'].split('@')[0]} {v['status_b']}" for v in same],
                cut,
                more="--format json",
            )
        )
    for ref, block in cmp.metrics.items():
        if not block["rows"]:
            continue
        spec = (catalog or {}).get(ref.split("@")[0])
        key = block["key"]
        metrics = list(dict.fromkeys(c[:-2] for r in block["rows"] for c in r if c.endswith("_a")))
        if width is not None and spec is not None and spec.headline:
            metrics = [m for m in spec.headline_columns if m in metrics] or metrics
        shown = block["rows"][:limit] if limit else block["rows"]
        rows = [
            {
                **{k: r.get(k) for k in key},
                **{m: _ab(r.get(f"{m}_a"), r.get(f"{m}_b"), r.get(f"{m}_ratio")) for m in metrics},
            }
            for r in shown
        ]
        body, left_out = table(key + metrics, rows, width, min_text=10**6)  # a cut A -> B cell says nothing
        lines += ["", f"{ref} (A -> B, and B / A)"] + body
        if len(block["rows"]) > len(shown):
            lines.append(f"(showing {len(shown)} of {len(block['rows'])} rows; --limit 0 shows all)")
        if left_out:
            lines.append(f"({left_out} more column{'s' if left_out != 1 else ''}: --format json)")
    return "\n".join(lines)
