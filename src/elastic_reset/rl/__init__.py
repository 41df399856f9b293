"""The RL engine: rollouts, rewards with a KL penalty, and the policy-gradient updates (REINFORCE with a
moving-average baseline, PPO with a value head and GAE, RLOO) that the drift-control methods plug into.

Modules are imported by name (e.g. ``from elastic_reset.rl import ops``); nothing is re-exported here.
"""
