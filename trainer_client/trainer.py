"""`ComposerTrainer`: TRL's GRPO plus two loss channels.

    loss = grpo + sdpo_weight * sdpo + dpo_weight * dpo

This module keeps the config, TRL's overrides and the wiring; each channel is a module of its own,
written against `policy_forward.PolicyHost` (what it needs from the trainer, which this class provides;
decision 122):

- GRPO is TRL's own loss, untouched: with both weights 0 the loss is exactly TRL's (the rollouts'
  failures are still read, for the per-step logs of `rollout_metrics`).
- SDPO (`sdpo`): self-distillation at the turns the policy got wrong (hint sites, decisions 061, 063),
  from GRPO's own forward (its hidden states, and the keys and values the live teacher reads,
  decisions 060, 076); the teacher's weights are `teacher`'s, and what it reads at a site is chosen from
  the hint sources of `teacher_contexts` (the hint, the raw error, a successful sibling, the task's
  reference; decision 129).
- DPO (`dpo`): trace-replay preference pairs, with trust-region DPO's reference sync (decision 068).
  The EMA teacher and the trust-region reference are copies of the policy that trail it (`policy_copies`).
- Several processes (decision 069): every rank joins every collective (a rank without a hint site in
  a step where another has one runs the SDPO forwards on a dummy site weighted 0), and the logged
  rollout, SDPO and DPO numbers are the global batch's.
- Rollouts: the environments' resets and tool rounds run concurrently across rollouts; that is the
  base class's, `ConcurrentRolloutTrainer` (`concurrent_rollouts`, decision 062).

Pinned to TRL 1.16.0 and transformers (pyproject.toml): the private methods overridden here (`_generate`, `_generate_and_score_completions`,
`_get_per_token_logps_and_entropies`, `_compute_loss`) and every other TRL internal used are listed in decision 064.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

import torch
from accelerate.utils import gather_object, is_peft_model
from datasets import Dataset
from transformers import Cache

from trainer_client.call_tokens import DistilledTokens, TurnTokenClasses, content_sites
from trainer_client.completion_samples import CompletionSampleLog, RolloutSample
from trainer_client.concurrent_rollouts import (
    ConcurrentRolloutConfig,
    ConcurrentRolloutTrainer,
)
from trainer_client.cpu_logprob_tiles import cpu_logprob_tiles
from trainer_client.dpo import DpoChannel, DpoSettings
from trainer_client.environment import TrlEnvironment, task_reference
from trainer_client.hint_sites import (
    HintSite,
    HintTemplate,
    TurnReport,
    locate_hint_sites,
    turn_reports,
)
from trainer_client.packing import takes_shared_prefixes
from trainer_client.policy_copies import EveryOptimizerSteps
from trainer_client.policy_forward import BackboneCapture
from trainer_client.preferences import PairTokens, PreferenceBatches, load_preference_pairs
from trainer_client.records import PreferencePair
from trainer_client.rollout_metrics import EpisodeOutcome, rollout_metrics
from trainer_client.sdpo import SdpoChannel, SdpoSettings
from trainer_client.teacher import SdpoTeacher
from trainer_client.teacher_contexts import (
    HINT_PLACEMENTS,
    hint_sources,
    privileged_context,
    reference_text,
    sibling_solutions,
    solution_calls,
    turn_answers,
)

log = logging.getLogger(__name__)


@dataclass
class ComposerConfig(ConcurrentRolloutConfig):
    """GRPOConfig plus rollout concurrency and the SDPO and DPO channels. (`beta` stays TRL's KL coefficient.)"""

    report_to: None | str | list[str] = field(
        default="tensorboard",
        metadata={
            "help": "Where metrics go: TensorBoard event files under `output_dir/runs` (`[train]` installs it; "
            "`tensorboard --logdir OUTPUT_DIR`), another integration's name, or 'none' / []."
        },
    )
    completion_samples_per_step: int = field(
        default=2,
        metadata={
            "help": "Rollouts of each generation batch written as conversations to `output_dir/completions.jsonl` "
            "(the task, each turn and tool answer, error kinds, reward), to read what the policy did; 0: none."
        },
    )
    sdpo_weight: float = field(default=0.0, metadata={"help": "alpha: weight of the SDPO loss; 0 disables it."})
    jsd_beta: float = field(
        default=0.5, metadata={"help": "Generalized JSD interpolation: 0 forward KL, 1 reverse KL, between JSD."}
    )
    jsd_temperature: float = field(default=1.0, metadata={"help": "Temperature of both distributions in the JSD."})
    jsd_top_k: int | None = field(
        default=None, metadata={"help": "Restrict the JSD to the teacher's top-k tokens plus a tail bucket."}
    )
    sdpo_teacher: str = field(
        default="live",
        metadata={"help": "Teacher weights: 'live' (the policy now), 'ema' (an EMA copy), 'base' (PEFT adapter off)."},
    )
    sdpo_normalizer: str = field(
        default="policy_tokens",
        metadata={
            "help": "What the SDPO sum over hint-site tokens is divided by: 'policy_tokens' (the generation batch's "
            "policy tokens, GRPO's own count, so a short site weighs as little as its tokens; decision 065) or "
            "'hint_tokens' (the batch's hint-site tokens: a mean over sites, one short site can weigh as much as GRPO)."
        },
    )
    teacher_ema_decay: float = field(default=0.99, metadata={"help": "EMA decay per optimizer step ('ema' teacher)."})
    sdpo_reuse_policy_cache: bool = field(
        default=True,
        metadata={
            "help": "The live teacher reads the rollouts' contexts from the keys and values of GRPO's own forward and "
            "runs only the hints and hinted turns (decision 076), with or without activation checkpointing. Applies "
            "where packed rows apply; otherwise, or off, the teacher runs the contexts again."
        },
    )
    hint_sources: list[str] = field(
        default_factory=lambda: ["template"],
        metadata={
            "help": "What the SDPO teacher reads at a site, combined in one message (decision 129): 'template' (the "
            "hint written for a failed turn), 'raw_error' (the tool answer the failed turn got), 'sibling' (the calls "
            "of a rollout of the same group that earned reward 1) and 'reference' (the task's reference solution, "
            "with the service's privileged token in the environment's client settings). Feedback sources make the "
            "failed turns sites; privileged ones (sibling, reference) every turn of a rollout that did not earn 1."
        },
    )
    hint_placement: str = field(
        default="before_turn",
        metadata={
            "help": "Where the teacher reads the message: 'before_turn' (just before the site's turn) or "
            "'after_prompt' (after the task prompt, before the first turn, then the rollout up to the site)."
        },
    )
    hint_role: str = field(default="user", metadata={"help": "Chat role of the hint message the teacher reads."})
    sdpo_tokens: str = field(
        default="content",
        metadata={
            "help": "Which tokens of a hint site's turn SDPO distils: 'content' (the call's argument values and prose, "
            "not its envelope, tool name and argument names, at every site: a site left with no content is dropped) "
            "or 'all'. Distilled whole, a teacher moved which call a turn makes and collapsed the policy (decisions "
            "132, 133, 135)."
        },
    )
    tool_call_marker: str = field(
        default="<tool_call>",
        metadata={
            "help": "Text that opens a tool call in the chat template: a turn with it but no parsed call failed "
            "to parse (a `json_decode` hint site). Qwen2.5/3 and Hermes templates: `<tool_call>`."
        },
    )
    dpo_weight: float = field(default=0.0, metadata={"help": "beta: weight of the DPO loss; 0 disables it."})
    dpo_beta: float = field(default=0.1, metadata={"help": "DPO inverse temperature (IPO: regulariser strength)."})
    dpo_loss_type: str = field(default="sigmoid", metadata={"help": "'sigmoid' (DPO) or 'ipo'."})
    dpo_pairs_path: str | None = field(default=None, metadata={"help": "Preference pairs JSONL (PreferencePair)."})
    dpo_batch_size: int = field(default=2, metadata={"help": "Pairs per DPO mini-batch (one per micro-step)."})
    dpo_max_length: int = field(default=2048, metadata={"help": "Longest pair sequence; a longer context loses its oldest exchanges, never the system prompt, tools or task."})
    dpo_tokens: str = field(
        default="differing",
        metadata={
            "help": "Which tokens of a pair's actions DPO scores: 'differing' (each action up to its last token that "
            "the two do not end with in common: the edit a pair prefers, not the rest the two share) or 'all'. "
            "Decision 134."
        },
    )
    dpo_group_by_context: bool = field(
        default=True,
        metadata={
            "help": "Draw each DPO mini-batch from pairs whose contexts extend one another (consecutive states of one "
            "trace) and run their shared context once (decision 078); every pair still comes once per pass. Off: a "
            "plain shuffle, a row per pair."
        },
    )
    dpo_system_prompt: str = field(
        default="rollout",
        metadata={
            "help": "The system prompt DPO pairs are rendered with: 'rollout' (the training prompts' own, or none "
            "and the chat template's default, as a rollout starts; decision 079) or 'trace' (the one the replayed "
            "trace carries: the traced agent's, or ingestion's generic one)."
        },
    )
    dpo_reuse_policy_cache: bool = field(
        default=True,
        metadata={
            "help": "The DPO mini-batch reads the head its pairs share with a rollout's prompt (system prompt, tools) "
            "from GRPO's forward, keys and values with their gradient, and runs only the rest (decision 079). Applies "
            "where packed rows apply and the forward records a gradient (not under reentrant checkpointing)."
        },
    )
    dpo_sync_ref_model: bool = field(
        default=False,
        metadata={
            "help": "Trust-region DPO (Gorbatovski et al., 2024): move the DPO reference towards the policy every "
            "`dpo_ref_model_sync_steps` optimizer steps. Off (the default, decision 068): the reference is the policy "
            "before training. TRL's `sync_ref_model` settings, `dpo_`-prefixed: the unprefixed ones drive GRPO's KL "
            "reference (`beta`)."
        },
    )
    dpo_ref_model_mixup_alpha: float = field(
        default=0.6,
        metadata={
            "help": "alpha: at each sync, reference = alpha * policy + (1 - alpha) * reference. 1.0 is the hard update "
            "(the reference becomes the policy; no copy of the model is kept)."
        },
    )
    dpo_ref_model_sync_steps: int = field(
        default=512,
        metadata={"help": "tau: optimizer steps between reference syncs (the paper's soft update: tau = 1, alpha < 1)."},
    )

    def __post_init__(self) -> None:
        if self.bf16 is None and self.use_cpu:
            # TRL's default is bf16 unless fp16: on a CPU without bf16 matmuls, every product about 40x slower than
            # fp32 (decision 144). A CPU run that wants bf16 (to rehearse a GPU's precision) sets it.
            self.bf16 = False
        super().__post_init__()
        if self.sdpo_normalizer not in ("policy_tokens", "hint_tokens"):
            raise ValueError(f"sdpo_normalizer must be 'policy_tokens' or 'hint_tokens', got {self.sdpo_normalizer!r}")
        self.hint_sources = list(hint_sources(self.hint_sources))
        if self.hint_placement not in HINT_PLACEMENTS:
            raise ValueError(f"hint_placement must be one of {HINT_PLACEMENTS}, got {self.hint_placement!r}")
        if self.sdpo_tokens not in get_args(DistilledTokens):
            raise ValueError(f"sdpo_tokens must be one of {get_args(DistilledTokens)}, got {self.sdpo_tokens!r}")
        if self.sdpo_teacher not in ("live", "ema", "base"):
            raise ValueError(f"sdpo_teacher must be 'live', 'ema' or 'base', got {self.sdpo_teacher!r}")
        if self.dpo_tokens not in get_args(PairTokens):
            raise ValueError(f"dpo_tokens must be one of {get_args(PairTokens)}, got {self.dpo_tokens!r}")
        if self.dpo_loss_type not in ("sigmoid", "ipo"):
            raise ValueError(f"dpo_loss_type must be 'sigmoid' or 'ipo', got {self.dpo_loss_type!r}")
        if self.dpo_system_prompt not in ("rollout", "trace"):
            raise ValueError(f"dpo_system_prompt must be 'rollout' or 'trace', got {self.dpo_system_prompt!r}")
        if min(self.sdpo_weight, self.dpo_weight) < 0:
            raise ValueError("sdpo_weight and dpo_weight must be >= 0")
        if self.dpo_sync_ref_model and self.dpo_weight == 0:
            # as TRL refuses `sync_ref_model` without a KL reference: a setting that would do nothing
            raise ValueError("dpo_sync_ref_model needs the DPO channel (dpo_weight > 0): there is no DPO reference to sync")
        if not 0.0 < self.dpo_ref_model_mixup_alpha <= 1.0:
            raise ValueError(f"dpo_ref_model_mixup_alpha must lie in (0, 1], got {self.dpo_ref_model_mixup_alpha}")
        if self.dpo_ref_model_sync_steps < 1:
            raise ValueError(f"dpo_ref_model_sync_steps must be >= 1, got {self.dpo_ref_model_sync_steps}")


def check_conversational_prompts(dataset: Any) -> None:
    """Refuse plain-string prompts up front: with `environment_factory`, TRL appends each reset's
    observation to the prompt's last chat message, and a string fails there with an opaque `TypeError`."""
    if not isinstance(dataset, Dataset) or "prompt" not in dataset.column_names or len(dataset) == 0:
        return
    prompt = dataset[0]["prompt"]
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) and "content" in prompt[-1]):
        raise ValueError(
            "with environment_factory, each row's `prompt` must be a list of chat messages (the reset observation "
            f"is appended to the last one's content); got {type(prompt).__name__}. "
            "Build rows with trainer_client.task_rows.task_row(task_id)."
        )


