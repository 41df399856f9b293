"""Models the project pretrains itself, built once by a command and cached outside git: the small IMDB policy
(:mod:`~elastic_reset.pretrain.imdb`, ``elastic-reset build-policy imdb``) and the Translation Game's agents
(:mod:`~elastic_reset.pretrain.translation`, ``elastic-reset build-translation``)."""
