"""Each test checks one numeric fact of elastic_reset.rl.ops against a case computed by hand in its comments."""

import math

import pytest
import torch

from elastic_reset.rl.config import ConfigError, config_from_dict
from elastic_reset.rl.ops import (
    AdaptiveKLController,
    FixedKLController,
    MovingAverageBaseline,
    gae,
    kl_estimate,
    masked_mean,
    masked_sum,
    masked_var,
    high_entropy_mask,
    policy_gradient_loss,
    ppo_policy_loss,
    reduce_loss,
    rloo_advantages,
    token_rewards,
    value_loss,
    whiten,
)


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          atol=tol, rtol=0)


# ------------------------------------------------------------------------------------------ masked statistics
X = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 5.0, -7.0, -7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # lengths 3 and 2


def test_masked_sum_mean_by_hand():
    # real tokens: 1, 2, 3, 4, 5 -> sum 15, mean 3; row means 2 and 4.5
    assert masked_sum(X, MASK).item() == 15.0
    assert masked_mean(X, MASK).item() == 3.0
    assert masked_mean(X, MASK, dim=1).tolist() == [2.0, 4.5]
    assert masked_sum(X, MASK.bool(), dim=1).tolist() == [6.0, 9.0]


def test_masked_mean_ignores_nan_and_inf_in_padding_and_gives_them_no_gradient():
    x = X.clone()
    x[0, 3], x[1, 2], x[1, 3] = float("nan"), float("inf"), -float("inf")
    x.requires_grad_(True)
    m = masked_mean(x, MASK)
    assert m.item() == 3.0
    m.backward()
    # d mean / d x = 1/5 on real tokens, 0 on padding
    assert close(x.grad, [[0.2, 0.2, 0.2, 0.0], [0.2, 0.2, 0.0, 0.0]])


def test_masked_mean_of_empty_row_is_zero_not_nan():
    m = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    assert masked_mean(X, m, dim=1).tolist() == [1.5, 0.0]


def test_masked_var_by_hand():
    # real tokens 1..5: mean 3, squared deviations 4+1+0+1+4 = 10; biased 10/5 = 2, unbiased 10/4 = 2.5
    assert close(masked_var(X, MASK, unbiased=False), 2.0)
    assert close(masked_var(X, MASK), 2.5)


def test_whiten_mean_zero_var_one_over_mask_and_padding_is_ignored():
    w = whiten(X, MASK)
    assert close(masked_mean(w, MASK), 0.0)
    assert close(masked_var(w, MASK), 1.0)
    # by hand: (x - 3) / sqrt(2.5)
    s = math.sqrt(2.5)
    assert close(w, [[-2 / s, -1 / s, 0, 0], [1 / s, 2 / s, 0, 0]])
    # change the padded values (even to NaN): same result
    x2 = X.clone()
    x2[0, 3], x2[1, 2], x2[1, 3] = 1e6, float("nan"), -3.0
    x2.requires_grad_(True)
    w2 = whiten(x2, MASK)
    assert torch.equal(w2.detach(), w)
    (w2 * torch.arange(8.0).view(2, 4)).sum().backward()  # any loss: the gradient stays finite, 0 on padding
    assert torch.isfinite(x2.grad).all() and x2.grad[~MASK.bool()].abs().max().item() == 0.0


def test_whiten_without_shift_keeps_the_mean():
    # lm-human-preferences whitens rewards with shift_mean=False: (x - 3)/sqrt(2.5) + 3
    w = whiten(X, MASK, shift_mean=False)
    assert close(masked_mean(w, MASK), 3.0)
    assert close(masked_var(w, MASK), 1.0)
    assert close(w[0, 0], -2 / math.sqrt(2.5) + 3)


def test_whiten_without_mask_uses_everything_and_upcasts_bf16():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])  # mean 2.5, unbiased var 5/3
    w = whiten(x.to(torch.bfloat16))
    assert w.dtype == torch.float32
    assert close(w, (x - 2.5) / math.sqrt(5 / 3), tol=1e-6)


