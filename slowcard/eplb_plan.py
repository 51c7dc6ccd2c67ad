"""A new expert placement from the measured expert loads, written as the expert map vLLM-Ascend
(``expert_map.json``) and MindIE (``*_global_deployment.json``) load; the map checked against
the format's invariants and replayed against the loads. Used by ``slowcard plan eplb``; prints
nothing.

Model (the one eplb-whatif uses): the loads are those of the EPLB epoch of the run's latest
window, summed per slot; a logical expert's load is split evenly among the slots that hold it;
a rank's load is the sum over its slots; MoE time of a layer follows its busiest rank, so the
time saved is ``1 - sum(new peak) / sum(current peak)`` over layers.

Planning, per layer (``plan``):

- start points: the placement in force (new slots, when ``redundant_per_rank`` adds some, filled
  one by one with a replica of the expert with the largest load per copy, on the least-loaded
  rank that has room and does not hold it: DeepSeek EPLB's replicate step); and, without a move
  cap, a fresh packing: replica counts by the same rule, copies heaviest first onto the
  least-loaded rank with a free slot that does not hold the expert yet;
- then a local search on the busiest rank: swap one of its experts with a lighter one of
  another rank (re-place), or turn a slot of an expert that has another copy into one more copy
  of the busiest rank's expert (replicate), whichever lowers the peak most per expert moved;
- a move is an expert copied to a device that did not hold it (the weights that must travel);
  with ``max_moves`` each layer moves at most that many, and the search takes the actions with
  the largest peak cut per move first (SGLang's rebalance also penalises moves);
- a layer whose peak the plan cannot cut by ``min_gain`` keeps its placement (no move).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import UsageError

MODES = ("both", "replace", "replicate")


@dataclass
class LayerLoad:
    """One MoE layer as measured: the placement in force and the tokens per slot."""

    layer: int
    devices: list[int]  # EP ranks (device_id), ascending
    placement: list[list[int]]  # per device (same order): the expert in each local slot
    slot_tokens: list[list[float]]  # per device: tokens of each slot over the epoch's windows

    @property
    def rank_tokens(self) -> list[float]:
        return [sum(s) for s in self.slot_tokens]

    def expert_tokens(self, n_experts: int) -> list[float]:
        w = [0.0] * n_experts
        for slots, toks in zip(self.placement, self.slot_tokens):
            for e, t in zip(slots, toks):
                w[e] += t
        return w


@dataclass
class Loads:
    """What ``read_loads`` found for a run."""

    run: str
    epoch: int | None
    windows: int
    n_experts: int
    slots_per_device: int
    layers: list[LayerLoad]


@dataclass
class LayerPlan:
    layer: int
    devices: list[int]
    before: list[list[int]]
    after: list[list[int]]
    current_max: float  # measured tokens of the busiest rank now
    new_max: float  # modelled tokens of the busiest rank under `after`
    mean_rank: float  # mean rank tokens (the same before and after)
    moves: int  # experts copied to a device that did not hold them
    replicas_added: list[int] = field(default_factory=list)  # experts with more copies than before
    kept: bool = False  # left as it is: no plan cut the peak by min_gain

    @property
    def current_par(self) -> float:
        return self.current_max / self.mean_rank if self.mean_rank else 1.0

    @property
    def new_par(self) -> float:
        return self.new_max / self.mean_rank if self.mean_rank else 1.0


@dataclass
class Plan:
    mode: str
    redundant_per_rank: int
    max_moves: int | None
    slots_per_device: int
    n_experts: int
    layers: list[LayerPlan]

    @property
    def saved_share(self) -> float:
        cur = sum(p.current_max for p in self.layers)
        return 1 - sum(p.new_max for p in self.layers) / cur if cur else 0.0

    @property
    def moves(self) -> int:
        return sum(p.moves for p in self.layers)


# ------------------------------------------------------------------ reading the loads
def read_loads(con, run: str) -> Loads:
    """The loads of the run's latest EPLB epoch per (layer, EP rank, slot), with the placement in
    force (the epoch's expert map; slots the map has and the loads lack count 0 tokens)."""
    from .queries import scoped_cursor

    cur = scoped_cursor(con, run)
    try:
        rows = cur.execute(
            """
            WITH wins AS (SELECT wseq, epoch FROM _expert_windows WHERE run = $run),
            last_e AS (SELECT epoch FROM wins ORDER BY wseq DESC LIMIT 1),
            win AS (SELECT wseq FROM wins WHERE epoch IS NOT DISTINCT FROM (SELECT epoch FROM last_e)),
            loads AS (
                SELECT layer, ep_rank, local_slot, any_value(expert) AS expert, sum(tokens) AS tokens
                FROM _expert_slot_load WHERE run = $run AND wseq IN (SELECT wseq FROM win)
                GROUP BY ALL
            ),
            mapped AS (
                SELECT layer, ep_rank, local_slot, expert FROM _expert_map_current
                WHERE run = $run AND epoch IS NOT DISTINCT FROM (SELECT epoch FROM last_e)
            )
            SELECT coalesce(m.layer, l.layer), coalesce(m.ep_rank, l.ep_rank), coalesce(m.local_slot, l.local_slot),
                   coalesce(m.expert, l.expert), coalesce(l.tokens, 0.0),
                   l.layer IS NOT NULL AS measured, m.layer IS NOT NULL OR NOT EXISTS (SELECT 1 FROM mapped) AS placed
            FROM mapped m FULL JOIN loads l USING (layer, ep_rank, local_slot)
            WHERE (SELECT count(*) FROM win) > 0
            ORDER BY 1, 2, 3
            """,
            {"run": run},
        ).fetchall()
        head = cur.execute(
            """SELECT any_value(epoch), count(DISTINCT wseq) FROM _expert_windows
               WHERE run = $run AND epoch IS NOT DISTINCT FROM
                     (SELECT epoch FROM _expert_windows WHERE run = $run ORDER BY wseq DESC LIMIT 1)""",
            {"run": run},
        ).fetchone()
    finally:
        cur.close()
    if not rows:
        raise UsageError(f"run {run!r} has no expert-load windows: ingest the expert-load dumps (and the map in force)")
    by_layer: dict[int, dict[int, dict[int, tuple[int, float]]]] = {}
    measured: dict[int, set[int]] = {}
    for layer, rank, slot, expert, tokens, has_load, placed in rows:
        if not placed:
            raise UsageError(
                f"run {run!r} layer {layer}: the loads have EP rank {rank} slot {slot}, which the expert map in "
                "force lacks: the loads and the map are of different deployments (ingest the map they ran under)"
            )
        by_layer.setdefault(layer, {}).setdefault(rank, {})[slot] = (int(expert), float(tokens))
        if has_load:
            measured.setdefault(layer, set()).add(rank)
    for layer, ranks in by_layer.items():
        missing = sorted(set(ranks) - measured.get(layer, set()))
        if missing:
            raise UsageError(
                f"run {run!r} layer {layer}: no load for EP ranks {missing[:8]}{'…' if len(missing) > 8 else ''} "
                f"of the {len(ranks)} the expert map places experts on: a plan needs every rank's load "
                "(ingest every rank's dump)"
            )
    layers: list[LayerLoad] = []
    slots_seen: set[int] = set()
    n_experts = 0
    for layer, ranks in sorted(by_layer.items()):
        devices = sorted(ranks)
        placement, toks = [], []
        for d in devices:
            slots = ranks[d]
            if sorted(slots) != list(range(len(slots))):
                raise UsageError(
                    f"run {run!r} layer {layer} EP rank {d}: local slots {sorted(slots)} have gaps; "
                    "the loads and the expert map in force disagree on the slots"
                )
            placement.append([slots[s][0] for s in range(len(slots))])
            toks.append([slots[s][1] for s in range(len(slots))])
            slots_seen.add(len(slots))
        n_experts = max(n_experts, max(max(p) for p in placement) + 1)
        layers.append(LayerLoad(layer, devices, placement, toks))
    if len(slots_seen) != 1:
        raise UsageError(
            f"run {run!r}: EP ranks hold different numbers of slots ({sorted(slots_seen)}); "
            "an expert map needs the same number on every device"
        )
    for ly in layers:
        lost = sorted(set(range(n_experts)) - {e for p in ly.placement for e in p})
        if lost:
            raise UsageError(
                f"run {run!r} layer {ly.layer}: logical experts {lost[:8]} have no slot in the placement "
                "in force; ingest the expert map of the epoch the loads ran under"
            )
    return Loads(run, head[0] if head else None, int(head[1]) if head else 0, n_experts, slots_seen.pop(), layers)


# ------------------------------------------------------------------ the model
def model_loads(place: list[list[int]], w: list[float]) -> list[float]:
    """Rank loads when each expert's load is split evenly over its slots."""
    n = [0] * len(w)
    for slots in place:
        for e in slots:
            n[e] += 1
    return [sum(w[e] / n[e] for e in slots) for slots in place]


def moves_between(before: list[list[int]], after: list[list[int]]) -> int:
    """Experts copied to a device that did not hold them (the weights a migration transfers)."""
    return sum(len(set(a) - set(b)) for b, a in zip(before, after))


class _State:
    """A layer's placement under search: copies per expert, rank loads, and moves so far."""

    def __init__(self, place: list[list[int]], w: list[float], origin: list[list[int]]):
        self.place = [list(p) for p in place]
        self.w = w
        self.origin = [set(p) for p in origin]
        self.n = [0] * len(w)
        for slots in self.place:
            for e in slots:
                if e >= 0:
                    self.n[e] += 1
        self.holders: list[set[int]] = [set() for _ in w]
        for d, slots in enumerate(self.place):
            for e in slots:
                if e >= 0:
                    self.holders[e].add(d)
        self.loads = [sum(w[e] / self.n[e] for e in slots if e >= 0) for slots in self.place]
        self.moves = sum(len({e for e in p if e >= 0} - o) for p, o in zip(self.place, self.origin))

    def per(self, e: int) -> float:
        return self.w[e] / self.n[e] if self.n[e] else math.inf

    def new_pair(self, d: int, e: int) -> int:
        return 0 if e in self.origin[d] else 1

    def gone_pair(self, d: int, e: int) -> int:
        return 0 if e in self.origin[d] else 1

    def fill(self, d: int, slot: int, e: int) -> None:
        """Put a copy of e into an empty slot of device d."""
        old = self.per(e) if self.n[e] else 0.0
        for h in self.holders[e]:
            self.loads[h] -= old - self.w[e] / (self.n[e] + 1)
        self.n[e] += 1
        self.holders[e].add(d)
        self.place[d][slot] = e
        self.loads[d] += self.w[e] / self.n[e]
        self.moves += self.new_pair(d, e)

    def swap(self, p: int, i: int, q: int, j: int) -> None:
        x, y = self.place[p][i], self.place[q][j]
        a, b = self.per(x), self.per(y)
        self.moves += self.new_pair(q, x) + self.new_pair(p, y) - self.gone_pair(p, x) - self.gone_pair(q, y)
        self.place[p][i], self.place[q][j] = y, x
        self.holders[x].discard(p)
        self.holders[x].add(q)
        self.holders[y].discard(q)
        self.holders[y].add(p)
        self.loads[p] += b - a
        self.loads[q] += a - b

    def replace(self, q: int, j: int, e: int) -> None:
        """Slot j of device q stops holding its expert (which has another copy) and holds e."""
        f = self.place[q][j]
        self.moves -= self.gone_pair(q, f)  # fill() below counts the copy of e
        pf_old, pf_new = self.per(f), self.w[f] / (self.n[f] - 1)
        for h in self.holders[f]:
            if h != q:
                self.loads[h] += pf_new - pf_old
        self.loads[q] -= pf_old
        self.n[f] -= 1
        self.holders[f].discard(q)
        self.place[q][j] = -1
        self.fill(q, j, e)


def _objective(loads: list[float]) -> tuple[float, float]:
    return (max(loads), sum(x * x for x in loads))


def _fill_empty(st: _State, slots: int) -> None:
    """Every empty slot (-1) gets a copy of the expert with the largest load per copy that some
    device with an empty slot does not hold, on the least-loaded such device."""
    while True:
        free = [d for d, p in enumerate(st.place) if -1 in p]
        if not free:
            return
        order = sorted(range(len(st.w)), key=lambda e: (-st.per(e), e))
        for e in order:
            cand = [d for d in free if d not in st.holders[e]]
            if cand:
                d = min(cand, key=lambda d: (st.loads[d], d))
                st.fill(d, st.place[d].index(-1), e)
                break
        else:  # every device with room holds every expert: cannot happen while slots <= experts
            raise UsageError(f"{slots} slots per device cannot all hold distinct experts")


def _search(st: _State, allow_swap: bool, allow_replicate: bool, budget: int | None, cold: float) -> None:
    """Steepest descent on the busiest rank (see the module doc); ``budget``: moves allowed in all."""
    R = len(st.place)
    for _ in range(8 * sum(len(p) for p in st.place)):
        loads = st.loads
        order = sorted(range(R), key=lambda d: -loads[d])
        p = order[0]
        peak = loads[p]
        best: tuple | None = None
        best_score: tuple[float, float] = (1e-9 * max(peak, 1.0), 0.0)  # a peak cut, else a squares cut
        left = None if budget is None else budget - st.moves
        if allow_swap:
            for i, x in enumerate(st.place[p]):
                a = st.per(x)
                for q in order[1:]:
                    if q in st.holders[x]:
                        continue
                    gap = peak - loads[q]
                    for j, y in enumerate(st.place[q]):
                        if y == x or p in st.holders[y]:
                            continue
                        d = a - st.per(y)
                        if d <= 0 or d >= gap:
                            continue
                        cost = st.new_pair(q, x) + st.new_pair(p, y) - st.gone_pair(p, x) - st.gone_pair(q, y)
                        if left is not None and cost > left:
                            continue
                        newp, newq = peak - d, loads[q] + d
                        rest = next((loads[r] for r in order if r not in (p, q)), 0.0)
                        top = max(newp, newq, rest)
                        dssq = newp * newp + newq * newq - peak * peak - loads[q] * loads[q]
                        score = _score(peak - top, -dssq, cost, budget)
                        if score > best_score:
                            best_score, best = score, ("swap", p, i, q, j)
        if allow_replicate:
            for x in set(st.place[p]):
                if st.n[x] >= R or st.w[x] <= 0:
                    continue
                a_old, a_new = st.per(x), st.w[x] / (st.n[x] + 1)
                if a_new < cold:
                    continue  # one more copy of x would hold less than an average slot: a cold replica
                for q in order[1:]:
                    if q in st.holders[x]:
                        continue
                    for j, f in enumerate(st.place[q]):
                        if f == x or st.n[f] < 2:
                            continue
                        cost = st.new_pair(q, x) - st.gone_pair(q, f)
                        if left is not None and cost > left:
                            continue
                        pf_old, pf_new = st.per(f), st.w[f] / (st.n[f] - 1)
                        changed: dict[int, float] = {}
                        for h in st.holders[x]:
                            changed[h] = loads[h] - (a_old - a_new)
                        for h in st.holders[f]:
                            if h != q:
                                changed[h] = changed.get(h, loads[h]) + (pf_new - pf_old)
                        changed[q] = loads[q] - pf_old + a_new
                        rest = next((loads[r] for r in order if r not in changed), 0.0)
                        top = max(max(changed.values()), rest)
                        dssq = sum(v * v - loads[h] * loads[h] for h, v in changed.items())
                        score = _score(peak - top, -dssq, cost, budget)
                        if score > best_score:
                            best_score, best = score, ("rep", q, j, x)
        if best is None:
            return
        if best[0] == "swap":
            st.swap(*best[1:])
        else:
            st.replace(*best[1:])


def _score(cut: float, ssq_cut: float, cost: int, budget: int | None) -> tuple[float, float]:
    if cut < 0 or (cut <= 0 and ssq_cut <= 0):
        return (-math.inf, -math.inf)
    if budget is None or cost <= 0:
        return (cut, ssq_cut)
    return (cut / cost, ssq_cut / cost)


def _pack(w: list[float], counts: list[int], R: int, S: int) -> list[list[int]]:
    """Copies heaviest per copy first, each onto the least-loaded device that has a free slot and
    does not hold that expert (ties to the lowest device)."""
    place: list[list[int]] = [[] for _ in range(R)]
    loads = [0.0] * R
    items = sorted(
        ((w[e] / counts[e], e) for e in range(len(w)) for _ in range(counts[e])), key=lambda t: (-t[0], t[1])
    )
    for per, e in items:
        cand = [d for d in range(R) if len(place[d]) < S and e not in place[d]]
        if not cand:
            # the devices with room all hold e: trade one of their experts with a device that does not
            d0 = next(d for d in range(R) if len(place[d]) < S)
            for d in range(R):
                if e in place[d]:
                    continue
                k = next((k for k, z in enumerate(place[d]) if z not in place[d0]), None)
                if k is not None:
                    z = place[d][k]
                    place[d][k] = e
                    place[d0].append(z)
                    zper = w[z] / counts[z]
                    loads[d] += per - zper
                    loads[d0] += zper
                    break
            else:
                raise UsageError(f"cannot pack {counts[e]} copies of expert {e} on distinct devices")
            continue
        d = min(cand, key=lambda d: (loads[d], d))
        place[d].append(e)
        loads[d] += per
    return place


def replica_counts(w: list[float], total: int, R: int, base: list[int] | None = None) -> list[int]:
    """Copies per expert for ``total`` slots: one each (or ``base``), then each further slot to
    the expert with the largest load per copy (DeepSeek EPLB's replicate step), at most R copies."""
    n = list(base) if base else [1] * len(w)
    spare = total - sum(n)
    for _ in range(spare):
        e = max((e for e in range(len(w)) if n[e] < R), key=lambda e: (w[e] / n[e], -e))
        n[e] += 1
    return n


def cold_copies(w: list[float], had: list[int], count: list[int], R: int, per_slot: float) -> list[tuple[int, int]]:
    """(expert, a better one) for each expert given more copies than it had although its load per
    copy without its last copy is below a slot's share of the layer's tokens while another expert
    that could take one more copy carries more per copy: a replica of a cold expert (when every
    slot must hold something, the lightest experts do get copies, and that is no fault)."""
    out = []
    for e in range(len(w)):
        if count[e] <= max(had[e], 1):
            continue
        before = w[e] / (count[e] - 1)
        if before >= per_slot * (1 - 1e-9):
            continue
        f = next((f for f in range(len(w)) if f != e and 0 < count[f] < R and w[f] / count[f] > before), None)
        if f is not None:
            out.append((e, f))
    return out


def _align(cur: list[list[int]], place: list[list[int]]) -> list[list[int]]:
    """A fresh packing's devices are interchangeable: give each packed device to the current device
    it shares most experts with (greedy, largest overlap first), so fewer experts move."""
    pairs = sorted(
        ((len(set(c) & set(p)), d, i) for d, c in enumerate(cur) for i, p in enumerate(place)),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    out: list[list[int] | None] = [None] * len(cur)
    used: set[int] = set()
    for _, d, i in pairs:
        if out[d] is None and i not in used:
            out[d] = place[i]
            used.add(i)
    return [p if p is not None else [] for p in out]


def _keep_slots(before: list[list[int]], after: list[list[int]], S: int) -> list[list[int]]:
    """The same experts per device, each staying in the slot it had where it can (a readable diff)."""
    out = []
    for b, a in zip(before, after):
        slots: list[int | None] = [None] * S
        rest = list(a)
        for i, e in enumerate(b[:S]):
            if e in rest:
                slots[i] = e
                rest.remove(e)
        it = iter(rest)
        out.append([s if s is not None else next(it) for s in slots])
    return out


def plan_layer(
    ly: LayerLoad,
    n_experts: int,
    slots: int,
    mode: str = "both",
    max_moves: int | None = None,
    min_gain: float = 0.02,
) -> LayerPlan:
    """The new placement of one layer (see the module doc)."""
    R = len(ly.devices)
    w = ly.expert_tokens(n_experts)
    cur = [list(p) for p in ly.placement]
    total = sum(w)
    cold = total / (R * slots) if R * slots else 0.0  # tokens per slot: a copy holding less is a cold replica
    current_max = max(ly.rank_tokens) if ly.rank_tokens else 0.0
    mean = total / R if R else 0.0
    grow = slots - len(cur[0])
    if grow < 0 and (mode != "both" or max_moves is not None):
        raise UsageError(
            f"--redundant-per-rank leaves {slots} slots per device, fewer than the {len(cur[0])} in force: "
            "only a full re-plan (--mode both, no --max-moves) can drop slots"
        )
    candidates: list[_State] = []
    if grow >= 0:
        # a second copy of an expert on the same device serves nothing more: its slot is refilled
        start = [[e if e not in p[:i] else -1 for i, e in enumerate(p)] + [-1] * grow for p in cur]
        empty = sum(p.count(-1) for p in start)
        st = _State(start, w, cur)
        if max_moves is not None and empty > max_moves:
            raise UsageError(
                f"layer {ly.layer}: {empty} slots need an expert copied (new slots of --redundant-per-rank, or a "
                f"second copy of an expert on one device): more than --max-moves {max_moves}"
            )
        _fill_empty(st, slots)
        _search(st, mode in ("both", "replace"), mode in ("both", "replicate"), max_moves, cold)
        candidates.append(st)
    if max_moves is None and mode in ("both", "replace"):
        if mode == "both":
            # copies per expert capped at R; on a few ranks also lower caps: packing is greedy,
            # and a lower cap sometimes packs better (cheap to try when R is small)
            caps = sorted({R, max(R - 1, 1), max(R // 2, 1), min(2, R)} if R <= 16 else {R}, reverse=True)
            options = [replica_counts(w, R * slots, c) for c in caps if c * n_experts >= R * slots]
        else:
            counts = [0] * n_experts
            for p in cur:
                for e in set(p):
                    counts[e] += 1
            options = [replica_counts(w, R * slots, R, base=counts) if sum(counts) < R * slots else counts]
        for counts in options:
            packed = _State(_pack(w, counts, R, slots), w, cur)
            _search(packed, True, mode == "both", None, cold)
            candidates.append(_State(_align(cur, packed.place), w, cur))
    had = [0] * n_experts
    for p in cur:
        for e in p:
            had[e] += 1
    # a packing that gave a copy to a cold expert is not written (the validator would reject it)
    sound_ones = [s for s in candidates if not cold_copies(w, had, s.n, R, cold)] or candidates[:1]
    best = min(sound_ones, key=lambda s: (_objective(s.loads), s.moves))
    new_max = max(best.loads)
    sound = grow == 0 and all(len(set(p)) == len(p) for p in cur)
    if sound and new_max >= current_max * (1 - min_gain):
        return LayerPlan(ly.layer, ly.devices, cur, cur, current_max, current_max, mean, 0, kept=True)
    after = _keep_slots(cur, best.place, slots)
    before_n = [0] * n_experts
    for p in cur:
        for e in p:
            before_n[e] += 1
    added = sorted({e for e in range(n_experts) if best.n[e] > before_n[e]})
    return LayerPlan(ly.layer, ly.devices, cur, after, current_max, new_max, mean, moves_between(cur, after), added)


def plan(
    loads: Loads,
    mode: str = "both",
    redundant_per_rank: int | None = None,
    max_moves: int | None = None,
    min_gain: float = 0.02,
) -> Plan:
    """A new placement for every layer of ``loads`` (see the module doc).

    ``redundant_per_rank``: slots per device become n_experts / ranks + this (default: as in
    force); ``max_moves``: experts copied to a new device per layer at most (None: no cap)."""
    if mode not in MODES:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if max_moves is not None and max_moves < 0:
        raise UsageError(f"--max-moves must be >= 0, not {max_moves}")
    R = len(loads.layers[0].devices)
    if redundant_per_rank is None:
        slots = loads.slots_per_device
        redundant_per_rank = slots - loads.n_experts // R
    else:
        if redundant_per_rank < 0:
            raise UsageError(f"--redundant-per-rank must be >= 0, not {redundant_per_rank}")
        if loads.n_experts % R:
            raise UsageError(
                f"{loads.n_experts} logical experts do not divide over {R} EP ranks: "
                "leave --redundant-per-rank out to keep the slots in force"
            )
        slots = loads.n_experts // R + redundant_per_rank
        if mode == "replace" and slots != loads.slots_per_device:
            raise UsageError(
                f"--mode replace keeps the {loads.slots_per_device} slots per device in force; "
                f"--redundant-per-rank {redundant_per_rank} would make {slots}"
            )
    if slots > loads.n_experts:
        raise UsageError(f"{slots} slots per device exceed the {loads.n_experts} logical experts")
    layers = [plan_layer(ly, loads.n_experts, slots, mode, max_moves, min_gain) for ly in loads.layers]
    return Plan(mode, redundant_per_rank, max_moves, slots, loads.n_experts, layers)


# ------------------------------------------------------------------ the file
def to_expert_map(p: Plan) -> dict:
    """The plan as an expert map: ``moe_layer_count``, ``layer_list[].device_list[].device_expert``."""
    return {
        "moe_layer_count": len(p.layers),
        "layer_list": [
            {
                "layer_id": lp.layer,
                "device_count": len(lp.devices),
                "device_list": [
                    {"device_id": d, "device_expert": list(slots)} for d, slots in zip(lp.devices, lp.after)
                ],
            }
            for lp in p.layers
        ],
    }


def validate(doc, loads: Loads, slots_per_device: int | None = None) -> list[str]:
    """What breaks the expert-map invariants for these loads (empty: the map is sound): the
    structure, every layer and device present once, ``slots_per_device`` slots on each device
    (default: as in force), every logical expert placed, no expert twice on one device, and no
    copy added to an expert whose load per copy before it was below the layer's tokens per slot
    while another expert carries more per copy (a replica of a cold expert: the slot would serve
    more elsewhere)."""
    S = slots_per_device or loads.slots_per_device
    E = loads.n_experts
    bad: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("layer_list"), list):
        return ['expected an object with a "layer_list" list']
    layers = doc["layer_list"]
    if doc.get("moe_layer_count") != len(layers):
        bad.append(f"moe_layer_count {doc.get('moe_layer_count')!r} but layer_list has {len(layers)} layers")
    want = {ly.layer: ly for ly in loads.layers}
    seen: set[int] = set()
    for i, entry in enumerate(layers):
        lid = entry.get("layer_id") if isinstance(entry, dict) else None
        devs = entry.get("device_list") if isinstance(entry, dict) else None
        if not isinstance(lid, int) or lid not in want or not isinstance(devs, list):
            bad.append(f"layer_list[{i}]: layer_id {lid!r} is not a measured layer, or no device_list")
            continue
        if lid in seen:
            bad.append(f"layer {lid}: appears twice")
            continue
        seen.add(lid)
        ly = want[lid]
        if entry.get("device_count", len(devs)) != len(devs):
            bad.append(f"layer {lid}: device_count {entry.get('device_count')} but {len(devs)} devices")
        ids = [d.get("device_id") if isinstance(d, dict) else None for d in devs]
        if sorted(x for x in ids if isinstance(x, int)) != ly.devices or len(ids) != len(ly.devices):
            bad.append(f"layer {lid}: devices {ids[:8]}… are not the {len(ly.devices)} EP ranks {ly.devices[:8]}…")
            continue
        place = {d["device_id"]: d.get("device_expert") for d in devs}
        count = [0] * E
        ok = True
        for dev in ly.devices:
            exps = place[dev]
            if not isinstance(exps, list) or any(isinstance(e, bool) or not isinstance(e, int) for e in exps):
                bad.append(f"layer {lid} device {dev}: device_expert is not a list of integer expert ids")
                ok = False
                continue
            if len(exps) != S:
                bad.append(f"layer {lid} device {dev}: {len(exps)} slots, expected {S}")
            out = sorted({e for e in exps if not 0 <= e < E})
            if out:
                bad.append(f"layer {lid} device {dev}: expert ids {out[:8]} outside 0..{E - 1}")
                ok = False
                continue
            twice = sorted({e for e in exps if exps.count(e) > 1})
            if twice:
                bad.append(f"layer {lid} device {dev}: experts {twice[:8]} twice on one device (a wasted slot)")
            for e in exps:
                count[e] += 1
        if not ok:
            continue
        lost = [e for e in range(E) if count[e] == 0]
        if lost:
            bad.append(f"layer {lid}: logical experts {lost[:8]} are not placed on any device")
        w = ly.expert_tokens(E)
        per_slot = sum(w) / (len(ly.devices) * S) if S else 0.0
        had = [0] * E
        for p in ly.placement:
            for e in p:
                had[e] += 1
        for e, f in cold_copies(w, had, count, len(ly.devices), per_slot):
            bad.append(
                f"layer {lid}: expert {e} gets {count[e] - had[e]} more cop(ies), but its {w[e]:.0f} tokens over "
                f"{count[e] - 1} copies are below the {per_slot:.0f} tokens per slot while expert {f} "
                f"carries {w[f] / count[f]:.0f} per copy (a replica of a cold expert)"
            )
    for lid in sorted(set(want) - seen):
        bad.append(f"layer {lid}: measured but missing from layer_list")
    return bad


@dataclass
class Replay:
    layer: int
    current_par: float  # measured
    new_par: float  # modelled under the map
    current_max: float
    new_max: float
    moves: int


def replay(doc: dict, loads: Loads) -> list[Replay]:
    """Each layer's measured peak/avg beside the one the map would give on the same loads."""
    E = loads.n_experts
    by_id = {e["layer_id"]: e for e in doc["layer_list"]}
    out = []
    for ly in loads.layers:
        entry = by_id[ly.layer]
        place = {d["device_id"]: d["device_expert"] for d in entry["device_list"]}
        after = [place[d] for d in ly.devices]
        w = ly.expert_tokens(E)
        # an unchanged layer keeps its measured loads (replicas need not split evenly)
        new = ly.rank_tokens if after == ly.placement else model_loads(after, w)
        mean = sum(w) / len(ly.devices)
        cur = max(ly.rank_tokens)
        out.append(
            Replay(
                ly.layer,
                cur / mean if mean else 1.0,
                max(new) / mean if mean else 1.0,
                cur,
                max(new),
                moves_between(ly.placement, after),
            )
        )
    return out
