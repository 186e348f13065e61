"""``otviz report``: the paper-style figures of an evaluation (:mod:`otviz.report.render`
reads the tables and heads, :mod:`otviz.report.figures` draws each figure)."""
