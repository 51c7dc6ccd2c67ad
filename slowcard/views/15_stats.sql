-- Statistics shared by the verdict queries (plain DuckDB SQL: DuckDB has no normal CDF).

-- Upper tail of the standard normal, P(Z >= z): Abramowitz & Stegun 26.2.17 (|error| < 7.5e-8).
CREATE OR REPLACE MACRO _normal_upper_p(z) AS
    CASE WHEN z >= 0
         THEN exp(-z * z / 2) / sqrt(2 * pi()) * (1 / (1 + 0.2316419 * z)) * (0.319381530 + (1 / (1 + 0.2316419 * z)) * (-0.356563782
              + (1 / (1 + 0.2316419 * z)) * (1.781477937 + (1 / (1 + 0.2316419 * z)) * (-1.821255978 + (1 / (1 + 0.2316419 * z)) * 1.330274429))))
         ELSE 1 - exp(-z * z / 2) / sqrt(2 * pi()) * (1 / (1 - 0.2316419 * z)) * (0.319381530 + (1 / (1 - 0.2316419 * z)) * (-0.356563782
              + (1 / (1 - 0.2316419 * z)) * (1.781477937 + (1 / (1 - 0.2316419 * z)) * (-1.821255978 + (1 / (1 - 0.2316419 * z)) * 1.330274429))))
    END;

-- One-sided signed-rank test (Wilcoxon, ties and zeros by Pratt's rule): P(W+ >= w_pos) when the
-- signs of the non-zero differences are fair coins. w: the non-zero differences' ranks of |d|
-- (midranks, doubled so they are integers), w_pos: the sum of those of the positive ones. Exact
-- (the distribution of W+ given these ranks, by adding one rank at a time) up to 16 differences,
-- else the normal approximation with a continuity correction of half a rank.
CREATE OR REPLACE MACRO _signed_rank_p(w, w_pos) AS
    CASE WHEN w IS NULL OR len(w) = 0 THEN 1.0
         WHEN len(w) <= 16
         THEN list_sum(list_reduce(list_transform(w, lambda x: [x::DOUBLE]),
                                   lambda acc, e: list_transform(range(len(acc) + e[1]::INTEGER),
                                       lambda k: coalesce(acc[k + 1], 0)
                                                 + CASE WHEN k >= e[1]::INTEGER THEN acc[k - e[1]::INTEGER + 1] ELSE 0 END),
                                   [1::DOUBLE])[w_pos::INTEGER + 1:]) / pow(2, len(w))
         ELSE _normal_upper_p((w_pos - list_sum(w) / 2 - 1) / sqrt(list_sum(list_transform(w, lambda x: x * x)) / 4))
    END;
