"""The run's components (rl/components.py): what they refuse before any sampling."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import REHEARSAL, tiny_config

from elastic_reset.errors import ConfigError
from elastic_reset.rewards.learned import LearnedReward
from elastic_reset.rl.components import build_components


class Listening(LearnedReward):
    def __call__(self, prompts, completions):
        return [0.0] * len(completions)

    def learn(self, prompts, completions):
        return {"loss": 0.0}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _refusal(config, reward_fn, *, processes: int, encoder_decoder: bool = False) -> str:
    task = SimpleNamespace(name="t", reward_fn=reward_fn, train_prompts=["p"] * 30)
    policy = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=encoder_decoder)))
    dp = SimpleNamespace(enabled=processes > 1)
    with pytest.raises(ConfigError) as err:  # raised before any sampling: the policy above cannot sample
        build_components(config, task, policy, None, dp, Path("unused"), 0)
    return str(err.value)


def test_a_reward_that_learns_is_refused_under_data_parallelism():
    assert _refusal(tiny_config(), Listening(), processes=2).startswith("task.name: task 't' has a reward that learns")


def test_rehearsal_is_refused_on_several_processes_or_an_encoder_decoder():
    config = tiny_config("method.name=selective_rehearsal", *REHEARSAL)
    for processes, encoder_decoder in ((2, False), (1, True)):
        said = _refusal(config, lambda p, c: [0.0] * len(c), processes=processes, encoder_decoder=encoder_decoder)
        assert said == "rehearsal: Selective Rehearsal runs in one process, on a decoder-only policy"


def test_a_reward_that_learns_is_moved_to_the_policys_device_and_learns_each_iteration():
    class Placed(Listening):
        def to(self, device):
            self.device = device
            return self

    reward = Placed()
    task = SimpleNamespace(name="t", reward_fn=reward, train_prompts=["p"] * 30)
    policy = SimpleNamespace(device="meta", model=None)
    (component,) = build_components(tiny_config(), task, policy, None, SimpleNamespace(enabled=False), Path("x"), 0)
    assert reward.device == "meta"
    assert component.on_batch(["p"], ["c"]) == {"reward_model/loss": 0.0}