# --------------------------------------------------------------------------------------------------------- KL
def test_kl_estimators_by_hand():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.4)])
    # k1 = log p - log q: log 2, log 0.5
    assert close(kl_estimate(logp, ref, "k1"), [math.log(2), math.log(0.5)])
    # k3 with r = q/p: r = 0.5 -> (0.5 - 1) - log 0.5 = 0.193147;  r = 2 -> 1 - log 2 = 0.306853
    assert close(kl_estimate(logp, ref, "k3"), [-0.5 + math.log(2), 1 - math.log(2)])
    # k2 = (log r)^2 / 2 = (log 2)^2 / 2 both times
    assert close(kl_estimate(logp, ref, "k2"), [math.log(2) ** 2 / 2] * 2)
    # the default is k1
    assert torch.equal(kl_estimate(logp, ref), kl_estimate(logp, ref, "k1"))


def test_k3_is_never_negative():
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(10_000, generator=g) * 5
    ref = logp + torch.randn(10_000, generator=g) * torch.logspace(-8, 1, 10_000)
    k3 = kl_estimate(logp, ref, "k3")
    assert bool((k3 >= 0).all())
    assert kl_estimate(logp, logp, "k3").abs().max().item() == 0.0


def test_k1_and_k3_means_match_the_true_kl_of_two_categoricals():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    # KL(p||q) = 0.5 ln(2.5) + 0.3 ln 1 + 0.2 ln(0.4) = 0.458145 - 0.183258 = 0.274887
    true_kl = 0.5 * math.log(2.5) + 0.2 * math.log(0.4)
    assert abs(true_kl - 0.274887) < 1e-6
    y = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, ref = p.log()[y], q.log()[y]
    for est in ("k1", "k3"):  # both unbiased; standard errors here are ~0.0015
        assert abs(kl_estimate(logp, ref, est).mean().item() - true_kl) < 0.01, est


def test_kl_estimate_bad_inputs():
    a = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="estimator"):
        kl_estimate(a, a, "k4")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_estimate(a, torch.zeros(2, 4), "k1")


# ------------------------------------------------------------------------------------------- KL controllers
@pytest.mark.parametrize(
    "kl, expected",
    [
        # target 6, horizon 10000, n_steps 256, beta 0.1:  e = clip(kl/6 - 1, -0.2, 0.2)
        (6.6, 0.1 * (1 + 0.1 * 256 / 10000)),  # e = +0.1 -> 0.100256 (KL too high: beta up)
        (5.4, 0.1 * (1 - 0.1 * 256 / 10000)),  # e = -0.1 -> 0.099744 (KL too low: beta down)
        (12.0, 0.1 * (1 + 0.2 * 256 / 10000)),  # e = +1 clipped to +0.2 -> 0.100512
        (0.0, 0.1 * (1 - 0.2 * 256 / 10000)),  # e = -1 clipped to -0.2 -> 0.099488
        (6.0, 0.1),  # on target: unchanged
    ],
)
def test_adaptive_kl_controller_one_update(kl, expected):
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    assert ctl.update(kl, n_steps=256) == pytest.approx(expected, rel=1e-12)
    assert ctl.value == pytest.approx(expected, rel=1e-12)


def test_adaptive_kl_controller_numbers_written_out_and_tensor_input():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(torch.tensor(6.6), 256)
    assert ctl.value == pytest.approx(0.100256)


def test_kl_controllers_state_roundtrip_and_fixed_is_constant():
    a = AdaptiveKLController(0.2, target=1.0, horizon=100)
    a.update(5.0, 10)  # e = 0.2 -> 0.2 * 1.02 = 0.204
    assert a.value == pytest.approx(0.204)
    b = AdaptiveKLController(0.2, target=1.0, horizon=100)
    b.load_state_dict(a.state_dict())
    assert b.value == a.value
    f = FixedKLController(0.05)
    assert f.update(100.0, 1000) == 0.05 and f.value == 0.05
    g = FixedKLController(0.0)
    g.load_state_dict(f.state_dict())
    assert g.value == 0.05


