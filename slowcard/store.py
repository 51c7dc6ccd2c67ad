"""The database: opening it, creating the schema, and the per-file bookkeeping of `sources`.

Owns: the DuckDB connection settings, the DDL (``schema.sql``, every ``ingest/*.sql`` and the
helper views in ``views/*.sql``), the built-in operator taxonomy rows, and the rule that one
file is one transaction. Must not know any file format.
"""

from __future__ import annotations

import hashlib
import importlib.resources as resources
import json
import os
import re
import shutil
import signal
import stat
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from . import lake, taxonomy, tempspace
from .errors import DatabaseBusy, UsageError

SCHEMA_VERSION = "1"
DEFAULT_LOCK_WAIT_S = 30.0


def lock_wait_from_env(raw: str | None) -> tuple[float, str | None]:
    """(seconds, warning) from SLOWCARD_LOCK_WAIT. A bad value must not kill every command at
    import (`--help` included): it falls back to the default and says so."""
    if raw is None or raw.strip() == "":
        return DEFAULT_LOCK_WAIT_S, None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0 <= value < 1e9):  # also refuses nan and inf
        return DEFAULT_LOCK_WAIT_S, (
            f"SLOWCARD_LOCK_WAIT={raw!r} is not a number of seconds >= 0; using {DEFAULT_LOCK_WAIT_S:.0f} s"
        )
    return value, None


# How long to wait for another process's lock on the database before giving up (seconds);
# SLOWCARD_LOCK_WAIT overrides it (a bad value is reported by the CLI, see LOCK_WAIT_WARNING).
LOCK_WAIT_S, LOCK_WAIT_WARNING = lock_wait_from_env(os.environ.get("SLOWCARD_LOCK_WAIT"))

# Source ids are handed out under this lock: the id is max(sequence, ids in use) + 1, and two
# threads reading it before either registers its id would share one (issue 16: after a crash
# the sequence is behind, and one file's failure cleanup then deleted the other file's rows).
_SID_LOCK = threading.Lock()
_FAULT_LOCK = threading.Lock()
_FAULT_HITS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Crash-test hook: SLOWCARD_FAULT=NAME:N[:SIG] sends this process SIG (default KILL; INT is
    Ctrl-C) the Nth time it reaches the point NAME, so a test kills or interrupts a command
    exactly where it means to (no sleeps)."""
    spec = os.environ.get("SLOWCARD_FAULT")
    if not spec:
        return
    want, _, rest = spec.partition(":")
    if want != name:
        return
    nth, _, sig = rest.partition(":")
    with _FAULT_LOCK:
        _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
        if _FAULT_HITS[name] == int(nth or 1):
            os.kill(os.getpid(), getattr(signal, f"SIG{sig or 'KILL'}"))


def _package_sql(folder: str | None) -> list[tuple[str, str]]:
    """(name, text) of every .sql file in a package folder, in name order."""
    root = resources.files("slowcard")
    if folder:
        root = root / folder
    return sorted((p.name, p.read_text(encoding="utf-8")) for p in root.iterdir() if p.name.endswith(".sql"))


def ddl_texts() -> list[tuple[str, str]]:
    """All DDL in the order it must run: core tables, format tables, helper views."""
    core = [("schema.sql", (resources.files("slowcard") / "schema.sql").read_text("utf-8"))]
    return core + _package_sql("ingest") + _package_sql("views")


def ddl_fingerprint() -> str:
    h = hashlib.sha256()
    for name, text in ddl_texts():
        h.update(name.encode())
        h.update(text.encode())
    h.update(taxonomy.builtin_text().encode())
    h.update(("materialized:" + ",".join(MATERIALIZED)).encode())
    return h.hexdigest()[:16]


_SURROGATE = re.compile("[\ud800-\udfff]")


def db_text(text: str) -> str:
    """A name or path from the OS as the database stores it. The OS gives bytes; Python keeps
    the bytes of a name that are not UTF-8 as lone surrogates (U+DC80..U+DCFF), which DuckDB
    cannot take (a traceback before issue 31). Each such byte becomes the text ``\\xNN`` (any
    other lone surrogate ``\\uXXXX``): the same name always gives the same text, and it prints as
    the bytes it was. Valid names are returned as they are."""
    if not _SURROGATE.search(text):
        return text

    def one(m: re.Match) -> str:
        code = ord(m.group())
        return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"

    return _SURROGATE.sub(one, text)


def check_db_name(path: str | Path) -> None:
    """UsageError for a database name DuckDB cannot open: one that is not UTF-8."""
    if str(path) != db_text(str(path)):
        raise UsageError(
            f"{db_text(str(path))}: the database's name is not valid UTF-8, and DuckDB opens UTF-8 "
            "names only; give --db a UTF-8 name (the files to ingest may keep theirs)"
        )


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Conflicting lock" in text or "Could not set lock" in text)


def connect(
    path: str | Path, read_only: bool = False, wait_s: float | None = None, config: dict | None = None
) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file, waiting up to ``wait_s`` seconds while another process holds it.

    Raises:
        DatabaseBusy: still locked after the wait; the message names the database and the holder.
    """
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    check_db_name(path)
    check_duckdb_file(path)
    # Never fetch or load extensions on the user's behalf: a SQLite or Postgres file given as --db
    # would otherwise make DuckDB download one (issue 16).
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False, **(config or {})}
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
            # DuckDB draws a progress bar on stdout for queries over ~2 s: stdout is the result
            con.execute("SET enable_progress_bar = false")
            if not read_only:
                # No checkpoint vacuum: every INSERT leaves partly filled row groups, and the
                # vacuum rewrites them all at the next checkpoint (8 files of 90 MB: +1.4 s on a
                # 4 s ingest and a 1.9x larger file; a .gz in 4 statements: +0.55 s). Row groups
                # of a replaced file are dropped whole at checkpoint without it (re-ingesting the
                # same files again and again keeps the file size bounded: tests/test_ingest_chrome.py).
                con.execute("SET max_vacuum_tasks = 0")
            return con
        except duckdb.IOException as exc:
            if not _is_lock_error(exc) or time.monotonic() >= deadline:
                if _is_lock_error(exc):
                    holder = str(exc).split("Conflicting lock is held in", 1)[-1].strip()
                    raise DatabaseBusy(
                        f"{path}: the database is locked by another process ({holder}) and "
                        f"stayed locked for {wait_s:.0f} s; wait for it to finish or use another --db"
                    ) from None
                raise UsageError(f"{path}: cannot open the database ({str(exc).splitlines()[0]})") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except duckdb.Error as exc:
            raise UsageError(
                f"{path}: cannot open the database ({str(exc).splitlines()[0]}); is it a slowcard DuckDB file?"
            ) from None


