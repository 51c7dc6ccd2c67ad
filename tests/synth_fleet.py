"""A generated fleet: runs of ranks placed on physical devices at random, with the slow cards each
run's diagnosis named, written as `slowcard fleet` stores them (runs, sources with host and
device id, run_verdicts, run_slow_cards). The judgement stamps are current, so `fleet` judges
nothing again and counts exactly these verdicts.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path

from slowcard import fleet as fleet_mod
from slowcard import queries, store

HOSTS = ("node0", "node1", "node2")
DEVICES = [f"{h}/{d}" for h in HOSTS for d in range(4)]  # 12 physical devices


def write_fleet(
    db: Path,
    n_runs: int = 20,
    n_ranks: int = 8,
    bad_device: str | None = None,
    bad_in_runs: int | None = None,
    hot_rank: int | None = None,
    noise_share: float = 0.0,
    fixed_placement: bool = False,
    seed: int = 45,
) -> list[dict]:
    """Write the fleet; returns per run {run, placement (rank -> device), slow (rank -> cause)}.

    ``bad_device`` is named whenever present (``bad_in_runs``: only in its first so many runs);
    ``hot_rank`` in every run wherever it lands; ``noise_share``: chance that a run names one
    more rank at random (a balanced fleet's false alarms). ``fixed_placement``: rank r is on
    device r in every run."""
    rng = random.Random(seed)
    con = store.open_db(db)
    t0 = datetime(2026, 11, 1, 8, 0)
    refs = ",".join(q.ref() for q in fleet_mod.speakers(queries.load_catalog()))
    out = []
    sid = 0
    bad_seen = 0
    try:
        for i in range(n_runs):
            run = f"job{i:02d}"
            on = DEVICES[:n_ranks] if fixed_placement else rng.sample(DEVICES, n_ranks)
            placement = dict(enumerate(on))
            con.execute("INSERT INTO runs VALUES (?, ?, ?, ?)", [run, f"/jobs/{run}", t0 + timedelta(hours=i), n_ranks])
            for rank, dev in placement.items():
                sid += 1
                host, d = dev.split("/")
                con.execute(
                    "INSERT INTO sources (source_id, run, path, format, rank, rank_source, host, device_id, "
                    "host_source, device_source, status, ingested_at) "
                    "VALUES (?, ?, ?, 'kineto', ?, 'distributedInfo', ?, ?, 'trace_header', 'kernel_pid', 'ok', ?)",
                    [sid, run, f"/jobs/{run}/rank{rank}.pt.trace.json", rank, host, int(d), t0 + timedelta(hours=i)],
                )
            slow: dict[int, tuple[str, float]] = {}
            if hot_rank is not None:
                slow[hot_rank] = ("token-skew", 15.0 + rng.random())
            if bad_device in on and (bad_in_runs is None or bad_seen < bad_in_runs):
                bad_seen += 1
                # a card wearing out: its cost grows run by run
                slow.setdefault(on.index(bad_device), ("slow-compute", 10.0 + 2.0 * bad_seen))
            if rng.random() < noise_share:
                slow.setdefault(rng.randrange(n_ranks), ("slow-compute", 5.0 + rng.random()))
            status = "FAIL" if slow else "PASS"
            stamp = fleet_mod._stamp(con, run, refs)
            con.execute(
                "INSERT INTO run_verdicts (run, status, query, files_stamp, judged_at) VALUES (?, ?, ?, ?, now())",
                [run, status, "ep-slow-rank@v8" if slow else None, stamp],
            )
            for rank, (cause, pct) in slow.items():
                con.execute(
                    "INSERT INTO run_slow_cards VALUES (?, ?, ?, 'FAIL', ?, ?, ?, 'ep-slow-rank@v8')",
                    [run, rank, f"rank {rank}", cause, pct * 2.0, pct],
                )
            out.append({"run": run, "placement": placement, "slow": slow})
    finally:
        con.close()
    return out