def test_kl_controller_bad_inputs():
    # Its settings (target, horizon, the initial / fixed coefficient) are the config's: refused there, below.
    ctl = AdaptiveKLController(0.1, target=1.0, horizon=10)
    with pytest.raises(ValueError, match="current_kl"):
        ctl.update(float("nan"), 1)
    with pytest.raises(ValueError, match="n_steps"):
        ctl.update(1.0, -1)
    with pytest.raises(ValueError, match="state"):
        ctl.load_state_dict({})
    assert ctl.value == 0.1  # the failed calls changed nothing


# ---------------------------------------------------------------------------------------- rewards and GAE
def test_token_rewards_put_the_score_at_the_last_real_token():
    kl_pen = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, -0.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    r = token_rewards(torch.tensor([2.0, -1.0]), kl_pen, mask)
    # row 0: -0.1, -0.2, -0.3 + 2 = 1.7, pad 0;   row 1: -0.5, 0.5 - 1 = -0.5, pad 0, 0
    assert close(r, [[-0.1, -0.2, 1.7, 0.0], [-0.5, -0.5, 0.0, 0.0]])


def test_token_rewards_full_length_response():
    r = token_rewards(torch.tensor([3.0]), torch.zeros(1, 3), torch.ones(1, 3))
    assert r.tolist() == [[0.0, 0.0, 3.0]]


def test_token_rewards_bad_inputs():
    with pytest.raises(ValueError, match=r"^mask: a response has no real token"):
        token_rewards(torch.zeros(2), torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"^mask: expected right padding"):
        token_rewards(torch.zeros(1), torch.zeros(1, 3), torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match=r"^score: expected shape \(2,\) \(one per response\), got \(3,\)"):
        token_rewards(torch.zeros(3), torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="kl_penalty"):
        token_rewards(torch.zeros(2), torch.zeros(2, 4), torch.ones(2, 3))


# Hand-computed GAE on one 3-token episode, gamma = 0.9, lambda = 0.8 (gamma * lambda = 0.72):
#   rewards = [0, 0, 1], values = [0.5, 0.4, 0.3], terminal after the 3rd token (V_3 = 0)
#   delta_2 = 1 + 0.9*0   - 0.3 =  0.7
#   delta_1 = 0 + 0.9*0.3 - 0.4 = -0.13
#   delta_0 = 0 + 0.9*0.4 - 0.5 = -0.14
#   A_2 = 0.7
#   A_1 = -0.13 + 0.72*0.7   = 0.374
#   A_0 = -0.14 + 0.72*0.374 = 0.12928
#   returns = A + V = [0.62928, 0.774, 1.0]
def test_gae_by_hand_one_episode():
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.4, 0.3]]), torch.ones(1, 3), 0.9, 0.8)
    assert close(adv, [[0.12928, 0.374, 0.7]])
    assert close(ret, [[0.62928, 0.774, 1.0]])


# Row 1 is a 2-token episode padded to 3, with garbage in its padded slot:
#   rewards = [0.5, 1.0], values = [0.2, 0.1], terminal after the 2nd token
#   delta_1 = 1.0 + 0        - 0.1 = 0.9
#   delta_0 = 0.5 + 0.9*0.1  - 0.2 = 0.39
#   A = [0.39 + 0.72*0.9, 0.9] = [1.038, 0.9];  returns = [1.238, 1.0]
def test_gae_batch_of_two_lengths_padding_does_not_leak():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 1.0, 100.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.1, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert close(adv, [[0.12928, 0.374, 0.7], [1.038, 0.9, 0.0]])
    assert close(ret, [[0.62928, 0.774, 1.0], [1.238, 1.0, 0.0]])
    # NaN in the padding changes nothing
    rewards[1, 2], values[1, 2] = float("nan"), float("nan")
    adv2, ret2 = gae(rewards, values, mask.bool(), gamma=0.9, lam=0.8)
    assert torch.equal(adv2, adv) and torch.equal(ret2, ret)
    # and the short row alone gives the same numbers
    adv3, _ = gae(rewards[1:, :2], values[1:, :2], torch.ones(1, 2), 0.9, 0.8)
    assert torch.equal(adv3, adv[1:, :2])


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    # gamma = lam = 1: A_t = sum_{s>=t} r_s - V_t.  rewards [1, 2, 3] -> to-go [6, 5, 3]
    adv, ret = gae(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 1.0, 1.0]]), torch.ones(1, 3), 1.0, 1.0)
    assert adv.tolist() == [[5.0, 4.0, 2.0]]
    assert ret.tolist() == [[6.0, 5.0, 3.0]]


