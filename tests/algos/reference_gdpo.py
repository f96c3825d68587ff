"""Reference numbers for tests/algos/test_core_algos.cpp (Advantages.Gdpo).

verl/trainer/ppo/core_algos.py compute_gdpo_outcome_advantage restated in torch from its formula
(verl at 1dda039b): each reward component is put on the response's last token, normalised by
compute_grpo_outcome_advantage (group mean and unbiased std, a group of one: mean 0, std 1), the
components are summed with their float32 weights, then masked_whiten * mask. float32 as verl.
Run: /usr/bin/python3 tests/algos/reference_gdpo.py  (torch 1.13 CPU)
"""
import torch

torch.set_printoptions(precision=8)

MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
INDEX = [7, 7, 7, 3, 3]
COMPONENTS = [[1.0, 0.0, 1.0, 0.5, 0.25], [0.2, 0.9, 0.4, 0.0, 1.0]]
WEIGHTS = [1.0, 0.5]


def grpo(token_level_rewards, mask, index, eps=1e-6, norm=True):
    scores = token_level_rewards.sum(dim=-1)
    groups = {}
    for i, u in enumerate(index):
        groups.setdefault(u, []).append(scores[i])
    mean, std = {}, {}
    for u, v in groups.items():
        if len(v) == 1:
            mean[u], std[u] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            t = torch.stack(v)
            mean[u], std[u] = torch.mean(t), torch.std(t)
    out = scores.clone()
    for i, u in enumerate(index):
        out[i] = (scores[i] - mean[u]) / (std[u] + eps) if norm else scores[i] - mean[u]
    return out.unsqueeze(-1) * mask


def masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def masked_whiten(values, mask):  # verl/utils/torch_functional.py, unbiased, shift_mean
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    var = var * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def gdpo(weights, norm=True):
    lengths = MASK.sum(-1).long()
    acc = None
    w = torch.tensor(weights, dtype=torch.float32)
    for k, comp in enumerate(COMPONENTS):
        r = torch.zeros_like(MASK)
        r[torch.arange(5), lengths - 1] = torch.tensor(comp)
        a = grpo(r, MASK, INDEX, norm=norm)
        acc = w[k] * a if acc is None else acc + w[k] * a
    return masked_whiten(acc, MASK) * MASK


print("weighted", gdpo(WEIGHTS).flatten().tolist())
print("ones", gdpo([1.0, 1.0]).flatten().tolist())
print("dr_grpo", gdpo(WEIGHTS, norm=False).flatten().tolist())
