"""Models the project trains itself before RL, each built once by ``elastic-reset build ...`` and cached outside git
(where: :mod:`elastic_reset.models`' cache paths; the data each reads: :mod:`elastic_reset.data`):

- the IMDB sentiment classifier, the IMDB task's reward (:mod:`~elastic_reset.pretrain.classifier`, on
  transformers' ``Trainer``; ``build imdb-classifier``);
- the small IMDB policy (:mod:`~elastic_reset.pretrain.imdb`, ``build imdb-policy``);
- the Translation Game's agents (:mod:`~elastic_reset.pretrain.translation`, ``build translation-agents``).

Preference reward models are trained by :mod:`elastic_reset.reward_models.train` (``reward-model train``), beside
the losses, model and packing they are made of."""
