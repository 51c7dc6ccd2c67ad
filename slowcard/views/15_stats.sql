-- Statistics shared by the verdict queries (plain DuckDB SQL: DuckDB has no normal CDF).

-- Upper tail of the standard normal, P(Z >= z): Abramowitz & Stegun 26.2.17 (|error| < 7.5e-8).
CREATE OR REPLACE MACRO _normal_upper_p(z) AS
    CASE WHEN z >= 0
         THEN exp(-z * z / 2) / sqrt(2 * pi()) * (1 / (1 + 0.2316419 * z)) * (0.319381530 + (1 / (1 + 0.2316419 * z)) * (-0.356563782
              + (1 / (1 + 0.2316419 * z)) * (1.781477937 + (1 / (1 + 0.2316419 * z)) * (-1.821255978 + (1 / (1 + 0.2316419 * z)) * 1.330274429))))
         ELSE 1 - exp(-z * z / 2) / sqrt(2 * pi()) * (1 / (1 - 0.2316419 * z)) * (0.319381530 + (1 / (1 - 0.2316419 * z)) * (-0.356563782
              + (1 / (1 - 0.2316419 * z)) * (1.781477937 + (1 / (1 - 0.2316419 * z)) * (-1.821255978 + (1 / (1 - 0.2316419 * z)) * 1.330274429))))
    END;
