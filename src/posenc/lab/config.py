"""What defines a laboratory run: the model, the optimisation, the evaluation, a comparison composed of
them, and the presets.

Each field owns its default and its command-line flag (:func:`posenc.runs.flags.option`), and the
comparison's settings declare the fields they share with the model's, the training's and the evaluation's
configs (:class:`~posenc.lab.eval_config.EvalConfig`) as those fields (:func:`posenc.runs.flags.like`), so
``posenc train``, ``eval`` and ``compare`` show and use one default for each. Every field is checked when
its object is made, by the validators of :mod:`posenc.lab.checks`, so a bad value is refused before any
work starts, with a :class:`LabError` naming the field, the value and what is allowed (the CLI prints it
as one line).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from posenc import cli
from posenc.extension import METHODS
from posenc.lab import defaults as D
from posenc.lab.checks import check_choice, check_choices, check_int, check_lengths, check_mix, check_number
from posenc.lab.encodings import (
    BUILTIN,
    ENCODINGS,
    EXTENSIONS,
    build,
    expand_schemes,
    lookup,
    registered_names,
)
from posenc.lab.errors import LabError
from posenc.lab.eval_config import EvalConfig
from posenc.lab.mix import check_mix_fits, check_training_mix, mix_help
from posenc.lab.passkey import TRAIN_KEY_DIGITS, passkey_min_length
from posenc.lab.recipes import RECIPES, check_recipes, continued
from posenc.lab.tokenizer import VOCAB_SIZE
from posenc.runs.flags import like, option

# ---------------------------------------------------------------------------------------------- model


def _encoding_help() -> str:
    return f"the positional encoding: one of {', '.join(registered_names())}, or package.module:function"


def _layers_help() -> str:
    kinds = ", ".join(sorted(n for n, s in ENCODINGS.items() if s.options))
    return (
        "a positional encoding per layer (posenc.lab.layers), e.g. 'rope,rope,rope,nope', 'every:4=nope' "
        f"(the others --encoding), 'local:16*3,rope:base=1e6'; kinds with options: {kinds}; any scheme "
        "that only changes attention (rope, none, nope, alibi, ...) is a kind (default: --encoding in every "
        "layer)"
    )


@dataclass(frozen=True)
class GPTConfig:
    """Everything needed to rebuild a model; saved as JSON next to its weights.

    ``max_len`` is the training length; it sizes the learned position table and is the
    ``original_max_position_embeddings`` of eval-time RoPE extensions.
    """

    encoding: str = option("rope", help=_encoding_help)
    n_layer: int = option(D.N_LAYER, type=cli.positive_int, help="transformer blocks")
    n_head: int = option(D.N_HEAD, type=cli.positive_int, help="attention heads")
    d_model: int = option(D.D_MODEL, type=cli.positive_int, help="model width")
    max_len: int = option(
        D.TRAIN_LEN, type=cli.positive_int, flag="train-len", help="training sequence length (bytes)"
    )
    vocab_size: int = VOCAB_SIZE
    rope_base: float = D.ROPE_BASE
    rope_scaling: dict | None = None  # set by an extension recipe (posenc.lab.recipes)
    pose_len: int | None = None  # PoSE's target length, set by the "pose" recipe
    layers: str | None = option(None, help=lambda: _layers_help())

    def __post_init__(self):
        scheme = lookup(self.encoding)
        for name in ("n_layer", "n_head", "d_model", "max_len", "vocab_size"):
            check_int(name, getattr(self, name))
        if self.d_model % self.n_head:
            raise LabError(
                f"d_model={self.d_model} must be a multiple of n_head={self.n_head} (each head gets "
                f"d_model/n_head dimensions)"
            )
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise LabError(
                f"rope_scaling={self.rope_scaling!r} must be a Hugging Face rope_scaling dict or None"
            )
        if self.pose_len is not None:
            check_int("pose_len", self.pose_len, minimum=self.max_len)
        scheme.check(self)  # a scheme that pairs dimensions needs an even size
        if self.layers is not None:
            build(self)  # a plan that does not parse or names a kind that cannot be a layer, refused now

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise LabError(f"model config has unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**d)


# ---------------------------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``batch_size`` is the global batch (split across DDP ranks)."""

    steps: int = option(D.STEPS, type=cli.positive_int, help="optimizer steps")
    batch_size: int = option(D.BATCH_SIZE, type=cli.positive_int, help="global batch, split across DDP ranks")
    lr: float = option(D.LR, type=float, help="peak learning rate (AdamW)")
    min_lr_ratio: float = D.MIN_LR_RATIO
    warmup: int = option(D.WARMUP, type=cli.count, help="linear warmup steps, then cosine decay")
    weight_decay: float = option(D.WEIGHT_DECAY, type=float, help="AdamW weight decay on matrices")
    grad_clip: float = option(D.GRAD_CLIP, type=float, help="clip the gradient norm to this; 0 turns it off")
    seed: int = option(D.SEED, type=cli.seed, help="initialisation and batch order")
    copy_fraction: float = option(
        D.COPY_FRACTION,
        type=float,
        help="share of training windows whose second half repeats the first, 0..1",
    )
    passkey_fraction: float = option(
        D.PASSKEY_FRACTION,
        type=float,
        help="share of training windows made into passkey prompts with their answer, so that the model "
        "learns retrieval inside the training length, 0..1; with the copy fraction at most 1 in all",
    )
    mix: str | None = option(None, help=mix_help)
    answer_weight: float = option(
        D.ANSWER_WEIGHT,
        type=float,
        help="loss weight of the training mix's answer bytes against the others' (weighted mean); 1: alike",
    )
    # continuing a trained model (an extension recipe, posenc.lab.recipes):
    seq_len: int | None = None  # window length, default the model's max_len
    init_from: str | None = None  # a run or checkpoint directory whose weights start this run
    first_batch: int = 0  # the data stream starts at this step's batch (after the run it continues)

    def __post_init__(self):
        check_int("steps", self.steps)
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len)
        check_int("first_batch", self.first_batch, minimum=0)
        check_mix(self.copy_fraction, self.passkey_fraction)
        mix = check_training_mix(self.mix, self.copy_fraction, self.passkey_fraction, self.answer_weight)
        object.__setattr__(self, "mix", mix)  # canonical: the run state and provenance compare it
        check_int("batch_size", self.batch_size)
        check_int("warmup", self.warmup, minimum=0)
        check_number("lr", self.lr, low=0, low_open=True, finite=True)
        check_number("min_lr_ratio", self.min_lr_ratio, low=0, high=1)
        check_number("grad_clip", self.grad_clip, low=0, why="0 turns clipping off")
        check_number("weight_decay", self.weight_decay, low=0)


