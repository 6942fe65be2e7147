"""Everything that judges a change: the regression gate over two run folders, the metrics it judges and which way
is better for each, and baselines.

    compare.py       the gate: settings matched across two folders, mismatches and notes, every row
    verdict.py       one row, the options, and the rule that judges a delta and its interval
    perf.py          the performance rows of one setting, with bootstrap intervals
    quality.py       the quality rows of eval.json, judged by tolerance
    gate_metrics.py  the judged performance metrics: direction, tolerance, stored value, resampled statistic
    directions.py    which way is better for every quality metric, from the metric's own source
    baseline.py      a run folder promoted to results/baselines/<name>/ with its provenance

Reads run folders (`measure`); runs nothing and prints nothing. tests/test_import_direction.py lists what it may
import (VERDICTS_MAY_IMPORT).
"""
