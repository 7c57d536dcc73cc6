"""TRL's fused log-probabilities on the CPU: TRL's tiles against `cpu_logprob_tiles` (decision 145).

    python benchmarks/cpu_logprob_tiles.py [--tokens 2472] [--hidden 32 576] [--repetitions 5] [--tiny]

For each hidden size, three arms each run the forward and backward pass of TRL's
`ChunkedLogProbFunction` (log-probabilities and entropy of `--tokens` positions against SmolLM2's
vocabulary of 49,152) in a process of its own, forked from this one before it ran any pass, so that its
peak memory and its allocator are its own:
`trl` (TRL's 32,768 columns, glibc as it is), `narrow` (1,024 columns) and `narrow+kept` (1,024 columns,
and glibc keeps freed tiles: what `ComposerTrainer` runs on the CPU). Reported per arm: the median pass
after a warm-up one, its system time and minor page faults, and the process's peak RSS. Every pass's
results must be finite and every arm's must match `trl`'s (log-probabilities, entropy, both gradients),
else the run fails. 2,472 positions are two rollouts of `trainer_tool_rounds.py --tiny` (a tool prompt
and a completion of 384 tokens each, every position scored). `--tiny` (CI's run): 64 positions, hidden 8,
one pass per arm.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from trl.kernels.chunked_logprob import ChunkedLogProbFunction
from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE  # also what the backward pass imports

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_client import cpu_logprob_tiles  # noqa: E402

VOCAB = 49152
ARMS = ("trl", "narrow", "narrow+kept")


def run_arm(arm: str, tokens: int, hidden_size: int, repetitions: int) -> dict:
    """One arm's passes in this process: timings, faults, peak memory and the last pass's results."""
    if arm == "narrow+kept":
        cpu_logprob_tiles.keep_freed_tiles()
    width = _CHUNKED_LOGPROB_CHUNK_SIZE if arm == "trl" else cpu_logprob_tiles.COLUMNS
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, generator=generator, requires_grad=True)
    weight = (torch.randn(VOCAB, hidden_size, generator=generator) / hidden_size**0.5).requires_grad_()
    targets = torch.randint(0, VOCAB, (tokens,), generator=generator)
    seconds, system_seconds, faults = [], [], []
    for _ in range(repetitions + 1):  # the first is a warm-up
        hidden.grad = weight.grad = None
        usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        logprobs, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, width, None, 1.0, ("entropy",))
        (logprobs.sum() + entropy.sum()).backward()
        after = resource.getrusage(resource.RUSAGE_SELF)
        seconds.append(time.perf_counter() - start)
        system_seconds.append(after.ru_stime - usage.ru_stime)
        faults.append(after.ru_minflt - usage.ru_minflt)
        results = [logprobs.detach(), entropy.detach(), hidden.grad, weight.grad]
        if not all(torch.isfinite(r).all() for r in results):
            raise RuntimeError(f"{arm}: a pass gave a value that is not finite")
    return {
        "seconds": statistics.median(seconds[1:]), "system_seconds": statistics.median(system_seconds[1:]),
        "page_faults": statistics.median(faults[1:]), "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "results": [r.flatten().tolist() for r in results[:2]] + [float(r.norm()) for r in results[2:]],
    }


def checked_against(reference: dict, measured: dict, arm: str) -> None:
    """Fails unless an arm's log-probabilities, entropies and gradient norms are TRL's, to float rounding."""
    for name, expected, got in zip(("log-probabilities", "entropy", "hidden gradient", "weight gradient"),
                                   reference["results"], measured["results"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-4,
                                   msg=lambda message, name=name: f"{arm}: {name} differ from TRL's tiles: {message}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2472)
    parser.add_argument("--hidden", type=int, nargs="+", default=[32, 576], help="hidden sizes (SmolLM2-135M: 576)")
    parser.add_argument("--repetitions", type=int, default=5, help="measured passes per arm, after a warm-up one")
    parser.add_argument("--tiny", action="store_true", help="64 positions, hidden 8, one pass per arm: every path and check")
    args = parser.parse_args()
    if args.tiny:
        args.tokens, args.hidden, args.repetitions = 64, [8], 1

    print(f"{args.tokens} positions x {VOCAB} vocabulary, forward and backward, median of {args.repetitions} passes after a warm-up")
    print(f"{'hidden':>6} {'arm':<12}{'pass s':>8}{'x trl':>7}{'sys s':>7}{'page faults':>12}{'peak RSS GiB':>13}")
    measured: dict[int, dict[str, dict]] = {hidden_size: {} for hidden_size in args.hidden}
    for hidden_size, arms in measured.items():  # no torch operation runs here before the last fork: each child starts clean
        for arm in ARMS:
            with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as child:
                arms[arm] = child.submit(run_arm, arm, args.tokens, hidden_size, args.repetitions).result()
    for hidden_size, arms in measured.items():
        for arm, m in arms.items():
            checked_against(arms["trl"], m, arm)
            print(f"{hidden_size:>6} {arm:<12}{m['seconds']:>8.3f}{m['seconds'] / arms['trl']['seconds']:>7.2f}"
                  f"{m['system_seconds']:>7.2f}{m['page_faults']:>12.0f}{m['peak_bytes'] / 2**30:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
