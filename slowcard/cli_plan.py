"""The `plan` commands (added to the typer app by ``register(app)``): `plan eplb` writes a new
expert placement as the expert map vLLM-Ascend and MindIE load (slowcard/eplb_plan.py), or with
``--check`` checks an existing map, and prints each layer's peak/avg now and under the map.

Exit codes: 0 the map was written (or checked) and is sound; 1 it breaks an invariant of the
format (nothing written); 2 usage or input error (unknown run, no expert loads, a cap the new
slots do not fit in).
"""

from __future__ import annotations

from pathlib import Path

import typer

from . import queries as queries_mod
from .cli_common import DEFAULT_DB, Commands, DbOption, LimitOption, RunOption, check_format, fail, pick_run


def _rows(reps, kept: dict, added: dict) -> list[list]:
    out = []
    for r in sorted(reps, key=lambda r: (-(r.current_max - r.new_max), r.layer)):
        saved = 1 - r.new_max / r.current_max if r.current_max else 0.0
        out.append(
            [
                r.layer,
                round(r.current_par, 3),
                round(r.new_par, 3),
                round(100 * saved, 1),
                r.moves,
                "kept as it is"
                if kept.get(r.layer)
                else (", ".join(f"E{e}" for e in added.get(r.layer, [])[:4]) or "-")
                + (" …" if len(added.get(r.layer, [])) > 4 else ""),
            ]
        )
    return out


COLUMNS = ["layer", "peak/avg now", "planned", "saved %", "moved", "copies added"]


