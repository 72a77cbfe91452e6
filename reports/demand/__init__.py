"""Demand of a run's actions, predicted from its history, and component sizes from it.

- ``series``: per component and action type, the demand series of a run
  directory's events.jsonl (busy seconds per iteration, bytes moved, peak memory).
- ``predictors``: next-iteration predictors: last value, EWMA, and a small
  LSTM over the recent sequence (``lstm``), trained on recorded runs; a
  ``Chooser`` keeps the LSTM only for the series kinds where it beat EWMA.
- ``sizing``: ``hetrun tune``'s proposal: ranks per component and memory that
  balance the pipeline at the lowest cost per env step (or sample).

torch is imported only by ``lstm``: readers and sizing stay light.
"""
