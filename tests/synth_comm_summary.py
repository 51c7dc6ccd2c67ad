"""A small msprof-analyze ``cluster_communication.json`` (the shape of the real one in
../shared/realdata/ascend): one rank set, ``ops`` all-reduce ops, every rank moving the same HCCS
and RDMA bytes; ``slow`` maps rank -> (link, factor): that rank's transit time on that link is
``factor`` times the others' (factor 2: half the bandwidth)."""

from __future__ import annotations

import json
from pathlib import Path

LINKS = ("RDMA", "HCCS", "PCIE", "SDMA")
SIZE_MB = {"RDMA": 16.0, "HCCS": 64.0}
GBPS = {"RDMA": 20.0, "HCCS": 80.0}  # GB/s = MB per ms


def write_cluster_communication(path, *, ranks: int = 4, ops: int = 6, slow: dict | None = None) -> Path:
    slow = slow or {}
    rank_set = "(" + ", ".join(map(str, range(ranks))) + ")"
    step: dict = {}
    for k in range(ops):
        per_rank = {}
        for r in range(ranks):
            bw_info = {}
            for link in LINKS:
                mb = SIZE_MB.get(link, 0.0)
                ms = mb / GBPS[link] if mb else 0.0
                if slow.get(r, (None,))[0] == link:
                    ms *= slow[r][1]
                bw_info[link] = {
                    "Transit Size(MB)": mb,
                    "Transit Time(ms)": ms,
                    "Bandwidth(GB/s)": round(mb / ms, 4) if ms else 0,
                    "Large Packet Ratio": 1.0 if mb else 0,
                    "Size Distribution": {},
                }
            transit = sum(v["Transit Time(ms)"] for v in bw_info.values())
            per_rank[str(r)] = {
                "Communication Time Info": {
                    "Start Timestamp(us)": 1_695_054_582_608_213.0 + 10_000 * k,
                    "Elapse Time(ms)": transit + 1.0,
                    "Transit Time(ms)": transit,
                    "Wait Time(ms)": 1.0,
                    "Synchronization Time(ms)": 0.5,
                    "Idle Time(ms)": 0.0,
                    "Wait Time Ratio": 0.5,
                    "Synchronization Time Ratio": 0.3,
                },
                "Communication Bandwidth Info": bw_info,
            }
        step[f"hcom_allReduce__501_{k}@6297232067196334501"] = per_rank
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({rank_set: {"step": step}}))
    return path