# ---------------------------------------------------------------------------------------------- comparison

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi")


def _schemes_help() -> str:
    more = ", ".join(n for n in BUILTIN if n not in SCHEMES)
    return (
        f"comma-separated encodings to compare; 'all': every built-in, also {more}; your own as "
        "package.module:function; a per-layer plan as plan:KIND/KIND/... (the --layers syntax, '/' between "
        "layers)"
    )


# the lab's RoPE extensions of static frequencies (posenc.extension.METHODS; dynamic NTK's schedule grows with
# the sequence, evaluated when asked) and the lab's own two, blockwise causal attention and the temperature
COMPARE_EXTENSIONS = (*(n for n, m in METHODS.items() if m.lab and not m.length_dependent), "bca", "temp")


@dataclass(frozen=True)
class Settings:
    """Everything that defines a comparison. Presets are instances; CLI flags override fields.

    Composed of the model's (:class:`GPTConfig`), the training's (:class:`TrainConfig`) and the
    evaluation's (:class:`EvalConfig`) fields, each declared as that field (default and flag), flat so
    that a preset is one dict of overrides and the saved settings one JSON object.
    """

    train_len: int = like(GPTConfig, "max_len")
    eval_mults: tuple[int, ...] = option(
        D.EVAL_MULTS, type=cli.int_list, help="evaluation lengths as multiples of the training length"
    )
    steps: int = like(TrainConfig, "steps")
    batch_size: int = like(TrainConfig, "batch_size")
    lr: float = like(TrainConfig, "lr")
    warmup: int = like(TrainConfig, "warmup")
    n_layer: int = like(GPTConfig, "n_layer")
    n_head: int = like(GPTConfig, "n_head")
    d_model: int = like(GPTConfig, "d_model")
    eval_tokens: int = like(EvalConfig, "eval_tokens")
    seed: int = like(TrainConfig, "seed")
    schemes: tuple[str, ...] = option(SCHEMES, type=cli.name_list, help=_schemes_help)
    extensions: tuple[str, ...] = COMPARE_EXTENSIONS
    ckpt_every: int = option(D.CKPT_EVERY, type=cli.positive_int, help="checkpoint interval in steps")
    seeds: int = option(
        1,
        type=cli.positive_int,
        help="models per scheme, seeds --seed, --seed + 1, ...: tables show mean ± sd",
    )
    protocols: tuple[str, ...] = like(EvalConfig, "protocols")
    sliding_tokens: int = like(EvalConfig, "sliding_tokens")
    probe_windows: int = like(EvalConfig, "probe_windows")
    copy_fraction: float = like(TrainConfig, "copy_fraction")
    passkey_fraction: float = like(TrainConfig, "passkey_fraction")
    mix: str | None = like(TrainConfig, "mix")
    answer_weight: float = like(TrainConfig, "answer_weight")
    passkey_trials: int = like(EvalConfig, "passkey_trials")
    # extension by training (posenc.lab.recipes): each recipe continues the base model for extend_steps
    extend_to: int = option(
        D.EXTEND_TO, type=cli.positive_int, help="the recipes' target length in training lengths"
    )
    extend_steps: int = option(
        0,
        type=cli.count,
        help="continue each RoPE model this many steps with each of --recipes, every recipe with the same "
        "tokens per step; 0: no recipes",
    )
    recipes: tuple[str, ...] = option(
        tuple(RECIPES),
        type=cli.name_list,
        choices=lambda: {name: r.meaning for name, r in RECIPES.items()},
        help="the extension recipes (posenc.lab.recipes)",
    )

    def __post_init__(self):
        check_int("seeds", self.seeds)
        object.__setattr__(self, "protocols", self.eval_config().protocols)  # checked, in report order
        check_mix(self.copy_fraction, self.passkey_fraction)
        mix = check_training_mix(self.mix, self.copy_fraction, self.passkey_fraction, self.answer_weight)
        object.__setattr__(self, "mix", mix)  # canonical: the run state and provenance compare it
        if self.passkey_fraction:
            least = passkey_min_length(TRAIN_KEY_DIGITS[0], "code") - 1
            if self.train_len < least:
                raise LabError(
                    f"passkey_fraction={self.passkey_fraction} needs train_len >= {least} (a passkey prompt "
                    f"and its answer in one training window); train_len is {self.train_len}"
                )
        if not self.schemes:
            check_choices("schemes", self.schemes, sorted(ENCODINGS))  # the "is empty" message
        object.__setattr__(self, "schemes", expand_schemes(self.schemes))
        check_choices("extensions", self.extensions, EXTENSIONS, empty_ok=True)
        check_lengths("eval_mults", self.eval_mults)
        check_int("train_len", self.train_len)
        check_mix_fits(self.mix, self.train_len)
        if "temp" in self.extensions and "none" in self.schemes and self.train_len < 2:
            raise LabError(  # checked here, before any model trains (the extension would refuse it after)
                f"extension 'temp' scales NoPE's scores by log(n) / log(train_len): it needs train_len >= 2, "
                f"got {self.train_len}; use a longer --train-len or leave 'none' out of --schemes"
            )
        check_recipes(self.recipes, self.extend_to, self.extend_steps, self.batch_size)
        if self.extend_steps:
            self._check_recipes_apply()
        for scheme in self.schemes:  # every scheme builds, before any trains
            build(self.model_config(scheme))

    def _check_recipes_apply(self) -> None:
        """With extend_steps, each recipe must run on some scheme: else it would be silently skipped."""
        if not self.recipes:
            raise LabError(
                f"recipes=[] is empty with extend_steps={self.extend_steps}; give one or more of: "
                f"{', '.join(RECIPES)} (or extend_steps=0 for none)"
            )
        idle = [r for r in self.recipes if not any(r in lookup(s).recipes for s in self.schemes)]
        if idle:
            hosts = [n for n, scheme in ENCODINGS.items() if scheme.recipes]
            raise LabError(
                f"recipes {idle} apply to none of schemes={list(self.schemes)}: a recipe continues the model "
                f"of a scheme it applies to ({', '.join(hosts)}); add one to the schemes or leave it out"
            )

    @property
    def eval_lens(self) -> list[int]:
        return [self.train_len * m for m in sorted(self.eval_mults)]

    def model_config(self, scheme: str) -> GPTConfig:
        return GPTConfig(
            encoding=scheme,
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_model=self.d_model,
            max_len=self.train_len,
        )

    def eval_config(self) -> EvalConfig:
        """What is measured at each length."""
        return EvalConfig(
            eval_tokens=self.eval_tokens,
            protocols=self.protocols,
            sliding_tokens=self.sliding_tokens,
            probe_windows=self.probe_windows,
            passkey_trials=self.passkey_trials,
        )

    def train_config(self, seed: int | None = None) -> TrainConfig:
        """The optimisation settings; ``seed`` replaces :attr:`seed` (one of a multi-seed comparison)."""
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            warmup=self.warmup,
            seed=self.seed if seed is None else seed,
            copy_fraction=self.copy_fraction,
            passkey_fraction=self.passkey_fraction,
            mix=self.mix,
            answer_weight=self.answer_weight,
        )

    def recipes_for(self, scheme: str) -> list[str]:
        """The recipes this comparison runs on ``scheme`` (none unless ``extend_steps``)."""
        return [r for r in self.recipes if r in lookup(scheme).recipes] if self.extend_steps else []

    def recipe_configs(self, scheme: str, seed: int, recipe: str, base_run: str) -> tuple:
        """(GPTConfig, TrainConfig) of ``recipe`` continuing the model of ``scheme`` in ``base_run``."""
        return continued(
            self.model_config(scheme),
            self.train_config(seed),
            recipe,
            self.extend_to,
            self.extend_steps,
            base_run,
        )

    def to_json(self) -> dict:
        """The fields as JSON values (tuples become lists), as saved in details.json and eval caches."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# Each preset is what it changes of Settings' defaults (posenc.lab.defaults).
PRESET_OVERRIDES: dict[str, dict] = {
    # Seconds, for tests: proves the pipeline, measures nothing.
    "tiny": dict(
        train_len=16,
        eval_mults=(1, 2, 4),
        steps=4,
        batch_size=4,
        warmup=1,
        n_layer=1,
        n_head=2,
        d_model=16,
        eval_tokens=256,
        ckpt_every=2,
        sliding_tokens=64,
        probe_windows=4,
        passkey_trials=4,
    ),
    # The default: every scheme on a laptop CPU (docs/lab-results.md has the measured wall time).
    "quick": {},
    # Long enough that sinusoidal, learned, rope and alibi end within 10% of each other in distribution
    # (the quick preset's gap is training time); under 40 min on 2 CPU cores (docs/lab-results.md).
    "standard": dict(steps=6000, ckpt_every=250),
    # A GPU (--device cuda): longer training length, bigger model, more steps and evaluation tokens.
    "gpu": dict(
        train_len=256,
        steps=4000,
        batch_size=64,
        lr=1e-3,
        warmup=200,
        n_layer=6,
        d_model=384,
        eval_tokens=262144,
        ckpt_every=500,
    ),
    # Far context (with --mix and --answer-weight): L = 256 bytes holds about seven lines of code, and 4
    # layers of 8 heads are deep enough for induction heads (two suffice: Olsson et al. 2022); evaluated to
    # 8L, where the recall probe's distances end. Sized to train on a CPU; its measured cost: docs/lab.md.
    "long": dict(train_len=256, eval_mults=(1, 2, 4, 8), steps=4000, ckpt_every=250),
}
PRESETS: dict[str, Settings] = {name: Settings(**kw) for name, kw in PRESET_OVERRIDES.items()}


def settings_for(preset: str, **overrides) -> Settings:
    """A preset with some fields replaced (None values are ignored)."""
    check_choice("preset", preset, PRESETS)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return replace(PRESETS[preset], **overrides)
