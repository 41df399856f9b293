"""Reward models trained on preference pairs: Bradley–Terry and the Advantage Model (Peng et al. 2023,
"Stabilizing RLHF through Advantage Model and Selective Rehearsal", §3.1).

- :mod:`~elastic_reset.reward_models.model`: the model, its settings, its folder (built fresh, loaded back);
- :mod:`~elastic_reset.reward_models.losses`, :mod:`~elastic_reset.reward_models.packing`: the losses; pairs into
  batches and scores;
- :mod:`~elastic_reset.reward_models.train`: training on transformers' ``Trainer`` (``reward-model train``);
- :mod:`~elastic_reset.reward_models.evaluate`, :mod:`~elastic_reset.reward_models.calibration`: accuracy and
  calibration (``reward-model evaluate``);
- :mod:`~elastic_reset.reward_models.reward`: a trained model as the RL engine's reward.

The pairs and their prompt-disjoint split: :mod:`elastic_reset.data.preferences`; the cache folder of a trained
model: :func:`elastic_reset.models.reward_model_path`."""