def rollout_system_messages(dataset: Any) -> list[dict[str, Any]] | None:
    """The system messages a rollout's prompt opens with: the first row's leading ones (none: the chat
    template's default applies). None where the prompts are not chat messages."""
    if not isinstance(dataset, Dataset) or "prompt" not in dataset.column_names or len(dataset) == 0:
        return None
    prompt = dataset[0]["prompt"]
    if not isinstance(prompt, list):
        return None
    return list(itertools.takewhile(lambda message: message.get("role") == "system", prompt))


class ComposerTrainer(ConcurrentRolloutTrainer):
    """GRPO + alpha * SDPO at hint sites + beta * trace-replay DPO. See the module docstring."""

    config_class: ClassVar[type[ComposerConfig]] = ComposerConfig

    def __init__(
        self, *args: Any, preference_pairs: Sequence[PreferencePair] | None = None, **kwargs: Any
    ) -> None:
        if kwargs.get("environment_factory") is not None:
            check_conversational_prompts(kwargs.get("train_dataset"))
        super().__init__(*args, **kwargs)
        config: ComposerConfig = self.args
        self.shared_prefixes = takes_shared_prefixes(self.policy_causal_lm().config)
        """Run a context once for all its continuations: a DPO pair's two actions, a rollout's hinted turns
        (`packing`, decision 075)."""
        self._hint_template = HintTemplate(
            self._tokenizer,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
            role=config.hint_role,
        )
        self._token_classes = TurnTokenClasses(self._tokenizer, config.tool_call_marker) if config.sdpo_tokens == "content" else None
        self._rollout_messages: list[list[dict[str, Any]]] = []
        self._warned_no_reference = False
        self._rollout_prompts: list[Any] = []
        # The main process's share of each batch is sample enough, and one writer keeps the file whole.
        self._completion_samples = (
            CompletionSampleLog(config.output_dir, config.completion_samples_per_step, config.seed)
            if self.accelerator.is_main_process and config.completion_samples_per_step > 0
            else None
        )
        self.sdpo = self._sdpo_channel(config)
        self.dpo = self._dpo_channel(config, preference_pairs) if config.dpo_weight > 0 else None

    def _sdpo_channel(self, config: ComposerConfig) -> SdpoChannel:
        """The SDPO channel; its teacher keeps an EMA copy only where the channel is on and asks for one."""
        kind = config.sdpo_teacher if config.sdpo_weight > 0 else "live"
        if kind == "ema" and self._parameters_sharded():
            raise ValueError(
                "sdpo_teacher='ema' keeps a full copy of the model and is not supported with ZeRO-3 or FSDP "
                "(sharded parameters); use 'live', or ZeRO-2"
            )
        if kind == "base" and not is_peft_model(self.model):
            raise ValueError("sdpo_teacher='base' needs a PEFT model (the base is the model with its adapter off)")
        teacher = SdpoTeacher(
            self, kind, ema_decay=config.teacher_ema_decay, gradient_checkpointing_kwargs=config.gradient_checkpointing_kwargs
        )
        if teacher.ema_copy is not None:
            self.add_callback(EveryOptimizerSteps(1, teacher.update_ema))
        settings = SdpoSettings(
            jsd_beta=config.jsd_beta,
            jsd_temperature=config.jsd_temperature,
            jsd_top_k=config.jsd_top_k,
            normalizer=config.sdpo_normalizer,
            reuse_policy_cache=config.sdpo_reuse_policy_cache,
            placement=config.hint_placement,
            steps_per_generation=config.steps_per_generation,
            num_processes=self.accelerator.num_processes,
        )
        return SdpoChannel(self, teacher, self._hint_template.header_ids, settings)

    def _dpo_channel(self, config: ComposerConfig, pairs: Sequence[PreferencePair] | None) -> DpoChannel:
        """The DPO channel over the given pairs, or those of `dpo_pairs_path`; with trust-region DPO, its
        reference sync after every `dpo_ref_model_sync_steps` optimizer steps."""
        if pairs is None:
            if config.dpo_pairs_path is None:
                raise ValueError("dpo_weight > 0 needs preference pairs (dpo_pairs_path or preference_pairs)")
            pairs = load_preference_pairs(config.dpo_pairs_path)
        preferences = PreferenceBatches(
            pairs,
            self._tokenizer,
            batch_size=config.dpo_batch_size,
            max_length=config.dpo_max_length,
            group_by_context=config.dpo_group_by_context,
            tokens=config.dpo_tokens,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
            # pairs without their own tools get the rollouts' (one environment class: its tools)
            tools=next(iter(getattr(self, "_env_tools", {}).values()), None) or self.tools,
            system_messages=rollout_system_messages(self.train_dataset) if config.dpo_system_prompt == "rollout" else None,
            seed=config.seed,
            rank=self.accelerator.process_index,
            world_size=self.accelerator.num_processes,
        )
        alpha = config.dpo_ref_model_mixup_alpha if config.dpo_sync_ref_model else None
        if alpha is not None:
            if is_peft_model(self.model):
                raise ValueError(
                    "dpo_sync_ref_model needs full fine-tuning: with a PEFT adapter the DPO reference is the base model "
                    "(adapter off), which trust-region updates cannot move"
                )
            if alpha < 1.0 and self._parameters_sharded():
                # The soft update mixes two whole models parameter by parameter; with sharded parameters each
                # rank holds only its shard of the policy. The hard update needs no copy and works sharded.
                raise ValueError(
                    "dpo_ref_model_mixup_alpha < 1 keeps a full copy of the model and is not supported with ZeRO-3 "
                    "or FSDP; use dpo_ref_model_mixup_alpha: 1.0 (hard sync every dpo_ref_model_sync_steps)"
                )
        settings = DpoSettings(
            beta=config.dpo_beta,
            loss_type=config.dpo_loss_type,
            reuse_policy_cache=config.dpo_reuse_policy_cache,
            reference_mixup_alpha=alpha,
        )
        channel = DpoChannel(self, preferences, settings)
        if alpha is not None:
            self.add_callback(EveryOptimizerSteps(config.dpo_ref_model_sync_steps, channel.sync_reference))
        return channel

    # ----------------------------------------------------------------- the channels' host (`PolicyHost`)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def pad_token_id(self) -> int:
        return self._tokenizer.pad_token_id

    @property
    def in_training(self) -> bool:
        return self.model.training

    def policy_causal_lm(self, model: torch.nn.Module | None = None) -> torch.nn.Module:
        unwrapped = self.accelerator.unwrap_model(self.model if model is None else model)
        return unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped

    def policy_base(self) -> contextlib.AbstractContextManager[Any]:
        unwrapped = self.accelerator.unwrap_model(self.model)
        return unwrapped.disable_adapter() if is_peft_model(unwrapped) else contextlib.nullcontext()

    def run_backbone(
        self,
        causal_lm: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        if attention_mask.dim() == 3:
            # the additive mask eager and SDPA attention add
            dtype = causal_lm.get_input_embeddings().weight.dtype
            blocked = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
            attention_mask = blocked.masked_fill(~attention_mask, torch.finfo(dtype).min)[:, None]
        # Runs the backbone, not the root module: under FSDP2 that works only once the root's own forward has
        # run in this step (its parameters stay gathered until its backward). Every call is made inside
        # `_compute_loss`, after GRPO's forward (decision 069).
        with self.accelerator.autocast():
            return causal_lm.base_model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                use_cache=cache is not None,
            )[0]

    def accumulation_share(self) -> float:
        return float(self.current_gradient_accumulation_steps) if self.in_training else 1.0

    def gather_ranks(self, *values: torch.Tensor | float) -> torch.Tensor:
        local = torch.tensor(
            [float(value.detach() if isinstance(value, torch.Tensor) else value) for value in values],
            device=self.accelerator.device,
        )
        return self.accelerator.gather(local[None]).cpu()

    def record_metric(self, name: str, value: float) -> None:
        self._metrics["train" if self.in_training else "eval"][name].append(value)

    def _parameters_sharded(self) -> bool:
        """ZeRO-3 or FSDP: each rank holds a shard of every parameter (ZeRO-2 and DDP replicate them)."""
        plugin = self.accelerator.state.deepspeed_plugin
        return self.is_fsdp_enabled or (self.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3)

    # ----------------------------------------------------------------- rollouts

    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        self._rollout_messages = result[3]  # the parsed completion messages, needed to map calls to turns
        self._rollout_prompts = prompts
        return result

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if not self.environments:
            return output
        hint_sites = self._rollout_hint_sites(output)
        if self.args.sdpo_weight > 0:
            output["hint_sites"] = hint_sites
            output["hint_tokens"] = self._global_count(sum(s.distilled_tokens for ss in hint_sites for s in ss))
        return output

    def _rollout_hint_sites(self, output: dict[str, Any]) -> list[list[HintSite]]:
        """Per rollout, its hint sites: the turns the policy got wrong (decision 063) and, with a privileged
        source, every turn of a rollout that did not earn 1 (decision 129); logs what the rollouts did."""
        model_token_mask = output["completion_mask"] * output.get("tool_mask", 1)
        end_of_turn = set(self.eos_token_ids)
        sources = self.args.hint_sources
        privileged = self._privileged_contexts()
        reports, hint_sites = [], []
        for index, environment in enumerate(self.environments):
            mask = model_token_mask[index].tolist()
            policy_positions = [position for position, flag in enumerate(mask) if flag]
            last_turn_ended = bool(policy_positions) and int(output["completion_ids"][index, policy_positions[-1]]) in end_of_turn
            rollout = turn_reports(
                list(getattr(environment, "tool_calls", ())),
                self._rollout_messages[index],
                {tool.__name__ for tool in self._env_tools[self._batch_environments[index]]},
                episode_over=getattr(environment, "episode_over", True),
                last_turn_ended=last_turn_ended,
                tool_call_marker=self.args.tool_call_marker,
            )
            reports.append(rollout)
            sites = locate_hint_sites(
                rollout or [],
                mask,
                self._hint_template,
                sources=sources,
                answers=turn_answers(self._rollout_messages[index]) if "raw_error" in sources else (),
                privileged=privileged[index],
            )
            if self._token_classes is not None:
                sites = content_sites(sites, output["completion_ids"][index].tolist(), self._token_classes)
            hint_sites.append(sites)
        mode = "train" if self.in_training else "eval"
        if self._completion_samples is not None and mode == "train":
            self._completion_samples.write(self.state.global_step, self._rollout_samples(reports, hint_sites))
        # The global batch's numbers: every rank's rollouts, in rank order (a GRPO group may span ranks).
        metrics = rollout_metrics(
            gather_object(reports),
            gather_object(hint_sites),
            gather_object([record for environment in self.environments for record in getattr(environment, "tool_calls", ())]),
            gather_object(
                [
                    EpisodeOutcome(getattr(environment, "task_id", None), float(getattr(environment, "reward", None) or 0.0))
                    for environment in self.environments
                ]
            ),
            self.num_generations if mode == "train" else self.num_generations_eval,
        )
        for name, value in metrics.items():
            self.record_metric(name, value)
        return hint_sites

    def _privileged_contexts(self) -> list[str | None]:
        """Per rollout of this process, what the privileged sources tell its teacher: for a rollout that did not
        earn reward 1 (and was neither lost nor ungraded), a successful sibling's calls and the task's reference, as chosen."""
        sources = self.args.hint_sources
        rewards = [float(getattr(environment, "reward", None) or 0.0) for environment in self.environments]
        siblings: list[str | None] = [None] * len(rewards)
        if "sibling" in sources:
            # A GRPO group may span ranks: pair every rank's rollouts, then keep this rank's share.
            every_reward = gather_object(rewards)
            every_solution = gather_object([solution_calls(messages) for messages in self._rollout_messages])
            group_size = self.num_generations if self.in_training else self.num_generations_eval
            offset = self.accelerator.process_index * len(rewards)
            siblings = sibling_solutions(every_reward, every_solution, group_size)[offset : offset + len(rewards)]
        contexts: list[str | None] = []
        for environment, reward, sibling in zip(self.environments, rewards, siblings):
            # Lost or ungraded (a sandbox fault): the reward says nothing of the policy's turns.
            failed = reward < 1.0 and not getattr(environment, "lost", False) and not (
                getattr(environment, "episode_over", False) and getattr(environment, "reward", 0.0) is None
            )
            reference = self._reference(environment) if failed and "reference" in sources else None
            contexts.append(privileged_context(sibling, reference) if failed else None)
        return contexts

    def _reference(self, environment: Any) -> str | None:
        """The environment's task reference as the teacher reads it; warns once when there is none to read."""
        reference = task_reference(environment) if isinstance(environment, TrlEnvironment) else None
        if reference is None and not self._warned_no_reference:
            self._warned_no_reference = True
            log.warning(
                "hint source 'reference': task %s has no reference to read (set the service's privileged_token and "
                "ClientSettings.privileged_token; decision 129)", getattr(environment, "task_id", None),
            )
        return reference_text(reference) if reference is not None else None

    def _rollout_samples(self, reports: list[list[TurnReport] | None], hint_sites: list[list[HintSite]]) -> list[RolloutSample]:
        """This process's rollouts of the batch as conversations, with the failures charged to their turns and
        what the teacher read at each site."""
        samples = []
        for index, (environment, prompt, rollout, sites) in enumerate(zip(self.environments, self._rollout_prompts, reports, hint_sites)):
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
            failures = [failure.kind.value for turn in rollout or () for failure in turn.failures]
            teacher = [
                {"turn": site.turn, "error_kinds": list(site.error_kinds), "teacher_reads": self._hint_template.decode(site.hint_ids)}
                for site in sites
            ]
            samples.append(RolloutSample(getattr(environment, "task_id", None), getattr(environment, "reward", None),
                                         messages, self._rollout_messages[index], failures, teacher))
        return samples

    def _global_count(self, local: int) -> torch.Tensor:
        return self.accelerator.gather(torch.tensor(local, device=self.accelerator.device)).sum()

    # ----------------------------------------------------------------- loss

    def _get_per_token_logps_and_entropies(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """TRL's, in tiles sized for the CPU when training there (`cpu_logprob_tiles`, decision 145)."""
        with cpu_logprob_tiles(self.accelerator.device):
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        # `hint_tokens` counts the whole generation batch on every rank, so all ranks take the same branch
        # (the SDPO forwards are collectives under ZeRO-3 / FSDP); a rank without a site of its own runs a dummy.
        sdpo = self.args.sdpo_weight > 0 and "hint_sites" in inputs and int(inputs["hint_tokens"]) > 0
        dpo = self.dpo.next_batch(inputs) if self.dpo is not None else None
        captured = None
        if sdpo or (dpo is not None and dpo.head is not None):
            record_contexts = sdpo and self.sdpo.reads_policy_cache
            head = dpo.head if dpo is not None else None
            with BackboneCapture(self.policy_causal_lm(model).base_model, record_contexts=record_contexts, head=head) as captured:
                loss = super()._compute_loss(model, inputs)
        else:
            loss = super()._compute_loss(model, inputs)
        # GRPO's own term, per optimizer step like the logged total `loss` (TRL returns a micro-step's share and
        # logs no loss of its own), so that each channel can be plotted beside the total (`coding-train plot`).
        self.record_metric("grpo/loss", self.accelerator.gather(loss.detach() * self.accumulation_share()).mean().item())
        if sdpo:
            loss = loss + self.args.sdpo_weight * self.sdpo.loss(model, inputs, captured.hidden_states, captured.keys_values)
        elif self.args.sdpo_weight > 0:
            self.record_metric("sdpo/loss", 0.0)
        if dpo is not None:
            policy_tokens = inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()  # what GRPO's forward ran
            head_keys_values = captured.head_keys_values if captured is not None else None
            loss = loss + self.args.dpo_weight * self.dpo.loss(model, policy_tokens, dpo, head_keys_values)
        return loss
