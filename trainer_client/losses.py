"""Loss functions of the SDPO and DPO channels: pure functions on tensors, no model, no trainer.

`generalized_jsd` follows the GKD paper's definition (Agarwal et al., 2024), P = teacher, Q = student:

    JSD_beta(P, Q) = beta * KL(P || M) + (1 - beta) * KL(Q || M),   M = beta * P + (1 - beta) * Q

It tends to zero at both ends, so the ends are defined by their limits divided by beta and 1 - beta
respectively: beta = 0 is the forward KL(P || Q) (mode-covering), beta = 1 the reverse KL(Q || P)
(mode-seeking), beta = 0.5 the symmetric Jensen-Shannon divergence.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

Reduction = Literal["none", "sum", "mean"]


def _top_k_with_tail(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both log-distributions restricted to the teacher's top-k tokens plus one bucket for the rest.

    The bucket keeps each restricted distribution normalised, so the divergence still sees how much
    mass the student puts outside the teacher's support instead of renormalising it away. Only the
    top-k log-probs are formed (logit minus logsumexp): no `(..., vocab)` log-softmax is kept, for the
    forward or the backward.
    """
    index = teacher_logits.topk(top_k, dim=-1).indices  # the logits' order is the probabilities'
    restricted = []
    for logits in (student_logits, teacher_logits):
        head = logits.gather(-1, index) - logits.logsumexp(dim=-1, keepdim=True)
        head_mass = head.logsumexp(dim=-1, keepdim=True).clamp(max=0.0)
        # log(1 - exp(x)) = log(-expm1(x)), accurate when the head holds almost all the mass
        tail = torch.log((-torch.expm1(head_mass)).clamp(min=torch.finfo(head.dtype).tiny))
        restricted.append(torch.cat([head, tail], dim=-1))
    return restricted[0], restricted[1]


def _reduce(values: torch.Tensor, mask: torch.Tensor | None, reduction: Reduction) -> torch.Tensor:
    if mask is not None:
        values = values * mask.to(values.dtype)
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum()
    count = mask.sum() if mask is not None else torch.tensor(values.numel(), device=values.device)
    return values.sum() / count.clamp(min=1)


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    top_k: int | None = None,
    mask: torch.Tensor | None = None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """Generalized Jensen-Shannon divergence between teacher and student, per token.

    Args:
        student_logits: `(..., vocab)` logits of the student; gradients flow through them.
        teacher_logits: `(..., vocab)` logits of the teacher, same shape; treated as given.
        beta: 0 = forward KL(teacher || student), 1 = reverse KL(student || teacher), between = JSD.
        temperature: Both logits are divided by it before the softmax.
        top_k: Restrict both distributions to the teacher's top-k tokens plus a tail bucket.
        mask: `(...)` 0/1 or bool; positions with 0 contribute nothing (and are not counted by "mean").
        reduction: "none" (per token, masked to 0), "sum", or "mean" over unmasked positions.

    Returns:
        The divergence, reduced as asked.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    student_logits, teacher_logits = student_logits.float() / temperature, teacher_logits.float() / temperature
    if top_k is not None and top_k < student_logits.size(-1):
        student_logps, teacher_logps = _top_k_with_tail(student_logits, teacher_logits, top_k)
    else:
        student_logps, teacher_logps = F.log_softmax(student_logits, dim=-1), F.log_softmax(teacher_logits, dim=-1)

    def kl(p_logps: torch.Tensor, q_logps: torch.Tensor) -> torch.Tensor:
        return F.kl_div(q_logps, p_logps, reduction="none", log_target=True).sum(-1)

    if beta == 0.0:
        divergence = kl(teacher_logps, student_logps)
    elif beta == 1.0:
        divergence = kl(student_logps, teacher_logps)
    else:
        # beta KL(p || m) + (1 - beta) KL(q || m) with m = beta p + (1 - beta) q, written as
        # beta sum p log p + (1 - beta) sum q log q - sum m log m: about a third of the passes over the
        # vocabulary of the logsumexp form (this is most of SDPO's own cost at a 49k vocabulary).
        # log m is clamped so that a token both assign 0 gives 0, and a zero gradient, not 0 * -inf.
        teacher_probs, student_probs = teacher_logps.exp(), student_logps.exp()
        mixture = torch.lerp(student_probs, teacher_probs, beta)
        mixture_entropy_term = mixture * mixture.clamp(min=torch.finfo(mixture.dtype).tiny).log()
        divergence = (
            beta * teacher_probs * teacher_logps + (1.0 - beta) * student_probs * student_logps - mixture_entropy_term
        ).sum(-1)
    return _reduce(divergence, mask, reduction)


class DPOOutput(NamedTuple):
    """Per-pair DPO loss and the implicit rewards it was computed from."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    """beta * (log pi(chosen) - log ref(chosen)), detached."""
    rejected_rewards: torch.Tensor
    """beta * (log pi(rejected) - log ref(rejected)), detached."""


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid",
) -> DPOOutput:
    """DPO on summed sequence log-probs, one value per pair.

    Args:
        policy_chosen_logps: `(pairs,)` log pi(chosen | context) under the trained policy.
        policy_rejected_logps: `(pairs,)` log pi(rejected | context) under the trained policy.
        reference_chosen_logps: `(pairs,)` the same under the frozen reference.
        reference_rejected_logps: `(pairs,)` the same under the frozen reference.
        beta: Inverse temperature of the implicit reward (sigmoid) or regulariser strength (IPO).
        loss_type: "sigmoid" = -log sigmoid(beta * h) (Rafailov et al., 2023);
            "ipo" = (h - 1 / (2 * beta))^2 (Azar et al., 2023); h = the difference of log-ratios.

    Returns:
        Losses and implicit rewards per pair.
    """
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    chosen_logratios = policy_chosen_logps - reference_chosen_logps
    rejected_logratios = policy_rejected_logps - reference_rejected_logps
    margin = chosen_logratios - rejected_logratios
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * margin)
    elif loss_type == "ipo":
        losses = (margin - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; expected 'sigmoid' or 'ipo'")
    return DPOOutput(losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach())
