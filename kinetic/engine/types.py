"""Protocol-neutral engine vocabulary: what a generation asks for and the events it yields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

FinishReason = Literal["stop", "length"]

# llama-server's default chain order (common_params_sampling.samplers), canonical names.
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DEFAULT_DRY_BREAKERS = ("\n", ":", "\"", "*")

SAMPLER_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
                 "infill", "adaptive_p")
# llama.cpp's alternative spellings (common_sampler_types_from_names) and one-letter codes
SAMPLER_ALIASES = {
    **{spelling: name for name in SAMPLER_NAMES
       for spelling in (name, name.replace("_", "-"), name.replace("_", ""))},
    "nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical": "typ_p", "typical_p": "typ_p",
    "typical-p": "typ_p", "typicalp": "typ_p",
}
SAMPLER_CODES = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                 "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill", "a": "adaptive_p"}


def sampler_order(raw: list[str] | str | None) -> tuple[str, ...] | None:
    """`samplers` as canonical names in chain order: a list of names (any llama.cpp spelling, any case),
    or a string of one-letter codes ("kt"). Unknown names are skipped, as llama-server does."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return tuple(SAMPLER_CODES[c] for c in raw if c in SAMPLER_CODES)
    return tuple(SAMPLER_ALIASES[n.lower()] for n in raw if isinstance(n, str) and n.lower() in SAMPLER_ALIASES)
