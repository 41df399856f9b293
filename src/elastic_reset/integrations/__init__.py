"""Drop-in integrations of Elastic Reset with other trainers (``trl``: a ``transformers.TrainerCallback``)."""
