"""Every default of the laboratory's experiments, in one place: the model, the optimisation, the
evaluation and passkey.

``GPTConfig``, ``TrainConfig``, ``EvalConfig`` and ``Settings`` (:mod:`posenc.lab.config`) take their field
defaults from here, the presets are override dicts on top of them, and the flags of ``posenc train``,
``eval`` and ``compare`` are generated from those fields (:mod:`posenc.runs.flags`), so they show and use
the same values. A command's conveniences that no experiment depends on (an output folder, the prompt of
``posenc sample``) are their option's own default (:mod:`posenc.lab.arguments`). This module imports
nothing.
"""

# ---------------------------------------------------------------------------------------------- model

N_LAYER = 4
# ALiBi's slopes 2^(-8h/H) were chosen for 8 heads (Press et al. 2021); with 4 the slopes spread too little.
N_HEAD = 8
D_MODEL = 128
TRAIN_LEN = 64  # the training length (bytes): the model's max_len
ROPE_BASE = 10000.0

# ---------------------------------------------------------------------------------------------- optimisation

STEPS = 1200
BATCH_SIZE = 16  # the global batch, split across DDP ranks
LR = 3e-3
MIN_LR_RATIO = 0.1  # the cosine schedule ends at this share of LR
WARMUP = 50
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
SEED = 0
CKPT_EVERY = 100
# the training mix: shares of windows made into copy tasks and into passkey prompts (0: plain text)
COPY_FRACTION = 0.0
PASSKEY_FRACTION = 0.0
# the loss weight of the training mix's answer bytes against every other byte's (1: all bytes alike)
ANSWER_WEIGHT = 1.0

# ---------------------------------------------------------------------------------------------- evaluation

EVAL_MULTS = (1, 2, 4, 8, 16)  # compare's evaluation lengths, multiples of the training length
EVAL_TOKENS = 32768  # validation tokens per length (the windows protocol)
SLIDING_TOKENS = 2048  # tokens the sliding protocol scores per length
PROBE_WINDOWS = 48  # windows per length of the far-context-gain and copy probes
PROBE_LAST = 32  # last tokens of each window the gain probe scores
COPY_PROBE_MAX_MULT = 2  # the copy probe runs at lengths up to this multiple of the training length
RECALL_PROBE_MAX_MULT = 8  # the recall probe too: its distances reach (n/2, n], up to 8L
# `posenc eval` looks at one model interactively: fewer lengths and prompts than a comparison.
EVAL_COMMAND_MULTS = (1, 2, 4, 8)

# Extension recipes (posenc.lab.recipes): continue a model to this many times its training length.
EXTEND_TO = 4

# ---------------------------------------------------------------------------------------------- passkey

# One passkey for every command: a 3-digit key in the 34-byte "code" prompt, so that it can be asked inside
# a 64-byte training length, with corpus text as filler (docs/lab.md).
PASSKEY_DIGITS = 3
PASSKEY_STYLE = "code"
PASSKEY_FILLER = "corpus"
PASSKEY_TRIALS = 40  # prompts per length and model in a comparison
EVAL_COMMAND_PASSKEY_TRIALS = 8
