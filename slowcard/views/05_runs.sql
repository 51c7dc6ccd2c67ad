-- Run-level checks that the cross-rank views depend on.

-- Ranks claimed by more than one file of the same format in one run: two jobs, or two
-- profiling sessions of one job, ingested as one run. Matching collectives or MoE layer
-- instances across ranks would then pair calls of different jobs (and give a rank two rows per
-- instance), so the cross-rank views (_collectives, _ep_sources) leave such runs out and the
-- queries that need them SKIP, naming the conflict. A rank with a trace AND an operator CSV is
-- not a conflict (different formats of one rank).
CREATE OR REPLACE VIEW rank_conflicts AS
SELECT run, rank, format, count(*) AS n_files, list(path ORDER BY path) AS paths
FROM scoped_sources
WHERE rank IS NOT NULL AND status <> 'failed'
  AND format IN ('kineto', 'ascend_trace', 'chrome_array', 'kernel_details', 'op_summary')
GROUP BY run, rank, format
HAVING count(*) > 1;