def test_gae_has_no_gradient_and_bad_inputs():
    v = torch.zeros(1, 3, requires_grad=True)
    adv, ret = gae(torch.zeros(1, 3), v, torch.ones(1, 3), 0.9, 0.9)
    assert not adv.requires_grad and not ret.requires_grad
    ones = torch.ones(1, 3)  # gamma and lam outside [0, 1]: refused by the config, below
    with pytest.raises(ValueError, match="values"):
        gae(ones, torch.ones(1, 4), ones, 0.9, 0.9)
    with pytest.raises(ValueError, match="mask"):
        gae(ones, ones, torch.tensor([[0.0, 1.0, 1.0]]), 0.9, 0.9)
    with pytest.raises(ValueError, match="mask"):
        gae(torch.ones(3), torch.ones(3), torch.ones(3), 0.9, 0.9)


# -------------------------------------------------------------------------------------------------- losses
# PPO hand case, clip_range 0.2, three real tokens and one padded slot:
#   token 0: A =  1, ratio 1.5: -A*r = -1.5, -A*clip = -1.2 -> max -1.2 (clipped)
#   token 1: A = -1, ratio 0.5: -A*r =  0.5, -A*clip =  0.8 -> max  0.8 (clipped)
#   token 2: A =  2, ratio 1.1: -A*r = -2.2, -A*clip = -2.2 -> max -2.2 (inside the range: not clipped)
#   loss = (-1.2 + 0.8 - 2.2) / 3 = -0.866667;  clipfrac = 2/3;  ratio_mean = 3.1/3
#   approx_kl = mean((r - 1) - log r) = (0.5 - ln 1.5 + -0.5 - ln 0.5 + 0.1 - ln 1.1) / 3
#   gradient wrt logp: 0 where clipped; token 2: d(-A r)/dlogp = -A r = -2.2, over 3 -> -0.733333
def test_ppo_policy_loss_clipping_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    ratios = torch.tensor([[1.5, 0.5, 1.1, 1.0]])
    logp = (old + ratios.log()).clone()
    logp[0, 3] = 80.0  # padding: exp(83) overflows fp32; must not matter, nor NaN the gradient
    logp.requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 1e9]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = ppo_policy_loss(logp, old, adv, mask, clip_range=0.2)
    assert close(loss, -2.6 / 3)
    assert close(stats["clipfrac"], 2 / 3)
    assert close(stats["ratio_mean"], 3.1 / 3)
    assert close(stats["approx_kl"], (0.5 - math.log(1.5) - 0.5 - math.log(0.5) + 0.1 - math.log(1.1)) / 3)
    loss.backward()
    assert close(logp.grad, [[0.0, 0.0, -2.2 / 3, 0.0]])
    assert all(not s.requires_grad for s in stats.values())


def test_ppo_policy_loss_does_not_clip_in_the_improving_direction():
    # A = +1, ratio 0.5 (below 1 - eps): -A*r = -0.5 > -A*clip = -0.8, so the unclipped term is used: loss -0.5
    old = torch.zeros(1, 1)
    loss, stats = ppo_policy_loss(old + math.log(0.5), old, torch.ones(1, 1), torch.ones(1, 1), 0.2)
    assert close(loss, -0.5) and stats["clipfrac"].item() == 0.0
    # identical policies: ratio 1, approx_kl 0, loss = -mean A
    a = torch.tensor([[1.0, 3.0]])
    loss, stats = ppo_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), a, torch.ones(1, 2), 0.2)
    assert close(loss, -2.0) and stats["approx_kl"].item() == 0.0 and stats["ratio_mean"].item() == 1.0


