"""Expert loads generated on a given placement (issue 44): skewed logical-expert loads per layer,
split evenly over each expert's copies, as a vLLM-Ascend expert-load tensor beside its map.
Used by tests/test_eplb_plan.py, tests/test_eplb_converged.py and bench/bench_eplb.py."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import synth_experts as se  # noqa: E402


def expert_weights(n_layers: int, n_experts: int, seed: int, hot: int = 4, hot_x: tuple = (4.0, 16.0)) -> list:
    """Per layer, tokens per logical expert: a lognormal body and ``hot`` experts ``hot_x`` times heavier."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n_layers):
        w = [1000.0 * rnd.lognormvariate(0.0, 0.5) for _ in range(n_experts)]
        for e in rnd.sample(range(n_experts), hot):
            w[e] *= rnd.uniform(*hot_x)
        out.append([round(x) for x in w])
    return out


def tensor(place: list, weights: list) -> list:
    """[layer][rank][slot] tokens: each expert's tokens split evenly over its copies (integers)."""
    out = []
    for lp, w in zip(place, weights):
        n: dict[int, int] = {}
        for slots in lp:
            for e in slots:
                n[e] = n.get(e, 0) + 1
        out.append([[w[e] // n[e] for e in slots] for slots in lp])
    return out


def placement_of(doc: dict) -> list:
    """[layer][device][slot] expert ids of an expert-map document (layers and devices in id order)."""
    layers = sorted(doc["layer_list"], key=lambda ly: ly["layer_id"])
    return [[d["device_expert"] for d in sorted(ly["device_list"], key=lambda d: d["device_id"])] for ly in layers]


def write_run(out: Path, place: list, weights: list, windows: int = 2, epoch: int | None = None) -> list[Path]:
    """An expert map (``expert_map_epoch<N>.json`` when ``epoch`` is given) and ``windows`` load
    windows on it (the window tokens are the weights split over the windows)."""
    out.mkdir(parents=True, exist_ok=True)
    name = "expert_map.json" if epoch is None else f"expert_map_epoch{epoch}.json"
    m = se.write_json(out / name, se.map_doc(place, epoch=epoch))
    t = tensor(place, [[x // windows for x in w] for w in weights])
    load = out / ("expert_load.json" if epoch is None else f"expert_load_epoch{epoch}.json")
    wins = [{"window": i, **({"epoch": epoch} if epoch is not None else {}), "load": t} for i in range(windows)]
    load.write_text(json.dumps({"kind": "expert_load", "windows": wins}, separators=(",", ":")), encoding="utf-8")
    return [m, load]


def write_loads(out: Path, place: list, weights: list, windows: int = 2) -> Path:
    """Only the load windows (``expert_load.json``) on ``place``, for a map that exists already."""
    out.mkdir(parents=True, exist_ok=True)
    t = tensor(place, [[x // windows for x in w] for w in weights])
    path = out / "expert_load.json"
    wins = [{"window": i, "load": t} for i in range(windows)]
    path.write_text(json.dumps({"kind": "expert_load", "windows": wins}, separators=(",", ":")), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """python tests/synth_eplb.py MAP OUT_DIR [--seed N]: skewed expert loads on an expert map's
    placement (the same logical loads for the same seed and shape, whatever the placement)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("map", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--windows", type=int, default=2)
    args = ap.parse_args(argv)
    place = placement_of(json.loads(args.map.read_text()))
    n_experts = max(e for lp in place for d in lp for e in d) + 1
    path = write_loads(args.out, place, expert_weights(len(place), n_experts, args.seed), args.windows)
    print(
        f"wrote {path}: {args.windows} windows of {len(place)} layers x {len(place[0])} ranks x "
        f"{len(place[0][0])} slots, {n_experts} logical experts (seed {args.seed})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
