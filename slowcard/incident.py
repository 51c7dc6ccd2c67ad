"""A watched incident in one place (issue 47): the captures taken on a watched run's alerts,
each with the diagnosis of its own run, joined to the slow cards of the watched run.

`slowcard watch --capture` records each capture in the ``captures`` table (slowcard/capture.py)
and ingests its files as a run of their own (``capture-<id>``). The watched run's slow card is
a DP domain named by the live metrics, for which that run holds no trace; the capture run holds
the traces and names its own slow card (``rank 5 token-skew``). The report shows the capture's
verdict under the alerted card's "why" and the capture run's own diagnosis in the same page;
this module finds which capture belongs to which card and diagnoses the capture runs. A
capture belongs to a card when its alert named that card (``captures.subject``, e.g.
``DP domain 5``, is the card's label). Pure library code: no printing.
"""

from __future__ import annotations

from dataclasses import dataclass

# Capture runs diagnosed and drawn in one report, the newest kept (each is a full diagnosis).
MAX_DIAGNOSED = 5


@dataclass
class Capture:
    """One capture of the watched run, and its run's diagnosis when it has one."""

    row: dict  # the ``captures`` row
    diag: object | None = None  # diagnosis.Diagnosis of row["run"]; None: nothing ingested, or not diagnosed here

    @property
    def capture_id(self) -> int:
        return int(self.row["capture_id"])

    @property
    def anchor(self) -> str:
        """The id of the capture run's section in the report page."""
        return f"capture-run-{self.capture_id}"

    def card(self):
        """The capture run's first slow card as its first screen shows it (``view.Card``), or None."""
        if self.diag is None:
            return None
        from .view import screen

        cards = screen(self.diag).cards
        wanted = self.row.get("slow_card")
        return next((c for c in cards if c.card == wanted), cards[0] if cards else None)

    def match_text(self) -> str:
        """How the capture's slow card relates to the alert (``captures.matches_alert``)."""
        m = self.row.get("matches_alert")
        subject = self.row.get("subject") or "the alert's subject"
        if m is None:
            return f"cannot tell whether it is {subject}"
        return f"the alerted {subject}" if m else f"not the alerted {subject}: another card"


def captures(con, run: str) -> list[dict]:
    """The captures taken on the alerts of watched run ``run``, or the capture that ``run`` is
    (``captures`` table), oldest first; none in a database written before that table."""
    import duckdb

    try:
        cur = con.execute("SELECT * FROM captures WHERE watch_run = ? OR run = ? ORDER BY capture_id", [run, run])
    except duckdb.Error:
        return []
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def story(con, run: str, catalog: dict | None = None, most: int = MAX_DIAGNOSED) -> list[Capture]:
    """The captures of watched run ``run``, oldest first; the ``most`` newest that ended ``ok``
    with a run of their own (other than ``run``) carry that run's diagnosis."""
    from .diagnosis import diagnose

    rows = captures(con, run)
    out = [Capture(r) for r in rows]
    done = [c for c in out if c.row.get("status") == "ok" and c.row.get("run") and c.row["run"] != run]
    for c in done[-most:] if most > 0 else []:
        c.diag = diagnose(con, c.row["run"], catalog)
    return out


def by_card(story_: list[Capture], labels, run: str) -> dict[str, list[Capture]]:
    """Card label -> the captures taken on an alert of watched run ``run`` that named that
    card, oldest first."""
    wanted = set(labels)
    out: dict[str, list[Capture]] = {}
    for c in story_:
        subject = c.row.get("subject")
        if isinstance(subject, str) and subject in wanted and c.row.get("watch_run") == run:
            out.setdefault(subject, []).append(c)
    return out
