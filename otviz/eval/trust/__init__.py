"""Which heatmap can you trust? The field's explanation metrics (Quantus) for every method,
explainer and model-free baseline: :mod:`~otviz.eval.trust.adapter` shows Quantus the backbone
as a phrase classifier and every heatmap as an explanation function,
:mod:`~otviz.eval.trust.metrics` runs the metrics, :mod:`~otviz.eval.trust.table` makes the
``otviz eval --tables trust`` table."""
