-- name: clock-offsets
-- version: 1
-- description: Clock offset of each host against the host of the lowest rank, estimated from matched collective end times.
-- requires: clock_offsets
-- verdict: none
-- role: report
-- order: 50
-- shows: compare
-- headline: host | offset_ms | n_samples
-- summary: host {host}: {offset_ms} ms

SELECT host, offset_ms, n_samples FROM clock_offsets WHERE run = $run ORDER BY host