StopType = Literal["eos", "word", "limit", "none"]
MemoryKind = Literal["attention", "hybrid", "recurrent"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings; defaults are llama-server's."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1  # -1: a fresh random seed per request
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: str | None = None  # GBNF text; constrains every sampled token
    ignore_eos: bool = False
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_n_sigma: float = -1.0  # < 0: off
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0  # 0: DRY off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = 0  # 0 off; 1 Mirostat, 2 Mirostat 2.0: temperature and Mirostat replace the whole chain
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0  # < 0: off
    adaptive_decay: float = 0.9
    min_keep: int = 0
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    backend_sampling: bool = False  # llama-server then samples in llama.cpp's graph; kinetic shows it, samples as ever


@dataclass(frozen=True)
class RankScore:
    """A document's relevance to a query (/rerank), as the model's classification head scores it."""

    score: float
    n_tokens: int  # the query-document pair's prompt tokens, counted into usage


@dataclass(frozen=True)
class ReasoningBudget:
    """llama-server's reasoning budget (kinetic.engine.llama.reasoning_budget): after `tokens` tokens of thinking
    (from `start`, or from the first token when the prompt opened the block), `message` then `end` are forced."""

    tokens: int
    start: str = "<think>"
    end: str = "</think>"
    message: str = ""
    starts_inside: bool = False
    # the request armed reasoning control: its thinking may be ended at once (Generation.end_reasoning)
    controllable: bool = False


@dataclass(frozen=True)
class Modalities:
    """What a model reads besides text: its multimodal projector's (llama-server's /props `modalities`)."""

    vision: bool = False
    audio: bool = False

    def reads(self, modality: str) -> bool:
        return (modality == "image" and self.vision) or (modality == "audio" and self.audio)


@dataclass(frozen=True, eq=False)
class MediaSpan:
    """One image or audio clip inside a prompt, as the projector encodes it.

    `prompt_tokens[start:start + n_pos]` hold stand-ins for it: negative ids made from the file's content
    hash (`key`), so the prompt cache compares media by content as it compares text by token, and a prefix
    never matches into a different image. `n_pos` is how many positions it takes in the sequence (fewer than
    `n_tokens`, the embeddings it is encoded to, on M-RoPE models); `chunk` is the engine's own handle."""

    start: int
    n_pos: int
    n_tokens: int
    key: str
    modality: str
    chunk: object

    @property
    def end(self) -> int:
        return self.start + self.n_pos

    @property
    def extra_tokens(self) -> int:
        """Embeddings beyond its positions (M-RoPE): what usage counts besides its stand-ins."""
        return self.n_tokens - self.n_pos


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = -1  # -1: until EOS or the end of the slot's context
    stop: tuple[str, ...] = ()
    n_probs: int = 0  # top alternatives reported per token (0: no logprobs)
    cache_prompt: bool = True
    id_slot: int = -1
    client: str = ""  # who asked (a key's name): waiting requests are served round-robin by client
    priority: int = 0  # the caller's (key file's `priority=`): a higher one is served first while waiting
    n_keep: int = 0  # prompt tokens a context shift keeps (-1: all)
    n_discard: int = 0  # tokens a context shift drops (0: half of those after n_keep)
    post_sampling_probs: bool = False  # n_probs from the sampler chain's candidates, as probabilities
    return_progress: bool = False  # emit PromptProgress while the prompt is evaluated
    # a prompt position other prompts are likely to share (where a chat's last message starts): on
    # hybrid and recurrent models the state there is saved (llama-server's user-message checkpoints)
    checkpoint_at: int = 0
    reasoning_budget: ReasoningBudget | None = None  # None: thinking is not limited
    media: tuple[MediaSpan, ...] = ()  # images and audio in the prompt, in order (their stand-ins in prompt_tokens)
    # this request's LoRA adapter scales by id (an adapter left out: 0); None: the server's (--lora, /lora-adapters)
    lora: tuple[tuple[int, float], ...] | None = None

    @property
    def n_prompt_tokens(self) -> int:
        return len(self.prompt_tokens)

    @property
    def text_tokens(self) -> list[int]:
        """The prompt without its media stand-ins: the tokens a sampler or a client may be given."""
        if not self.media:
            return self.prompt_tokens
        kept: list[int] = []
        start = 0
        for span in self.media:
            kept += self.prompt_tokens[start:span.start]
            start = span.end
        return kept + self.prompt_tokens[start:]


@dataclass(frozen=True)
class TokenProb:
    id: int
    token: str
    bytes: list[int]
    logprob: float


@dataclass(frozen=True)
class TokenLogprob(TokenProb):
    top_logprobs: list[TokenProb] = field(default_factory=list)


@dataclass(frozen=True)
class Timings:
    """llama-server's timings object, with its definitions (see the spec, section 8.8)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0  # speculative decoding: tokens drafted, and how many of them the model accepted
    draft_n_accepted: int = 0

    def to_dict(self) -> dict[str, float | int]:
        prompt_per_token = self.prompt_ms / self.prompt_n if self.prompt_n else 0.0
        prompt_per_second = 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0
        # The first generated token comes out of the last prompt batch, hence n - 1.
        steps = self.predicted_n - 1
        predicted_per_token = self.predicted_ms / steps if steps > 0 else 0.0
        predicted_per_second = 1000.0 * steps / self.predicted_ms if steps > 0 and self.predicted_ms > 0 else 0.0
        shown: dict[str, float | int] = {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": prompt_per_token,
            "prompt_per_second": prompt_per_second,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": predicted_per_second,
        }
        if self.draft_n > 0:  # as llama-server: only when something was drafted
            shown.update(draft_n=self.draft_n, draft_n_accepted=self.draft_n_accepted)
        return shown


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    """Text released by one sampled token ('' while a possible stop string is held back)."""

    text: str
    token_id: int
    logprob: TokenLogprob | None = None
    timings: Timings | None = None  # the request's timings so far (llama-server's timings_per_token)


@dataclass(frozen=True)
class PromptProgress:
    """After each prompt batch, for requests that ask (llama-server's `prompt_progress`)."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def timings(self) -> Timings:
        """The prompt's timings so far (llama-server's timings_per_token on a progress event): nothing predicted."""
        return Timings(cache_n=self.cache, prompt_n=self.processed - self.cache, prompt_ms=self.time_ms,
                       predicted_n=0, predicted_ms=0.0)

    def to_dict(self) -> dict[str, float | int]:
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


@dataclass(frozen=True)
class StructuredCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`
    id: str = ""


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    stop_type: StopType
    stopping_word: str
    text: str
    tokens: list[int]
    usage: Usage
    timings: Timings
    id_slot: int
    tokens_cached: int
    truncated: bool
    # tool calls the model's server gave as structure (a remote OpenAI-compatible one); a local model's
    # calls are in `text`, and the chat layer reads them from there
    calls: tuple[StructuredCall, ...] = ()


Event = TextDelta | PromptProgress | Finished


@dataclass(frozen=True)
class DeviceInfo:
    """One of ggml's devices (`CUDA0`, `Metal`, `Vulkan0`, `CPU`), as llama.cpp names and describes it."""

    name: str
    description: str
    type: str  # CPU, GPU, IGPU, ACCEL
    memory_total: int  # bytes
    memory_free: int  # bytes, at load


@dataclass(frozen=True)
class Offload:
    """Where llama.cpp put a model's layers at load (what llama-server logs as "offloaded N/M layers to GPU")."""

    backends: tuple[str, ...]  # ggml's registered backends, e.g. ("CUDA", "CPU")
    devices: tuple[DeviceInfo, ...]  # the devices the offloaded layers went to; the CPU's alone when none
    layers_offloaded: int
    layers: int  # the model's layers plus its output layer, llama.cpp's count
    cpu_reason: str = ""  # why nothing was offloaded ("" when some layers were)


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model says about itself (shown by /props, /v1/models, /api/show...)."""

    path: Path
    architecture: str
    description: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_params: int
    size: int
    vocab_type: int
    bos_token: str
    eos_token: str
    bos_id: int
    add_bos: bool
    chat_template: str | None
    metadata: dict[str, str]
    # fill-in-the-middle tokens by llama.cpp's names (pre, suf, mid, rep, sep, pad); -1 or absent: none
    fim_tokens: dict[str, int] = field(default_factory=dict)
    # "attention": one KV cell per token, trimmed to any prefix; "hybrid" (LFM2, Qwen3.5) and "recurrent"
    # (Mamba): layers whose state is one snapshot per sequence, valid only at the position it reached
    memory_kind: MemoryKind = "attention"
    offload: Offload | None = None  # None for a model another server runs
    eog_ids: tuple[int, ...] = ()  # every end-of-generation token (EOS, EOT, <end_of_turn>...): what ignore_eos bans

    @property
    def ftype(self) -> str:
        """'Q4_K - Medium' out of llama.cpp's 'gemma3 270M Q4_K - Medium'."""
        parts = self.description.split(" ", 2)
        return parts[2] if len(parts) == 3 else self.description


@dataclass(frozen=True)
class SlotState:
    """One slot as GET /slots shows it, copied out of the engine at one moment."""

    id: int
    is_processing: bool
    used: bool  # has served at least one request
    n_prompt_tokens: int
    n_prompt_tokens_processed: int
    n_prompt_tokens_cache: int
    n_decoded: int
    client: str = ""
    id_task: int = -1
    request: GenerationRequest | None = None  # the slot's last task (GET /slots shows its params)


@dataclass(frozen=True)
class SlotFileResult:
    """What a slot save, restore or erase did: tokens and bytes moved, and how long it took."""

    id_slot: int
    n_tokens: int
    n_bytes: int
    ms: float


@dataclass(frozen=True)
class EngineStats:
    """Counters and gauges for /metrics, llama-server's names without the prefix."""

    counters: dict[str, float]
    requests_processing: int
    requests_deferred: int
    deferred_by_client: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)  # rates since the previous scrape, means