def test_clip_range_high_clips_above_at_its_own_bound():
    # DAPO's clip-higher, eps 0.2 / eps_high 0.28: A = +1, ratio 1.25 is inside [0.8, 1.28] (loss -1.25, gradient
    # -1.25); with the symmetric clip it is cut at 1.2 (gradient 0). Below, A = -1, ratio 0.7: cut at 0.8 either way.
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.25), math.log(0.7)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = ppo_policy_loss(logp, old, adv, torch.ones(1, 2), 0.2, clip_range_high=0.28)
    assert close(loss, (-1.25 + 0.8) / 2) and close(stats["clipfrac"], 0.5)
    loss.backward()
    assert close(logp.grad, [[-1.25 / 2, 0.0]])
    symmetric, stats = ppo_policy_loss(logp, old, adv, torch.ones(1, 2), 0.2)
    assert close(symmetric, (-1.2 + 0.8) / 2) and close(stats["clipfrac"], 1.0)


def test_ratio_max_caps_the_unclipped_ratio_of_a_negative_advantage():
    # A = -1, ratio 3, eps 0.2: PPO's pessimistic term is the unclipped -A·3 = 3 (gradient 3); delta 2 caps it at 2
    # (no gradient). A = +1, ratio 3: clipped at 1.2 either way.
    old = torch.zeros(1, 2)
    logp = torch.full((1, 2), math.log(3.0), requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0]])
    loss, _ = ppo_policy_loss(logp, old, adv, torch.ones(1, 2), 0.2)
    assert close(loss, (3.0 - 1.2) / 2)
    capped, _ = ppo_policy_loss(logp, old, adv, torch.ones(1, 2), 0.2, ratio_max=2.0)
    assert close(capped, (2.0 - 1.2) / 2)
    capped.backward()
    assert close(logp.grad, [[0.0, 0.0]])


