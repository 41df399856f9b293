"""Reward models trained on preference pairs (issue 12): Bradley–Terry and the Advantage Model (Peng et al. 2023,
"Stabilizing RLHF through Advantage Model and Selective Rehearsal", §3.1), their data and their calibration."""
