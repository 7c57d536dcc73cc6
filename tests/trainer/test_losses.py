"""The loss functions against values worked out by hand (natural logs, 6 decimals)."""

import math

import pytest
import torch

from trainer_client.losses import dpo_loss, generalized_jsd


def logits_of(*probs: float) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs])


# teacher T = [0.5, 0.5], student S = [0.25, 0.75]
TEACHER = logits_of(0.5, 0.5)
STUDENT = logits_of(0.25, 0.75)


@pytest.mark.parametrize(
    ("beta", "expected"),
    [
        # KL(T||S) = .5 ln(.5/.25) + .5 ln(.5/.75)
        (0.0, 0.143841),
        # KL(S||T) = .25 ln(.25/.5) + .75 ln(.75/.5)
        (1.0, 0.130812),
        # M = [.375, .625]; .5 (.5 ln(.5/.375) + .5 ln(.5/.625)) + .5 (.25 ln(.25/.375) + .75 ln(.75/.625))
        (0.5, 0.033822),
    ],
)
def test_generalized_jsd_matches_hand_values(beta: float, expected: float) -> None:
    value = generalized_jsd(STUDENT, TEACHER, beta=beta)
    assert value.item() == pytest.approx(expected, abs=1e-6)


def test_beta_may_be_passed_positionally() -> None:
    # the loss functions read like TRL's: (student, teacher, beta) and (four log-prob tensors, beta)
    assert generalized_jsd(STUDENT, TEACHER, 0.0).item() == pytest.approx(0.143841, abs=1e-6)
    one = torch.tensor([0.0])
    assert dpo_loss(one, one, one, one, 0.5).losses.item() == pytest.approx(math.log(2), abs=1e-6)


def test_generalized_jsd_between_ends_weights_the_mixture() -> None:
    # beta = .25: M = .25 T + .75 S = [.3125, .6875]
    # .25 (.5 ln(.5/.3125) + .5 ln(.5/.6875)) + .75 (.25 ln(.25/.3125) + .75 ln(.75/.6875))
    # = .25 * .075775 + .75 * .009472
    value = generalized_jsd(STUDENT, TEACHER, beta=0.25)
    assert value.item() == pytest.approx(0.026048, abs=1e-6)


def test_temperature_flattens_both_distributions() -> None:
    # logits / 2 -> probabilities proportional to sqrt(p): S' = [.366025, .633975], T' = T
    # KL(T||S') = .5 ln(.5/.366025) + .5 ln(.5/.633975)
    value = generalized_jsd(STUDENT, TEACHER, beta=0.0, temperature=2.0)
    assert value.item() == pytest.approx(0.037252, abs=1e-6)


def test_top_k_keeps_a_tail_bucket() -> None:
    # teacher [.5, .3, .2], student [.2, .2, .6]; top-1 of the teacher is token 0:
    # T = [.5 | .5], S = [.2 | .8]; KL(T||S) = .5 ln(.5/.2) + .5 ln(.5/.8)
    value = generalized_jsd(logits_of(0.2, 0.2, 0.6), logits_of(0.5, 0.3, 0.2), beta=0.0, top_k=1)
    assert value.item() == pytest.approx(0.223144, abs=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_top_k_equals_the_divergence_of_the_restricted_distributions_with_gradients(beta: float) -> None:
    """Against the definition written out: full log-softmax, the teacher's top-k gathered, the rest's mass
    as a tail bucket; the divergence of those two distributions, and its gradient on the student."""
    torch.manual_seed(0)
    teacher = torch.randn(5, 300) * 3
    student = (torch.randn(5, 300) * 3).requires_grad_()
    value = generalized_jsd(student, teacher, beta=beta, temperature=0.7, top_k=10, reduction="sum")
    (gradient,) = torch.autograd.grad(value, student)

    reference_student = student.detach().double().requires_grad_()  # float64: `1 - head` cancels

    def restricted(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits / 0.7, dim=-1)
        head = probs.gather(-1, teacher.topk(10, dim=-1).indices)
        return torch.cat([head, 1 - head.sum(-1, keepdim=True)], dim=-1)

    p, q = restricted(teacher.double()), restricted(reference_student)
    m = beta * p + (1 - beta) * q
    kl = lambda a, b: (a * (a / b).log()).sum(-1)  # noqa: E731
    expected = {0.0: lambda: kl(p, q), 1.0: lambda: kl(q, p)}.get(beta, lambda: beta * kl(p, m) + (1 - beta) * kl(q, m))().sum()
    (expected_gradient,) = torch.autograd.grad(expected, reference_student)
    torch.testing.assert_close(value, expected.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gradient, expected_gradient.float(), rtol=1e-3, atol=1e-5)


def test_mask_drops_positions_from_sum_and_mean() -> None:
    student = torch.stack([STUDENT, STUDENT.flip(0)])
    teacher = torch.stack([TEACHER, TEACHER])
    mask = torch.tensor([1, 0])
    per_token = generalized_jsd(student, teacher, beta=0.0, mask=mask, reduction="none")
    assert per_token.tolist() == pytest.approx([0.143841, 0.0], abs=1e-6)
    assert generalized_jsd(student, teacher, beta=0.0, mask=mask).item() == pytest.approx(0.143841, abs=1e-6)
    assert generalized_jsd(student, teacher, beta=0.0, mask=torch.zeros(2)).item() == 0.0


def test_identical_distributions_have_zero_divergence_and_gradient_reaches_student_only() -> None:
    student = STUDENT.clone().requires_grad_(True)
    teacher = STUDENT.clone().requires_grad_(True)
    loss = generalized_jsd(student, teacher.detach(), beta=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert teacher.grad is None
    assert torch.allclose(student.grad, torch.zeros(2), atol=1e-7)


@pytest.mark.parametrize("kwargs", [{"beta": 1.5}, {"beta": -0.1}, {"temperature": 0.0}])
def test_generalized_jsd_rejects_bad_parameters(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generalized_jsd(STUDENT, TEACHER, **kwargs)


def test_sigmoid_dpo_matches_hand_values() -> None:
    # log-ratios: chosen -1 - (-2) = 1, rejected -3 - (-2) = -1; h = 2; beta h = 1
    # loss = -ln sigmoid(1) = ln(1 + e^-1)
    out = dpo_loss(
        torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0]), beta=0.5
    )
    assert out.losses.item() == pytest.approx(0.313262, abs=1e-6)
    assert out.chosen_rewards.item() == pytest.approx(0.5)
    assert out.rejected_rewards.item() == pytest.approx(-0.5)


def test_ipo_matches_hand_values() -> None:
    # h = 2, 1 / (2 beta) = 1 -> (2 - 1)^2; and h = 0 -> (0 - 1)^2
    out = dpo_loss(
        torch.tensor([-1.0, -2.0]),
        torch.tensor([-3.0, -2.0]),
        torch.tensor([-2.0, -2.0]),
        torch.tensor([-2.0, -2.0]),
        beta=0.5,
        loss_type="ipo",
    )
    assert out.losses.tolist() == pytest.approx([1.0, 1.0])


def test_dpo_gradient_raises_chosen_and_lowers_rejected() -> None:
    chosen = torch.tensor([-2.0], requires_grad=True)
    rejected = torch.tensor([-2.0], requires_grad=True)
    dpo_loss(chosen, rejected, torch.tensor([-2.0]), torch.tensor([-2.0])).losses.sum().backward()
    assert chosen.grad.item() < 0 < rejected.grad.item()


def test_dpo_rejects_unknown_loss_type() -> None:
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), loss_type="hinge")  # type: ignore[arg-type]
