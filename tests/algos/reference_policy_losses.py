"""Reference numbers for tests/algos/test_core_algos.cpp (PolicyLossModes.*).

Each policy loss of verl/trainer/ppo/core_algos.py (compute_policy_loss_<mode>), restated in
torch from its formula, on one tiny batch; torch's autograd gives d loss / d log_prob, so the
stop-gradients (gspo, cispo) are torch's. float64. clip_cov takes the candidates of largest
covariance instead of verl's random draw (as src/trainer/core_algos.cpp does).
Run: /usr/bin/python3 tests/algos/reference_policy_losses.py  (torch 1.13 CPU)
"""
import torch

torch.set_printoptions(precision=10)
D = torch.float64

MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=D)
OLD = torch.tensor([[-1.0, -0.7, -2.0, -0.4], [-1.2, -0.3, -1.0, -1.0], [-0.8, -1.5, -0.6, -1.0]], dtype=D)
X = torch.tensor([[0.1, 0.35, -0.3, -0.05], [0.25, -0.15, 0.0, 0.0], [0.05, 0.4, -0.25, 0.0]], dtype=D)
ADV = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, 0.0, 0.0], [0.8, -1.2, 0.3, 0.0]], dtype=D)
LO, HI = 0.2, 0.28  # clip_ratio_low, clip_ratio_high


def mmean(v, m):
    return (v * m).sum() / (m.sum() + 1e-8)


def token_mean(l, m):
    return (l * m).sum() / m.sum()


def seq_mean_token_mean(l, m):
    per_seq = (l * m).sum(-1) / (m.sum(-1) + 1e-8)
    has = (m.sum(-1) > 0).to(D)
    return (per_seq * has).sum() / has.sum()


def gpg(lp):
    return token_mean(-lp * ADV, MASK), {}


def gspo(lp):
    x = lp - OLD
    s = (x * MASK).sum(-1) / MASK.sum(-1).clamp(min=1)
    log_r = torch.clamp(lp - lp.detach() + s.detach().unsqueeze(-1), max=10.0)
    r = torch.exp(log_r)
    l1, l2 = -ADV * r, -ADV * torch.clamp(r, 1 - LO, 1 + HI)
    loss = seq_mean_token_mean(torch.maximum(l1, l2), MASK)
    return loss, {"clipfrac": mmean((l2 > l1).to(D), MASK), "ppo_kl": mmean(-x, MASK)}


def sapo(lp, tau_pos=1.0, tau_neg=1.05):
    x = torch.clamp(lp - OLD, -20, 20)
    r = torch.exp(x)
    tau = torch.where(ADV > 0, torch.full_like(ADV, tau_pos), torch.full_like(ADV, tau_neg))
    gate = torch.sigmoid(tau * (r - 1)) * 4 / tau
    return seq_mean_token_mean(-gate * ADV, MASK), {"ppo_kl": mmean(-x, MASK)}


def cispo(lp):
    x = torch.clamp(lp - OLD, -20, 20)
    r = torch.exp(x)
    c = torch.clamp(r, 1 - LO, 1 + HI)
    loss = token_mean(-c.detach() * ADV * lp, MASK)
    return loss, {"clipfrac": mmean((r != c).to(D), MASK), "ppo_kl": mmean(-x, MASK)}


def clip_cov(lp, ratio, lb, ub):
    x = lp - OLD
    r = torch.exp(x)
    l1, l2 = -ADV * r, -ADV * torch.clamp(r, 1 - LO, 1 + HI)
    cov = (ADV - mmean(ADV, MASK)) * (lp.detach() - mmean(lp.detach(), MASK))
    ok = (MASK > 0) & ~(l2 > l1) & (cov > lb) & (cov < ub)
    n = max(int(ratio * MASK.sum().item()), 1)
    cand = [i for i in range(ok.numel()) if ok.reshape(-1)[i]]
    cand.sort(key=lambda i: (-cov.reshape(-1)[i].item(), i))
    corr = torch.ones_like(ADV).reshape(-1)
    corr[cand[:n]] = 0
    corr = corr.reshape(ADV.shape)
    loss = token_mean(torch.maximum(l1, l2) * corr, MASK)
    return loss, {"cut": cand[:n], "clipfrac": mmean((corr == 0).to(D), MASK), "cov": cov}


def kl_cov(lp, ratio, coef):
    x = lp - OLD
    r = torch.exp(x)
    valid = MASK > 0
    a, l = ADV[valid], lp.detach()[valid]
    cov = (a - a.mean()) * (l - l.mean())
    k = max(1, int(len(cov) * ratio))
    top = torch.topk(cov, k).indices
    flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][top]
    pen = torch.zeros(ADV.numel(), dtype=D)
    pen[flat] = 1
    pen = pen.reshape(ADV.shape)
    loss = token_mean(-ADV * r + pen * coef * x.abs(), MASK)
    return loss, {"penalised": flat.tolist(), "ppo_kl": mmean(x.abs(), MASK)}


def geo_mean(lp):
    x = lp - OLD
    sg = torch.sign(ADV)
    xc = torch.clamp(x, -LO, HI)
    xm = sg * torch.min(sg * x, sg * xc)
    n = MASK.sum(-1)
    ratio = torch.exp((xm * MASK).sum(-1) / (n + 1e-8))
    adv = (ADV * MASK).sum(-1) / (n + 1e-8)
    loss = torch.mean(-adv * ratio)
    clipped = (x != xc).to(D)
    return loss, {
        "clipfrac": mmean(clipped * (ADV > 0), MASK),
        "clipfrac_lower": mmean(clipped * (ADV < 0), MASK),
        "ppo_kl": mmean(-x, MASK),
    }


def run(name, fn, *args):
    lp = (OLD + X).clone().requires_grad_(True)
    loss, metrics = fn(lp, *args)
    loss.backward()
    print(f"== {name}: loss {loss.item():.10f}")
    for k, v in metrics.items():
        print(f"   {k}: {v.tolist() if torch.is_tensor(v) and v.numel() > 1 else (v.item() if torch.is_tensor(v) else v)}")
    print("   grad", [round(g, 10) for g in lp.grad.reshape(-1).tolist()])


if __name__ == "__main__":
    run("gpg", gpg)
    run("gspo", gspo)
    run("sapo", sapo)
    run("cispo", cispo)
    run("clip_cov top-1 of 2", clip_cov, 0.2, 0.005, 0.2)
    run("clip_cov all candidates", clip_cov, 0.5, 0.02, 5.0)
    run("kl_cov", kl_cov, 0.25, 0.1)
    run("geo_mean", geo_mean)
