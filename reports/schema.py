"""The JSON Schema of ``hetrun report --json`` (print it with ``hetrun report --schema``).

Version ``hetrun.report/1``. Fields may be added; none listed here is
renamed or removed without a new version. Times are epoch seconds, durations
seconds, sizes bytes.
"""

from __future__ import annotations

from typing import Any

SCHEMA_ID = "hetrun.report/1"

_num = {"type": "number"}
_opt_num = {"type": ["number", "null"]}
_opt_int = {"type": ["integer", "null"]}
_str = {"type": "string"}
_opt_str = {"type": ["string", "null"]}

_RANK = {"type": "object", "required": ["component", "rank", "node", "actions", "busy_s", "life_s",
                                         "busy_fraction", "by_type"],
         "properties": {"component": _str, "rank": {"type": "integer"}, "node": _str,
                        "actions": {"type": "integer"}, "busy_s": _num, "life_s": _num,
                        "busy_fraction": _num, "bytes": {"type": "integer"}, "peak_mem": {"type": "integer"},
                        "by_type": {"type": "object", "additionalProperties": {"type": "integer"}}}}

_COMPONENT = {"type": "object", "required": ["name", "ranks", "nodes", "iterations", "busy_s", "busy_fraction",
                                              "node_hours", "core_hours", "gpu_hours"],
              "properties": {"name": _str, "ranks": {"type": "integer"}, "nodes": {"type": "array", "items": _str},
                             "iterations": {"type": "integer"}, "busy_s": _num, "busy_fraction": _num,
                             "node_hours": _num, "core_hours": _num, "gpu_hours": _num,
                             "first_action": _opt_num, "last_action": _opt_num, "active_s": _num,
                             "s_per_iteration": _num, "command": {"type": "boolean"}}}

_COMP_RESTORE = {"type": "object", "required": ["state", "ranks", "ranks_restored", "step", "iteration"],
                 "properties": {"state": {"enum": ["restored", "fresh", "unconfirmed", "no restore recorded"]},
                                "ranks": {"type": "integer"}, "ranks_restored": {"type": "integer"},
                                "step": {}, "iteration": _opt_int, "fresh_reason": _opt_str}}

_RESTART = {"type": "object",
            "required": ["restart", "cause", "cause_text", "detail", "queue_wait_s", "first_step_s", "components",
                         "work_lost_iterations", "work_lost_s"],
            "properties": {"restart": {"type": "integer", "minimum": 1}, "cause": _str, "cause_text": _str,
                           "detail": {"type": "array", "items": _str}, "queue_wait_s": _opt_num,
                           "first_step_s": _opt_num, "resumed_iteration": _opt_int,
                           "components": {"type": "object", "additionalProperties": _COMP_RESTORE},
                           "work_lost_iterations": _opt_int, "work_lost_s": _opt_num,
                           "work_lost_from_actions": _opt_int,
                           "sizes_before": {"type": "object", "additionalProperties": {"type": "integer"}},
                           "sizes": {"type": "object", "additionalProperties": {"type": "integer"}}}}

_CKPT = {"type": "object", "required": ["component", "step", "in_store", "state_bytes", "stored_bytes", "ratio",
                                         "stall_s", "save_s", "tiers", "verified"],
         "properties": {"component": _str, "step": {"type": "integer"}, "in_store": {"type": "boolean"},
                        "state_bytes": _opt_int, "stored_bytes": _opt_int, "ratio": _opt_num,
                        "stall_s": _opt_num, "save_s": _opt_num, "tiers": {"type": "array", "items": _str},
                        "verified": _str, "error": _opt_str}}

# One line per component in the text report (reports/ckpt.py: summarize).
_CKPT_SUMMARY = {"type": "object", "required": ["count", "in_store", "newest_step", "stored_bytes", "failed"],
                 "properties": {"count": {"type": "integer"}, "in_store": {"type": "integer"},
                                "newest_step": _opt_int, "newest_created": _opt_num,
                                "newest_state_bytes": _opt_int, "stored_bytes": {"type": "integer"},
                                "failed": {"type": "integer"}, "restored": {"type": "integer"}}}

