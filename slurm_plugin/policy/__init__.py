"""The pool policy: a YAML file -> Slurm's own objects (QOS, associations, slurm.conf
settings, a job_submit.lua). ``model`` validates, ``plan`` diffs against the live
cluster, ``apply`` carries the plan out, ``lua`` renders the submit filter."""
