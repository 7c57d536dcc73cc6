"""`ComposerTrainer`: TRL's GRPO plus two loss channels.

    loss = grpo + sdpo_weight * sdpo + dpo_weight * dpo

- GRPO is TRL's own loss, untouched: with both weights 0 the loss is exactly TRL's (the rollouts'
  failures are still read, for the per-step logs of `rollout_metrics`).
- SDPO (self-distillation at hint sites): for an assistant turn the policy got wrong (a tool error
  of its doing, or a failure TRL answers itself: an unparsable call, an unknown tool, a turn with no
  call; decision 063), the teacher (the policy without gradient, reading the hint just before the
  turn) is distilled into the student (the policy on the original context) with a generalized JSD
  over that turn's tokens.
  The student's hidden states come from GRPO's own forward pass (a hook on the backbone), and so do
  the contexts the live teacher reads: it runs only each hint and hinted turn, after GRPO's keys and
  values (decision 076). The vocabulary projection runs only at hint-site positions, for student and
  teacher alike, through the model's own output path (softcapping, logit scaling: `output_head`).
- DPO (trace replay): mini-batches of preference pairs (each rank its own shard), reference log-probs
  computed at the first DPO loss (after `accelerator.prepare`) and cached; optionally trust-region DPO
  (the reference moved towards the policy every `dpo_ref_model_sync_steps` steps, decision 068).
- Several processes (decision 069): every rank joins every collective (a rank without a hint site in
  a step where another has one runs the SDPO forwards on a dummy site weighted 0), and the logged
  rollout, SDPO and DPO numbers are the global batch's.
- Rollouts: the environments' resets and tool rounds run concurrently across rollouts; that is the
  base class's, `ConcurrentRolloutTrainer` (`concurrent_rollouts`, decision 062).

Pinned to TRL 1.16.0: the private methods overridden here (`_generate`, `_generate_and_score_completions`,
`_compute_loss`) and every other TRL internal used are listed in decision 064.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from accelerate.utils import gather_object, is_peft_model
from datasets import Dataset
from transformers import Cache, TrainerCallback
from trl.models.utils import disable_gradient_checkpointing

from trainer_client.completion_samples import CompletionSampleLog, RolloutSample
from trainer_client.concurrent_rollouts import (
    ConcurrentRolloutConfig,
    ConcurrentRolloutTrainer,
)
from trainer_client.hint_sites import (
    HintSite,
    HintTemplate,
    TurnReport,
    locate_hint_sites,
    teacher_row,
    turn_reports,
)
from trainer_client.losses import dpo_loss, generalized_jsd
from trainer_client.output_head import output_logits
from trainer_client.packing import (
    Continuation,
    PackedBatch,
    PackedRow,
    common_prefix_length,
    pack,
    pack_after_cache,
    takes_shared_prefixes,
)
from trainer_client.policy_forward import (
    BackboneCapture,
    HeadCache,
    KeysValues,
    PolicyContexts,
    PromptHead,
    checkpointed_layers_keep_cache,
)
from trainer_client.preferences import PreferenceBatches, load_preference_pairs
from trainer_client.records import PreferencePair
from trainer_client.rollout_metrics import EpisodeOutcome, rollout_metrics

TeacherKind = Literal["live", "ema", "base"]


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
    hint_role: str = field(default="user", metadata={"help": "Chat role of the hint message the teacher reads."})
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
        super().__post_init__()
        if self.sdpo_normalizer not in ("policy_tokens", "hint_tokens"):
            raise ValueError(f"sdpo_normalizer must be 'policy_tokens' or 'hint_tokens', got {self.sdpo_normalizer!r}")
        if self.sdpo_teacher not in ("live", "ema", "base"):
            raise ValueError(f"sdpo_teacher must be 'live', 'ema' or 'base', got {self.sdpo_teacher!r}")
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


@dataclass(frozen=True)
class DpoBatch:
    """One micro-step's DPO mini-batch."""

    indices: list[int]
    """The pairs' positions in the rank's shard."""
    batch: PackedBatch
    """Their rows (`PreferenceBatches.collate`)."""
    head: PromptHead | None
    """The rollout prompt head every row opens with, whose keys and values GRPO's forward records for it."""