# What the report leads with (reports/run_report.py: headline): the newest attempt's outcome,
# the result (newest evaluation return, else a loss), throughput, waste, the one count of
# restarts / preemptions (the same as `hetrun status`), a command component's logged steps.
_HEADLINE = {"type": "object", "required": ["status", "result", "throughput", "wasted_share", "restarts",
                                             "preemptions"],
             "properties": {"status": _opt_str, "attempt": _opt_int, "failure": _opt_str,
                            "result": {"type": ["object", "null"], "required": ["kind", "name", "value"],
                                       "properties": {"kind": _str, "name": _str, "value": _num,
                                                      "iteration": _opt_int}},
                            "throughput": _opt_str, "wasted_share": _opt_num,
                            "restarts": {"type": "integer"}, "preemptions": {"type": "integer"},
                            "work_lost_iterations": _opt_int,
                            "command_steps": {"type": "object", "additionalProperties": {"type": "integer"}}}}

_ACCT = {"type": "object", "required": ["component", "job_id", "attempt", "state", "elapsed_s", "alloc_tres",
                                         "max_rss", "exit_code", "nodes"],
         "properties": {"component": _str, "job_id": _str, "attempt": {"type": "integer"}, "state": _str,
                        "elapsed_s": _opt_int, "alloc_tres": _str, "max_rss": _opt_int, "exit_code": _str,
                        "nodes": _str}}

_PLACED = {"type": "object", "required": ["component", "mode", "partition"],
           "properties": {"component": _str, "mode": {"enum": ["auto", "ranked", "fit", "fixed", "unplaced"]},
                          "partition": _opt_str, "gres": _opt_str, "ranked": {"type": "array", "items": _str}, "node_count": _opt_int,
                          "node_count_chosen": {"type": "boolean"}, "score": _opt_num,
                          "start_in_s": _opt_num, "reasons": {"type": "array", "items": _str},
                          "lost": {"type": "array", "items": _str}, "pool_taken_at": _opt_num}}

REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "hetrun report",
    "type": "object",
    "required": ["schema", "run_dir", "name", "wall_s", "attempts", "ranks", "components", "counts",
                 "restart_history", "outcome", "work_lost", "checkpoint_history", "accounting", "cost", "timeline"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "run_dir": _str, "name": _str, "job_id": _opt_str, "backend": _opt_str,
        "first": _opt_num, "last": _opt_num, "wall_s": _num, "attempts": {"type": "integer"},
        "env_steps": {"type": "integer"}, "steps_per_s": _num, "actions": {"type": "integer"},
        "ranks": {"type": "array", "items": _RANK},
        "components": {"type": "array", "items": _COMPONENT},
        "counts": {"type": "object", "required": ["restarts", "preemptions", "time_limits", "failures", "unknown"],
                   "additionalProperties": {"type": "integer"}},
        "restart_history": {"type": "array", "items": _RESTART},
        "outcome": {"type": "object", "required": ["outcome"],
                    "properties": {"outcome": _str, "attempt": _opt_int,
                                   "failures": {"type": "array", "items": _str}}},
        "work_lost": _opt_int,
        "checkpoint_history": {"type": "object", "required": ["rows", "notes"],
                               "properties": {"rows": {"type": "array", "items": _CKPT},
                                              "notes": {"type": "array", "items": _str},
                                              "summary": {"type": "object", "additionalProperties": _CKPT_SUMMARY}}},
        "accounting": {"type": "object", "required": ["rows", "note"],
                       "properties": {"rows": {"type": "array", "items": _ACCT}, "note": _opt_str}},
        "cost": {"type": "object", "required": ["currency", "source", "total", "components", "wasted_share"],
                 "properties": {"currency": _str, "source": _str, "total": _num, "per_iteration": _opt_num,
                                "per_million_env_steps": _opt_num, "wasted_share": _num,
                                "wasted_restarts_share": _num, "wasted_idle_share": _num,
                                "idle_unmeasured": {"type": "array", "items": _str},
                                "components": {"type": "object"}}},
        "headline": _HEADLINE,
        "curves": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["kind", "name", "points"],
            "properties": {"kind": _str, "name": _str, "rank": {"type": "integer"},
                           "points": {"type": "array", "items": {"type": "array", "prefixItems": [
                               _num, {"type": ["integer", "null"]}, _num]}}}}},
        "timeline": {"type": "object", "properties": {
            "origin": _opt_num, "bucket_s": _num, "buckets": {"type": "integer"},
            "ranks": {"type": "object", "additionalProperties": {
                "type": "object", "required": ["busy", "marks"],
                "properties": {"busy": {"type": "object", "additionalProperties": {"type": "array", "items": _num}},
                               "marks": {"type": "array", "items": {"type": "array", "prefixItems": [_num, _str]}}}}},
            "work": {"type": "object", "additionalProperties": {"type": "array", "items": _num}}}},
        "resources": {"type": "object", "properties": {
            "samples": {"type": "integer"}, "note": _opt_str,
            "rows": {"type": "array", "items": {"type": "object", "required": ["component", "node", "samples"],
                                                "properties": {"component": _str, "node": _str,
                                                               "cpu_pct": _opt_num, "rss_max": _opt_num,
                                                               "gpu_util": _opt_num, "gpu_mem_max": _opt_num,
                                                               "gpu_power_w": _opt_num}}}}},
        "skipped_lines": {"type": "integer"},
        # reports/demand_section.py: predicted against measured demand per window
        "demand": {"type": "object", "required": ["predictor", "window", "rows", "note"], "properties": {
            "predictor": _str, "window": {"type": "integer", "minimum": 1}, "note": _opt_str,
            "rows": {"type": "array", "items": {
                "type": "object", "required": ["component", "action_type", "metric", "windows", "mae", "relative"],
                "properties": {"component": _str, "action_type": _str, "metric": _str, "unit": _str,
                               "mae": _opt_num, "relative": _opt_num,
                               "windows": {"type": "array", "items": {
                                   "type": "object", "required": ["first", "last", "predicted", "actual", "error"],
                                   "properties": {"first": {"type": "integer"}, "last": {"type": "integer"},
                                                  "predicted": _num, "actual": _num, "error": _num}}}}}}}},
        # reports/throughput.py: steady (median window) and whole-run throughput, per attempt
        "throughput": {"type": "object", "properties": {
            "unit": _str, "useful_work": {"type": "integer"}, "whole_run": _opt_num, "wall_s": _num,
            "startup_s": _num, "queue_gaps_s": _num,
            "attempts": {"type": "array", "items": {
                "type": "object", "required": ["attempt", "sizes", "iterations", "work", "steady", "spread"],
                "properties": {"attempt": {"type": "integer"}, "iterations": {"type": "integer"},
                               "work": {"type": "integer"}, "steady": _opt_num, "active": _opt_num,
                               "startup_s": _opt_num, "queue_gap_s": _opt_num, "relative_spread": _opt_num,
                               "sizes": {"type": "object", "additionalProperties": {"type": "integer"}}}}}}},
        # reports/placement.py: per range of attempts (a resume starts a new one), each component
        "placement": {"type": "object", "required": ["attempts", "note"], "properties": {
            "note": _opt_str,
            "ran_on": {"type": "array", "items": {"type": "object", "properties": {
                "component": _str, "job_id": _opt_str, "attempt": _opt_int, "partition": _str, "nodes": _opt_str}}},
            "attempts": {"type": "array", "items": {
                "type": "object", "required": ["first_restart", "last_restart", "source", "components"],
                "properties": {"first_restart": {"type": "integer"}, "last_restart": _opt_int, "source": _str,
                               "components": {"type": "array", "items": _PLACED}}}}}},
    },
}