def test_cispo_weighs_the_plain_gradient_by_the_capped_ratio_without_cutting_any_token():
    # cap 2: token 0 (A = 1, ratio 3) weighs 2, token 1 (A = -1, ratio 0.5) weighs 0.5; loss -(2·logp0 - 0.5·logp1)/2
    # and d/dlogp = -A·min(ρ, 2)/2: -1 and +0.25. PPO's clip would give token 0 no gradient at all.
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(3.0), math.log(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = ppo_policy_loss(logp, old, adv, torch.ones(1, 2), 0.2, clip_range_high=2.0, surrogate="cispo")
    assert close(loss, -(2.0 * math.log(3.0) - 0.5 * math.log(0.5)) / 2) and close(stats["clipfrac"], 0.5)
    loss.backward()
    assert close(logp.grad, [[-1.0, 0.25]])


def test_sequence_level_ratio_is_the_exp_of_the_mean_token_log_ratio():
    # GSPO: row 0's token log-ratios 0.1 and -0.1 give one ratio exp(0) = 1 for both tokens, so with A = 1 each of
    # its tokens' losses is -1, and each log-prob moves both: gradient 2 x -A·ρ/2 / 3 tokens = -1/3 (per token it
    # would be -exp(±0.1)/3). Row 1: one real token, log-ratio ln 2: ratio 2 > 1.2, clipped, no gradient; its
    # padded slot (a huge log-prob) changes nothing.
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, -0.1], [math.log(2.0), 80.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = ppo_policy_loss(logp, old, torch.ones(2, 2), mask, 0.2, level="sequence")
    assert close(loss, (-1.0 - 1.0 - 1.2) / 3)
    assert close(stats["ratio_mean"], (1.0 + 1.0 + 2.0) / 3) and close(stats["clipfrac"], 1 / 3)
    loss.backward()
    assert close(logp.grad, [[-1 / 3, -1 / 3], [0.0, 0.0]])
    tokens, _ = ppo_policy_loss(logp, old, torch.ones(2, 2), mask, 0.2)
    assert close(tokens, (-math.exp(0.1) - math.exp(-0.1) - 1.2) / 3)
    with pytest.raises(ValueError, match="^level: expected token, sequence or sequence_sum"):
        ppo_policy_loss(logp, old, torch.ones(2, 2), mask, 0.2, level="seq")
    with pytest.raises(ValueError, match="^surrogate: expected clip, cispo, sapo or vespo, got 'gspo'"):
        ppo_policy_loss(logp, old, torch.ones(2, 2), mask, 0.2, surrogate="gspo")


def test_loss_reductions_by_hand():
    # Rows [1, 2] and [4] (padding is NaN): token mean 7/3 (TRL's bnpo), the token sum over a batch's 3.5 tokens
    # per minibatch (dapo), the mean of the rows' means (1.5 + 4) / 2 (grpo), the mean of the rows' sums (3 + 4) / 2
    # (luspo), the sum over responses x max_len 2 x 5 (dr_grpo); an empty row counts as zeros.
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert close(reduce_loss(x, mask, "token"), 7 / 3)
    assert close(reduce_loss(x, mask, "batch_token", step_tokens=3.5), 2.0)
    assert close(reduce_loss(x, mask, "sequence"), 2.75)
    assert close(reduce_loss(x, mask, "sum"), 3.5)
    assert close(reduce_loss(x, mask, "constant", max_len=5), 0.7)
    empty = torch.cat([mask, torch.zeros(1, 3, dtype=mask.dtype)])
    assert close(reduce_loss(torch.cat([x, torch.ones(1, 3)]), empty, "sequence"), 5.5 / 3)
    with pytest.raises(ValueError, match="^max_len: expected a positive number"):
        reduce_loss(x, mask, "constant")
    with pytest.raises(ValueError, match="^step_tokens: expected a positive number"):
        reduce_loss(x, mask, "batch_token")
    with pytest.raises(ValueError, match="^how: expected token, batch_token, sequence, sum or constant"):
        reduce_loss(x, mask, "mean")


def test_high_entropy_mask_keeps_the_top_share_of_real_tokens():
    # real entropies 0.1, 0.5, 0.9 and 0.3 (the padded 5.0 is not one): their median is 0.4, so a share of 0.5 keeps
    # 0.5 and 0.9; a share of 1 keeps every real token, of 0 only the highest
    entropy = torch.tensor([[0.1, 0.5, 0.9, 5.0], [0.3, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert high_entropy_mask(entropy, mask, 0.5).tolist() == [[False, True, True, False], [False] * 4]
    assert high_entropy_mask(entropy, mask, 1.0).tolist() == mask.bool().tolist()
    assert high_entropy_mask(entropy, mask, 0.0).tolist() == [[False, False, True, False], [False] * 4]
    # the quantile is the whole minibatch's: another process's lower entropies let 0.3 in too
    others = lambda x: torch.cat([x, torch.tensor([0.0, 0.0])])  # noqa: E731  (median 0.2)
    assert high_entropy_mask(entropy, mask, 0.5, others).tolist() == [[False, True, True, False],
                                                                     [True, False, False, False]]
    assert not high_entropy_mask(entropy, torch.zeros_like(mask), 0.5).any()


def test_the_plain_policy_gradient_loss_is_minus_the_advantage_weighted_log_prob():
    logp = torch.tensor([[-1.0, -2.0, 50.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss = policy_gradient_loss(logp, adv, mask, "constant", max_len=4)
    assert close(loss, (2.0 - 2.0) / 4)
    loss.backward()
    assert close(logp.grad, [[-2.0 / 4, 1.0 / 4, 0.0]])


def test_ppo_policy_loss_bad_inputs():
    z = torch.zeros(1, 2)  # a clip range of 0, -0.1 or None: refused by the config, below
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(z, z, torch.zeros(2, 2), z, 0.2)


# Value loss hand case, clip_range_value 0.25:
#   token 0: v 1.0, old 0.5, R 2: (v-R)^2 = 1;  clip: 0.5 + 0.25 = 0.75 -> (0.75-2)^2 = 1.5625 -> max 1.5625 (clipped)
#   token 1: v 2.0, old 1.5, R 1: (v-R)^2 = 1;  clip: 1.5 + 0.25 = 1.75 -> 0.75^2 = 0.5625    -> max 1 (unclipped)
#   token 2: v 0.5, old 0.5, R 0: 0.25 both                                                    -> 0.25
#   loss = 0.5 * (1.5625 + 1 + 0.25) / 3 = 0.46875;  vf_clipfrac = 1/3
#   without clipping: 0.5 * (1 + 1 + 0.25) / 3 = 0.375
def test_value_loss_clipping_by_hand():
    values = torch.tensor([[1.0, 2.0, 0.5, 1e6]], requires_grad=True)
    old = torch.tensor([[0.5, 1.5, 0.5, float("nan")]])
    returns = torch.tensor([[2.0, 1.0, 0.0, -1e6]])
    mask = torch.tensor([[True, True, True, False]])
    loss, stats = value_loss(values, old, returns, mask, 0.25)
    assert loss.item() == 0.46875
    assert close(stats["vf_clipfrac"], 1 / 3)
    loss.backward()
    # token 0 clipped (no gradient); token 1: 0.5 * 2 (v - R) / 3 = 1/3; token 2: 0.5 * 2 * 0.5 / 3 = 1/6
    assert close(values.grad, [[0.0, 1 / 3, 1 / 6, 0.0]])
    loss, stats = value_loss(values, old, returns, mask, None)
    assert loss.item() == 0.375 and stats["vf_clipfrac"].item() == 0.0


def test_rloo_bad_inputs():
    s = torch.zeros(6)  # k = 1, 0, 2.0 or True: refused by the config, below
    with pytest.raises(ValueError, match=r"^k: 6 scores are not a whole number of groups of k=4"):
        rloo_advantages(s, 4)
    with pytest.raises(ValueError, match=r"^scores: expected a 1-D tensor"):
        rloo_advantages(torch.zeros(2, 3), 3)


@pytest.mark.parametrize("baseline,factor", [("group_mean", 1.0), ("leave_one_out", 4 / 3)])
def test_rloo_scaled_by_its_group_is_grpos_advantage(baseline, factor):
    # group_mean: GRPO's advantage exactly; leave_one_out: times k/(k - 1)
    from elastic_reset.rl.distributed import DataParallel
    from elastic_reset.rl.estimators import build_estimator

    config = config_from_dict({}, ["algo.name=rloo", "algo.samples_per_prompt=4", "algo.prompts_per_step=2",
                                   "algo.scale_rewards=group", "algo.whiten_advantages=false",
                                   f"algo.baseline={baseline}"]).algo
    rloo = build_estimator(config, DataParallel(), 3, 8, torch.device("cpu"))
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 3.0, 1.0, 2.0, 6.0])
    mask = torch.ones(8, 3)
    advantages, _ = rloo.advantages(scores, torch.ones(8, dtype=torch.bool), mask, mask, torch.zeros(8, 3), 0.0, None)
    groups = scores.view(2, 4)  # TRL's GRPO: (r - group mean) / (group std + 1e-4), std unbiased
    grpo = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).reshape(-1)
    assert torch.allclose(advantages, (factor * grpo)[:, None].expand(8, 3), atol=1e-6)
    with pytest.raises(ConfigError, match=r"^algo\.scale_rewards: 'group' scales each prompt's group"):
        config_from_dict({}, ["algo.name=ppo", "algo.scale_rewards=group"])
    with pytest.raises(ConfigError, match=r"^algo\.baseline: 'group_mean' is a baseline from each prompt's group"):
        config_from_dict({}, ["algo.name=reinforce", "algo.baseline=group_mean"])


def test_group_advantages_by_hand():
    s = torch.tensor([1.0, 0.0, 0.5, 2.5])
    assert rloo_advantages(s, 2).tolist() == [1.0, -1.0, -2.0, 2.0]  # s_i - the other one
    assert rloo_advantages(s, 2, "group_mean").tolist() == [0.5, -0.5, -1.0, 1.0]  # s_i - the pair's mean
    assert rloo_advantages(s, 4, "group_mean").tolist() == [0.0, -1.0, -0.5, 1.5]
    with pytest.raises(ValueError, match=r"^baseline: expected leave_one_out or group_mean, got 'mean'"):
        rloo_advantages(s, 2, "mean")


def test_moving_average_baseline_by_hand():
    b = MovingAverageBaseline(decay=0.9)
    assert b.value is None
    assert b.update(2.0) == 2.0  # the first update takes the batch mean as is
    assert b.update(torch.tensor(4.0)) == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)  # 2.2
    c = MovingAverageBaseline(decay=0.9)
    c.load_state_dict(b.state_dict())
    assert c.value == pytest.approx(2.2) and c.num_updates == 2
    assert c.update(0.0) == pytest.approx(1.98)
    c.load_state_dict(MovingAverageBaseline(0.5).state_dict())
    assert c.value is None


def test_moving_average_baseline_bad_inputs():
    b = MovingAverageBaseline(0.5)  # a decay of 1.0, -0.1 or 2: refused by the config, below
    with pytest.raises(ValueError, match="batch_mean_reward"):
        b.update(float("inf"))
    with pytest.raises(ValueError, match="batch_mean_reward"):
        b.update(torch.ones(3))
    with pytest.raises(ValueError, match="state"):
        b.load_state_dict({"num_updates": 3})
    assert b.value is None


# ------------------------------------------------------------------------------------- shared bad inputs
def test_masked_stats_bad_inputs():
    with pytest.raises(ValueError, match=r"^mask: shape \(2, 4\) does not match x's \(2, 3\)"):
        masked_mean(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"^mask: shape \(3,\) does not match x's \(2, 3\)"):
        masked_sum(torch.zeros(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match=r"^mask: 1 real token\(s\); the unbiased variance needs more"):
        masked_var(torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"^mask: 0 real token\(s\)"):
        whiten(torch.zeros(2, 3), torch.zeros(2, 3))


# ------------------------------------------------------------------- settings: validated once, by the config
# The functions above take their settings from the run config and do not re-check them; each value they used to
# refuse is refused when the config is loaded, naming its key (tests/test_config.py's pattern).
def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict({}, list(overrides))
    return str(err.value)


@pytest.mark.parametrize("overrides,key", [
    # AdaptiveKLController's target, horizon and initial coefficient; FixedKLController's coefficient
    *[((f"kl.target={bad}",), "kl.target") for bad in ("0", "-1.0", ".nan")],
    *[((f"kl.horizon={bad}",), "kl.horizon") for bad in ("0", "-1.0", ".nan")],
    (("kl.coef=-0.1", "kl.target=1.0"), "kl.coef"),
    (("kl.coef=-1.0",), "kl.coef"),
    # gae's gamma and lam
    (("algo.gamma=1.5",), "algo.gamma"),
    (("algo.lam=-0.1",), "algo.lam"),
    # ppo_policy_loss's clip range
    *[((f"algo.clip_range={bad}",), "algo.clip_range") for bad in ("0", "-0.1", "null")],
    # rloo_advantages' k (samples per prompt)
    *[(("algo.name=rloo", f"algo.samples_per_prompt={bad}"), "algo.samples_per_prompt")
      for bad in ("1", "0", "2.0", "true")],
    # MovingAverageBaseline's decay
    *[((f"algo.baseline_decay={bad}",), "algo.baseline_decay") for bad in ("1.0", "-0.1", "2")],
])
def test_the_config_refuses_the_settings_ops_does_not_check(overrides, key):
    assert refused(*overrides).startswith(f"{key}: ")


def test_the_adaptive_entropy_weight_moves_by_its_step_within_bounds_and_acts_below_the_target():
    from elastic_reset.rl.ops import AdaptiveEntropyCoef

    ctl = AdaptiveEntropyCoef(0.1, target=1.0, delta=0.05, low=0.0, high=0.12)
    assert ctl.applied == 0.0  # no step measured yet: TRL's last entropy starts at +inf
    assert ctl.update(0.5) == 0.12 and ctl.applied == 0.12  # at or below the target: up, to the ceiling
    assert close(ctl.update(2.0), 0.07) and ctl.applied == 0.0  # above it: down, and no bonus next step
    assert close(ctl.update(3.0), 0.02) and ctl.update(3.0) == 0.0  # down to the floor
    again = AdaptiveEntropyCoef(0.5, 1.0, 0.05, 0.0, 1.0)
    again.load_state_dict(ctl.state_dict())
    assert (again.coef, again.last, again.applied) == (0.0, 3.0, 0.0)