def register(app: typer.Typer) -> None:
    """Add the `plan` command group (`plan eplb`) to ``app``."""
    plan_app = typer.Typer(
        cls=Commands,
        no_args_is_help=True,
        help="Write a fix as the file the service loads: `plan eplb` an expert map from the measured expert loads.",
    )
    app.add_typer(plan_app, name="plan")

    @plan_app.command("eplb")
    def plan_eplb(
        out: Path | None = typer.Option(None, "--out", "-o", help="Expert map JSON to write (expert_map.json)."),
        db: DbOption = Path(DEFAULT_DB),
        run: RunOption = None,
        mode: str = typer.Option(
            "both",
            "--mode",
            help="both | replace (move experts only) | replicate (change only which experts get copies).",
        ),
        redundant_per_rank: int | None = typer.Option(
            None,
            "--redundant-per-rank",
            help="Redundant slots per device for copies (slots = experts / ranks + this; default: as in force).",
        ),
        max_moves: int | None = typer.Option(
            None, "--max-moves", help="Per layer, at most this many experts copied to a device that lacks them."
        ),
        min_gain: float = typer.Option(
            0.02, "--min-gain", help="A layer whose peak cannot fall by this share keeps its placement."
        ),
        check: Path | None = typer.Option(
            None, "--check", help="Check and replay this existing expert map instead of planning one."
        ),
        fmt: str = typer.Option("table", "--format", "-f", help="table | json"),
        limit: LimitOption = 20,
    ):
        """Write a new expert placement, planned from the run's measured expert loads, as the
        expert map vLLM-Ascend and MindIE load; validated and replayed on the loads.

        The loads are those of the run's latest EPLB epoch; the map (vLLM-Ascend
        expert_map.json, MindIE *_global_deployment.json) places every logical expert, keeps the
        slots per device in force (or experts / ranks + --redundant-per-rank), never puts an
        expert twice on one device, and moves at most --max-moves experts per layer. Printed:
        each layer's peak/avg now and planned, the experts moved, and the MoE time saved.

        Examples:
            slowcard plan eplb --db ep.duckdb --out expert_map.json
            slowcard plan eplb --db ep.duckdb --out expert_map.json --max-moves 8 --redundant-per-rank 1
            slowcard plan eplb --db ep.duckdb --check expert_map.json
        """
        import orjson

        from . import eplb_plan as ep

        check_format(fmt, ("table", "json"))
        if (out is None) == (check is None):
            fail("give --out FILE to write a plan, or --check FILE to check an existing map")
        con = queries_mod.open_readonly(db)
        try:
            chosen = pick_run(con, run)
            loads = ep.read_loads(con, chosen)
        finally:
            con.close()
        kept: dict = {}
        added: dict = {}
        if check is not None:
            try:
                doc = orjson.loads(check.read_bytes())
            except orjson.JSONDecodeError as exc:
                fail(f"{check}: not valid JSON ({exc}); an expert map is one JSON object")
            except OSError as exc:
                fail(f"{check}: cannot read it ({exc.strerror or exc})")
            devs = doc.get("layer_list", [{}])[0].get("device_list", [{}]) if isinstance(doc, dict) else [{}]
            first = devs[0].get("device_expert") if devs and isinstance(devs[0], dict) else None
            slots = len(first) if isinstance(first, list) else loads.slots_per_device
            target = check
        else:
            p = ep.plan(loads, mode, redundant_per_rank, max_moves, min_gain)
            doc = ep.to_expert_map(p)
            slots = p.slots_per_device
            kept = {lp.layer: lp.kept for lp in p.layers}
            added = {lp.layer: lp.replicas_added for lp in p.layers}
            assert out is not None
            target = out
        problems = ep.validate(doc, loads, slots)
        if problems:
            for msg in problems[:20]:
                typer.echo(f"{target}: {msg}", err=True)
            more = f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""
            fail(
                f"{target}: {len(problems)} problem(s){more}"
                + ("; the plan was not written" if check is None else "; slowcard would not write such a map"),
                1,
            )
        reps = ep.replay(doc, loads)
        cur = sum(r.current_max for r in reps)
        saved = 1 - sum(r.new_max for r in reps) / cur if cur else 0.0
        if check is None:
            from .outfile import atomic_output

            try:
                with atomic_output(target) as f:
                    f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
            except OSError as exc:
                fail(f"{target}: cannot write the expert map ({exc.strerror or exc})")
        n = len(reps)
        summary: dict = {
            "run": chosen,
            "epoch": loads.epoch,
            "windows": loads.windows,
            "map": str(target),
            "written": check is None,
            "layers": n,
            "devices": len(loads.layers[0].devices),
            "slots_per_device": slots,
            "logical_experts": loads.n_experts,
            "mode": None if check is not None else mode,
            "max_moves": max_moves,
            "peak_avg_now": round(sum(r.current_par for r in reps) / n, 3),
            "peak_avg_planned": round(sum(r.new_par for r in reps) / n, 3),
            "moe_time_saved_pct": round(100 * saved, 1),
            "experts_moved": sum(r.moves for r in reps),
            "layers_kept": sum(1 for r in reps if r.moves == 0),
        }
        if fmt == "json":
            summary["per_layer"] = [dict(zip(COLUMNS, row)) for row in _rows(reps, kept, added)]
            typer.echo(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
            raise typer.Exit(0)
        from tabulate import tabulate

        rows = _rows(reps, kept, added)
        shown = rows if limit <= 0 else rows[:limit]
        typer.echo(
            f"run {chosen!r}, epoch {loads.epoch}, {loads.windows} window(s): {n} layers x {summary['devices']} devices "
            f"x {slots} slots, {loads.n_experts} logical experts"
        )
        typer.echo(tabulate(shown, headers=COLUMNS, tablefmt="simple"))
        if len(shown) < len(rows):
            typer.echo(f"({len(rows) - len(shown)} more layers: --limit 0 shows all)")
        typer.echo(
            f"overall: peak/avg {summary['peak_avg_now']} now -> {summary['peak_avg_planned']} planned (mean over layers), "
            f"{summary['moe_time_saved_pct']} % of MoE time saved, {summary['experts_moved']} expert(s) moved, "
            f"{summary['layers_kept']} layer(s) unchanged"
        )
        verb = "wrote" if check is None else "checked"
        typer.echo(
            f"{verb} {target}: valid (every logical expert placed, {slots} slots on each of the {summary['devices']} "
            "devices, no expert twice on one device, no copy of a cold expert added)"
        )
        raise typer.Exit(0)
