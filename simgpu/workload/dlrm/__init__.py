"""DLRM: embedding tables sharded over ranks, bottom / top MLPs, the feature interaction."""