# What other files given as --db start with, for a message that says what the file is.
_OTHER_MAGIC = (
    (b"SQLite format 3\x00", "a SQLite database"),
    (b"PAR1", "a Parquet file"),
    (b"\x1f\x8b", "a gzip file"),
    (b"PK\x03\x04", "a zip file"),
)


def is_duckdb_file(path: str | Path) -> bool:
    """True when path is an existing DuckDB database file (its header says DUCK)."""
    try:
        with open(path, "rb") as f:
            return f.read(12)[8:12] == b"DUCK"
    except OSError:
        return False


def check_duckdb_file(path: str | Path) -> None:
    """Refuse, before DuckDB opens it, an existing file that is not a DuckDB database (DuckDB
    would try to load an extension for it, or fail with an internal message)."""
    if str(path) == ":memory:":
        return
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return  # a new database
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder; --db takes a DuckDB file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the database ({exc.strerror or exc})") from None
    if not head or head[8:12] == b"DUCK":
        return
    what = next((name for magic, name in _OTHER_MAGIC if head.startswith(magic)), "not a DuckDB database")
    raise UsageError(f"{path}: {what}, not a slowcard DuckDB database; give another --db (a new file name creates one)")


def check_ours(con, path: str | Path) -> None:
    """Refuse a DuckDB database that slowcard did not create, before anything writes to it: its
    tables are someone else's (an `events` table of theirs is not ours), and opening it must not
    add slowcard's 69 tables and views to it. An empty database is ours to fill."""
    try:  # ours: one row of `meta` answers (the listing below reads information_schema: ~15 ms)
        if con.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone():
            return
    except duckdb.Error:
        pass
    names = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() ORDER BY 1"
        ).fetchall()
    ]
    if not names:
        return
    if "meta" in names:
        try:
            if con.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone():
                return
        except duckdb.Error:
            pass
    shown = ", ".join(names[:5]) + (" …" if len(names) > 5 else "")
    raise UsageError(
        f"{path}: this DuckDB database was not created by slowcard (it holds {shown}); "
        "slowcard does not write into other databases: give another --db"
    )


