"""Regression: a chunk whose delta planes are stored plain after all (the
sample promised a gain the plane did not give) must decode to its bytes.

The encoder re-split the chunk into one scratch buffer for every such plane;
with two or more, a later re-split overwrote the plain bytes of an earlier
one (the part already queued pointed into that buffer): the object was
written "full", named by the right hash, and failed verification on restore
(found with a MoE LM qkv bias, 48 fp32, between two checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import torch
from hetrun.runtime.ckpt import open_store, tiers_for
from hetrun.runtime.ckpt.writer import CheckpointWriter

BEFORE = [-1104041566, -1105518036, 1042939500, -1108706232, -1133083360, 1047500640, -1100724478, 1040203922, -1127817744, 1003936832, 1043667380, -1099884816, 1036489332, 1040206520, -1120771848, 1023927688, 1043622608, -1104402922, 1045873004, -1104107352, 1040545528, 1045356836, 1034184504, -1101319684, 1048438736, 1030067280, -1114268516, 1042414220, 1043261752, 1034252500, -1102453688, 1027107968, -1108368284, -1106202794, 1047312556, -1106333818, -1103780848, -1113410376, 1048355072, -1112837920, -1102598882, -1106590340, -1105960310, 1036435416, 1038020644, 1041144390, 1007151520, -1101990612]
AFTER = [-1104217584, -1105658115, 1043088142, -1108889344, -1132114458, 1047301296, -1100538543, 1039942779, -1127605827, 998449829, 1043697376, -1099699405, 1036724738, 1040272302, -1120578399, 1023709124, 1043623403, -1104402370, 1045870151, -1104108913, 1040547051, 1045352009, 1034189098, -1101319819, 1048438051, 1030073178, -1114274928, 1042416103, 1043257795, 1034240762, -1102452216, 1027081456, -1107991722, -1106287011, 1047112314, -1106514142, -1103978010, -1113021696, 1048176349, -1113106038, -1102401468, -1106391168, -1106134887, 1036829228, 1037673155, 1041334942, 1002111379, -1102160073]


def test_two_checkpoints_of_a_small_bias_both_verify(tmp_path: Path) -> None:
    writer = CheckpointWriter(tiers_for(tmp_path, None), keep=5, max_delta_chain=4)
    for step, values in ((2, BEFORE), (4, AFTER)):
        writer.save(step, {"bias": torch.tensor(values, dtype=torch.int32).view(torch.float32)})
        assert writer.wait().ok
    writer.close()
    store = open_store(tmp_path)
    assert store.verify(2) == [] and store.verify(4) == []
    got = store.load_rank(4, 0)[0]["bias"]
    assert got.view(torch.int32).tolist() == AFTER