class _EmaTeacherUpdate(TrainerCallback):
    """Moves the EMA teacher towards the policy after every optimizer step."""

    def __init__(self, trainer: ComposerTrainer) -> None:
        self._trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._trainer._update_ema_teacher()


class _DpoReferenceSync(TrainerCallback):
    """Trust-region DPO: syncs the DPO reference every `dpo_ref_model_sync_steps` optimizer steps."""

    def __init__(self, trainer: ComposerTrainer) -> None:
        self._trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % args.dpo_ref_model_sync_steps == 0:
            self._trainer._sync_dpo_reference()


def frozen_copy(causal_lm: torch.nn.Module) -> torch.nn.Module:
    """A copy of the causal LM that runs its own weights, in eval mode and without gradient."""
    copied = copy.deepcopy(causal_lm)
    # TRL patches `forward` on instances with closures over the policy's own modules (fused LM head,
    # fp32 LM head); a deep copy keeps the closures and would run the policy, so restore the classes'.
    for module in copied.modules():
        vars(module).pop("forward", None)
    return copied.eval().requires_grad_(False)


@torch.no_grad()
def mix_into(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """TR-DPO's reference update, in place: every target parameter becomes `alpha * source + (1 - alpha) * target`
    (the rule of TRL's `SyncRefModelCallback`; alpha = 1 copies the source). Same parameter order in both."""
    for target_param, source_param in zip(target.parameters(), source.parameters(), strict=True):
        target_param.lerp_(source_param.detach().to(target_param.dtype), alpha)


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
        self._hint_template = HintTemplate(
            self._tokenizer,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
            role=config.hint_role,
        )
        self._rollout_messages: list[list[dict[str, Any]]] = []
        self._rollout_prompts: list[Any] = []
        # The main process's share of each batch is sample enough, and one writer keeps the file whole.
        self._completion_samples = (
            CompletionSampleLog(config.output_dir, config.completion_samples_per_step, config.seed)
            if self.accelerator.is_main_process and config.completion_samples_per_step > 0
            else None
        )
        self._ema_teacher: torch.nn.Module | None = None
        if config.sdpo_weight > 0 and config.sdpo_teacher == "ema":
            if self._parameters_sharded():
                raise ValueError(
                    "sdpo_teacher='ema' keeps a full copy of the model and is not supported with ZeRO-3 or FSDP "
                    "(sharded parameters); use 'live', or ZeRO-2"
                )
            self._ema_teacher = frozen_copy(self._causal_lm(self.model))
            self.add_callback(_EmaTeacherUpdate(self))
        if config.sdpo_weight > 0 and config.sdpo_teacher == "base" and not is_peft_model(self.model):
            raise ValueError("sdpo_teacher='base' needs a PEFT model (the base is the model with its adapter off)")
        self._preferences: PreferenceBatches | None = None
        self._dpo_reference: torch.nn.Module | None = None
        """Trust-region DPO with alpha < 1: the reference's own weights. Otherwise None: the reference is
        the policy itself when its log-probs are computed (at the first DPO loss, or at a hard sync)."""
        if config.dpo_weight > 0:
            if preference_pairs is None:
                if config.dpo_pairs_path is None:
                    raise ValueError("dpo_weight > 0 needs preference pairs (dpo_pairs_path or preference_pairs)")
                preference_pairs = load_preference_pairs(config.dpo_pairs_path)
            self._preferences = PreferenceBatches(
                preference_pairs,
                self._tokenizer,
                batch_size=config.dpo_batch_size,
                max_length=config.dpo_max_length,
                group_by_context=config.dpo_group_by_context,
                chat_template=self.chat_template,
                chat_template_kwargs=self.chat_template_kwargs,
                # pairs without their own tools get the rollouts' (one environment class: its tools)
                tools=next(iter(getattr(self, "_env_tools", {}).values()), None) or self.tools,
                system_messages=rollout_system_messages(self.train_dataset) if config.dpo_system_prompt == "rollout" else None,
                seed=config.seed,
                rank=self.accelerator.process_index,
                world_size=self.accelerator.num_processes,
            )
            if config.dpo_sync_ref_model:
                self._set_up_reference_sync(config)
        self._shared_prefixes = takes_shared_prefixes(self._causal_lm(self.model).config)
        """Run a context once for all its continuations: a DPO pair's two actions, a rollout's hinted turns
        (`packing`, decision 075)."""

    def _set_up_reference_sync(self, config: ComposerConfig) -> None:
        if is_peft_model(self.model):
            raise ValueError(
                "dpo_sync_ref_model needs full fine-tuning: with a PEFT adapter the DPO reference is the base model "
                "(adapter off), which trust-region updates cannot move"
            )
        if config.dpo_ref_model_mixup_alpha < 1.0:
            if self._parameters_sharded():
                # The soft update mixes two whole models parameter by parameter; with sharded parameters each
                # rank holds only its shard of the policy. The hard update needs no copy and works sharded.
                raise ValueError(
                    "dpo_ref_model_mixup_alpha < 1 keeps a full copy of the model and is not supported with ZeRO-3 "
                    "or FSDP; use dpo_ref_model_mixup_alpha: 1.0 (hard sync every dpo_ref_model_sync_steps)"
                )
            self._dpo_reference = frozen_copy(self._causal_lm(self.model))
        self.add_callback(_DpoReferenceSync(self))

    # ----------------------------------------------------------------- model parts

    def _parameters_sharded(self) -> bool:
        """ZeRO-3 or FSDP: each rank holds a shard of every parameter (ZeRO-2 and DDP replicate them)."""
        plugin = self.accelerator.state.deepspeed_plugin
        return self.is_fsdp_enabled or (self.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3)

    def _causal_lm(self, model: torch.nn.Module) -> torch.nn.Module:
        """The transformers causal LM inside whatever wraps it (accelerate, PEFT)."""
        unwrapped = self.accelerator.unwrap_model(model)
        return unwrapped.get_base_model() if is_peft_model(unwrapped) else unwrapped

    def _hidden_states(
        self,
        causal_lm: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """Last hidden states, after the keys and values in `cache` if given. A `(rows, length, keys)` boolean
        `attention_mask` says which keys each query sees (a packed batch); it becomes the additive mask that
        eager and SDPA attention add."""
        if attention_mask.dim() == 3:
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

    @contextlib.contextmanager
    def _teacher(self) -> Iterator[torch.nn.Module]:
        """The teacher's causal LM, run without gradient."""
        kind = self.args.sdpo_teacher
        if kind == "ema":
            assert self._ema_teacher is not None
            yield self._ema_teacher
            return
        causal_lm = self._causal_lm(self.model)
        adapter_off = self.accelerator.unwrap_model(self.model).disable_adapter() if kind == "base" else None
        with (
            adapter_off or contextlib.nullcontext(),
            disable_gradient_checkpointing(causal_lm, self.args.gradient_checkpointing_kwargs),
        ):
            yield causal_lm

    @torch.no_grad()
    def _update_ema_teacher(self) -> None:
        decay = self.args.teacher_ema_decay
        policy = dict(self._causal_lm(self.model).named_parameters())
        for name, teacher_param in self._ema_teacher.named_parameters():
            teacher_param.lerp_(policy[name].detach().to(teacher_param.dtype), 1.0 - decay)

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
            output["hint_tokens"] = self._global_count(sum(s.end - s.start for ss in hint_sites for s in ss))
        return output

    def _rollout_hint_sites(self, output: dict[str, Any]) -> list[list[HintSite]]:
        """Per rollout, the turns the policy got wrong (decision 063); logs what the rollouts did."""
        model_token_mask = output["completion_mask"] * output.get("tool_mask", 1)
        end_of_turn = set(self.eos_token_ids)
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
            hint_sites.append(locate_hint_sites(rollout or [], mask, self._hint_template))
        mode = "train" if self.model.training else "eval"
        if self._completion_samples is not None and mode == "train":
            self._completion_samples.write(self.state.global_step, self._rollout_samples(reports))
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
            self._metrics[mode][name].append(value)
        return hint_sites

    def _rollout_samples(self, reports: list[list[TurnReport] | None]) -> list[RolloutSample]:
        """This process's rollouts of the batch as conversations, with the failures charged to their turns."""
        samples = []
        for index, (environment, prompt, rollout) in enumerate(zip(self.environments, self._rollout_prompts, reports)):
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
            failures = [failure.kind.value for turn in rollout or () for failure in turn.failures]
            samples.append(RolloutSample(getattr(environment, "task_id", None), getattr(environment, "reward", None),
                                         messages, self._rollout_messages[index], failures))
        return samples

    def _global_count(self, local: int) -> torch.Tensor:
        return self.accelerator.gather(torch.tensor(local, device=self.accelerator.device)).sum()

    # ----------------------------------------------------------------- loss

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        mode = "train" if self.model.training else "eval"
        # `hint_tokens` counts the whole generation batch on every rank, so all ranks take the same branch
        # (the SDPO forwards are collectives under ZeRO-3 / FSDP); a rank without a site of its own runs a dummy.
        sdpo = self.args.sdpo_weight > 0 and "hint_sites" in inputs and int(inputs["hint_tokens"]) > 0
        dpo = self._next_dpo_batch(inputs) if self.args.dpo_weight > 0 else None
        captured = None
        if sdpo or (dpo is not None and dpo.head is not None):
            record_contexts = sdpo and self._teacher_reads_policy_cache()
            head = dpo.head if dpo is not None else None
            with BackboneCapture(self._causal_lm(model).base_model, record_contexts=record_contexts, head=head) as captured:
                loss = super()._compute_loss(model, inputs)
        else:
            loss = super()._compute_loss(model, inputs)
        # GRPO's own term, per optimizer step like the logged total `loss` (TRL returns a micro-step's share and
        # logs no loss of its own), so that each channel can be plotted beside the total (`coding-train plot`).
        grpo = self.accelerator.gather(loss.detach() * self._accumulation_share()).mean().item()
        self._metrics[mode]["grpo/loss"].append(grpo)
        if sdpo:
            loss = loss + self.args.sdpo_weight * self._sdpo_loss(model, inputs, captured.hidden_states, captured.keys_values)
        elif self.args.sdpo_weight > 0:
            self._metrics[mode]["sdpo/loss"].append(0.0)
        if dpo is not None:
            policy_tokens = inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()  # what GRPO's forward ran
            head_keys_values = captured.head_keys_values if captured is not None else None
            loss = loss + self.args.dpo_weight * self._dpo_loss(model, policy_tokens, dpo, head_keys_values)
        return loss

    def _accumulation_share(self) -> float:
        """Each micro-step's share of an optimizer step, as TRL's GRPO loss scales itself."""
        return float(self.current_gradient_accumulation_steps) if self.model.training else 1.0

    def _teacher_reads_policy_cache(self) -> bool:
        """Whether the teacher can take the rollouts' contexts from GRPO's forward: it is that forward's
        model (the live policy) and it runs packed continuations (decision 076)."""
        return self.args.sdpo_reuse_policy_cache and self.args.sdpo_teacher == "live" and self._shared_prefixes

    def _sdpo_loss(
        self, model: torch.nn.Module, inputs: dict[str, Any], hidden_states: torch.Tensor, keys_values: KeysValues | None = None
    ) -> torch.Tensor:
        """Generalized JSD summed over this micro-batch's hint-site tokens, divided by a token count of the
        generation batch (`sdpo_normalizer`). `keys_values`: GRPO's forward's, of the micro-batch, if recorded."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids = inputs["completion_ids"]
        prompt_length = prompt_ids.size(1)
        rows, positions, teacher_rows, turn_lengths, cache_rows, context_starts = [], [], [], [], [], []
        for row, sites in enumerate(inputs["hint_sites"]):
            if not sites:
                continue
            prompt = prompt_ids[row][prompt_mask[row].bool()].tolist()
            cache_rows.append(row)
            context_starts.append(prompt_length - len(prompt))  # TRL left-pads prompts
            completion = completion_ids[row].tolist()
            for site in sites:
                # the hidden state at t predicts token t + 1
                span = range(prompt_length + site.start - 1, prompt_length + site.end - 1)
                rows.extend([row] * len(span))
                positions.extend(span)
                turn_lengths.append(site.end - site.start)
            teacher_rows.append(teacher_row(prompt, completion, sites, self._hint_template.header_ids))
        site_tokens = len(positions)
        if not site_tokens:
            # No site here but some on another rank: the same forwards on row 0's first completion token,
            # weighted 0, so this rank joins the parameter gathers of ZeRO-3 / FSDP in them.
            prompt = prompt_ids[0][prompt_mask[0].bool()].tolist()
            rows, positions, turn_lengths = [0], [prompt_length - 1], [1]
            teacher_rows = [PackedRow(prompt, [Continuation(len(prompt), [int(completion_ids[0, 0])])])]
            keys_values = None  # the dummy's one token is predicted from the context
        device = hidden_states.device
        student_logits = output_logits(
            self._causal_lm(model), hidden_states[torch.tensor(rows, device=device), torch.tensor(positions, device=device)]
        )
        contexts = PolicyContexts(keys_values, cache_rows, context_starts) if keys_values is not None else None
        teacher_logits = self._teacher_logits(teacher_rows, turn_lengths, contexts)
        jsd = generalized_jsd(
            student_logits,
            teacher_logits,
            beta=self.args.jsd_beta,
            temperature=self.args.jsd_temperature,
            top_k=self.args.jsd_top_k,
            reduction="sum",
        ) * float(site_tokens > 0)
        # Normalise like TRL's token-level losses, over a count of the whole generation batch, so that the
        # micro-steps of one optimizer step add up to one token mean (decision 065 for which count).
        normalizer = self._sdpo_token_count(inputs) / self.accelerator.num_processes
        if self.model.training:
            normalizer = normalizer * self._accumulation_share() / self.args.steps_per_generation
        loss = jsd / normalizer
        mode = "train" if self.model.training else "eval"
        ranks = self._gathered(loss, jsd, site_tokens)
        self._metrics[mode]["sdpo/loss"].append(ranks[:, 0].mean().item())  # the ranks' gradients are averaged
        self._metrics[mode]["sdpo/jsd"].append((ranks[:, 1].sum() / ranks[:, 2].sum().clamp(min=1)).item())
        self._metrics[mode]["sdpo/hint_tokens"].append(ranks[:, 2].sum().item())
        return loss

    def _gathered(self, *values: torch.Tensor | float) -> torch.Tensor:
        """`(ranks, len(values))`: each rank's values, detached, from every rank (all must call it)."""
        local = torch.tensor(
            [float(value.detach() if isinstance(value, torch.Tensor) else value) for value in values],
            device=self.accelerator.device,
        )
        return self.accelerator.gather(local[None]).cpu()

    def _sdpo_token_count(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The generation batch's token count the SDPO sum is divided by (decision 065)."""
        hint_tokens = inputs["hint_tokens"]
        if self.args.sdpo_normalizer == "hint_tokens":
            return hint_tokens.clamp(min=1)
        # Sites in completions TRL masks out (`mask_truncated_completions`) are not in GRPO's count.
        return torch.maximum(inputs["num_items_in_batch"], hint_tokens).clamp(min=1)

    @torch.no_grad()
    def _teacher_logits(
        self, rows: Sequence[PackedRow], turn_lengths: Sequence[int], contexts: PolicyContexts | None = None
    ) -> torch.Tensor:
        """Teacher logits at the positions predicting the last `turn_length` tokens of each continuation
        (continuations in order, row by row). The contexts are read from GRPO's keys and values where
        given (`contexts`), else run: a rollout's context once for all its sites where the model allows
        (`packing`)."""
        device = self.accelerator.device
        if contexts is not None:
            batch = pack_after_cache(
                rows, self._tokenizer.pad_token_id, context_starts=contexts.context_starts, cache_length=contexts.length
            )
            cache = contexts.cache_for_rows()
        else:
            batch = pack(rows, self._tokenizer.pad_token_id, shared=self._shared_prefixes)
            cache = None
        lengths = iter(turn_lengths)
        batch_rows, positions = [], []
        for row, placements in enumerate(batch.placements):
            for continuation, placement in enumerate(placements):
                count = next(lengths)
                predictors = batch.predictors(row, continuation)
                if count > len(predictors):
                    raise ValueError("a turn's first token is predicted from the cached context; put the hint before it")
                batch_rows.extend([placement.row] * count)
                positions.extend(predictors[-count:])
        with self._teacher() as teacher:
            hidden = self._hidden_states(
                teacher, batch.input_ids.to(device), batch.attention_mask.to(device), batch.position_ids.to(device), cache
            )
            scored = hidden[torch.tensor(batch_rows, device=device), torch.tensor(positions, device=device)]
            return output_logits(teacher, scored)

    def _sequence_logps(
        self, causal_lm: torch.nn.Module, batch: PackedBatch, head_keys_values: KeysValues | None = None
    ) -> torch.Tensor:
        """Summed log-probs of each continuation, in order; the vocabulary is projected only at its tokens.
        With `head_keys_values`, every row's first positions are read from them (a prompt head recorded in
        GRPO's forward, its gradient included) and only the rest of the rows runs."""
        device = self.accelerator.device
        head, cache, keep_cache = 0, None, contextlib.nullcontext()
        if head_keys_values is not None:
            head, cache = head_keys_values[0][0].size(-2), HeadCache(head_keys_values, rows=batch.input_ids.size(0))
            keep_cache = checkpointed_layers_keep_cache(causal_lm.base_model)
        with keep_cache:
            hidden = self._hidden_states(
                causal_lm,
                batch.input_ids[:, head:].to(device),
                batch.attention_mask[:, head:].to(device),  # a packed mask: the rest's queries, every key
                batch.position_ids[:, head:].to(device),
                cache,
            )
        rows, predictors, targets, numbers = (t.to(device) for t in batch.scored_tokens())
        logits = output_logits(causal_lm, hidden[rows, predictors - head])
        token_logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        continuations = sum(len(placements) for placements in batch.placements)  # known on the host: no device sync
        return torch.zeros(continuations, device=device).index_add(0, numbers, token_logps)

    def _collate_pairs(self, preferences: PreferenceBatches, indices: list[int]) -> PackedBatch:
        return preferences.collate(indices, self._tokenizer.pad_token_id, shared_prefix=self._shared_prefixes)

    @torch.no_grad()
    def _reference_logps(self, preferences: PreferenceBatches) -> torch.Tensor:
        """(chosen, rejected) log-probs of this rank's pairs under the DPO reference: its own copy (soft
        trust-region DPO), else the policy as it is now, adapter off for a PEFT policy (its base). Called at
        the first DPO loss, after `accelerator.prepare` (a sharded model can only run from then on), and
        after each reference sync; every rank has as many pairs, so as many forwards."""
        own_copy = self._dpo_reference is not None
        causal_lm = self._dpo_reference if own_copy else self._causal_lm(self.model)
        adapter_off = (
            self.accelerator.unwrap_model(self.model).disable_adapter() if not own_copy and is_peft_model(self.model) else None
        )
        logps = torch.empty(len(preferences.pairs), 2)
        order = preferences.grouped_indices()  # a chain's pairs together: their shared context runs once
        was_training = causal_lm.training
        causal_lm.eval()  # no dropout in a reference
        try:
            with adapter_off or contextlib.nullcontext(), disable_gradient_checkpointing(causal_lm, None):
                for start in range(0, len(order), preferences.batch_size):
                    indices = order[start : start + preferences.batch_size]
                    logps[indices] = self._sequence_logps(causal_lm, self._collate_pairs(preferences, indices)).view(-1, 2).cpu()
        finally:
            causal_lm.train(was_training)
        return logps

    @torch.no_grad()
    def _sync_dpo_reference(self) -> None:
        """Trust-region DPO's update (`mix_into`; for alpha = 1 the policy itself is the new reference),
        then the cached log-probs are dropped: every rank recomputes its pairs' at the next DPO loss."""
        if self._dpo_reference is not None:
            mix_into(self._dpo_reference, self._causal_lm(self.model), self.args.dpo_ref_model_mixup_alpha)
        self._preferences.reference_logps = None

    def _next_dpo_batch(self, inputs: dict[str, Any]) -> DpoBatch:
        """The micro-step's DPO mini-batch, and the head its pairs share with a rollout's prompt, if GRPO's
        forward may record it for them (decision 079)."""
        preferences = self._preferences
        indices = preferences.next_indices()
        batch = self._collate_pairs(preferences, indices)
        head = None
        if self.args.dpo_reuse_policy_cache and self._shared_prefixes:
            contexts = [preferences.pairs[index].context_ids for index in indices]
            longest = min(map(len, contexts)) - 1  # a context's last token predicts its actions: it must run
            # Rows without left padding: there the head's positions are those of the pairs' own rows.
            for row in (inputs["prompt_mask"][:, 0] == 1).nonzero().flatten().tolist():
                prompt = inputs["prompt_ids"][row].tolist()
                length = min(longest, *(common_prefix_length(prompt, context) for context in contexts))
                if length > (head.length if head else 0):
                    head = PromptHead(row, length)
        return DpoBatch(indices, batch, head)

    def _dpo_loss(
        self,
        model: torch.nn.Module,
        policy_tokens: torch.Tensor,
        dpo: DpoBatch | None = None,
        head_keys_values: KeysValues | None = None,
    ) -> torch.Tensor:
        """The loss of the DPO mini-batch `dpo` (by default the next one, run whole); logs `dpo/token_share`,
        the tokens it ran over GRPO's `policy_tokens` in this micro-step, which is what the channel adds to
        the step's time (decision 077). The head recorded in GRPO's forward (`head_keys_values`) is read, not
        run, where it carries its gradient: not under reentrant activation checkpointing, whose forward
        records no graph."""
        preferences = self._preferences
        if dpo is None:
            indices = preferences.next_indices()
            dpo = DpoBatch(indices, self._collate_pairs(preferences, indices), head=None)
        if preferences.reference_logps is None:
            preferences.reference_logps = self._reference_logps(preferences)
        if head_keys_values is not None and torch.is_grad_enabled() and not head_keys_values[0][0].requires_grad:
            head_keys_values = None
        policy = self._sequence_logps(self._causal_lm(model), dpo.batch, head_keys_values).view(-1, 2)  # (pairs, chosen / rejected)
        reference = preferences.reference_logps[dpo.indices].to(policy.device)
        out = dpo_loss(
            policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], beta=self.args.dpo_beta, loss_type=self.args.dpo_loss_type
        )
        mode = "train" if self.model.training else "eval"
        loss = out.losses.mean()
        head = 0 if head_keys_values is None else head_keys_values[0][0].size(-2)
        # every rank scores as many pairs (`rank_shard`): the global means are the means of the ranks'
        ranks = self._gathered(
            loss,
            (out.chosen_rewards > out.rejected_rewards).float().mean(),
            (out.chosen_rewards - out.rejected_rewards).mean(),
            dpo.batch.token_count() - head * dpo.batch.input_ids.size(0),
            policy_tokens,
        )
        for name, value in zip(("dpo/loss", "dpo/accuracy", "dpo/margin"), ranks[:, :3].mean(dim=0).tolist()):
            self._metrics[mode][name].append(value)
        self._metrics[mode]["dpo/token_share"].append((ranks[:, 3].sum() / ranks[:, 4].sum().clamp(min=1)).item())
        return loss / self._accumulation_share()