def apply_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create or update every table and view; cheap when nothing changed (the DDL fingerprint
    stored in `meta` matches this version's)."""
    fp = ddl_fingerprint()
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'ddl_fingerprint'").fetchone()
        if row and row[0] == fp:
            return
    except duckdb.CatalogException:
        pass
    con.execute("BEGIN")
    try:
        _materialize_start(con)
        for _name, text in ddl_texts():
            # statement by statement, storing each view of MATERIALIZED as soon as it exists: the
            # views created after it then bind against its stored table, not its whole definition
            # (binding was most of the cost of a new database's schema: 0.27 -> 0.22 s)
            for stmt in duckdb.extract_statements(text):
                con.execute(stmt.query)
                m = _CREATE_VIEW.match(stmt.query)
                if m and m.group(1) in MATERIALIZED:
                    _materialize_view(con, m.group(1))
        lake.rebuild_views(con)  # the DDL wrote the views <table>_all over the tables alone
        taxonomy.load_builtin(con)
        rebuild_derived(con)
        con.execute(
            "INSERT OR REPLACE INTO meta VALUES ('ddl_fingerprint', ?), ('schema_version', ?)",
            [fp, SCHEMA_VERSION],
        )
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    refresh_materialized(con)  # stamps were cleared above: every run is refilled


# Cross-rank views that every EP / collective query reads, stored as tables (issue 17). As
# views, each query re-planned and re-ran their whole tree (a plan of ~1,200 operators for
# ep-slow-rank; 1.2 s for the 18 queries of a diagnose of the 4-rank example, half of it
# planning); stored, the same diagnose takes ~0.3 s plus ~0.15 s to fill them once.
# Each name V keeps its definition as the view ``_live_V``; V becomes ``SELECT * FROM _mat_V``,
# so a query (and every view built on V) reads the stored rows. Listed in dependency order
# (each after the views it reads; tests/test_store_materialized.py checks it); every one has a
# `run` column: the rows are refreshed per run, for the runs whose inputs changed (`_mat_stamps`).
# Per-layer, per-collective and per-rank views only: the per-operation ones (_ep_ops, _layer_ops)
# would store again a large part of op_class_rows; they stay views (read by the refresh only).
MATERIALIZED = (
    "_ep_sources",
    "_steps",
    "_layer_bounds",
    "_moe_layers_all",
    "moe_layers",
    "_layer_cuts",
    "moe_layer_facts",
    "_collectives",
    "_coll_matched",
    "clock_offsets",
    "collective_waits",
    "_layer_collectives",
)

# What the materialised views are computed from, per run: the run's files (their ids and the
# `sources` columns the views read) and the operator taxonomy (op_class_rows follow it). A file
# re-ingested gets a new source id, so any write that changes a run's rows changes its stamp.
_STAMP_SQL = """
WITH tax AS (
    SELECT coalesce(md5(string_agg(t::VARCHAR, ';' ORDER BY t::VARCHAR)), '') AS h FROM op_taxonomy t
)
SELECT s.run,
       md5(tax.h || string_agg(concat_ws(',', s.source_id, s.rank, s.status, s.format, s.host, s.path),
                               ';' ORDER BY s.source_id)) AS stamp
FROM sources s, tax
GROUP BY s.run, tax.h
"""

# Read-only connections opened by open_db: their stored views were brought up to date at open,
# and nothing can write while they are open (DuckDB's file lock), so queries skip the check.
_FRESH: weakref.WeakSet = weakref.WeakSet()


# The view a DDL statement creates (its text may start with comment lines).
_CREATE_VIEW = re.compile(r'(?:\s*--[^\n]*\n)*\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+"?(\w+)"?', re.I)


def _materialize_start(con) -> None:
    con.execute("CREATE TABLE IF NOT EXISTS _mat_stamps (run VARCHAR PRIMARY KEY, stamp VARCHAR NOT NULL)")
    con.execute("CREATE TABLE IF NOT EXISTS _mat_errors (run VARCHAR, view VARCHAR, message VARCHAR)")
    con.execute("DELETE FROM _mat_stamps")  # new definitions: every run is refilled


def _materialize_view(con, v: str) -> None:
    """Right after the DDL created view ``v`` (of MATERIALIZED): keep its definition as
    ``_live_V``, store its rows in ``_mat_V`` (filled by refresh_materialized) and make V read them."""
    con.execute(f'DROP VIEW IF EXISTS "_live_{v}"')
    con.execute(f'ALTER VIEW "{v}" RENAME TO "_live_{v}"')
    con.execute(f'CREATE OR REPLACE TABLE "_mat_{v}" AS SELECT * FROM "_live_{v}" LIMIT 0')
    con.execute(f'CREATE VIEW "{v}" AS SELECT * FROM "_mat_{v}"')


def _stale_runs(con) -> tuple[list[str], list[str]]:
    """(runs whose stored views are out of date, runs stored that no longer exist)."""
    current = dict(con.execute(_STAMP_SQL).fetchall())
    stored = dict(con.execute("SELECT run, stamp FROM _mat_stamps").fetchall())
    stale = sorted(r for r, s in current.items() if stored.get(r) != s)
    gone = sorted(r for r in stored if r not in current)
    return stale, gone


def materialized_stale(con) -> bool:
    """True when some run's stored views no longer match its files. False when nothing is stored:
    a database of an older version (its DDL fingerprint differs: apply_schema adds them) or a
    connection that is not to a slowcard database (a query run on tables of its own)."""
    try:
        stale, gone = _stale_runs(con)
    except duckdb.CatalogException:
        return False
    return bool(stale or gone)


def refresh_materialized(con) -> bool:
    """Recompute the stored views of the runs whose files or taxonomy changed since they were
    stored; False when all were up to date. All views and the stamps in one transaction (one
    commit instead of 13: ~60 ms of a small ingest); when a view fails on a run's data, again
    one transaction per view, so that the others keep their rows. Stamps are written last, so an
    interrupted refresh is redone at the next open (nothing reads the database while this
    writer holds it). A view that fails on a run's data (a query over it used to ERROR) leaves
    no rows for that run and its message in `_mat_errors`, and so do the stored views built on
    it; queries that read them report that message as their ERROR (queries.run_query)."""
    stale, gone = _stale_runs(con)
    if not stale and not gone:
        return False
    every = bool(not gone and stale and len(stale) == scalar(con, "SELECT count(DISTINCT run) FROM sources"))
    where, params = ("", []) if every else (" WHERE run IN (SELECT unnest(?::VARCHAR[]))", [stale + gone])
    con.execute("BEGIN")
    try:
        con.execute(f"DELETE FROM _mat_errors{where}", params)
        for v in MATERIALIZED:
            _refill_view(con, v, stale, every, where, params)
        _write_stamps(con)
    except duckdb.Error:
        con.execute("ROLLBACK")  # a view fails on this data: view by view below
        set_scope(con, None)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    else:
        # outside the handlers: a commit that fails (disk full) is not the data's fault, and
        # DuckDB has already ended the transaction; the caller reports it, stamps stay old
        con.execute("COMMIT")
        return True
    con.execute(f"DELETE FROM _mat_errors{where}", params)
    failed: dict[str, str] = {}
    for v in MATERIALIZED:
        reads = [w for w in failed if w in _reads(con, v)] if failed else []
        con.execute("BEGIN")
        try:
            _refill_view(con, v, [] if reads else stale, every, where, params)
        except duckdb.Error as exc:
            con.execute("ROLLBACK")
            con.execute(f'DELETE FROM "_mat_{v}"{where}', params)
            failed[v] = str(exc).splitlines()[0]
        except BaseException:
            con.execute("ROLLBACK")
            raise
        else:
            con.execute("COMMIT")
        if reads:
            failed[v] = failed[reads[0]]
    if failed:
        con.execute(
            "INSERT INTO _mat_errors SELECT unnest(?::VARCHAR[]) AS run, v.* FROM (SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])) v",
            [stale, list(failed), list(failed.values())],
        )
    con.execute("BEGIN")
    _write_stamps(con)
    con.execute("COMMIT")
    return True


def _refill_view(con, v: str, stale: list[str], every: bool, where: str, params: list) -> None:
    """Inside the caller's transaction: drop the stored rows of view ``v`` for the refreshed runs
    and store its rows of the ``stale`` runs again (none when ``stale`` is empty)."""
    con.execute(f'DELETE FROM "_mat_{v}"{where}', params)
    if stale and every:
        con.execute(f'INSERT INTO "_mat_{v}" BY NAME SELECT * FROM "_live_{v}"')
    elif stale:
        # run by run, each with the views scoped to it (scoped_sources): a run's refill
        # costs its own size, not the database's
        for r in stale:
            set_scope(con, r)
            try:
                con.execute(f'INSERT INTO "_mat_{v}" BY NAME SELECT * FROM "_live_{v}" WHERE run = ?', [r])
            finally:
                set_scope(con, None)


def _write_stamps(con) -> None:
    con.execute("DELETE FROM _mat_stamps")
    con.execute(f"INSERT INTO _mat_stamps {_STAMP_SQL}")


def set_scope(con, run: str | None) -> None:
    """Make this connection's views read ``run`` only (``scoped_sources`` in schema.sql), or every
    run again (None). SET VARIABLE takes no bound parameter: the run is a quoted literal."""
    if run is None:
        con.execute("RESET VARIABLE slowcard_scope")
    else:
        con.execute("SET VARIABLE slowcard_scope = '" + run.replace("'", "''") + "'")


def _reads(con, view: str) -> set[str]:
    """The stored views that the definition of ``view`` names."""
    row = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = ?", [f"_live_{view}"]).fetchone()
    text = row[0] if row else ""
    return {w for w in MATERIALIZED if re.search(rf"\b{w}\b", text)}


def stored_view_errors(con, run: str) -> dict[str, str]:
    """view -> the error its definition gave on this run's data at the last refresh."""
    try:
        return dict(con.execute("SELECT view, message FROM _mat_errors WHERE run = ?", [run]).fetchall())
    except duckdb.CatalogException:
        return {}


def ensure_fresh(con) -> None:
    """Before a query: bring the stored views up to date on a writable connection that wrote since
    (a read-only one from open_db is up to date). Raises UsageError on a read-only connection
    opened elsewhere whose stored views are out of date."""
    if con in _FRESH or not materialized_stale(con):
        return
    try:
        refresh_materialized(con)
    except duckdb.Error as exc:
        raise UsageError(
            "the database's stored views are out of date and this connection cannot update them "
            f"({str(exc).splitlines()[0]}); open the database with slowcard.open_db or run a slowcard command on it"
        ) from None


# Rows derived from a file's rows, written in the file's commit by a table macro of the views
# (views/10_classes.sql) and rebuilt when the taxonomy or the views change: (table, macro).
DERIVED = (("op_class_rows", "_op_classes_for"), ("a2a_split_rows", "_a2a_splits_for"))


def rebuild_derived(con) -> None:
    """Recompute the derived rows of every file (after a taxonomy or view change)."""
    files = con.execute("SELECT 1 FROM sources LIMIT 1").fetchone() is not None
    # Derived rows the Dask workers wrote to the lake follow the old taxonomy: they are forgotten
    # (their files go at the next Dask ingest's cleanup) and derived again in the database.
    lake.unregister(con, tables=[table for table, _macro in DERIVED])
    con.execute("DELETE FROM _name_classes")
    if files:
        classify_new_names(con, None)
    for table, macro in DERIVED:
        con.execute(f"DELETE FROM {table}")
        if not files:  # a new database: nothing to derive (planning the macro alone takes ~0.1 s)
            continue
        con.execute(
            f"INSERT INTO {table} SELECT * FROM {macro}(NULL) WHERE source_id IN (SELECT source_id FROM sources)"
        )


def classify_new_names(con, sids: Sequence[int] | None) -> None:
    """Add to ``_name_classes`` the taxonomy's answer for the names of files ``sids`` (every file:
    None) that it does not hold yet; the classification is planned only when there are some."""
    new = f"SELECT name FROM _names_of({_sids_literal(sids)}) WHERE name NOT IN (SELECT name FROM _name_classes)"
    if con.execute(f"{new} LIMIT 1").fetchone() is None:
        return
    # matching is paid for the new names only (the rule takes them as one list)
    con.execute(
        f"""INSERT INTO _name_classes
            SELECT name, op_class, coll_kind, pattern
            FROM _classify_names((SELECT list(name) FROM ({new})))"""
    )


def derive_rows(con, sids: Sequence[int]) -> None:
    """Write the derived rows (DERIVED) of files ``sids``, their new names classified first: one
    statement per table for all of them (a batch whose rows went in through one INSERT shares
    row groups, so one scan per file would read the others' rows again)."""
    classify_new_names(con, sids)
    for table, macro in DERIVED:
        con.execute(f"INSERT INTO {table} SELECT * FROM {macro}({_sids_literal(sids)})")


def _sids_literal(sids: Sequence[int] | None) -> str:
    """Source ids written into the statement as a list literal, not bound: the planner then sees
    the values, so ``_in_files(source_id, sids)`` in the table macros folds to a range filter on
    source_id that skips other files' row groups (bench/README.md)."""
    return "NULL" if sids is None else "[" + _sids_csv(sids) + "]"


def _sids_csv(sids: Sequence[int]) -> str:
    """Source ids as a comma-separated literal, for ``source_id IN (...)``."""
    return ", ".join(str(int(s)) for s in sids)


def cache_dir() -> Path | None:
    """Where slowcard keeps what it can rebuild at any time (the empty-schema database):
    ``$SLOWCARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/slowcard``, else ``~/.cache/slowcard``.
    None when ``SLOWCARD_CACHE_DIR`` is set to an empty string (no cache)."""
    own = os.environ.get("SLOWCARD_CACHE_DIR")
    if own is not None:
        return Path(own) if own.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slowcard"


# The schema template (a new database is a copy of it) lives in a folder of its own inside the
# cache folder, which only slowcard writes: a user's files beside it are never read, trusted or
# pruned. A template's name carries the version key and the sha256 of its bytes,
# ``schema-<key>-<sha16>.duckdb``: it is published only after its content was checked (an empty
# database of this schema: schema fingerprint, no run and no row, the built-in taxonomy intact:
# ``template_problem``), and every copy is hashed as it is made: a copy whose bytes do not hash
# to the name is never used (the template is dropped, the schema created in place).
# (Before issue 31 a slowcard database or a symlink to one at the template path seeded every new
# database with its runs, and someone else's DuckDB file there refused every new --db.)
TEMPLATE_FOLDER = "schema-templates"
_TEMPLATE_NAME = re.compile(r"^schema-(?P<key>[0-9a-f]{16})-(?P<sha>[0-9a-f]{16})\.duckdb$")
# Template versions kept (one per slowcard / DuckDB version pair in use); older ones go.
_TEMPLATES_KEPT = 4
# The only tables an empty database of this schema holds rows in.
_TEMPLATE_FILLED = {"meta", "op_taxonomy"}


def _template_key() -> str:
    """What a new database's schema depends on: the DDL and taxonomy (ddl_fingerprint), the code
    here that applies them, and the DuckDB version that writes the file."""
    h = hashlib.sha256(ddl_fingerprint().encode())
    h.update(Path(__file__).read_bytes())
    h.update(duckdb.__version__.encode())
    return h.hexdigest()[:16]


def _template_folder(create: bool) -> Path | None:
    """The template folder: a real folder (not a link) owned by this user, created private;
    None when there is no cache or the folder is not ours."""
    base = cache_dir()
    if base is None:
        return None
    folder = base / TEMPLATE_FOLDER
    try:
        if create:
            folder.mkdir(parents=True, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    return folder


def _own_templates(folder: Path) -> list[tuple[Path, str, str, float]]:
    """(path, key, sha16, mtime) of the files in the template folder that slowcard wrote: named
    as templates, regular files (no link), owned by this user, one link."""
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        m = _TEMPLATE_NAME.match(entry.name)
        if not m:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_nlink == 1:
            out.append((Path(entry.path), m.group("key"), m.group("sha"), st.st_mtime))
    return out


def _sha16(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def template_problem(con) -> str | None:
    """Why a database is not an empty database of this version's schema (None: it is one)."""
    try:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if meta != {"ddl_fingerprint": ddl_fingerprint(), "schema_version": SCHEMA_VERSION}:
            return "its schema fingerprint is not this version's"
        filled = {
            r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE estimated_size > 0").fetchall()
        }
        if filled - _TEMPLATE_FILLED:
            return f"it holds rows ({', '.join(sorted(filled - _TEMPLATE_FILLED)[:3])})"
        rows = con.execute(
            "SELECT pattern, op_class, coll_kind, priority, origin FROM op_taxonomy ORDER BY ALL"
        ).fetchall()
    except duckdb.Error as exc:
        return f"it does not read as one ({str(exc).splitlines()[0]})"
    want = sorted((*r, "builtin") for r in taxonomy.parse(taxonomy.builtin_text(), "slowcard/taxonomy.csv"))
    if sorted(rows, key=repr) != sorted(want, key=repr):
        return "its operator taxonomy is not the built-in one"
    return None


def schema_template() -> Path | None:
    """The cached empty database with this version's schema, built on first use (a new database's
    schema costs ~0.15-0.25 s to create and ~0.02 s to copy: the fixed cost of every `diagnose`
    into a new --db, of every Dask worker's file). None when there is no usable cache folder; the
    caller then creates the schema itself. Never raises. A new template is checked before it is
    published; its copies are hashed against its name (``_copy_schema_template``)."""
    folder = _template_folder(create=True)
    if folder is None:
        return None
    key = _template_key()
    mine = sorted((t for t in _own_templates(folder) if t[1] == key), key=lambda t: t[3], reverse=True)
    if mine:
        return mine[0][0]
    tempspace.clean_stale([folder])  # builds cut short by a kill
    try:
        work = tempspace.make_dir("template", folder)
    except OSError:
        return None
    try:
        tmp = work / "template.duckdb"
        con = connect(tmp, wait_s=0)
        try:
            apply_schema(con)
        finally:
            con.close()
        if Path(f"{tmp}.wal").exists():  # not checkpointed: the file alone is not the database
            return None
        con = connect(tmp, read_only=True, wait_s=0)
        try:
            if template_problem(con) is not None:
                return None
        finally:
            con.close()
        path = folder / f"schema-{key}-{_sha16(tmp)}.duckdb"
        os.replace(tmp, path)  # whole or absent: concurrent builders each publish a complete file
    except (OSError, duckdb.Error, UsageError):
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune_templates(folder, key)
    return path


def _prune_templates(folder: Path, key: str) -> None:
    """Keep the newest template of this key and of the _TEMPLATES_KEPT - 1 newest other keys;
    only files slowcard wrote in its own folder (``_own_templates``) are ever removed."""
    newest: dict[str, float] = {}
    own = sorted(_own_templates(folder), key=lambda t: t[3], reverse=True)
    for _path, k, _sha, mtime in own:
        newest.setdefault(k, mtime)
    keep_keys = [key] + [k for k in sorted(newest, key=lambda k: newest[k], reverse=True) if k != key]
    keep_keys = keep_keys[:_TEMPLATES_KEPT]
    seen: set[str] = set()
    for path, k, _sha, _mtime in own:
        if k in keep_keys and k not in seen:
            seen.add(k)
            continue
        try:  # another process may be pruning too
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _drop_template(template: Path) -> None:
    """A template that failed its check goes (it is rebuilt at the next new database)."""
    folder = _template_folder(create=False)
    if folder is not None and template.parent == folder and _TEMPLATE_NAME.match(template.name):
        try:
            template.unlink(missing_ok=True)
        except OSError:
            pass


def _copy_schema_template(path: str | Path) -> bool:
    """Create the new database ``path`` as a copy of the schema template, hashed as it is copied;
    False (nothing written) when ``path`` exists, is in memory, there is no template, or the
    bytes do not hash to the template's name (then it is dropped, and the caller creates the
    schema in place)."""
    if str(path) == ":memory:" or Path(path).exists():
        return False
    template = schema_template()
    if template is None:
        return False
    m = _TEMPLATE_NAME.match(template.name)
    if m is None:
        return False
    # copied into a temporary folder beside the database (owned by this process: tempspace),
    # hashed, then linked into place: another process opening the same new path
    # meanwhile finds no file or a whole, checked one, and never loses its own
    try:
        work = tempspace.make_dir("template", Path(path).parent, hidden=True)
    except OSError:
        return False
    try:
        tmp = work / "copy.duckdb"
        h = hashlib.sha256()
        with open(template, "rb") as src, open(tmp, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                dst.write(block)
        if h.hexdigest()[:16] != m.group("sha"):  # changed since slowcard checked and wrote it
            _drop_template(template)
            return False
        os.link(tmp, path)
    except OSError:  # FileExistsError: another process created it first; or no hard links here
        return False
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return True


def open_db(path: str | Path, read_only: bool = False, wait_s: float | None = None):
    """Open the database for writing (schema applied) or for reading (schema refreshed first
    when this slowcard version's views differ from the ones stored in the file)."""
    path = Path(path)
    check_db_name(path)  # before anything is created under that name
    if read_only:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such database; run `slowcard ingest PATH --db {path}` first")
        con = connect(path, read_only=True, wait_s=wait_s)
        try:
            check_ours(con, path)
        except UsageError:
            con.close()
            raise
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'ddl_fingerprint'").fetchone()
        except duckdb.CatalogException:
            row = None
        if row is None or row[0] != ddl_fingerprint() or materialized_stale(con):
            con.close()
            con = connect(path, wait_s=wait_s)
            apply_schema(con)
            refresh_materialized(con)
            con.close()
            con = connect(path, read_only=True, wait_s=wait_s)
        _FRESH.add(con)
        return con
    _copy_schema_template(path)  # a checked copy, or nothing (the schema is then created here)
    con = connect(path, wait_s=wait_s)
    try:
        check_ours(con, path)
    except UsageError:
        con.close()
        raise
    apply_schema(con)  # one read of `meta` on a database copied from the template
    clean_pending(con)
    # Temp folders of killed ingests: part files in /dev/shm, Dask staging beside the database.
    tempspace.clean_stale(tempspace.default_roots() + [path.resolve().parent])
    return con


def one_row(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple[Any, ...]:
    """The first row of a query that always returns one (an aggregate, ``RETURNING`` of one
    insert). ``fetchone()`` is typed Optional; a missing row here is a bug, so say which query."""
    row = con.execute(sql, params).fetchone()
    if row is None:
        raise RuntimeError(f"query returned no row: {' '.join(sql.split())[:200]}")
    return row


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> Any:
    """The first column of ``one_row``."""
    return one_row(con, sql, params)[0]


def fingerprint_file(path: Path, size: int) -> str:
    """sha256 over the size, the first MiB and the last MiB: cheap on GB files and enough to
    tell a re-written file from the same file ingested twice."""
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > (2 << 20):
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()[:32]


def row_tables(con) -> list[str]:
    """Every base table that holds per-file rows (it has a source_id column), but `sources`."""
    return [
        r[0]
        for r in con.execute(
            """SELECT c.table_name FROM information_schema.columns c
               JOIN information_schema.tables t USING (table_schema, table_name)
               WHERE c.column_name = 'source_id' AND t.table_type = 'BASE TABLE'
                 AND c.table_name <> 'sources' AND c.table_schema = 'main'
                 AND NOT starts_with(c.table_name, '_mat_')  -- stored views: refreshed per run
                 AND c.table_name <> 'lake_files'  -- the lake's registry: lake.unregister
               ORDER BY 1"""
        ).fetchall()
    ]


def ensure_run(con, run: str, root_path: str | None) -> None:
    run, root_path = db_text(run), None if root_path is None else db_text(root_path)
    con.execute(
        "INSERT INTO runs (run, root_path, created_at) SELECT ?, ?, now() "
        "WHERE NOT EXISTS (SELECT 1 FROM runs WHERE run = ?)",
        [run, root_path, run],
    )


def new_source_id(con) -> int:
    """A fresh source id, registered as pending until its `sources` row is committed.

    A file's rows are written under this id outside any long transaction; they stay invisible
    (views join `sources`) until ``commit_source`` publishes them, and a killed ingest leaves
    only pending rows that the next write-open removes.
    """
    # A sequence value handed out before a crash can be handed out again after it (DuckDB does
    # not persist uncommitted sequence steps), so never go below what is already in use. Read
    # and registered (autocommit) under one lock: the next thread sees this id as in use.
    with _SID_LOCK:
        sid = con.execute(
            """SELECT greatest(nextval('source_id_seq'),
                               (SELECT coalesce(max(source_id), 0) + 1 FROM sources),
                               (SELECT coalesce(max(source_id), 0) + 1 FROM pending_sources))"""
        ).fetchone()[0]
        con.execute("INSERT INTO pending_sources VALUES (?, now())", [sid])
    fault_point("pending")
    return sid


def new_source_ids(con, n: int) -> list[int]:
    """``n`` fresh source ids at once, each registered as pending as ``new_source_id`` does, in
    ONE autocommit statement pair (a batch of files: one WAL flush instead of one per file).
    Ids a caller ends up not using are released with ``release_source_ids``."""
    if n <= 0:
        return []
    with _SID_LOCK:
        first = con.execute(
            """SELECT greatest(nextval('source_id_seq'),
                               (SELECT coalesce(max(source_id), 0) + 1 FROM sources),
                               (SELECT coalesce(max(source_id), 0) + 1 FROM pending_sources))"""
        ).fetchone()[0]
        ids = list(range(first, first + n))
        # registered as pending, they are in use: new_source_id reads past them (max + 1)
        con.execute("INSERT INTO pending_sources SELECT range, now() FROM range(?, ?)", [first, first + n])
    return ids


def release_source_ids(con, sids: Sequence[int]) -> None:
    """Pending ids handed out and never used (no row was written under them): unregistered."""
    if sids:
        con.execute(f"DELETE FROM pending_sources WHERE source_id IN ({_sids_csv(sids)})")


def discard_source(con, sid: int) -> None:
    """Remove every row written under a source id that will not be committed. An id that is
    committed in `sources` is never touched (a cleanup must not delete someone's rows)."""
    if con.execute("SELECT 1 FROM sources WHERE source_id = ?", [sid]).fetchone():
        con.execute("DELETE FROM pending_sources WHERE source_id = ?", [sid])
        return
    for table in row_tables(con):
        con.execute(f'DELETE FROM "{table}" WHERE source_id = ?', [sid])
    con.execute("DELETE FROM pending_sources WHERE source_id = ?", [sid])


@contextmanager
def discard_on_error(con, sid: int):
    """Write a file's rows under ``sid``: on any exception, remove what was written (a failed
    discard is left to clean_pending at the next open) and re-raise for the caller to report."""
    try:
        yield
    except BaseException:
        try:
            discard_source(con, sid)
        except duckdb.Error:
            pass
        raise


def clean_pending(con) -> int:
    """Drop rows of ingests that never committed (killed processes). Returns how many ids."""
    ids = [r[0] for r in con.execute("SELECT source_id FROM pending_sources").fetchall()]
    for sid in ids:
        discard_source(con, sid)
    return len(ids)


def claim_source(con, run: str, path: str, size: int, fingerprint: str) -> int:
    """Test helper for format modules: create (or reuse) the `sources` row of (run, path) inside
    the caller's transaction and clear its old rows. The ingest driver uses new_source_id +
    commit_source instead."""
    run, path = db_text(run), db_text(path)
    row = con.execute("SELECT source_id FROM sources WHERE run = ? AND path = ?", [run, path]).fetchone()
    if row:
        sid = row[0]
        for table in row_tables(con):
            con.execute(f'DELETE FROM "{table}" WHERE source_id = ?', [sid])
        return sid
    sid = con.execute("SELECT nextval('source_id_seq')").fetchone()[0]
    con.execute(
        "INSERT INTO sources (source_id, run, path, size_bytes, fingerprint, status) VALUES (?, ?, ?, ?, ?, 'ok')",
        [sid, run, path, size, fingerprint],
    )
    return sid


@dataclass
class SourceRecord:
    """What ends up in the `sources` row of one file."""

    format: str
    rows_seen: int
    rows_kept: int
    rows_dropped: int
    status: str
    message: str
    metadata: dict
    base_time_ns: int = 0
    rank: int | None = None
    rank_source: str | None = None
    dp_rank: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    ep_rank: int | None = None
    world_size: int | None = None
    host: str | None = None


@dataclass
class Commit:
    """One file's commit: what ``commit_source`` publishes for it (see there)."""

    sid: int
    run: str
    path: str
    size: int
    fingerprint: str
    rec: SourceRecord
    drops: Sequence[tuple[str, Any, int]] = ()
    cell_drops: Sequence[tuple[str, Any, int]] = ()
    lake_files: Sequence[tuple[str, str, int]] = ()


def commit_source(
    con,
    sid: int,
    run: str,
    path: str,
    size: int,
    fingerprint: str,
    rec: SourceRecord,
    drops: Sequence[tuple[str, Any, int]],
    cell_drops: Sequence[tuple[str, Any, int]] = (),
    derive: bool = True,
    lake_files: Sequence[tuple[str, str, int]] = (),
) -> None:
    """Publish a file's rows in one short transaction: the previous ingest of the same (run, path),
    if any, disappears and this one appears, or (on any error) nothing changes. ``derive``: write
    its derived rows here (False: derive_rows already wrote them under its pending id, or they
    are in ``lake_files``). ``lake_files``: (table, path, rows) of the file's rows written as
    Parquet (slowcard/lake.py), registered in this same transaction."""
    commit_sources(con, [Commit(sid, run, path, size, fingerprint, rec, drops, cell_drops, lake_files)], derive)


def commit_sources(con, commits: Sequence[Commit], derive: bool = True) -> None:
    """Publish several files in ONE transaction (a batch of files whose ingest all succeeded,
    ingest/_shared.py): each as ``commit_source`` does, by one statement per step for all of them
    (their `sources` rows, their derived rows by table). All of them appear, or (on any error)
    none: a caller that wants the others kept when one fails commits them one by one then. Every
    write commit is a WAL flush, and 64 files' statements one by one took ~0.5 s (bench/README
    "Many small rank files"): both are paid once for the batch."""
    if not commits:
        return
    rows = [_source_row(c) for c in commits]
    sids = [c.sid for c in commits]
    replaced: list[str] = []
    con.execute("BEGIN")
    try:
        # the previous ingest of the same (run, path), if any, disappears
        named, keys = json_rows((("run", "VARCHAR"), ("path", "VARCHAR")), [r[1:3] for r in rows])
        olds = [
            r[0]
            for r in con.execute(
                f"SELECT s.source_id FROM sources s JOIN (SELECT {named}) b ON s.run = b.run AND s.path = b.path",
                [keys],
            ).fetchall()
        ]
        if olds:
            replaced += lake.unregister(con, sids=olds)
            for table in dict.fromkeys(row_tables(con) + ["source_drops", "sources"]):
                con.execute(f'DELETE FROM "{table}" WHERE source_id IN ({_sids_csv(olds)})')
        named, values = json_rows(_SOURCE_COLUMNS, rows)
        columns = ", ".join(name for name, _type in _SOURCE_COLUMNS)
        con.execute(f"INSERT INTO sources ({columns}, ingested_at) SELECT {named}, now()", [values])
        ledger = [entry for c in commits for entry in _ledger(c)]
        if ledger:
            named, values = json_rows(_LEDGER_COLUMNS, ledger)
            columns = ", ".join(name for name, _type in _LEDGER_COLUMNS)
            con.execute(f"INSERT INTO source_drops ({columns}) SELECT {named}", [values])
        # Derived rows, in the same transaction so that they appear with the files (a batch that
        # derived them already, under the still pending ids, passes derive=False).
        if derive:
            derive_rows(con, sids)
        for c in commits:
            lake.register(con, c.sid, c.lake_files)
        con.execute(f"DELETE FROM pending_sources WHERE source_id IN ({_sids_csv(sids)})")
        for c in commits:
            fault_point("commit")
            if c.lake_files:
                fault_point("lake_commit")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    # outside the handler: a commit that fails (disk full) has already ended the transaction,
    # and its own message is the one to report
    con.execute("COMMIT")
    lake.delete_files(replaced)  # the replaced ingests' Parquet: no view reads it any more
    for _c in commits:
        fault_point("committed")


# The columns of a `sources` row as _source_row lists them, and of a `source_drops` row (_ledger).
_SOURCE_COLUMNS = (
    ("source_id", "INTEGER"),
    ("run", "VARCHAR"),
    ("path", "VARCHAR"),
    ("size_bytes", "BIGINT"),
    ("fingerprint", "VARCHAR"),
    ("format", "VARCHAR"),
    ("rank", "INTEGER"),
    ("rank_source", "VARCHAR"),
    ("dp_rank", "INTEGER"),
    ("tp_rank", "INTEGER"),
    ("pp_rank", "INTEGER"),
    ("ep_rank", "INTEGER"),
    ("world_size", "INTEGER"),
    ("host", "VARCHAR"),
    ("base_time_ns", "BIGINT"),
    ("rows_seen", "BIGINT"),
    ("rows_kept", "BIGINT"),
    ("rows_dropped", "BIGINT"),
    ("status", "VARCHAR"),
    ("message", "VARCHAR"),
    ("metadata", "VARCHAR"),
)
_LEDGER_COLUMNS = (
    ("source_id", "INTEGER"),
    ("reason", "VARCHAR"),
    ("position", "VARCHAR"),
    ("n_rows", "BIGINT"),
    ("scope", "VARCHAR"),
)


def json_rows(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]], param: str = "?") -> tuple[str, str]:
    """Rows for a statement as ONE parameter: (a select list that unnests them into the named,
    typed ``columns``, the JSON text to bind to its ``param``). DuckDB's Python client converts
    every bound value on its own (~70 µs each): a batch of 64 files' `sources` rows took 0.09 s as
    1,408 parameters (or as 21 list parameters), and 4 ms as one JSON text that DuckDB parses."""
    spec = json.dumps([{name: sql_type for name, sql_type in columns}])
    text = json.dumps([dict(zip((name for name, _type in columns), row)) for row in rows])
    return f"unnest(from_json({param}, '{spec}'), recursive := true)", text


def _source_row(c: Commit) -> list[Any]:
    """The `sources` row of a commit (but ingested_at), in _SOURCE_COLUMNS' order (the record's
    fields carry the columns' names), names as the database stores them (db_text)."""
    values = {k: db_text(v) if isinstance(v, str) else v for k, v in vars(c.rec).items()}
    values.update(
        source_id=c.sid,
        run=db_text(c.run),
        path=db_text(c.path),
        size_bytes=c.size,
        fingerprint=c.fingerprint,
        metadata=json.dumps(c.rec.metadata, default=str),
    )
    return [values[name] for name, _type in _SOURCE_COLUMNS]


def _ledger(c: Commit) -> list[tuple[int, str, Any, int, str]]:
    """The `source_drops` rows of a commit: what it dropped, by row and by cell."""
    out = []
    for scope, entries in (("row", c.drops), ("cell", c.cell_drops)):
        out += [(c.sid, db_text(r), p if p is None else db_text(str(p)), n, scope) for r, p, n in entries]
    return out


def load_user_taxonomy(con, path: str | Path) -> int:
    """Add (or replace, by pattern) user op-name patterns from a CSV file (``taxonomy.csv``'s
    columns) and rebuild what is derived from the taxonomy, in one transaction. Returns how many.

    Here and not in ``taxonomy`` so that imports flow downward (store uses taxonomy, never back).
    """
    rows = taxonomy.read_user_taxonomy(con, path)
    con.execute("BEGIN")
    try:
        taxonomy.replace_user_rows(con, rows)
        rebuild_derived(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(rows)
