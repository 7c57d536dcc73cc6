"""ComposerTrainer scores TRL's fused log-probabilities in CPU-sized tiles on the CPU (decision 145)."""

from __future__ import annotations

import resource

import torch
import trl.trainer.utils as trl_utils
from trl.kernels.chunked_logprob import ChunkedLogProbFunction

from tests.trainer.conftest import build_batch, make_config, make_trainer
from trainer_client import cpu_logprob_tiles


def test_the_trainer_scores_in_narrow_tiles_on_the_cpu_and_leaves_trls_width_after(tmp_path, tokenizer, base_model, monkeypatch) -> None:
    trainer = make_trainer(base_model, tokenizer, make_config(tmp_path, sdpo_weight=0.0, dpo_weight=0.0))
    inputs = build_batch(trainer, tokenizer, hinted=[False, False])
    widths = []
    trl_apply = ChunkedLogProbFunction.apply

    def recording_apply(*args):
        widths.append(args[5])  # hidden, weight, bias, targets, temperature, chunk_size, ...
        return trl_apply(*args)

    wide = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
    monkeypatch.setattr(ChunkedLogProbFunction, "apply", recording_apply)  # the class TRL's forward calls
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    assert widths == [cpu_logprob_tiles.COLUMNS] and torch.isfinite(loss)
    assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == wide > cpu_logprob_tiles.COLUMNS
    assert all(torch.isfinite(p.grad).all() for p in trainer.model.parameters() if p.grad is not None)


def test_narrow_tiles_give_trls_log_probabilities_and_gradients() -> None:
    torch.manual_seed(0)
    vocab = 3 * cpu_logprob_tiles.COLUMNS + 5  # a last tile narrower than the others
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(vocab, 16, requires_grad=True)
    targets = torch.randint(0, vocab, (40,))

    def scored(width: int) -> list[torch.Tensor]:
        hidden.grad = weight.grad = None
        logprobs, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, width, None, 1.0, ("entropy",))
        (logprobs.sum() + entropy.sum()).backward()
        return [logprobs.detach(), entropy.detach(), hidden.grad, weight.grad]

    narrow, wide = scored(cpu_logprob_tiles.COLUMNS), scored(trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE)
    for a, b in zip(narrow, wide):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_after_a_pass_on_the_cpu_freed_tiles_are_kept_for_the_next_one() -> None:
    with cpu_logprob_tiles.cpu_logprob_tiles(torch.device("cpu")):  # what a pass on the CPU opens
        pass
    tile_pages = 4096 * cpu_logprob_tiles.COLUMNS * 4 // resource.getpagesize()

    def page_faults_to_fill(tiles: int) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held = [torch.ones(4096, cpu_logprob_tiles.COLUMNS) for _ in range(tiles)]
        assert all(tile.sum() == tile.numel() for tile in held)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    page_faults_to_fill(6), page_faults_to_fill(6)  # the heap grows to hold six tiles at once; each time all are freed
    assert page_faults_to_fill(6) < tile_pages  # glibc's own thresholds hand all six back to the kernel every time
