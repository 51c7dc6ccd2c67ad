-- Statistics shared by the verdict queries (plain DuckDB SQL: DuckDB has no normal CDF).

-- Upper tail of the standard normal, P(Z >= z): Abramowitz & Stegun 26.2.17 (|error| < 7.5e-8).
CREATE OR REPLACE MACRO _normal_upper_p(z) AS
    CASE WHEN z >= 0
         THEN exp(-z * z / 2) / sqrt(2 * pi()) * (1 / (1 + 0.2316419 * z)) * (0.319381530 + (1 / (1 + 0.2316419 * z)) * (-0.356563782
              + (1 / (1 + 0.2316419 * z)) * (1.781477937 + (1 / (1 + 0.2316419 * z)) * (-1.821255978 + (1 / (1 + 0.2316419 * z)) * 1.330274429))))
         ELSE 1 - exp(-z * z / 2) / sqrt(2 * pi()) * (1 / (1 - 0.2316419 * z)) * (0.319381530 + (1 / (1 - 0.2316419 * z)) * (-0.356563782
              + (1 / (1 - 0.2316419 * z)) * (1.781477937 + (1 / (1 - 0.2316419 * z)) * (-1.821255978 + (1 / (1 - 0.2316419 * z)) * 1.330274429))))
    END;

-- Upper tail of a sum of independent terms by the saddlepoint (Lugannani-Rice): w is the signed
-- root of the deviance at the saddlepoint (w^2 / 2 = t s - K(t)), u the tilt times the root of
-- the cumulant generating function's second derivative there. Where one or two heavy-tailed
-- terms carry the variance (a descheduling spike) the normal tail of the same sum is tens of
-- times too small; this one tracks the exact permutation tail (bench/README.md, issue 41). Never
-- above exp(-w^2 / 2), the Chernoff bound, which holds at any tilt: at the edge of the support
-- (a rank on top in every instance that varies) u goes to 0 and the formula alone breaks down.
CREATE OR REPLACE MACRO _saddlepoint_upper_p(w, u) AS
    least(exp(-w * w / 2), 1.0, greatest(0.0, _normal_upper_p(w) + exp(-w * w / 2) / sqrt(2 * pi()) * (1 / u - 1 / w)));

-- Upper binomial tail P(X >= k) for X ~ Binomial(n, p), 0 < p < 1, summed exactly from lgamma
-- (how often something happened against how often chance would make it: a rank last at k of n
-- collectives, a device slow in k of the n runs it was in).
CREATE OR REPLACE MACRO _binomial_upper_p(k, n, p) AS
    least(1.0, coalesce(list_sum(list_transform(range(k::BIGINT, n::BIGINT + 1),
        lambda j: exp(lgamma(n + 1) - lgamma(j + 1) - lgamma(n - j + 1) + j * ln(p) + (n - j) * ln(1 - p)))), 0.0));
