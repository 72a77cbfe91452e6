"""hetrun's planning layer: job spec -> action graph -> compiled, scheduled, packed plan.

- ``spec``: the job YAML models and ``load_spec`` (errors with file:line:column)
- ``overrides``: sbatch-style command-line overrides
- ``action``: ``TrainingAction``, ``ActionGraph``, ``NodeCapacity``
- ``expand`` -> ``compile`` -> ``schedule`` -> ``plan``: the pipeline behind ``build_plan``
- ``unroll``: the template over iterations and ranks, and its heap scheduler

Imports neither torch, numpy nor anything Slurm: planning runs anywhere, fast.
"""
